//! A planned operation as the request sozu-command-lib sends. Pure.

use sozu_command_lib::config::ListenerBuilder;
use sozu_command_lib::proto::command::{
    request::RequestType, ActivateListener, AddBackend, AddCertificate, AlpnProtocols,
    CertificateAndKey, ClientAuthMode, ClientAuthPolicy, CloseSessions, Cluster, Header,
    HeaderMatchKind, HeaderPosition, HeaderPredicate, HealthCheckConfig, HealthCheckMode,
    HstsConfig, HttpStatusRange, ListenerType, LoadBalancingParams, PathRule, PathRuleKind,
    RedirectPolicy, RedirectScheme as SozuRedirectScheme, RemoveBackend, RemoveCertificate,
    ReplaceCertificate, RequestHttpFrontend, RulePosition, SetHealthCheck, TlsVersion,
    UpdateHttpListenerConfig, UpdateHttpsListenerConfig,
};
use sozu_command_lib::proto::command::{
    DeactivateListener, LoadBalancingAlgorithms, ProxyProtocolConfig, RemoveListener,
    RequestTcpFrontend, RequestUdpFrontend, UpdateTcpListenerConfig, UpdateUdpListenerConfig,
};

use std::sync::Arc;

use super::SozuError;
use crate::plan::state::{
    Address, Backend, Certificate, ClientAuthState, ClusterPolicy, Frontend, FrontendPolicy,
    HeaderEdit, HeaderMatch, HeaderTest, HealthCheck, Hsts, ListenerSettings, PathKind, Probe,
    Protocol, StreamFrontend, UNIX_BACKEND_IDENTITY,
};
use crate::plan::Op;
use crate::workspace::{Balancing, Http2Offer, RedirectScheme};

/// A policy as sozu takes it. Off is `enabled = false`, which on a frontend suppresses the
/// listener's policy.
pub fn hsts_config(hsts: Option<&Hsts>) -> HstsConfig {
    match hsts {
        Some(h) if h.enabled => HstsConfig {
            enabled: Some(true),
            max_age: Some(h.max_age),
            include_subdomains: Some(h.include_subdomains),
            preload: Some(h.preload),
            force_replace_backend: None,
        },
        _ => HstsConfig {
            enabled: Some(false),
            ..Default::default()
        },
    }
}

/// A policy as sozu reports it; `None` when it is off.
pub fn hsts_of(config: &HstsConfig) -> Option<Hsts> {
    if config.enabled != Some(true) {
        return None;
    }
    Some(Hsts {
        enabled: true,
        max_age: config.max_age.unwrap_or(31_536_000),
        include_subdomains: config.include_subdomains.unwrap_or(false),
        preload: config.preload.unwrap_or(false),
    })
}

/// A frontend's own policy as sozu reports it: off stays an override (`Hsts::OFF`).
pub fn frontend_hsts_of(config: Option<&HstsConfig>) -> Option<Hsts> {
    config.map(|c| hsts_of(c).unwrap_or(Hsts::OFF))
}

/// A health check as sozu takes it.
pub fn health_check_config(check: &HealthCheck) -> HealthCheckConfig {
    let (mode, uri, accepted) = match &check.probe {
        Probe::Http {
            path,
            accepted_statuses,
        } => (
            HealthCheckMode::Http,
            path.clone(),
            accepted_statuses
                .iter()
                .map(|&(start, end)| HttpStatusRange {
                    start: u32::from(start),
                    end: u32::from(end),
                })
                .collect(),
        ),
        Probe::Tcp => (HealthCheckMode::Tcp, "/".to_owned(), Vec::new()),
    };
    HealthCheckConfig {
        uri,
        interval: check.interval,
        timeout: check.timeout,
        healthy_threshold: check.healthy_threshold,
        unhealthy_threshold: check.unhealthy_threshold,
        expected_status: 0,
        mode: mode as i32,
        accepted_statuses: accepted,
        port: check.port.map(u32::from),
        headers: Vec::new(),
    }
}

