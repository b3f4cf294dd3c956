//! One order for one host, from placing it to a validated chain and key.
//!
//! The certificate's key is made (P-256) and stored with the order's URL right after the order is
//! placed, before anything else happens: an agent restarted mid-order resumes that order, even one
//! the CA completed meanwhile, instead of placing a second. Every TXT record published is removed
//! once the CA has looked, whether it liked what it saw or not. Nothing is handed back that does
//! not pass [`crate::certs::parse`], the check every pair goes through before sozu.

use std::time::{Duration, SystemTime};

use instant_acme::{
    Account, AuthorizationStatus, CertificateIdentifier, ChallengeType, Identifier, NewOrder,
    Order, OrderStatus, RetryPolicy,
};

use super::client::RetryAfter;
use super::dns01::{challenge_name, Dns01Error, Lookup};
use super::provider::Provider;
use super::store::PendingOrder;
use super::AcmeError;

/// How long the CA may take to validate, and then to issue.
const POLL: RetryPolicy = RetryPolicy::new()
    .initial_delay(Duration::from_millis(250))
    .backoff(1.5)
    .timeout(Duration::from_secs(120));

/// What an order needs besides the host.
pub struct Context<'a> {
    pub account: &'a Account,
    pub retry_after: &'a RetryAfter,
    pub directory: &'a str,
    pub provider: &'a Provider,
    pub lookup: &'a Lookup,
    /// The profile to ask for, when the CA offers it.
    pub profile: Option<&'a str>,
    /// The certificate this one replaces (ARI), when the CA offers renewal information.
    pub replaces: Option<CertificateIdentifier<'static>>,
}

/// A validated chain and its key.
pub struct Obtained {
    pub chain_pem: String,
    pub key_pem: zeroize::Zeroizing<String>,
    pub certificate: crate::plan::state::Certificate,
    /// Whether this run placed the order (false: one placed earlier was resumed).
    pub placed: bool,
}

/// How an order failed, and what the CA's failure means for the limits.
#[derive(Debug)]
pub struct Failed {
    pub error: AcmeError,
    /// The CA refused the challenge response: a failed authorisation for the limits.
    pub authorization_failed: bool,
    /// Whether the order had been placed when it failed.
    pub placed: bool,
    /// The CA's Retry-After, Unix seconds.
    pub retry_after: Option<i64>,
}

/// Where an order's progress is kept, so that an agent restarted mid-order resumes it.
pub trait Progress {
    /// The order in flight, or `None` once it is finished (nothing to resume).
    fn save(
        &mut self,
        pending: Option<&PendingOrder>,
    ) -> impl std::future::Future<Output = Result<(), AcmeError>> + Send;

    /// The order in flight as last saved.
    fn pending(&self) -> Option<PendingOrder>;
}

/// Runs the order for `host`: resumes `pending` when it is one of this CA's, else places one.
pub async fn obtain(
    ctx: &Context<'_>,
    host: &str,
    pending: Option<PendingOrder>,
    progress: &mut (impl Progress + Send),
) -> Result<Obtained, Failed> {
    let mut placed = false;
    let retry_after = || {
        ctx.retry_after
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(crate::clock::unix_seconds)
    };
    let result = run(ctx, host, pending, &mut placed, progress).await;
    match result {
        Ok(obtained) => {
            // The order is done: nothing to resume.
            if let Err(e) = progress.save(None).await {
                tracing::warn!(host, error = %e, "cannot clear the finished order from the state directory");
            }
            Ok(Obtained { placed, ..obtained })
        }
        Err((error, authorization_failed, finished)) => {
            if finished {
                let _ = progress.save(None).await;
            }
            Err(Failed {
                error,
                authorization_failed,
                placed,
                retry_after: retry_after(),
            })
        }
    }
}

/// The error, whether the CA failed an authorisation, and whether the order is finished (an
/// invalid order cannot be resumed).
type RunError = (AcmeError, bool, bool);

