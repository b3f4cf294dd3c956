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
//! - **HTTP/1.1 only.** Over HTTP/2 every request to a server shares one connection, so one
//!   connection that stops moving fails every order in flight at once, each after its whole
//!   deadline and each with a backoff after it. That was seen once: ten orders against pebble
//!   (a Go server, which offers HTTP/2) on a busy machine, five of them timing out within the
//!   same 2 ms. Over HTTP/1.1 a stalled connection costs its own request. The issuer sends a few
//!   requests a minute, for which one connection each is nothing.

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

/// The client: HTTPS only, HTTP/1.1.
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
    let connector = builder.https_only().enable_http1().wrap_connector(http);
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// What the test server does with a request.
    #[derive(Clone, Copy)]
    pub(crate) enum Behaviour {
        /// Answers 200 with this JSON body.
        Answer(&'static str),
        /// Reads the request and never answers.
        Hang,
        /// Answers 200 and streams a body that never ends.
        Endless,
    }

    /// An HTTPS server on 127.0.0.1 with a certificate from a CA of its own. Returns its
    /// address and the CA's PEM.
    pub(crate) async fn tls_server(behaviour: Behaviour) -> (std::net::SocketAddr, String) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
        leaf.subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    match behaviour {
                        Behaviour::Answer(answer) => {
                            let response = format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                                answer.len()
                            );
                            let _ = tls.write_all(response.as_bytes()).await;
                            let _ = tls.shutdown().await;
                        }
                        Behaviour::Hang => std::future::pending::<()>().await,
                        Behaviour::Endless => {
                            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
                            if tls.write_all(head.as_bytes()).await.is_err() {
                                return;
                            }
                            let chunk = format!("4000\r\n{}\r\n", "x".repeat(0x4000));
                            while tls.write_all(chunk.as_bytes()).await.is_ok() {}
                        }
                    }
                });
            }
        });
        (address, ca_cert.pem())
    }

    async fn get(behaviour: Behaviour, deadline: Duration) -> Result<Response<Bytes>, HttpError> {
        let (address, ca) = tls_server(behaviour).await;
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("ca.pem");
        std::fs::write(&bundle, ca).unwrap();
        let client = client(Roots::Bundle(&bundle)).unwrap();
        let request = Request::get(format!("https://{address}/dir"))
            .body(BodyWrapper::<Bytes>::default())
            .unwrap();
        exchange(&client, request, deadline).await
    }

    /// A server that never answers costs one deadline; one that streams without end is cut at
    /// the body limit. Neither holds the caller.
    #[tokio::test]
    async fn a_hanging_or_endless_server_costs_one_bounded_request() {
        let started = std::time::Instant::now();
        let hung = get(Behaviour::Hang, Duration::from_secs(1)).await;
        assert_eq!(
            hung.unwrap_err(),
            HttpError::TimedOut(Duration::from_secs(1))
        );
        assert!(started.elapsed() < Duration::from_secs(30));
        let endless = get(Behaviour::Endless, Duration::from_secs(60)).await;
        assert_eq!(endless.unwrap_err(), HttpError::TooLarge);
        let fine = get(Behaviour::Answer("{}"), Duration::from_secs(10)).await;
        assert_eq!(fine.unwrap().body().as_ref(), b"{}");
    }
}