/// A health check as sozu reports it.
pub fn health_check_of(config: &HealthCheckConfig) -> HealthCheck {
    let probe = if config.mode == HealthCheckMode::Tcp as i32 {
        Probe::Tcp
    } else {
        let mut accepted_statuses: Vec<(u16, u16)> = config
            .accepted_statuses
            .iter()
            .map(|r| {
                (
                    u16::try_from(r.start).unwrap_or(u16::MAX),
                    u16::try_from(r.end).unwrap_or(u16::MAX),
                )
            })
            .collect();
        if accepted_statuses.is_empty() && config.expected_status != 0 {
            let code = u16::try_from(config.expected_status).unwrap_or(u16::MAX);
            accepted_statuses.push((code, code));
        }
        Probe::Http {
            path: config.uri.clone(),
            accepted_statuses,
        }
    };
    HealthCheck {
        probe,
        interval: config.interval,
        timeout: config.timeout,
        healthy_threshold: config.healthy_threshold,
        unhealthy_threshold: config.unhealthy_threshold,
        port: config.port.and_then(|p| u16::try_from(p).ok()),
    }
}

/// A redirect status as sozu's policy.
fn redirect_policy(status: u16) -> RedirectPolicy {
    match status {
        302 => RedirectPolicy::Found,
        308 => RedirectPolicy::PermanentRedirect,
        _ => RedirectPolicy::Permanent,
    }
}

fn redirect_scheme(scheme: RedirectScheme) -> SozuRedirectScheme {
    match scheme {
        RedirectScheme::Https => SozuRedirectScheme::UseHttps,
        RedirectScheme::Http => SozuRedirectScheme::UseHttp,
        RedirectScheme::Same => SozuRedirectScheme::UseSame,
    }
}

/// A frontend's policy as sozu lists it; `None` when it has none.
pub fn frontend_policy_of(f: &RequestHttpFrontend) -> Option<Arc<FrontendPolicy>> {
    let redirect = match f.redirect.and_then(|r| RedirectPolicy::try_from(r).ok()) {
        Some(RedirectPolicy::Permanent) => Some(301),
        Some(RedirectPolicy::Found) => Some(302),
        Some(RedirectPolicy::PermanentRedirect) => Some(308),
        _ => None,
    };
    let scheme = match f
        .redirect_scheme
        .and_then(|s| SozuRedirectScheme::try_from(s).ok())
    {
        Some(SozuRedirectScheme::UseHttps) => RedirectScheme::Https,
        Some(SozuRedirectScheme::UseHttp) => RedirectScheme::Http,
        _ => RedirectScheme::Same,
    };
    let policy = FrontendPolicy {
        redirect: redirect.map(|status| (status, scheme)),
        rewrite_host: f.rewrite_host.clone(),
        rewrite_path: f.rewrite_path.clone(),
        rewrite_port: f.rewrite_port.and_then(|p| u16::try_from(p).ok()),
        headers: f
            .headers
            .iter()
            .map(|h| HeaderEdit {
                response: h.position == HeaderPosition::Response as i32,
                name: h.key.clone(),
                value: h.val.clone(),
            })
            .collect(),
        required_auth: f.required_auth.unwrap_or(false),
    };
    (!policy.is_empty()).then(|| Arc::new(policy))
}

/// A frontend as sozu is sent it. Every field of [`Frontend`] and [`FrontendPolicy`] is named
/// here, and every field of sozu's request is written out: a field added to either side fails to
/// compile until it is sent (or said not to be). Its mirror, read back, is [`frontend_policy_of`]
/// and the listing's `frontend_of`.
fn frontend_request(f: &Frontend) -> RequestHttpFrontend {
    let Frontend {
        hostname: _,
        alias: _,
        protocol: _,
        address,
        path,
        method,
        header_predicates,
        cluster_id,
        tags,
        hsts,
        policy,
    } = f;
    let none = FrontendPolicy::default();
    let FrontendPolicy {
        redirect,
        rewrite_host,
        rewrite_path,
        rewrite_port,
        headers,
        required_auth,
    } = policy.as_deref().unwrap_or(&none);
    RequestHttpFrontend {
        cluster_id: cluster_id.clone(),
        address: (*address).into(),
        // The host, or its other spelling (`alias`).
        hostname: f.sozu_hostname(),
        path: path_rule(path),
        method: method.clone(),
        header_predicates: header_predicates.iter().map(header_predicate).collect(),
        position: RulePosition::Tree as i32,
        tags: tags
            .iter()
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect(),
        redirect: redirect.map(|(status, _)| redirect_policy(status) as i32),
        redirect_scheme: redirect.map(|(_, scheme)| redirect_scheme(scheme) as i32),
        // sozu's own redirect answer is used as it is.
        redirect_template: None,
        rewrite_host: rewrite_host.clone(),
        rewrite_path: rewrite_path.clone(),
        rewrite_port: rewrite_port.map(u32::from),
        required_auth: required_auth.then_some(true),
        headers: headers
            .iter()
            .map(|h| Header {
                position: if h.response {
                    HeaderPosition::Response
                } else {
                    HeaderPosition::Request
                } as i32,
                key: h.name.clone(),
                val: h.value.clone(),
            })
            .collect(),
        hsts: hsts.as_ref().map(|h| hsts_config(Some(h))),
    }
}

