//! The HTTPS client of the issuer: one stack (hyper over rustls) for the ACME CA and for a DNS
//! provider's API, so that both verify certificates the same way and both are bounded the same
//! way.
//!
//! - **Roots.** A provider's public API and a public CA are verified against the platform's roots
//!   (on Linux, the system's bundle, or the file `SSL_CERT_FILE` names); a private CA against
//!   `acme.ca_bundle` alone.
//! - **Bounds.** Every exchange has a deadline that covers connecting, the answer's headers and
//!   its whole body, and a body larger than [`MAX_BODY_BYTES`] is refused: a server that hangs or
//!   streams without end costs one failed request, never a stuck issuer.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use instant_acme::BodyWrapper;

/// The client: HTTPS only, HTTP/1.1 or HTTP/2.
pub type Https = HyperClient<HttpsConnector<HttpConnector>, BodyWrapper<Bytes>>;

/// An answer's body beyond this is refused. ACME objects and DNS API answers are a few KiB; a
/// certificate chain a few more.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// Connecting (TCP, before TLS) must succeed within this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("{}: {reason}", path.display())]
    Bundle {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("no complete answer within {} s", .0.as_secs())]
    TimedOut(Duration),
    #[error("the answer is larger than {} bytes", MAX_BODY_BYTES)]
    TooLarge,
    #[error("{0}")]
    Failed(String),
}

/// Whose certificates the client trusts.
#[derive(Debug, Clone, Copy)]
pub enum Roots<'a> {
    /// The platform's roots: the system's bundle, or `SSL_CERT_FILE` / `SSL_CERT_DIR`.
    Platform,
    /// Every certificate of this PEM file, and nothing else.
    Bundle(&'a Path),
}

/// Builds a client trusting `roots`.
pub fn client(roots: Roots<'_>) -> Result<Https, HttpError> {
    let builder = match roots {
        Roots::Bundle(path) => {
            use rustls_pki_types::pem::PemObject;
            use rustls_pki_types::CertificateDer;
            let fail = |reason: String| HttpError::Bundle {
                path: path.to_owned(),
                reason,
            };
            let mut store = rustls::RootCertStore::empty();
            for der in CertificateDer::pem_file_iter(path).map_err(|e| fail(e.to_string()))? {
                store
                    .add(der.map_err(|e| fail(e.to_string()))?)
                    .map_err(|e| fail(e.to_string()))?;
            }
            if store.is_empty() {
                return Err(fail("no PEM certificate in it".into()));
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| HttpError::Tls(e.to_string()))?
                .with_root_certificates(store)
                .with_no_client_auth();
            HttpsConnectorBuilder::new().with_tls_config(config)
        }
        Roots::Platform => HttpsConnectorBuilder::new()
            .try_with_platform_verifier()
            .map_err(|e| HttpError::Tls(e.to_string()))?,
    };
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let connector = builder
        .https_only()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Ok(HyperClient::builder(TokioExecutor::new()).build(connector))
}

/// Sends `request` and reads the whole answer within `deadline`, its body at most
/// [`MAX_BODY_BYTES`].
pub async fn exchange(
    client: &Https,
    request: Request<BodyWrapper<Bytes>>,
    deadline: Duration,
) -> Result<Response<Bytes>, HttpError> {
    let read = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| HttpError::Failed(chain(&e)))?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    HttpError::TooLarge
                } else {
                    HttpError::Failed(chain(e.as_ref()))
                }
            })?
            .to_bytes();
        Ok(Response::from_parts(parts, body))
    };
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or(Err(HttpError::TimedOut(deadline)))
}

/// An error and its sources, `: `-separated (hyper's own message is only "client error").
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let next = e.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = e.source();
    }
    text
}
