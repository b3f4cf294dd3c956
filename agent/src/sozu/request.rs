//! A planned operation as the request sozu-command-lib sends. Pure.

use sozu_command_lib::config::ListenerBuilder;
use sozu_command_lib::proto::command::{
    request::RequestType, ActivateListener, AddBackend, AddCertificate, CertificateAndKey, Cluster,
    ListenerType, PathRule, RemoveBackend, RemoveCertificate, ReplaceCertificate,
    RequestHttpFrontend, RulePosition,
};

use super::SozuError;
use crate::plan::Op;
use crate::state::{Address, Backend, Certificate, Frontend, Protocol, UNIX_BACKEND_IDENTITY};

fn frontend_request(f: &Frontend) -> RequestHttpFrontend {
    RequestHttpFrontend {
        cluster_id: f.cluster_id.clone(),
        address: f.address.into(),
        hostname: f.hostname.clone(),
        path: PathRule::prefix(f.path_prefix.clone()),
        position: RulePosition::Tree as i32,
        tags: f
            .tags
            .iter()
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect(),
        ..Default::default()
    }
}

fn certificate_and_key(c: &Certificate) -> CertificateAndKey {
    CertificateAndKey {
        certificate: c.chain.first().cloned().unwrap_or_default(),
        certificate_chain: c.chain.iter().skip(1).cloned().collect(),
        key: c.key.expose().to_owned(),
        versions: vec![],
        names: c.names.iter().cloned().collect(),
    }
}

fn listener_type(protocol: Protocol) -> i32 {
    match protocol {
        Protocol::Http => ListenerType::Http as i32,
        Protocol::Https => ListenerType::Https as i32,
    }
}

/// The request for `op`. Only a listener can fail to build (sozu's own defaults refusing the
/// address); that is reported like a refusal, never sent as a default listener.
pub fn to_request(op: &Op) -> Result<RequestType, SozuError> {
    let refused = |e: sozu_command_lib::config::ConfigError| SozuError::Refused {
        request: op.describe(),
        message: e.to_string(),
    };
    Ok(match op {
        Op::AddListener { protocol, address } => {
            let mut builder = match protocol {
                Protocol::Http => ListenerBuilder::new_http((*address).into()),
                Protocol::Https => ListenerBuilder::new_https((*address).into()),
            };
            match protocol {
                Protocol::Http => {
                    RequestType::AddHttpListener(builder.to_http(None).map_err(refused)?)
                }
                Protocol::Https => {
                    RequestType::AddHttpsListener(builder.to_tls(None).map_err(refused)?)
                }
            }
        }
        Op::ActivateListener { protocol, address } => {
            RequestType::ActivateListener(ActivateListener {
                address: (*address).into(),
                proxy: listener_type(*protocol),
                from_scm: false,
                interface: None,
            })
        }
        Op::AddCluster { id } => RequestType::AddCluster(Cluster {
            cluster_id: id.clone(),
            sticky_session: false,
            https_redirect: true,
            ..Default::default()
        }),
        Op::AddBackend {
            cluster_id,
            backend,
        } => {
            let (address, unix_path) = socket_address(op, backend)?;
            RequestType::AddBackend(AddBackend {
                cluster_id: cluster_id.clone(),
                backend_id: backend.id.clone(),
                address: address.into(),
                unix_path,
                ..Default::default()
            })
        }
        Op::RemoveBackend {
            cluster_id,
            backend,
        } => RequestType::RemoveBackend(RemoveBackend {
            cluster_id: cluster_id.clone(),
            backend_id: backend.id.clone(),
            address: socket_address(op, backend)?.0.into(),
        }),
        Op::RemoveCluster { id } => RequestType::RemoveCluster(id.clone()),
        Op::AddFrontend(f) => match f.protocol {
            Protocol::Http => RequestType::AddHttpFrontend(frontend_request(f)),
            Protocol::Https => RequestType::AddHttpsFrontend(frontend_request(f)),
        },
        Op::RemoveFrontend(f) => match f.protocol {
            Protocol::Http => RequestType::RemoveHttpFrontend(frontend_request(f)),
            Protocol::Https => RequestType::RemoveHttpsFrontend(frontend_request(f)),
        },
        Op::AddCertificate {
            address,
            certificate,
        } => RequestType::AddCertificate(AddCertificate {
            address: (*address).into(),
            certificate: certificate_and_key(certificate),
            expired_at: None,
        }),
        Op::ReplaceCertificate {
            address,
            old_fingerprint,
            certificate,
        } => RequestType::ReplaceCertificate(ReplaceCertificate {
            address: (*address).into(),
            new_certificate: certificate_and_key(certificate),
            old_fingerprint: old_fingerprint.clone(),
            new_expired_at: None,
        }),
        Op::RemoveCertificate {
            address,
            fingerprint,
        } => RequestType::RemoveCertificate(RemoveCertificate {
            address: (*address).into(),
            fingerprint: fingerprint.clone(),
        }),
    })
}

/// The address sozu knows a backend by, and its socket path for a unix backend. A backend named
/// by DNS cannot be sent: the socket protocol carries addresses only (the agent resolves names).
fn socket_address(
    op: &Op,
    backend: &Backend,
) -> Result<(std::net::SocketAddr, Option<String>), SozuError> {
    match &backend.address {
        Address::Ip(address) => Ok((*address, None)),
        Address::Unix(path) => Ok((
            UNIX_BACKEND_IDENTITY,
            Some(path.to_string_lossy().into_owned()),
        )),
        Address::Name { .. } => Err(SozuError::Refused {
            request: op.describe(),
            message: "a backend named by DNS cannot be sent over the socket; resolve it first"
                .into(),
        }),
    }
}