/// A path rule as sozu is sent it.
fn path_rule(path: &crate::plan::state::PathRule) -> PathRule {
    match path.kind {
        PathKind::Prefix => PathRule::prefix(path.value.clone()),
        PathKind::Regex => PathRule::regex(path.value.clone()),
        PathKind::Equals => PathRule::equals(path.value.clone()),
    }
}

/// A path rule as sozu holds it: an unknown kind (a newer sozu's) is read as a prefix, the
/// rule sozu itself falls back to.
pub fn path_rule_of(path: PathRule) -> crate::plan::state::PathRule {
    let kind = match PathRuleKind::try_from(path.kind) {
        Ok(PathRuleKind::Regex) => PathKind::Regex,
        Ok(PathRuleKind::Equals) => PathKind::Equals,
        Ok(PathRuleKind::Prefix) | Err(_) => PathKind::Prefix,
    };
    crate::plan::state::PathRule {
        kind,
        value: path.value,
    }
}

/// A header predicate as sozu is sent it.
fn header_predicate(h: &HeaderMatch) -> HeaderPredicate {
    let (kind, value) = match &h.test {
        HeaderTest::Exact(v) => (HeaderMatchKind::Exact, Some(v.clone())),
        HeaderTest::Regex(v) => (HeaderMatchKind::Regex, Some(v.clone())),
        HeaderTest::Present => (HeaderMatchKind::Present, None),
    };
    HeaderPredicate {
        name: h.name.clone(),
        kind: kind as i32,
        value,
    }
}

