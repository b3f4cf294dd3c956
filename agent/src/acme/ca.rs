//! The CA as the issuer's loop sees it: [`Ca::connect`] opens the account and makes the tools
//! an order needs; a [`Session`] answers renewal information and runs one order. [`AcmeCa`] is
//! the real one (instant-acme over [`super::http`], DNS-01 through the workspace's provider);
//! the loop's schedule is tested against a fake, with paused time.
//!
//! Every call has a deadline: opening the account ([`CONNECT_TIMEOUT`]), a renewal-information
//! request (each HTTP exchange, [`super::http`]); an order's own steps are bounded by their
//! polls' timeouts and DNS propagation's.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use instant_acme::{Account, CertificateIdentifier};

use super::client::AccountSource;
use super::dns01::Lookup;
use super::order::{self, Failed, Obtained, Progress};
use super::provider::Provider;
use super::store::{PendingOrder, Store};
use super::AcmeError;
use crate::workspace::{Acme, Dns01};

/// Opening the account (restoring it and fetching the CA's directory, or creating it) must be
/// done by then; a CA that hangs is tried again after the back-off.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// What the CA says of a certificate's renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewalInfo {
    /// The CA's suggested window (Unix seconds), and how long to wait before asking again.
    Window {
        start: i64,
        end: i64,
        retry_after: Duration,
    },
    /// The CA offers no renewal information (ARI).
    Unsupported,
    /// Not available now: asked again later.
    Unavailable(String),
}

/// A CA the issuer can connect to.
pub trait Ca: Send + Sync + 'static {
    type Session: Session;

    /// The account at `acme.directory` (restored from `store`, or created and stored there) and
    /// what orders need besides it.
    fn connect(
        &self,
        acme: &Acme,
        store: &Arc<Store>,
    ) -> impl Future<Output = Result<Self::Session, AcmeError>> + Send;
}

/// An open account at a CA.
pub trait Session: Send + Sync + 'static {
    /// How the configured profile was handled, when the CA does not offer it.
    fn profile_note(&self) -> Option<String>;

    /// The CA's renewal window for the certificate whose chain (leaf first) is `chain_pem`.
    fn renewal_info(&self, chain_pem: &str) -> impl Future<Output = RenewalInfo> + Send;

    /// One order for `host`: `pending` resumed when it can be, else a new order, which replaces
    /// the certificate `replaces` (its chain) when given. Its progress goes to `progress`.
    fn order(
        &self,
        host: &str,
        pending: Option<PendingOrder>,
        replaces: Option<String>,
        progress: &mut (impl Progress + Send),
    ) -> impl Future<Output = Result<Obtained, Failed>> + Send;
}

/// The real CA: instant-acme, DNS-01 through the workspace's provider.
#[derive(Debug, Clone)]
pub struct AcmeCa {
    /// Cloudflare's API root ([`super::cloudflare::API`] but in tests).
    pub cloudflare_api: String,
}

pub struct AcmeSession {
    source: Arc<AccountSource>,
    /// For renewal information (no order state).
    account: Account,
    directory: String,
    profile: Option<String>,
    profile_note: Option<String>,
    provider: Arc<Provider>,
    lookup: Arc<Lookup>,
}

impl Ca for AcmeCa {
    type Session = AcmeSession;