async fn run(
    ctx: &Context<'_>,
    host: &str,
    pending: Option<PendingOrder>,
    placed: &mut bool,
    progress: &mut (impl Progress + Send),
) -> Result<Obtained, RunError> {
    let plain = |e: AcmeError| (e, false, false);
    let (mut order, key_pem) = match resume(ctx, host, pending).await {
        Some(resumed) => resumed,
        None => {
            let key =
                rcgen::KeyPair::generate().map_err(|e| plain(AcmeError::Key(e.to_string())))?;
            let identifiers = [Identifier::Dns(host.to_owned())];
            let mut new = NewOrder::new(&identifiers);
            if let Some(profile) = ctx.profile {
                new = new.profile(profile);
            }
            if let Some(replaces) = ctx.replaces.clone() {
                new = new.replaces(replaces);
            }
            let order = ctx
                .account
                .new_order(&new)
                .await
                .map_err(|e| plain(AcmeError::from_acme(e)))?;
            *placed = true;
            let record = PendingOrder {
                url: order.url().to_owned(),
                directory: ctx.directory.to_owned(),
                key_pem: zeroize::Zeroizing::new(key.serialize_pem()),
                placed_at: crate::clock::unix_seconds(SystemTime::now()),
            };
            progress.save(Some(&record)).await.map_err(plain)?;
            tracing::info!(host, order = %record.url, "order placed");
            (order, record.key_pem)
        }
    };

    let status = order.state().status;
    if status == OrderStatus::Pending {
        let mut published: Vec<(hickory_proto::rr::Name, String)> = Vec::new();
        let authorized = authorize(ctx, host, &mut order, &mut published).await;
        // Whatever happened, the records published are removed: exactly these values.
        for (name, value) in &published {
            if let Err(e) = ctx.provider.cleanup(name, value).await {
                tracing::warn!(host, record = %name, error = %e, "cannot remove a DNS-01 record");
            }
        }
        authorized?;
    }
    let status = order.state().status;
    if status == OrderStatus::Invalid {
        return Err((order_problem(&mut order, host), false, true));
    }
    if status == OrderStatus::Ready {
        let key =
            rcgen::KeyPair::from_pem(&key_pem).map_err(|e| plain(AcmeError::Key(e.to_string())))?;
        let csr = rcgen::CertificateParams::new(vec![host.to_owned()])
            .and_then(|params| params.serialize_request(&key))
            .map_err(|e| plain(AcmeError::Key(e.to_string())))?;
        order
            .finalize_csr(csr.der())
            .await
            .map_err(|e| plain(AcmeError::from_acme(e)))?;
    }
    let chain_pem = order
        .poll_certificate(&POLL)
        .await
        .map_err(|e| plain(AcmeError::from_acme(e)))?;
    let now = crate::clock::unix_seconds(SystemTime::now());
    let certificate = crate::certs::parse(
        chain_pem.as_bytes(),
        std::path::Path::new("issued chain"),
        key_pem.as_bytes(),
        std::path::Path::new("issued key"),
        host,
        now,
    )
    .map_err(|e| (AcmeError::Invalid(e), false, true))?;
    Ok(Obtained {
        chain_pem,
        key_pem,
        certificate,
        placed: *placed,
    })
}

/// The order in flight from an earlier run, if it is this CA's and can still finish.
async fn resume(
    ctx: &Context<'_>,
    host: &str,
    pending: Option<PendingOrder>,
) -> Option<(Order, zeroize::Zeroizing<String>)> {
    let pending = pending.filter(|p| p.directory == ctx.directory)?;
    match ctx.account.order(pending.url.clone()).await {
        Ok(mut order) => {
            let status = order.state().status;
            if status == OrderStatus::Invalid {
                return None;
            }
            tracing::info!(host, order = %pending.url, status = %order_status(status), "resuming the order placed before the restart");
            Some((order, pending.key_pem))
        }
        Err(e) => {
            tracing::info!(host, order = %pending.url, error = %e, "the order placed before the restart cannot be resumed; placing another");
            None
        }
    }
}

