//! From what Nickel evaluated ([`super::RawWorkspace`]) to the validated model. The contract has
//! already checked every field; the conversion still refuses anything it cannot represent
//! instead of trusting that, because the contract file and this code can drift apart.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use ipnet::IpNet;

use super::matching::{path_captures, route_match};
use super::route_policy::{self, RawPolicy, RoutePolicy};
use super::*;

/// A value the contract let through but the model cannot represent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("listener `{field}`: `{value}` is not a socket address")]
    Listener { field: &'static str, value: String },
    #[error("route `{host}`: {reason}")]
    Route { host: String, reason: String },
    #[error("tls_dir `{0}` is not an absolute path")]
    TlsDir(String),
    #[error("lb_ip `{0}` is not an IP address clients can connect to")]
    LbIp(String),
    #[error("deploy.replicas {0} is not a whole number from 1 to 1000")]
    Replicas(String),
    #[error("deploy.{field} {value} is not a whole number of seconds from 0 to 3600")]
    Seconds { field: &'static str, value: String },
    #[error("deploy.extra_egress_ports: {0} is not a whole number from 1 to 65535")]
    EgressPort(String),
    #[error("allowed_sources: `{0}` is not a network in canonical CIDR form")]
    Cidr(String),
    #[error(
        "deploy.termination_grace_period_seconds {grace} must be longer than \
         deploy.pre_stop_seconds {pre_stop}"
    )]
    GracePeriod { grace: u32, pre_stop: u32 },
    #[error("acme.{field}: {reason}")]
    Acme { field: &'static str, reason: String },
    #[error("hsts: {0}")]
    Hsts(String),
    #[error("deploy.load_balancer: {0}")]
    LoadBalancer(String),
    #[error("traffic.{field}: `{value}` is not accepted")]
    Traffic { field: &'static str, value: String },
    #[error("listeners.{field}: {reason}")]
    ListenerPolicy { field: &'static str, reason: String },
    #[error("{0}")]
    Policy(String),
    #[error("traefik: {0}")]
    Traefik(String),
}

/// `listeners.*` beyond the addresses. The contract checked each; what it let through that the
/// model cannot hold is still refused here.
fn listener_policy(raw: &RawListeners) -> Result<ListenerPolicy, ModelError> {
    let fail = |field: &'static str, reason: String| ModelError::ListenerPolicy { field, reason };
    let min_tls_version = match raw.min_tls_version.as_str() {
        "1.2" => TlsVersion::V1_2,
        "1.3" => TlsVersion::V1_3,
        other => {
            return Err(fail(
                "min_tls_version",
                format!("unknown TLS version `{other}`"),
            ))
        }
    };
    let timeout = |field: &'static str, n: f64, max: f64| {
        whole(field, n, 1.0..=max).map_err(|reason| fail("timeouts", reason))
    };
    let timeouts = ListenerTimeouts {
        front: timeout("front", raw.timeouts.front, 86_400.0)?,
        back: timeout("back", raw.timeouts.back, 86_400.0)?,
        connect: timeout("connect", raw.timeouts.connect, 3_600.0)?,
        request: timeout("request", raw.timeouts.request, 3_600.0)?,
    };
    let absolute = |path: &str| {
        let path = PathBuf::from(path);
        if path.is_absolute() {
            Ok(path)
        } else {
            Err(fail(
                "client_auth",
                format!("`{}` is not an absolute path", path.display()),
            ))
        }
    };
    let auth = &raw.client_auth;
    let ca_file = auth.ca_file.as_deref().map(absolute).transpose()?;
    if auth.mode != ClientAuthMode::Off && ca_file.is_none() {
        return Err(fail(
            "client_auth",
            format!("mode {} needs ca_file", auth.mode),
        ));
    }
    let crl_files = auth
        .crl_files
        .iter()
        .map(|p| absolute(p))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(name) = &raw.interface {
        if name.is_empty()
            || name.len() > 15
            || name.contains(['/', ':'])
            || name.contains(char::is_whitespace)
        {
            return Err(fail(
                "interface",
                format!("`{name}` is not an interface name"),
            ));
        }
    }
    Ok(ListenerPolicy {
        interface: raw.interface.clone(),
        min_tls_version,
        expect_proxy: raw.expect_proxy,
        timeouts,
        client_auth: ClientAuth {
            mode: auth.mode,
            ca_file,
            crl_files,
        },
        http2: raw.http2,
    })
}

/// The contract checked the combination; a value it let through that the model cannot hold is
/// still refused here.
fn load_balancer(raw: RawLoadBalancer) -> Result<LoadBalancer, ModelError> {
    let fail = |reason: &str| ModelError::LoadBalancer(reason.to_owned());
    let port = |p: f64| match p {
        p if p.fract() == 0.0 && (1.0..=65535.0).contains(&p) => Ok(p as u16),
        p => Err(fail(&format!(
            "node port {p} is not a whole number from 1 to 65535"
        ))),
    };
    let node_ports = raw
        .node_ports
        .map(|p| {
            Ok::<_, ModelError>(NodePorts {
                https: port(p.https)?,
                http: port(p.http)?,
            })
        })
        .transpose()?;
    match raw.provider {
        LbProvider::Class if raw.class.is_none() => return Err(fail("'class needs `class`")),
        LbProvider::Class => {}
        _ if raw.class.is_some() => return Err(fail("`class` is read with 'class only")),
        _ => {}
    }
    if node_ports.is_some() && raw.provider != LbProvider::NodePort {
        return Err(fail("`node_ports` is read with 'node_port only"));
    }
    Ok(LoadBalancer {
        provider: raw.provider,
        class: raw.class,
        annotations: raw.annotations,
        node_ports,
    })
}

impl Workspace {
    pub fn from_raw(raw: RawWorkspace) -> Result<Workspace, ModelError> {
        let listener = |field: &'static str, value: &str| {
            value
                .parse::<SocketAddr>()
                .map_err(|_| ModelError::Listener {
                    field,
                    value: value.to_owned(),
                })
        };
        let listeners = Listeners {
            https: listener("https", &raw.listeners.https)?,
            http: listener("http", &raw.listeners.http)?,
        };
        let listener_policy = Box::new(listener_policy(&raw.listeners)?);
        let tls_dir = PathBuf::from(&raw.tls_dir);
        if !tls_dir.is_absolute() {
            return Err(ModelError::TlsDir(raw.tls_dir));
        }
        let mut routes = raw
            .routes
            .into_iter()
            .map(Route::from_raw)
            .collect::<Result<Vec<_>, _>>()?;
        // A host's HTTPS routes first (`/…` sorts before `tcp:…`), by path prefix.
        routes.sort_by_cached_key(|r| (r.host.clone(), r.place()));
        let lb_ip = raw
            .lb_ip
            .map(|ip| match ip.parse::<IpAddr>() {
                Ok(address) if !address.is_unspecified() => Ok(address),
                _ => Err(ModelError::LbIp(ip)),
            })
            .transpose()?;
        let replicas = match raw.deploy.replicas {
            n if n.fract() == 0.0 && (1.0..=1000.0).contains(&n) => n as u16,
            n => return Err(ModelError::Replicas(n.to_string())),
        };
        let seconds = |field: &'static str, n: f64| match n {
            n if n.fract() == 0.0 && (0.0..=3600.0).contains(&n) => Ok(n as u32),
            n => Err(ModelError::Seconds {
                field,
                value: n.to_string(),
            }),
        };
        let allowed_sources = raw
            .allowed_sources
            .map(|sources| {
                sources
                    .into_iter()
                    .map(|cidr| match cidr.parse::<IpNet>() {
                        Ok(net) if net.trunc() == net => Ok(net),
                        _ => Err(ModelError::Cidr(cidr)),
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        let deploy = Box::new(Deploy {
            namespace: raw.deploy.namespace,
            sozu_image: raw.deploy.sozu_image,
            agent_image: raw.deploy.agent_image,
            readiness: raw.deploy.readiness,
            load_balancer: load_balancer(raw.deploy.load_balancer)?,
            replicas,
            resources: raw.deploy.resources,
            service_monitor: raw.deploy.service_monitor,
            prometheus_rule: raw.deploy.prometheus_rule,
            grafana_dashboard: raw.deploy.grafana_dashboard,
            pre_stop_seconds: seconds("pre_stop_seconds", raw.deploy.pre_stop_seconds)?,
            termination_grace_period_seconds: seconds(
                "termination_grace_period_seconds",
                raw.deploy.termination_grace_period_seconds,
            )?,
            extra_egress_ports: raw
                .deploy
                .extra_egress_ports
                .into_iter()
                .map(|p| match p {
                    p if p.fract() == 0.0 && (1.0..=65535.0).contains(&p) => Ok(p as u16),
                    p => Err(ModelError::EgressPort(p.to_string())),
                })
                .collect::<Result<_, _>>()?,
            monitoring: raw.deploy.monitoring,
            cluster_dns: raw.deploy.cluster_dns,
        });
        if deploy.termination_grace_period_seconds <= deploy.pre_stop_seconds {
            return Err(ModelError::GracePeriod {
                grace: deploy.termination_grace_period_seconds,
                pre_stop: deploy.pre_stop_seconds,
            });
        }
        let acme = raw.acme.map(Acme::from_raw).transpose()?.map(Box::new);
        let hsts = match raw.hsts {
            None => None,
            Some(hsts) => hsts_from_raw(hsts).map_err(ModelError::Hsts)?,
        };
        let error_pages = route_policy::error_pages_from_raw(raw.error_pages, None)
            .map_err(ModelError::Policy)?;
        let traefik = raw
            .traefik
            .map(traefik::TraefikSettings::from_raw)
            .transpose()
            .map_err(ModelError::Traefik)?
            .map(Box::new);
        Ok(Workspace {
            traefik,
            traefik_live: None,
            headers: Box::new(route_policy::headers_from_raw(raw.headers)),
            error_pages,
            zone: raw.zone,
            listeners,
            listener_policy,
            tls_rotation: raw.tls_rotation,
            cluster_issuer: raw.cluster_issuer,
            tls_dir,
            routes,
            lb_ip,
            allowed_sources,
            deploy,
            acme,
            hsts,
            allow_special_upstream_addresses: raw.allow_special_upstream_addresses,
            traffic: Box::new(raw.traffic.map(traffic).transpose()?.unwrap_or_default()),
            certificates: raw
                .certificates
                .into_iter()
                .map(|pair| CertificateFiles {
                    cert_file: PathBuf::from(pair.cert_file),
                    key_file: PathBuf::from(pair.key_file),
                })
                .collect(),
        })
    }
}

/// `traffic`, checked again: a listen address with a port, senders that are addresses.
fn traffic(raw: RawTraffic) -> Result<Traffic, ModelError> {
    let fail = |field: &'static str, value: &str| ModelError::Traffic {
        field,
        value: value.to_owned(),
    };
    let listen = match raw.listen.parse::<SocketAddr>() {
        Ok(address) if address.port() != 0 => address,
        _ => return Err(fail("listen", &raw.listen)),
    };
    let senders = raw
        .senders
        .iter()
        .map(|s| match s.parse::<IpAddr>() {
            // A source is compared as IPv4 when it is an IPv4-mapped IPv6 address, so is a sender.
            Ok(ip) if !ip.is_unspecified() => Ok(ip.to_canonical()),
            _ => Err(fail("senders", s)),
        })
        .collect::<Result<_, _>>()?;
    let path = match raw.access_log.path {
        Some(path) if Path::new(&path).is_absolute() => Some(PathBuf::from(path)),
        Some(path) => return Err(fail("access_log.path", &path)),
        None => None,
    };
    Ok(Traffic {
        listen,
        senders,
        access_log: AccessLog {
            enabled: raw.access_log.enabled,
            path,
            query_string: raw.access_log.query_string,
        },
    })
}

/// A DNS server as the contract admits it: an IP address, with a port unless it is 53.
pub fn dns_server(s: &str) -> Option<SocketAddr> {
    s.parse::<SocketAddr>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)))
}