/// A frontend's header predicates as sozu holds them, in the order the agent keeps them (names
/// lowercase, sorted, each once); one of a kind this agent does not know makes the whole list
/// unknown to it (`None`), so the frontend differs from anything the agent wants.
pub fn header_predicates_of(list: Vec<HeaderPredicate>) -> Option<Vec<HeaderMatch>> {
    let mut matches = list
        .into_iter()
        .map(|p| {
            let test = match (HeaderMatchKind::try_from(p.kind).ok()?, p.value) {
                (HeaderMatchKind::Exact, Some(v)) => HeaderTest::Exact(v),
                (HeaderMatchKind::Regex, Some(v)) => HeaderTest::Regex(v),
                (HeaderMatchKind::Present, None) => HeaderTest::Present,
                _ => return None,
            };
            Some(HeaderMatch {
                name: p.name.to_ascii_lowercase(),
                test,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    matches.sort();
    matches.dedup();
    Some(matches)
}

/// A route's cluster: HTTP redirected to HTTPS, and its policy. Every field of
/// [`ClusterPolicy`] is named and every field of sozu's `Cluster` written out, as for a
/// frontend ([`frontend_request`]): a field added to either fails to compile until it is sent.
/// Its mirror, read back, is [`cluster_policy_of`].
pub fn cluster(id: &str, policy: Option<&ClusterPolicy>) -> Cluster {
    let none = ClusterPolicy::default();
    let ClusterPolicy {
        authorized_hashes,
        www_authenticate,
        max_connections_per_ip,
        max_connections_per_subnet,
        retry_after,
        answers,
        proxy_protocol,
        http2,
        sticky_session,
        load_balancing,
    } = policy.unwrap_or(&none);
    Cluster {
        cluster_id: id.to_owned(),
        sticky_session: *sticky_session,
        https_redirect: true,
        // sozu's own port for the redirect: the https listener's.
        https_redirect_port: None,
        proxy_protocol: proxy_protocol.then_some(ProxyProtocolConfig::SendHeader as i32),
        load_balancing: algorithm(*load_balancing) as i32,
        // sozu's own measure of load for `LeastLoaded` and `PowerOfTwo` (connections).
        load_metric: None,
        affinity_header: None,
        affinity_cookie: None,
        authorized_hashes: authorized_hashes.clone(),
        www_authenticate: www_authenticate.clone(),
        max_connections_per_ip: *max_connections_per_ip,
        max_connections_per_subnet: *max_connections_per_subnet,
        retry_after: *retry_after,
        // The pages, every one of them, are in `answers`.
        answer_503: None,
        answers: answers
            .iter()
            .map(|(status, page)| (status.clone(), page.to_string()))
            .collect(),
        // Absent rather than `false` for an HTTP/1.1 route, as sozu's own file loader sends it.
        http2: http2.then_some(true),
        // A route's health check goes by its own request (`SetHealthCheck`), which sozu
        // applies to a running cluster; a 'udp route's too (docs/contract.md).
        health_check: None,
        udp: None,
        // Every backend a candidate for every client; sozu's own number of connection attempts.
        shard_percent: None,
        shard_min_backends: None,
        shard_mode: None,
        max_connection_attempts: None,
    }
}

/// A cluster's policy as sozu holds it; `None` when it has none.
pub fn cluster_policy_of(c: &Cluster) -> Option<Arc<ClusterPolicy>> {
    let policy = ClusterPolicy {
        authorized_hashes: c.authorized_hashes.clone(),
        www_authenticate: c.www_authenticate.clone(),
        max_connections_per_ip: c.max_connections_per_ip,
        max_connections_per_subnet: c.max_connections_per_subnet,
        retry_after: c.retry_after,
        answers: c
            .answers
            .iter()
            .map(|(s, page)| (s.clone(), Arc::from(page.as_str())))
            .collect(),
        proxy_protocol: c.proxy_protocol == Some(ProxyProtocolConfig::SendHeader as i32),
        http2: c.http2 == Some(true),
        sticky_session: c.sticky_session,
        load_balancing: balancing_of(c.load_balancing),
    };
    (!policy.is_empty()).then(|| Arc::new(policy))
}

/// sozu's algorithm for a route's `balancing`.
fn algorithm(balancing: Balancing) -> LoadBalancingAlgorithms {
    match balancing {
        Balancing::RoundRobin => LoadBalancingAlgorithms::RoundRobin,
        Balancing::Random => LoadBalancingAlgorithms::Random,
        Balancing::LeastLoaded => LoadBalancingAlgorithms::LeastLoaded,
        Balancing::PowerOfTwo => LoadBalancingAlgorithms::PowerOfTwo,
        Balancing::Hrw => LoadBalancingAlgorithms::Hrw,
        Balancing::Maglev => LoadBalancingAlgorithms::Maglev,
    }
}

/// A cluster's algorithm as sozu holds it. A number this agent does not know reads as sozu's
/// default, round robin, as sozu itself reads it (`try_from(..).unwrap_or_default()`,
/// `Server::add_cluster`, lib/src/server.rs).
fn balancing_of(value: i32) -> Balancing {
    match LoadBalancingAlgorithms::try_from(value).unwrap_or_default() {
        LoadBalancingAlgorithms::RoundRobin => Balancing::RoundRobin,
        LoadBalancingAlgorithms::Random => Balancing::Random,
        LoadBalancingAlgorithms::LeastLoaded => Balancing::LeastLoaded,
        LoadBalancingAlgorithms::PowerOfTwo => Balancing::PowerOfTwo,
        LoadBalancingAlgorithms::Hrw => Balancing::Hrw,
        LoadBalancingAlgorithms::Maglev => Balancing::Maglev,
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
        Protocol::Tcp => ListenerType::Tcp as i32,
        Protocol::Udp => ListenerType::Udp as i32,
    }
}

/// An HTTP or HTTPS frontend's request, adding it or removing it. A frontend with header
/// predicates goes by verbs of its own (`add_https_frontend_with_header_predicates` and the
/// rest in sozu-command-lib 2.3.3's `command.proto`), which a worker too old to match headers
/// cannot decode: sozu-command-lib's constructors pick the verb.
fn http_frontend(op: &Op, f: &Frontend, add: bool) -> Result<RequestType, SozuError> {
    let request = frontend_request(f);
    Ok(match (f.protocol, add) {
        (Protocol::Http, true) => RequestType::add_http_frontend(request),
        (Protocol::Https, true) => RequestType::add_https_frontend(request),
        (Protocol::Http, false) => RequestType::remove_http_frontend(request),
        (Protocol::Https, false) => RequestType::remove_https_frontend(request),
        (Protocol::Tcp | Protocol::Udp, _) => return Err(not_for(op, f.protocol)),
    })
}

/// A TCP or UDP frontend's request, adding it or removing it.
fn stream_frontend(op: &Op, f: &StreamFrontend, add: bool) -> Result<RequestType, SozuError> {
    let tags = f
        .tags
        .iter()
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    Ok(match f.protocol {
        Protocol::Tcp => {
            let request = RequestTcpFrontend {
                cluster_id: f.cluster_id.clone(),
                address: f.address.into(),
                tags,
                sni: f.sni.clone(),
                alpn: Vec::new(),
            };
            if add {
                RequestType::AddTcpFrontend(request)
            } else {
                RequestType::RemoveTcpFrontend(request)
            }
        }
        Protocol::Udp => {
            let request = RequestUdpFrontend {
                cluster_id: f.cluster_id.clone(),
                address: f.address.into(),
                tags,
            };
            if add {
                RequestType::AddUdpFrontend(request)
            } else {
                RequestType::RemoveUdpFrontend(request)
            }
        }
        Protocol::Http | Protocol::Https => return Err(not_for(op, f.protocol)),
    })
}

/// A request the agent would never plan: a setting on a listener of the wrong protocol.
fn not_for(op: &Op, protocol: Protocol) -> SozuError {
    SozuError::Refused {
        request: op.describe(),
        message: format!("not a request for a {protocol} listener"),
    }
}

fn client_auth_mode(auth: &ClientAuthState) -> ClientAuthMode {
    if auth.required {
        ClientAuthMode::ClientAuthRequired
    } else {
        ClientAuthMode::ClientAuthOptional
    }
}

/// The ALPN protocols the HTTPS listener offers, as sozu takes them.
fn alpn(http2: Http2Offer) -> Vec<String> {
    http2.alpn().iter().map(|p| (*p).to_owned()).collect()
}

/// The settings sozu changes on a running listener.
fn patch_listener(
    protocol: Protocol,
    address: std::net::SocketAddr,
    settings: &ListenerSettings,
) -> RequestType {
    let [front, back, connect, request] = settings.timeouts;
    match protocol {
        Protocol::Tcp => RequestType::UpdateTcpListener(UpdateTcpListenerConfig {
            address: address.into(),
            expect_proxy: Some(settings.expect_proxy),
            front_timeout: Some(front),
            back_timeout: Some(back),
            connect_timeout: Some(connect),
            ..Default::default()
        }),
        Protocol::Udp => RequestType::UpdateUdpListener(UpdateUdpListenerConfig {
            address: address.into(),
            front_timeout: Some(front),
            back_timeout: Some(back),
            max_rx_datagram_size: Some(settings.max_datagram_size),
            ..Default::default()
        }),
        Protocol::Http => RequestType::UpdateHttpListener(UpdateHttpListenerConfig {
            address: address.into(),
            expect_proxy: Some(settings.expect_proxy),
            front_timeout: Some(front),
            back_timeout: Some(back),
            connect_timeout: Some(connect),
            request_timeout: Some(request),
            ..Default::default()
        }),
        Protocol::Https => RequestType::UpdateHttpsListener(UpdateHttpsListenerConfig {
            address: address.into(),
            expect_proxy: Some(settings.expect_proxy),
            front_timeout: Some(front),
            back_timeout: Some(back),
            connect_timeout: Some(connect),
            request_timeout: Some(request),
            // Both in one patch: sozu validates the result, and h2 alone with HTTP/1.1 still
            // allowed (or the reverse) is a state it would hold for no reason.
            alpn_protocols: Some(AlpnProtocols {
                values: alpn(settings.http2),
            }),
            disable_http11: Some(settings.http2 == Http2Offer::Only),
            ..Default::default()
        }),
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
        Op::AddListener {
            protocol,
            address,
            settings,
        } => {
            let client_auth = match (protocol, &settings.client_auth) {
                (Protocol::Https, Some(auth)) if auth.cas.is_empty() => {
                    // Never a listener without the client certificates the workspace asks for.
                    return Err(SozuError::Refused {
                        request: op.describe(),
                        message: "the device CA and CRLs of listeners.client_auth have not all \
                                  been read good yet: no https listener is made without them (see \
                                  each file's problem in sozu.client_auth)"
                            .into(),
                    });
                }
                (Protocol::Https, Some(auth)) => Some(auth),
                _ => None,
            };
            let mut builder = match protocol {
                Protocol::Http => ListenerBuilder::new_http((*address).into()),
                Protocol::Https => ListenerBuilder::new_https((*address).into()),
                Protocol::Tcp => ListenerBuilder::new_tcp((*address).into()),
                Protocol::Udp => ListenerBuilder::new_udp((*address).into()),
            };
            let [front, back, connect, request] = settings.timeouts;
            builder
                .with_interface(settings.interface.clone())
                .with_front_timeout(Some(front))
                .with_back_timeout(Some(back));
            if matches!(protocol, Protocol::Http | Protocol::Https | Protocol::Tcp) {
                builder
                    .with_expect_proxy(settings.expect_proxy)
                    .with_connect_timeout(Some(connect));
            }
            if matches!(protocol, Protocol::Http | Protocol::Https) {
                builder.with_request_timeout(Some(request));
            }
            if *protocol == Protocol::Https && settings.tls13_only {
                builder.with_tls_versions(vec![TlsVersion::TlsV13]);
            }
            match protocol {
                Protocol::Tcp => {
                    RequestType::AddTcpListener(builder.to_tcp(None).map_err(refused)?)
                }
                Protocol::Udp => {
                    let mut config = builder.to_udp(None).map_err(refused)?;
                    if settings.max_datagram_size > 0 {
                        config.max_rx_datagram_size = settings.max_datagram_size;
                    }
                    RequestType::AddUdpListener(config)
                }
                Protocol::Http => {
                    RequestType::AddHttpListener(builder.to_http(None).map_err(refused)?)
                }
                Protocol::Https => {
                    builder.with_alpn_protocols(Some(alpn(settings.http2)));
                    let mut config = builder.to_tls(None).map_err(refused)?;
                    config.disable_http11 = Some(settings.http2 == Http2Offer::Only);
                    match client_auth {
                        Some(auth) => {
                            config.client_auth = Some(client_auth_mode(auth) as i32);
                            config.client_ca_certificates = auth.cas.clone();
                            config.client_ca_crls = auth.crls.clone();
                            // Its own verb: a worker that cannot apply it refuses it, rather
                            // than make the listener without client authentication.
                            RequestType::AddHttpsListenerWithClientAuth(config)
                        }
                        None => RequestType::AddHttpsListener(config),
                    }
                }
            }
        }
        Op::ActivateListener {
            protocol,
            address,
            interface,
        } => RequestType::ActivateListener(ActivateListener {
            address: (*address).into(),
            proxy: listener_type(*protocol),
            from_scm: false,
            interface: interface.clone(),
        }),
        Op::PatchListener {
            protocol,
            address,
            settings,
        } => patch_listener(*protocol, *address, settings),
        Op::SetClientAuth {
            address,
            client_auth,
        } => RequestType::UpdateHttpsListenerWithClientAuth(UpdateHttpsListenerConfig {
            address: (*address).into(),
            client_auth_policy: Some(ClientAuthPolicy {
                client_auth: Some(match client_auth {
                    Some(auth) => client_auth_mode(auth) as i32,
                    None => ClientAuthMode::ClientAuthNone as i32,
                }),
                client_ca_certificates: client_auth
                    .as_ref()
                    .map(|a| a.cas.clone())
                    .unwrap_or_default(),
                client_ca_crls: client_auth
                    .as_ref()
                    .map(|a| a.crls.clone())
                    .unwrap_or_default(),
            }),
            ..Default::default()
        }),
        Op::SetListenerHsts { address, hsts } => {
            RequestType::UpdateHttpsListener(UpdateHttpsListenerConfig {
                address: (*address).into(),
                hsts: Some(hsts_config(hsts.as_ref())),
                ..Default::default()
            })
        }
        Op::SetHealthCheck { cluster_id, check } => RequestType::SetHealthCheck(SetHealthCheck {
            cluster_id: cluster_id.clone(),
            config: health_check_config(check),
        }),
        Op::RemoveHealthCheck { cluster_id } => RequestType::RemoveHealthCheck(cluster_id.clone()),
        Op::CloseSessions {
            cluster_id,
            backend,
        } => RequestType::CloseSessions(CloseSessions {
            cluster_id: cluster_id.clone(),
            backend_id: Some(backend.id.clone()),
            address: None,
        }),
        Op::AddCluster { id, policy } => RequestType::AddCluster(cluster(id, policy.as_deref())),
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
                load_balancing_parameters: Some(LoadBalancingParams {
                    weight: i32::try_from(backend.weight).unwrap_or(i32::MAX),
                }),
                sticky_id: Some(backend.sticky_id()),
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
        Op::AddFrontend(f) => http_frontend(op, f, true)?,
        Op::RemoveFrontend(f)
        | Op::SwapFrontend {
            frontend: f,
            add: false,
            ..
        } => http_frontend(op, f, false)?,
        Op::SwapFrontend {
            frontend: f,
            add: true,
            ..
        } => http_frontend(op, f, true)?,
        Op::AddStreamFrontend(f) => stream_frontend(op, f, true)?,
        Op::RemoveStreamFrontend(f) => stream_frontend(op, f, false)?,
        Op::DeactivateListener { protocol, address } => {
            RequestType::DeactivateListener(DeactivateListener {
                address: (*address).into(),
                proxy: listener_type(*protocol),
                to_scm: false,
                interface: None,
            })
        }
        Op::RemoveListener { protocol, address } => RequestType::RemoveListener(RemoveListener {
            address: (*address).into(),
            proxy: listener_type(*protocol),
            interface: None,
        }),
        Op::SetListenerAnswers {
            protocol,
            address,
            answers,
        } => {
            let answers = answers
                .iter()
                .map(|(status, page)| (status.clone(), page.to_string()))
                .collect();
            match protocol {
                Protocol::Https => RequestType::UpdateHttpsListener(UpdateHttpsListenerConfig {
                    address: (*address).into(),
                    answers,
                    ..Default::default()
                }),
                Protocol::Http => RequestType::UpdateHttpListener(UpdateHttpListenerConfig {
                    address: (*address).into(),
                    answers,
                    ..Default::default()
                }),
                Protocol::Tcp | Protocol::Udp => return Err(not_for(op, *protocol)),
            }
        }
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
            old_fingerprint: old_fingerprint.to_string(),
            new_expired_at: None,
        }),
        Op::RemoveCertificate {
            address,
            fingerprint,
        } => RequestType::RemoveCertificate(RemoveCertificate {
            address: (*address).into(),
            fingerprint: fingerprint.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What the agent sends on a cluster is what it reads back from sozu's listing, so a cluster
    /// whose stickiness or algorithm changed behind the agent's back differs from what it wants
    /// (drift), and one that did not, does not.
    #[test]
    fn stickiness_and_balancing_are_read_back_as_sent() {
        for (sticky_session, load_balancing) in [
            (true, Balancing::RoundRobin),
            (false, Balancing::LeastLoaded),
            (true, Balancing::PowerOfTwo),
            (false, Balancing::Random),
            (false, Balancing::Hrw),
            (true, Balancing::Maglev),
        ] {
            let policy = ClusterPolicy {
                sticky_session,
                load_balancing,
                ..ClusterPolicy::default()
            };
            let sent = cluster("pi-a", Some(&policy));
            assert_eq!(sent.sticky_session, sticky_session);
            assert_eq!(
                cluster_policy_of(&sent).as_deref(),
                Some(&policy),
                "{policy:?}"
            );
            let mut changed = sent.clone();
            changed.load_balancing = if load_balancing == Balancing::Random {
                LoadBalancingAlgorithms::RoundRobin as i32
            } else {
                LoadBalancingAlgorithms::Random as i32
            };
            assert_ne!(cluster_policy_of(&changed).as_deref(), Some(&policy));
        }
        // sozu's defaults read back as no policy at all, as before these fields.
        assert_eq!(cluster_policy_of(&cluster("pi-a", None)), None);
    }
}