/// An order's status as RFC 8555 writes it.
fn order_status(status: OrderStatus) -> &'static str {
    match status {
        OrderStatus::Pending => "pending",
        OrderStatus::Ready => "ready",
        OrderStatus::Processing => "processing",
        OrderStatus::Valid => "valid",
        OrderStatus::Invalid => "invalid",
    }
}

/// A value of the ACME protocol as the protocol writes it (`pending`, `ip 10.0.0.1`), for a
/// message: its JSON form, a `{ type, value }` pair read as two words.
fn word(value: &impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(text)) => text,
        Ok(serde_json::Value::Object(fields)) => fields
            .values()
            .filter_map(|v| v.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        Ok(other) => other.to_string(),
        Err(_) => "of an unknown kind".into(),
    }
}

/// Answers every pending authorisation with DNS-01, then waits for the CA's verdict.
async fn authorize(
    ctx: &Context<'_>,
    host: &str,
    order: &mut Order,
    published: &mut Vec<(hickory_proto::rr::Name, String)>,
) -> Result<(), RunError> {
    let plain = |e: AcmeError| (e, false, false);
    let dns = |e: Dns01Error| (AcmeError::Dns01(e), false, false);
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz.map_err(|e| plain(AcmeError::from_acme(e)))?;
        match authz.status {
            AuthorizationStatus::Pending => {}
            // Reused from an earlier order (the CA remembers a validation for a while).
            AuthorizationStatus::Valid => continue,
            other => {
                return Err((
                    AcmeError::Authorization(format!("authorisation is {}", word(&other))),
                    false,
                    true,
                ))
            }
        }
        let identifier = match &authz.identifier().identifier {
            Identifier::Dns(name) => name.clone(),
            other => {
                return Err(plain(AcmeError::Authorization(format!(
                    "unsupported identifier {}",
                    word(other)
                ))))
            }
        };
        // The CA asks to prove control of the name ordered, nothing else: a TXT record is
        // published only for the host itself.
        if !identifier.eq_ignore_ascii_case(host) {
            return Err((
                AcmeError::Authorization(format!(
                    "the CA asks to authorise {identifier} for an order of {host}"
                )),
                false,
                true,
            ));
        }
        let mut challenge = authz.challenge(ChallengeType::Dns01).ok_or_else(|| {
            plain(AcmeError::Authorization(format!(
                "the CA offers no dns-01 challenge for {identifier}"
            )))
        })?;
        let value = challenge.key_authorization().dns_value();
        let name = ctx
            .lookup
            .follow_cnames(&challenge_name(&identifier).map_err(dns)?)
            .await
            .map_err(dns)?;
        ctx.provider.present(&name, &value).await.map_err(dns)?;
        published.push((name.clone(), value.clone()));
        let servers = ctx.lookup.authoritative(&name).await.map_err(dns)?;
        ctx.lookup
            .wait_propagated(&servers, &name, &value)
            .await
            .map_err(dns)?;
        challenge
            .set_ready()
            .await
            .map_err(|e| plain(AcmeError::from_acme(e)))?;
    }
    match order.poll_ready(&POLL).await {
        Ok(OrderStatus::Ready) => Ok(()),
        Ok(_) => Err((order_problem(order, "the order"), true, true)),
        Err(instant_acme::Error::Api(problem)) => {
            Err((AcmeError::Validation(problem.to_string()), true, true))
        }
        Err(e) => Err(plain(AcmeError::from_acme(e))),
    }
}

fn order_problem(order: &mut Order, what: &str) -> AcmeError {
    match &order.state().error {
        Some(problem) => AcmeError::Validation(problem.to_string()),
        None => AcmeError::Validation(format!("{what}: the CA marked the order invalid")),
    }
}