    async fn connect(&self, acme: &Acme, store: &Arc<Store>) -> Result<AcmeSession, AcmeError> {
        let provider = Arc::new(match &acme.dns01 {
            Dns01::Rfc2136 {
                server,
                zone,
                tsig_key_name,
                tsig_algorithm,
                tsig_secret_file,
            } => Provider::Rfc2136(Box::new(super::rfc2136::Rfc2136::new(
                *server,
                zone,
                tsig_key_name,
                *tsig_algorithm,
                tsig_secret_file.clone(),
            )?)),
            Dns01::Cloudflare { api_token_file } => {
                Provider::Cloudflare(Box::new(super::cloudflare::Cloudflare::new(
                    self.cloudflare_api.clone(),
                    api_token_file.clone(),
                    super::http::client(super::http::Roots::Platform)
                        .map_err(|e| AcmeError::Tls(e.to_string()))?,
                )))
            }
        });
        let lookup = Arc::new(Lookup::new(
            acme.propagation.nameservers.clone(),
            Duration::from_secs(acme.propagation.timeout_secs),
        ));
        let opened = async {
            let (source, created) = AccountSource::open(acme, store).await?;
            let account = source.account().await?;
            Ok::<_, AcmeError>((source, created, account))
        };
        let (source, created, account) = tokio::time::timeout(CONNECT_TIMEOUT, opened)
            .await
            .map_err(|_| {
                AcmeError::Unreachable(format!(
                    "the account was not open within {} s",
                    CONNECT_TIMEOUT.as_secs()
                ))
            })??;
        tracing::info!(directory = %acme.directory, created, "ACME account ready");
        let (profile, profile_note) = match &acme.profile {
            None => (None, None),
            Some(wanted) if account.profiles().any(|p| p.name == wanted) => {
                (Some(wanted.clone()), None)
            }
            Some(wanted) => {
                let note = format!("the CA offers no profile `{wanted}`; orders use its default");
                tracing::warn!(profile = %wanted, "{note}");
                (None, Some(note))
            }
        };
        Ok(AcmeSession {
            source: Arc::new(source),
            account,
            directory: acme.directory.clone(),
            profile,
            profile_note,
            provider,
            lookup,
        })
    }
}

impl Session for AcmeSession {
    fn profile_note(&self) -> Option<String> {
        self.profile_note.clone()
    }

    async fn renewal_info(&self, chain_pem: &str) -> RenewalInfo {
        let Some(id) = certificate_id(chain_pem) else {
            return RenewalInfo::Unavailable("the leaf has no authority key identifier".into());
        };
        match self.account.renewal_info(&id).await {
            Ok((info, retry_after)) => RenewalInfo::Window {
                start: info.suggested_window.start.unix_timestamp(),
                end: info.suggested_window.end.unix_timestamp(),
                retry_after,
            },
            Err(instant_acme::Error::Unsupported(_)) => RenewalInfo::Unsupported,
            Err(e) => RenewalInfo::Unavailable(AcmeError::from_acme(e).to_string()),
        }
    }

    /// A nonce the CA refused (RFC 8555 §6.5: the client retries) fails the attempt only after
    /// instant-acme's own retries; the order is then resumed at once, twice at most, instead of
    /// costing a back-off.
    async fn order(
        &self,
        host: &str,
        pending: Option<PendingOrder>,
        replaces: Option<String>,
        progress: &mut (impl Progress + Send),
    ) -> Result<Obtained, Failed> {
        let mut pending = pending;
        let mut placed = false;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self
                .attempt(host, pending, replaces.clone(), progress)
                .await
            {
                Err(failed) if matches!(failed.error, AcmeError::BadNonce(_)) && attempt < 3 => {
                    tracing::info!(host, error = %failed.error, "the CA refused a nonce; resuming the order");
                    placed |= failed.placed;
                    pending = progress.pending();
                }
                Err(failed) => {
                    return Err(Failed {
                        placed: placed || failed.placed,
                        ..failed
                    })
                }
                Ok(obtained) => {
                    return Ok(Obtained {
                        placed: placed || obtained.placed,
                        ..obtained
                    })
                }
            }
        }
    }
}

impl AcmeSession {
    async fn attempt(
        &self,
        host: &str,
        pending: Option<PendingOrder>,
        replaces: Option<String>,
        progress: &mut (impl Progress + Send),
    ) -> Result<Obtained, Failed> {
        let (account, retry_after) = match self.source.account_recording().await {
            Ok(opened) => opened,
            Err(error) => {
                return Err(Failed {
                    error,
                    authorization_failed: false,
                    placed: false,
                    retry_after: None,
                })
            }
        };
        let ctx = order::Context {
            account: &account,
            retry_after: &retry_after,
            directory: &self.directory,
            provider: &self.provider,
            lookup: &self.lookup,
            profile: self.profile.as_deref(),
            replaces: replaces.as_deref().and_then(certificate_id),
        };
        order::obtain(&ctx, host, pending, progress).await
    }
}

/// The ARI identifier (authority key id and serial) of a chain's leaf.
fn certificate_id(chain_pem: &str) -> Option<CertificateIdentifier<'static>> {
    use rustls_pki_types::pem::PemObject;
    let leaf = rustls_pki_types::CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .next()?
        .ok()?;
    CertificateIdentifier::try_from(&leaf)
        .ok()
        .map(CertificateIdentifier::into_owned)
}
