//! sozu's answers to its listings, in the planner's terms ([`crate::plan::state`]): listeners,
//! frontends, clusters and certificates as [`Actual`] holds them. Pure: the connection that asks
//! is [`super::client`]'s. A certificate answer's keys are dropped here, on receipt.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use sozu_command_lib::proto::command::{
    response_content::ContentType, CertificateAndKey, ClientAuthMode, ClusterInformations,
    ListedFrontends, ListenersList, ResponseContent, TlsVersion,
};

use super::request::{self, health_check_of, hsts_of};
use super::SozuError;
use crate::plan::state::{
    Actual, Address, Backend, ClientAuthState, ClusterState, Frontend, ListenerCertificates,
    ListenerSettings, Protocol, StreamFrontend,
};
use crate::workspace::Http2Offer;

/// Every listener of `list` into `actual`: its protocol and whether it is active, its settings,
/// its error pages and its HSTS.
pub(super) fn add_listeners(actual: &mut Actual, list: &ListenersList) {
    // What both kinds of listener report alike.
    let common = |interface: &Option<String>, expect_proxy, timeouts| ListenerSettings {
        interface: interface.clone(),
        expect_proxy,
        timeouts,
        ..ListenerSettings::default()
    };
    for l in list.http_listeners.values() {
        let address = l.address.into();
        actual.listeners.insert(address, (Protocol::Http, l.active));
        let timeouts = [
            l.front_timeout,
            l.back_timeout,
            l.connect_timeout,
            l.request_timeout,
        ];
        actual
            .listener_settings
            .insert(address, common(&l.interface, l.expect_proxy, timeouts));
        actual
            .listener_answers
            .insert(address, answers_of(&l.answers));
    }
    for l in list.https_listeners.values() {
        let address = l.address.into();
        actual
            .listeners
            .insert(address, (Protocol::Https, l.active));
        let timeouts = [
            l.front_timeout,
            l.back_timeout,
            l.connect_timeout,
            l.request_timeout,
        ];
        let client_auth = l
            .client_auth
            .filter(|&m| m != ClientAuthMode::ClientAuthNone as i32)
            .map(|m| ClientAuthState {
                required: m == ClientAuthMode::ClientAuthRequired as i32,
                cas: l.client_ca_certificates.clone(),
                crls: l.client_ca_crls.clone(),
            });
        actual.listener_settings.insert(
            address,
            ListenerSettings {
                tls13_only: l.versions == [TlsVersion::TlsV13 as i32],
                client_auth,
                http2: Http2Offer::of(&l.alpn_protocols, l.disable_http11.unwrap_or(false)),
                ..common(&l.interface, l.expect_proxy, timeouts)
            },
        );
        actual
            .listener_answers
            .insert(address, answers_of(&l.answers));
        if let Some(hsts) = l.hsts.as_ref().and_then(hsts_of) {
            actual.hsts.insert(l.address.into(), hsts);
        }
    }
    // The listeners of routes of their own port: what each reports, as
    // `ListenerSettings::for_protocol` says a listener of its kind holds.
    for l in list.tcp_listeners.values() {
        let address = l.address.into();
        actual.listeners.insert(address, (Protocol::Tcp, l.active));
        let timeouts = [l.front_timeout, l.back_timeout, l.connect_timeout, 0];
        actual
            .listener_settings
            .insert(address, common(&l.interface, l.expect_proxy, timeouts));
    }
    for l in list.udp_listeners.values() {
        let address = l.address.into();
        actual.listeners.insert(address, (Protocol::Udp, l.active));
        let timeouts = [l.front_timeout, l.back_timeout, 0, 0];
        actual.listener_settings.insert(
            address,
            ListenerSettings {
                max_datagram_size: l.max_rx_datagram_size,
                ..common(&l.interface, false, timeouts)
            },
        );
    }
}

/// The frontends of one listing into `actual` (listings may overlap: each is a set).
pub(super) fn add_frontends(actual: &mut Actual, list: ListedFrontends) -> Result<(), SozuError> {
    let http = list.http_frontends.into_iter().map(|f| (Protocol::Http, f));
    let https = list
        .https_frontends
        .into_iter()
        .map(|f| (Protocol::Https, f));
    for (protocol, f) in http.chain(https) {
        actual.frontends.insert(Arc::new(frontend_of(protocol, f)));
    }
    for f in list.tcp_frontends {
        actual.stream_frontends.insert(StreamFrontend {
            protocol: Protocol::Tcp,
            address: f.address.into(),
            sni: f.sni,
            cluster_id: f.cluster_id,
            tags: f.tags.into_iter().collect(),
        });
    }
    for f in list.udp_frontends {
        actual.stream_frontends.insert(StreamFrontend {
            protocol: Protocol::Udp,
            address: f.address.into(),
            sni: None,
            cluster_id: f.cluster_id,
            tags: f.tags.into_iter().collect(),
        });
    }
    Ok(())
}

