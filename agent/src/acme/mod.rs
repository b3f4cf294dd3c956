//! `tls_rotation = 'sozu_managed`: the agent obtains and renews its certificates itself, from an
//! ACME CA over DNS-01, and writes each pair into `<tls_dir>/<host>/` the way cert-manager's CSI
//! driver does. Issuing and serving stay apart: the reconcile loop's watch → validate →
//! ReplaceCertificate path serves what the issuer writes, like any other pair.
//!
//! | module | owns | I/O |
//! |---|---|---|
//! | [`policy`] | renewal time (ARI window, or a fraction of the lifetime), back-off, rate limits | none |
//! | [`issuer`] | the loop: which host to order when, ARI polls, status | through the others |
//! | [`ca`] | the CA as the loop sees it: the account, renewal information, one order | through the others |
//! | [`order`] | one order: place or resume, DNS-01, finalise, validate | ACME, DNS |
//! | [`dns01`] | challenge names, CNAME delegation, propagation checks, the shared error | DNS |
//! | [`provider`] | which DNS provider publishes a TXT record | through the next |
//! | [`rfc2136`], [`cloudflare`] | publishing and removing a TXT record | DNS, HTTPS |
//! | [`client`] | the account, on the HTTP client under instant-acme | HTTPS |
//! | [`http`] | the one HTTPS client (roots, deadlines, body limits) of the CA and the DNS API | HTTPS |
//! | [`store`] | the state directory: lock, account, per-host records, atomic 0600 writes | files |
//! | [`tlsdir`] | writing a pair the AtomicWriter way | files |
//! | [`secret`] | reading secrets from files, never showing them | files |
//! | [`handle`] | where the issuer publishes its status ([`crate::document::IssuerStatus`]) | none |

pub mod ca;
pub mod client;
pub mod cloudflare;
pub mod dns01;
pub mod handle;
pub mod http;
pub mod issuer;
pub mod order;
pub mod provider;
pub mod renewal_policy;
pub mod rfc2136;
pub mod secret;
pub mod store;
pub mod tlsdir;

pub use handle::IssuerHandle;
pub use issuer::{run, Knobs, Options};

use std::path::PathBuf;

/// Why the issuer, or one of its orders, failed. Messages name files, hosts, servers and the
/// CA's own words; never a key, a secret or a token.
#[derive(Debug, thiserror::Error)]
pub enum AcmeError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Secret(#[from] secret::SecretError),
    #[error("acme.ca_bundle {}: {reason}", path.display())]
    CaBundle { path: PathBuf, reason: String },
    #[error("TLS setup for the ACME client: {0}")]
    Tls(String),
    #[error("the ACME CA cannot be reached: {0}")]
    Unreachable(String),
    #[error("the ACME CA refused the request for now (rate limit): {0}")]
    RateLimited(String),
    #[error("the ACME CA answered: {0}")]
    Ca(String),
    #[error("the ACME CA refused a request's nonce again after retries: {0}")]
    BadNonce(String),
    #[error("the ACME CA no longer knows the account: {0}")]
    AccountGone(String),
    #[error("the CA did not validate the DNS-01 challenge: {0}")]
    Validation(String),
    #[error("authorisation: {0}")]
    Authorization(String),
    #[error(transparent)]
    Dns01(#[from] dns01::Dns01Error),
    #[error("certificate key: {0}")]
    Key(String),
    #[error("the CA issued a certificate that fails validation: {0}")]
    Invalid(crate::certs::CertError),
    #[error(transparent)]
    Write(#[from] tlsdir::WriteError),
}

impl AcmeError {
    /// A short, stable name of the failure, for status and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            AcmeError::Store(_) => "state_dir",
            AcmeError::Secret(_) => "secret",
            AcmeError::CaBundle { .. } | AcmeError::Tls(_) => "tls_setup",
            AcmeError::Unreachable(_) => "ca_unreachable",
            AcmeError::RateLimited(_) => "rate_limited",
            AcmeError::Ca(_) => "ca_error",
            AcmeError::BadNonce(_) => "bad_nonce",
            AcmeError::AccountGone(_) => "account_unknown",
            AcmeError::Validation(_) => "validation",
            AcmeError::Authorization(_) => "authorization",
            AcmeError::Dns01(e) => e.reason(),
            AcmeError::Key(_) => "key",
            AcmeError::Invalid(_) => "invalid_certificate",
            AcmeError::Write(_) => "tls_dir",
        }
    }

    /// Sorts instant-acme's errors into what an operator acts on differently.
    pub fn from_acme(error: instant_acme::Error) -> AcmeError {
        match error {
            instant_acme::Error::Api(problem) => {
                let kind = problem.r#type.as_deref().unwrap_or_default();
                if kind.ends_with(":rateLimited") {
                    AcmeError::RateLimited(problem.to_string())
                } else if kind.ends_with(":badNonce") {
                    AcmeError::BadNonce(problem.to_string())
                } else if kind.ends_with(":accountDoesNotExist") {
                    AcmeError::AccountGone(problem.to_string())
                } else {
                    AcmeError::Ca(problem.to_string())
                }
            }
            instant_acme::Error::Hyper(e) => AcmeError::Unreachable(http::chain(&e)),
            instant_acme::Error::Other(e) => AcmeError::Unreachable(http::chain(e.as_ref())),
            instant_acme::Error::Timeout(_) => {
                AcmeError::Ca("timed out waiting for the order to change state".into())
            }
            other => AcmeError::Ca(http::chain(&other)),
        }
    }
}