impl Acme {
    fn from_raw(raw: RawAcme) -> Result<Acme, ModelError> {
        let fail = |field: &'static str, reason: &str| ModelError::Acme {
            field,
            reason: reason.to_owned(),
        };
        let absolute = |field: &'static str, path: String| {
            let path = PathBuf::from(path);
            if path.is_absolute() {
                Ok(path)
            } else {
                Err(fail(field, "not an absolute path"))
            }
        };
        let d = raw.dns01;
        let dns01 = match d.provider {
            Dns01Provider::Rfc2136 => {
                let server = d.server.as_deref().unwrap_or_default();
                Dns01::Rfc2136 {
                    server: dns_server(server)
                        .ok_or_else(|| fail("dns01.server", "not a DNS server address"))?,
                    zone: d.zone.ok_or_else(|| fail("dns01.zone", "missing"))?,
                    tsig_key_name: d
                        .tsig_key_name
                        .ok_or_else(|| fail("dns01.tsig_key_name", "missing"))?,
                    tsig_algorithm: match d.tsig_algorithm.as_deref() {
                        None | Some("hmac-sha256") => TsigAlgorithm::HmacSha256,
                        Some("hmac-sha384") => TsigAlgorithm::HmacSha384,
                        Some("hmac-sha512") => TsigAlgorithm::HmacSha512,
                        Some(_) => return Err(fail("dns01.tsig_algorithm", "unsupported")),
                    },
                    tsig_secret_file: absolute(
                        "dns01.tsig_secret_file",
                        d.tsig_secret_file.unwrap_or_default(),
                    )?,
                }
            }
            Dns01Provider::Cloudflare => Dns01::Cloudflare {
                api_token_file: absolute(
                    "dns01.api_token_file",
                    d.api_token_file.unwrap_or_default(),
                )?,
            },
        };
        let nameservers = raw
            .propagation
            .nameservers
            .map(|servers| {
                servers
                    .iter()
                    .map(|s| {
                        dns_server(s).ok_or_else(|| {
                            fail("propagation.nameservers", "not a DNS server address")
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        let timeout = raw.propagation.timeout;
        if timeout.fract() != 0.0 || !(1.0..=3600.0).contains(&timeout) {
            return Err(fail(
                "propagation.timeout",
                "not a whole number of seconds from 1 to 3600",
            ));
        }
        Ok(Acme {
            directory: raw.directory,
            email: raw.email,
            profile: raw.profile,
            ca_bundle: raw
                .ca_bundle
                .map(|p| absolute("ca_bundle", p))
                .transpose()?,
            eab: raw.eab,
            dns01,
            propagation: Propagation {
                nameservers,
                timeout_secs: timeout as u64,
            },
            state_dir: absolute("state_dir", raw.state_dir)?,
        })
    }
}

impl Route {
    pub fn from_raw(raw: RawRoute) -> Result<Route, ModelError> {
        let fail = |reason: String| ModelError::Route {
            host: raw.host.clone(),
            reason,
        };
        let upstreams = match (&raw.upstream, &raw.upstreams) {
            (Some(upstream), None) => vec![RouteUpstream {
                upstream: upstream_from_raw(upstream, raw.port).map_err(fail)?,
                weight: 1,
                drain: raw.drain,
            }],
            (None, Some(list)) if !list.is_empty() => {
                if raw.port.is_some() {
                    return Err(fail("`port` goes inside each of `upstreams`".into()));
                }
                list.iter()
                    .map(|u| {
                        let weight = match u.weight {
                            None => 1,
                            // sozu's configuration file holds a weight in a byte.
                            Some(w) if w.fract() == 0.0 && (1.0..=255.0).contains(&w) => w as u32,
                            Some(w) => {
                                return Err(fail(format!(
                                    "weight {w} of upstream `{}` is not a whole number from 1 to \
                                     255 (drain an upstream with `drain = true`)",
                                    u.upstream
                                )))
                            }
                        };
                        Ok(RouteUpstream {
                            upstream: upstream_from_raw(&u.upstream, u.port).map_err(fail)?,
                            weight,
                            drain: u.drain || raw.drain,
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
            (None, Some(_)) => return Err(fail("`upstreams` is empty".into())),
            (Some(_), Some(_)) => {
                return Err(fail("give `upstream` or `upstreams`, not both".into()))
            }
            (None, None) if raw.redirect.is_some() => Vec::new(),
            (None, None) => return Err(fail("missing `upstream` (or `upstreams`)".into())),
        };
        let mut seen = std::collections::BTreeSet::new();
        for u in &upstreams {
            if !seen.insert(u.upstream.to_string()) {
                return Err(fail(format!("upstream `{}` is given twice", u.upstream)));
            }
        }
        if upstreams
            .iter()
            .filter(|u| matches!(u.upstream, Upstream::Unix { .. }))
            .count()
            > 1
        {
            return Err(fail("at most one `unix://` upstream per route".into()));
        }
        let (path, method, match_headers) = route_match(&raw).map_err(fail)?;
        let health = raw
            .health
            .map(health_from_raw)
            .transpose()
            .map_err(|e| fail(format!("health: {e}")))?;
        let hsts = match raw.hsts {
            None => None,
            Some(hsts) => Some(
                hsts_from_raw(hsts)
                    .map_err(|e| fail(format!("hsts: {e}")))?
                    .unwrap_or(Hsts::OFF),
            ),
        };
        if raw.strip_prefix && !matches!(path, PathMatch::Prefix(_)) {
            return Err(fail(format!(
                "`strip_prefix` needs a `path_prefix`, not `{}`",
                path.field()
            )));
        }
        let mut policy = RoutePolicy::from_raw(
            RawPolicy {
                redirect: raw.redirect,
                rewrite: raw.rewrite,
                strip_prefix: raw.strip_prefix,
                headers: raw.headers,
                basic_auth: raw.basic_auth,
                limits: raw.limits,
                error_pages: raw.error_pages,
            },
            &raw.host,
            &raw.path_prefix,
            None,
        )
        .map_err(fail)?;
        path_captures(&path, &policy).map_err(fail)?;
        if policy.redirect.is_some() && (raw.sticky.is_some() || raw.balancing.is_some()) {
            return Err(fail(
                "a route with `redirect` forwards nothing: it takes no `sticky` or `balancing`"
                    .into(),
            ));
        }
        if policy.redirect.is_some() && raw.upstream_protocol.is_some() {
            return Err(fail(
                "a route with `redirect` forwards nothing: it takes no `upstream_protocol`".into(),
            ));
        }
        if policy.redirect.is_some() && !upstreams.is_empty() {
            return Err(fail(
                "a route with `redirect` forwards nothing: it takes no upstream".into(),
            ));
        }
        let stream_name = match raw.protocol.unwrap_or(RawProtocol::Https) {
            RawProtocol::Https => {
                if raw.listen_port.is_some()
                    || raw.proxy_protocol.is_some()
                    || raw.max_datagram_size.is_some()
                    || raw.client_auth_exempt.is_some()
                {
                    return Err(fail(
                        "an 'https route takes no `listen_port`, `proxy_protocol`, \
                         `max_datagram_size` or `client_auth_exempt`"
                            .into(),
                    ));
                }
                let http = HttpRoute {
                    path,
                    method,
                    match_headers,
                    hsts,
                    policy: (!policy.is_empty()).then(|| Box::new(policy)),
                    upstream_protocol: raw.upstream_protocol.unwrap_or_default(),
                    sticky: raw.sticky.unwrap_or(false),
                };
                return Ok(Route {
                    id: http_route_id(&raw.host, &http),
                    host: raw.host,
                    upstreams,
                    health,
                    balancing: raw.balancing.unwrap_or_default(),
                    kind: RouteKind::Http(http),
                });
            }
            RawProtocol::Tcp => "tcp",
            RawProtocol::TlsPassthrough => "tls",
            RawProtocol::Udp => "udp",
        };
        // A route of its own port: forwarded as it is, so none of what sozu reads in HTTP but its
        // connection limits, which sozu applies to connections and flows alike (a refusal
        // carries no `Retry-After`: the contract refuses one here).
        let limits = policy.limits.take().map(|l| Limits {
            retry_after: 0,
            ..l
        });
        if !policy.is_empty()
            || hsts.is_some()
            || path != PathMatch::Prefix("/".into())
            || method.is_some()
            || !match_headers.is_empty()
            || raw.upstream_protocol.is_some()
            || raw.sticky.is_some()
        {
            return Err(fail(
                "a route of its own port takes no path field, method, match_headers, hsts, \
                 sticky or route policy"
                    .into(),
            ));
        }
        if upstreams
            .iter()
            .any(|u| matches!(u.upstream, Upstream::Unix { .. }))
        {
            return Err(fail(
                "a route of its own port needs an upstream address: sozu connects its backends \
                 by IP and port"
                    .into(),
            ));
        }
        let listen_port = match raw.listen_port {
            Some(p) if p.fract() == 0.0 && (1.0..=65535.0).contains(&p) => p as u16,
            Some(p) => {
                return Err(fail(format!(
                    "listen_port {p} is not a whole number from 1 to 65535"
                )))
            }
            None => return Err(fail("missing `listen_port`".into())),
        };
        let proxy_protocol = raw.proxy_protocol.unwrap_or(false);
        if raw.max_datagram_size.is_some() && raw.protocol != Some(RawProtocol::Udp) {
            return Err(fail("only a 'udp route takes `max_datagram_size`".into()));
        }
        let client_auth_exempt = raw.client_auth_exempt.unwrap_or(false);
        let kind = match raw.protocol {
            Some(RawProtocol::Tcp) => RouteKind::Tcp(StreamRoute {
                listen_port,
                proxy_protocol,
                limits,
                client_auth_exempt,
            }),
            Some(RawProtocol::TlsPassthrough) => RouteKind::TlsPassthrough(StreamRoute {
                listen_port,
                proxy_protocol,
                limits,
                client_auth_exempt,
            }),
            _ => {
                if raw.proxy_protocol.is_some() {
                    return Err(fail("a 'udp route takes no `proxy_protocol`".into()));
                }
                // sozu probes a UDP route's backends by a TCP connection (docs/contract.md,
                // "Kinds of routes"): there is no HTTP to ask them.
                if health.as_ref().is_some_and(|h| h.probe != Probe::Tcp) {
                    return Err(fail(
                        "a 'udp route's health check is a tcp one: give it `mode = 'tcp`".into(),
                    ));
                }
                let max_datagram_size = match raw.max_datagram_size {
                    None => None,
                    Some(n) if n.fract() == 0.0 && (512.0..=16_384.0).contains(&n) => {
                        Some(n as u32)
                    }
                    Some(n) => {
                        return Err(fail(format!(
                            "max_datagram_size {n} is not a whole number from 512 to 16384"
                        )))
                    }
                };
                RouteKind::Udp(UdpRoute {
                    listen_port,
                    limits,
                    max_datagram_size,
                    client_auth_exempt,
                })
            }
        };
        Ok(Route {
            id: port_route_id(&raw.host, stream_name, listen_port),
            host: raw.host,
            upstreams,
            health,
            balancing: raw.balancing.unwrap_or_default(),
            kind,
        })
    }
}

/// One upstream as written: a DNS name or an IP literal with a port, or a `unix://` path.
fn upstream_from_raw(upstream: &str, port: Option<f64>) -> Result<Upstream, String> {
    let port = match port {
        None => None,
        Some(p) if p.fract() == 0.0 && (1.0..=65535.0).contains(&p) => Some(p as u16),
        Some(p) => return Err(format!("port {p} is not a whole number from 1 to 65535")),
    };
    Ok(match (upstream.strip_prefix("unix://"), port) {
        (Some(path), None) if path.starts_with('/') => Upstream::Unix {
            path: PathBuf::from(path),
        },
        (Some(_), None) => return Err("a unix upstream needs an absolute path".into()),
        (Some(_), Some(_)) => return Err("a unix upstream takes no port".into()),
        (None, None) => return Err(format!("upstream `{upstream}` needs a port")),
        (None, Some(port)) => match upstream.parse::<IpAddr>() {
            Ok(ip) => Upstream::Ip {
                address: SocketAddr::new(ip, port),
            },
            Err(_) => Upstream::Dns {
                name: upstream.to_owned(),
                port,
            },
        },
    })
}

/// A whole number within `range`, or why not.
fn whole(field: &str, n: f64, range: std::ops::RangeInclusive<f64>) -> Result<u32, String> {
    if n.fract() == 0.0 && range.contains(&n) {
        Ok(n as u32)
    } else {
        Err(format!(
            "{field} {n} is not a whole number from {} to {}",
            range.start(),
            range.end()
        ))
    }
}

fn health_from_raw(raw: RawHealth) -> Result<HealthCheck, String> {
    let probe = match raw.mode {
        HealthMode::Http => {
            let path = raw.path.unwrap_or_else(|| "/".to_owned());
            if !path.starts_with('/') {
                return Err(format!("path `{path}` does not start with `/`"));
            }
            let accepted_statuses = raw
                .accepted_statuses
                .iter()
                .map(|s| {
                    let (start, end) = match s {
                        RawStatus::Code(code) => (*code, *code),
                        RawStatus::Range(range) => {
                            let parsed = range.split_once('-').and_then(|(a, b)| {
                                Some((a.trim().parse::<f64>().ok()?, b.trim().parse::<f64>().ok()?))
                            });
                            parsed.ok_or_else(|| {
                                format!("accepted status `{range}` is not a range like `200-399`")
                            })?
                        }
                    };
                    let start = whole("accepted status", start, 100.0..=599.0)?;
                    let end = whole("accepted status", end, 100.0..=599.0)?;
                    if start > end {
                        return Err(format!("accepted statuses {start}-{end} are backwards"));
                    }
                    Ok((start as u16, end as u16))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Probe::Http {
                path,
                accepted_statuses,
            }
        }
        HealthMode::Tcp => {
            if raw.path.is_some() || !raw.accepted_statuses.is_empty() {
                return Err("a tcp health check takes no `path` or `accepted_statuses`".into());
            }
            Probe::Tcp
        }
    };
    let interval = whole("interval", raw.interval, 1.0..=3600.0)?;
    let timeout = whole("timeout", raw.timeout, 1.0..=3600.0)?;
    if timeout > interval {
        return Err(format!(
            "timeout {timeout} is longer than interval {interval}"
        ));
    }
    Ok(HealthCheck {
        probe,
        interval,
        timeout,
        healthy_threshold: whole("healthy_threshold", raw.healthy_threshold, 1.0..=100.0)?,
        unhealthy_threshold: whole("unhealthy_threshold", raw.unhealthy_threshold, 1.0..=100.0)?,
        port: raw
            .port
            .map(|p| whole("port", p, 1.0..=65535.0).map(|p| p as u16))
            .transpose()?,
    })
}

/// A policy, or `None` for `false`. `true` is the default policy.
fn hsts_from_raw(raw: RawHsts) -> Result<Option<Hsts>, String> {
    match raw {
        RawHsts::Switch(false) => Ok(None),
        RawHsts::Switch(true) => Ok(recommended_hsts()),
        RawHsts::Policy(p) => Ok(Some(Hsts {
            enabled: true,
            max_age: whole("max_age", p.max_age, 0.0..=4_294_967_295.0)?,
            include_subdomains: p.include_subdomains,
            preload: p.preload,
        })),
    }
}