/// A frontend as sozu lists it.
fn frontend_of(
    protocol: Protocol,
    f: sozu_command_lib::proto::command::RequestHttpFrontend,
) -> Frontend {
    let (hostname, alias) = Frontend::parse_sozu_hostname(&f.hostname);
    let policy = request::frontend_policy_of(&f);
    // A predicate this agent cannot read is kept as one it never sends (a `Present` test under
    // an empty name), so the frontend differs from every wanted one and is not taken for one.
    let header_predicates =
        request::header_predicates_of(f.header_predicates).unwrap_or_else(|| {
            vec![crate::plan::state::HeaderMatch {
                name: String::new(),
                test: crate::plan::state::HeaderTest::Present,
            }]
        });
    Frontend {
        protocol,
        address: f.address.into(),
        hostname,
        path: request::path_rule_of(f.path),
        method: f.method,
        header_predicates,
        cluster_id: f.cluster_id,
        tags: f.tags.into_iter().collect(),
        hsts: request::frontend_hsts_of(f.hsts.as_ref()),
        policy,
        alias,
    }
}

/// A listener's error pages as sozu lists them (an empty one is no page).
fn answers_of(answers: &BTreeMap<String, String>) -> BTreeMap<String, std::sync::Arc<str>> {
    answers
        .iter()
        .filter(|(_, page)| !page.is_empty())
        .map(|(status, page)| (status.clone(), std::sync::Arc::from(page.as_str())))
        .collect()
}

/// The certificates a state read found.
pub(super) enum HeldCertificates {
    /// The main state's, which does not say which listener holds which.
    Everywhere(ListenerCertificates),
    /// The workers', per listener.
    ByListener(BTreeMap<SocketAddr, ListenerCertificates>),
}

/// The certificates `held` into `actual`, for each of its HTTPS listeners.
pub(super) fn add_certificates(actual: &mut Actual, held: &HeldCertificates) {
    for (&address, &(protocol, _)) in &actual.listeners {
        if protocol == Protocol::Https {
            let on_listener = match held {
                // The main state does not say which listener holds which certificate; an
                // HTTPS listener per workspace makes that moot, and a request naming a
                // certificate the listener lacks is a no-op in sozu.
                HeldCertificates::Everywhere(all) => all.clone(),
                HeldCertificates::ByListener(by) => by.get(&address).cloned().unwrap_or_default(),
            };
            actual.certificates.insert(address, on_listener);
        }
    }
}

/// The certificate each name is served with, per HTTPS listener, from the workers' answers to
/// `QueryCertificatesFromWorkers` (a certificate one worker lacks still counts: the main state
/// has it).
pub(super) fn served_certificates(
    responses: BTreeMap<String, ResponseContent>,
) -> Result<BTreeMap<SocketAddr, ListenerCertificates>, SozuError> {
    let mut names: BTreeMap<SocketAddr, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for content in responses.into_values() {
        let Some(ContentType::CertificatesByAddress(list)) = content.content_type else {
            return Err(SozuError::unexpected("query certificates from workers"));
        };
        for by_address in list.certificates {
            let on = names.entry(by_address.address.into()).or_default();
            for summary in by_address.certificate_summaries {
                on.entry(summary.fingerprint)
                    .or_default()
                    .insert(summary.domain.to_ascii_lowercase());
            }
        }
    }
    Ok(names
        .into_iter()
        .map(|(address, by_fingerprint)| {
            let mut held = ListenerCertificates::default();
            for (fingerprint, names) in &by_fingerprint {
                held.insert(fingerprint.as_str(), names);
            }
            (address, held)
        })
        .collect())
}

/// One cluster as sozu's main process lists it: whether it exists, its backends, its health
/// check, its policy and its frontends.
pub(super) fn cluster_state_of(list: ClusterInformations) -> ClusterState {
    let mut read = ClusterState::default();
    for info in list.vec {
        read.exists |= info.configuration.is_some();
        let http = info.http_frontends.into_iter().map(|f| (Protocol::Http, f));
        let https = info
            .https_frontends
            .into_iter()
            .map(|f| (Protocol::Https, f));
        read.frontends
            .extend(http.chain(https).map(|(p, f)| Arc::new(frontend_of(p, f))));
        read.health_check = info
            .configuration
            .as_ref()
            .and_then(|c| c.health_check.as_ref())
            .map(health_check_of);
        read.policy = info
            .configuration
            .as_ref()
            .and_then(super::request::cluster_policy_of);
        for b in info.backends {
            let weight = b
                .load_balancing_parameters
                .map_or(1, |p| u32::try_from(p.weight.max(1)).unwrap_or(1));
            let backend = Backend {
                id: b.backend_id,
                address: match b.unix_path {
                    Some(path) => Address::Unix(PathBuf::from(path)),
                    None => Address::Ip(b.address.into()),
                },
                weight,
            };
            read.backends.insert(backend);
        }
    }
    read
}

pub(super) fn cert_names(cert: &CertificateAndKey) -> BTreeSet<String> {
    if !cert.names.is_empty() {
        return cert.names.iter().map(|n| n.to_ascii_lowercase()).collect();
    }
    crate::certs::names_of_pem(cert.certificate.as_bytes()).unwrap_or_default()
}
