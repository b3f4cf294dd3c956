//! Routes read from Traefik's dynamic configuration joined to the workspace's own.
//!
//! Pure. The Traefik source ([`crate::sources::traefik`]) reads the files and the endpoint and
//! translates them ([`super`]); [`merge`] makes of the workspace as evaluated and those routes
//! the one workspace everything downstream sees (the plan, DNS names, certificate hosts,
//! status, metrics, `render`). Each route goes through what the workspace's own go through:
//! the conversion the contract's fields get ([`Route::from_raw`]), and the checks `check` makes
//! across routes (a match taken twice, a port taken twice or by a listener). A router that
//! fails one is refused whole, with its origin; the workspace's own routes always win, so a
//! Traefik file can never take a route away from the workspace.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use serde_json::Value;

use super::{Carried, CertificatePair, Origin, Refused};
use crate::document::TraefikStatus;
use crate::workspace::{CertificateFiles, RawRoute, Route, RouteKind, TraefikLive, Workspace};

/// How a route from Traefik says where it comes from.
pub fn origin_label(origin: &Origin) -> String {
    format!("traefik: {origin}")
}

/// `own` (the workspace as evaluated) with `carried` (the routes translated from Traefik's
/// configuration) among its routes, and the routers refused on the way (each whole: a router
/// whose one frontend cannot be served serves none). `status` is the sources' own account,
/// to which the refusals are added. `admin_port`: the agent's admin server's, which no route
/// may take. `certificates` (the configuration's `tls.certificates`) join the workspace's own
/// `certificates` after them, so that a pair the workspace names wins over Traefik's for a host
/// both cover.
pub fn merge(
    own: &Workspace,
    carried: &[Carried],
    certificates: &[CertificatePair],
    mut refused: Vec<Refused>,
    mut status: TraefikStatus,
    admin_port: u16,
) -> Workspace {
    let mut out_refused: BTreeMap<Origin, String> = BTreeMap::new();
    for r in refused.drain(..) {
        out_refused.entry(r.origin).or_insert(r.reason);
    }
    // Each router's routes, converted as the workspace's own are.
    let mut converted: Vec<(Origin, Route)> = Vec::new();
    for c in carried {
        if out_refused.contains_key(&c.origin) {
            continue;
        }
        match convert(c) {
            Ok(route) => converted.push((c.origin.clone(), route)),
            Err(reason) => {
                out_refused.entry(c.origin.clone()).or_insert(reason);
            }
        }
    }
    let mut taken = Taken::of(own, admin_port);
    // Two passes: a router is checked with every frontend it has, and the checks of the
    // routers kept are taken in a second pass, so that a router refused for its second
    // frontend leaves nothing of its first behind.
    let mut by_router: BTreeMap<Origin, Vec<Route>> = BTreeMap::new();
    for (origin, route) in converted {
        if !out_refused.contains_key(&origin) {
            by_router.entry(origin).or_default().push(route);
        }
    }
    let mut added: Vec<Route> = Vec::new();
    let mut origins = BTreeMap::new();
    for (origin, routes) in by_router {
        let mut trial = taken.clone();
        let problem = routes.iter().find_map(|route| trial.take(route).err());
        match problem {
            Some(reason) => {
                out_refused.insert(origin, reason);
            }
            None => {
                taken = trial;
                for route in routes {
                    origins.insert(route.id.clone(), origin_label(&origin));
                    added.push(route);
                }
            }
        }
    }
    let mut workspace = own.clone();
    let (pairs, unusable) = certificate_files(certificates);
    for pair in pairs {
        if !workspace.certificates.contains(&pair) {
            workspace.certificates.push(pair);
        }
    }
    status.routes = added.len();
    status.refused = out_refused
        .iter()
        .map(|(origin, reason)| {
            Refused {
                origin: origin.clone(),
                reason: reason.clone(),
            }
            .to_string()
        })
        .chain(unusable)
        .collect();
    workspace.routes.extend(added);
    workspace
        .routes
        .sort_by_cached_key(|r| (r.host.clone(), r.place()));
    workspace.traefik_live = Some(Box::new(TraefikLive { origins, status }));
    workspace
}

/// The pairs `tls.certificates` names, as the workspace's `certificates`: a relative path is
/// the directory's of the file that names it (Traefik reads it from its working directory,
/// which a file beside the configuration does not depend on). One named by an endpoint's
/// answer must be absolute: the answer has no directory. Those are said, not served.
fn certificate_files(pairs: &[CertificatePair]) -> (Vec<CertificateFiles>, Vec<String>) {
    let mut files = Vec::new();
    let mut unusable = Vec::new();
    for pair in pairs {
        let from_file = !(pair.file.starts_with("http://") || pair.file.starts_with("https://"));
        let base = std::path::Path::new(&pair.file)
            .parent()
            .filter(|_| from_file);
        let anchor = |path: &str| -> Option<PathBuf> {
            let path = PathBuf::from(path);
            match base {
                _ if path.is_absolute() => Some(path),
                Some(dir) => Some(dir.join(path)),
                None => None,
            }
        };
        match (anchor(&pair.cert_file), anchor(&pair.key_file)) {
            (Some(cert_file), Some(key_file)) => files.push(CertificateFiles {
                cert_file,
                key_file,
            }),
            _ => unusable.push(format!(
                "{}{}: tls.certificates names a relative path ({}), which an endpoint's answer cannot anchor: give absolute paths",
                pair.file,
                pair.line.map(|l| format!(":{l}")).unwrap_or_default(),
                pair.cert_file,
            )),
        }
    }
    (files, unusable)
}

/// A translated route through the conversion the contract's routes take: the translation
/// writes the contract's field names, and its own working keys (`__priority`) are dropped.
fn convert(carried: &Carried) -> Result<Route, String> {
    let mut fields: serde_json::Map<String, Value> = carried
        .route
        .iter()
        .filter(|(k, _)| !k.starts_with("__"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    contract_defaults(&mut fields);
    let raw: RawRoute = serde_json::from_value(Value::Object(fields))
        .map_err(|e| format!("its route cannot be read as a workspace route: {e}"))?;
    Route::from_raw(raw).map_err(|e| e.to_string())
}

/// The defaults the contract gives a route's fields the translation leaves out (as it leaves
/// them out of the workspace text `import traefik` writes): a route's `path_prefix`, a health
/// check's mode and thresholds. Kept equal to the contract by a test.
fn contract_defaults(fields: &mut serde_json::Map<String, Value>) {
    fields
        .entry("path_prefix")
        .or_insert_with(|| Value::from("/"));
    if let Some(Value::Object(health)) = fields.get_mut("health") {
        for (key, value) in [
            ("mode", Value::from("http")),
            ("interval", Value::from(10)),
            ("timeout", Value::from(5)),
            ("healthy_threshold", Value::from(3)),
            ("unhealthy_threshold", Value::from(3)),
        ] {
            health.entry(key).or_insert(value);
        }
        if health.get("mode") == Some(&Value::from("http")) {
            health.entry("path").or_insert_with(|| Value::from("/"));
        }
    }
}

/// What the routes kept so far take: HTTP matches by route id (which is made of the host and
/// the whole match), and ports.
#[derive(Debug, Clone)]
struct Taken {
    ids: HashMap<String, String>,
    /// Port → its protocol and the hosts of the routes on it.
    ports: HashMap<u16, (&'static str, BTreeSet<String>)>,
    /// Ports of sozu's listeners and of the agent, what each is, and whether it is a
    /// listener's (which UDP routes may share).
    reserved: Vec<(u16, String, bool)>,
    /// Hosts that sozu terminates TLS for.
    terminated: BTreeSet<String>,
    /// `listeners.client_auth.mode = 'required`: a route of its own port would let in clients
    /// without a certificate (sozu checks them on the https listener only), which a workspace
    /// route must say it means (`client_auth_exempt`) and a Traefik router cannot.
    client_auth_required: bool,
    passed_through: BTreeSet<String>,
}

impl Taken {
    fn of(own: &Workspace, admin_port: u16) -> Taken {
        let reserved = vec![
            (
                own.listeners.https.port(),
                "the https listener's port".to_owned(),
                true,
            ),
            (
                own.listeners.http.port(),
                "the http listener's port".to_owned(),
                true,
            ),
            (
                own.traffic.listen.port(),
                "the access-log receiver's port (traffic.listen)".to_owned(),
                false,
            ),
            (
                admin_port,
                "the agent's admin port (--admin-address)".to_owned(),
                false,
            ),
        ];
        let mut taken = Taken {
            ids: HashMap::new(),
            ports: HashMap::new(),
            reserved,
            terminated: BTreeSet::new(),
            passed_through: BTreeSet::new(),
            client_auth_required: own.listener_policy.client_auth.mode
                == crate::workspace::ClientAuthMode::Required,
        };
        for route in &own.routes {
            taken.record(route, "the workspace");
        }
        taken
    }

    fn record(&mut self, route: &Route, by: &str) {
        self.ids
            .insert(route.id.clone(), format!("{by}'s route {}", route.place()));
        match route.listen_port() {
            None => {
                self.terminated.insert(route.host.clone());
            }
            Some(port) => {
                let entry = self
                    .ports
                    .entry(port)
                    .or_insert((route.protocol(), BTreeSet::new()));
                entry.1.insert(route.host.clone());
                if matches!(route.kind, RouteKind::TlsPassthrough(_)) {
                    self.passed_through.insert(route.host.clone());
                }
            }
        }
    }

    /// Takes what `route` needs, or says what stands in its way.
    fn take(&mut self, route: &Route) -> Result<(), String> {
        if let Some(owner) = self.ids.get(&route.id) {
            return Err(format!(
                "host `{}` {} is already served by {owner}",
                route.host,
                route.place()
            ));
        }
        if let Some(port) = route.listen_port() {
            if self.client_auth_required {
                return Err(format!(
                    "its '{} route on port {port} would be open without a client certificate: listeners.client_auth.mode is 'required, and sozu checks client certificates on the https listener only",
                    route.protocol()
                ));
            }
            let udp = route.protocol() == "udp";
            // As `check` has it: a listener's port is in the way of TCP routes, the agent's
            // own ports of every route.
            if let Some((_, what, _)) = self
                .reserved
                .iter()
                .find(|(p, _, listener)| *p == port && !(udp && *listener))
            {
                return Err(format!("listen_port {port} is {what}"));
            }
            if let Some((protocol, hosts)) = self.ports.get(&port) {
                let shared = *protocol == "tls_passthrough"
                    && route.protocol() == "tls_passthrough"
                    && !hosts.contains(&route.host);
                if !shared {
                    return Err(format!(
                        "listen_port {port} is taken by a '{protocol} route of {}",
                        hosts.iter().cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
            }
            if matches!(route.kind, RouteKind::TlsPassthrough(_))
                && self.terminated.contains(&route.host)
            {
                return Err(format!(
                    "host `{}` is both passed through and terminated (an 'https route of it)",
                    route.host
                ));
            }
        } else if self.passed_through.contains(&route.host) {
            return Err(format!(
                "host `{}` is both passed through and terminated (a 'tls_passthrough route of it)",
                route.host
            ));
        }
        self.record(route, "traefik");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::traefik::{translate_texts, EntryPoint, Options};
    use crate::workspace::{test_route, test_workspace, Upstream};

    fn translated(yaml: &str) -> crate::translate::traefik::Translation {
        let mut entry_points = crate::translate::traefik::default_entry_points();
        entry_points.insert("ssh".into(), EntryPoint::Port(8443));
        entry_points.insert("db".into(), EntryPoint::Port(5432));
        entry_points.insert("adm".into(), EntryPoint::Port(9180));
        translate_texts(
            &[("d/a.yaml".into(), yaml.into())],
            &Options {
                zone: "in.example.org".into(),
                entry_points,
                host: Some("tcp.in.example.org".into()),
            },
        )
    }

    /// `own` joined with all that `t` carries and refuses, with the admin port at 9180.
    fn joined(own: &Workspace, t: crate::translate::traefik::Translation) -> Workspace {
        merge(
            own,
            &t.routes,
            &t.certificates,
            t.refused,
            TraefikStatus::default(),
            9180,
        )
    }

    fn own() -> Workspace {
        test_workspace(
            std::path::Path::new("/tls"),
            vec![test_route(
                "app.in.example.org",
                Upstream::Unix {
                    path: "/run/own.sock".into(),
                },
            )],
        )
    }

    /// `tls.certificates` joins the workspace's `certificates` after its own pairs: a relative
    /// path read from the directory of the file that names it, an endpoint's relative one said
    /// and not served (its answer has no directory).
    #[test]
    fn tls_certificates_join_the_workspace_pairs_anchored_to_their_file() {
        let yaml =
            "tls:\n  certificates:\n    - certFile: certs/a.crt\n      keyFile: /abs/a.key\n";
        let t = translated(yaml);
        assert_eq!(t.certificates.len(), 1, "{t:?}");
        let mut own = own();
        own.certificates.push(CertificateFiles {
            cert_file: "/own/w.crt".into(),
            key_file: "/own/w.key".into(),
        });
        let ws = joined(&own, t);
        assert_eq!(
            ws.certificates,
            [
                CertificateFiles {
                    cert_file: "/own/w.crt".into(),
                    key_file: "/own/w.key".into(),
                },
                CertificateFiles {
                    cert_file: "d/certs/a.crt".into(),
                    key_file: "/abs/a.key".into(),
                },
            ]
        );
        let from_endpoint = [CertificatePair {
            file: "http://atlas:8080/v1/integrations/traefik/config".into(),
            line: Some(3),
            cert_file: "a.crt".into(),
            key_file: "a.key".into(),
        }];
        let ws = merge(
            &own,
            &[],
            &from_endpoint,
            Vec::new(),
            TraefikStatus::default(),
            9180,
        );
        assert_eq!(ws.certificates.len(), 1, "only the workspace's own");
        let refused = &ws.traefik_live.as_ref().expect("merged").status.refused;
        assert!(
            refused
                .iter()
                .any(|r| r.contains("config:3") && r.contains("relative path (a.crt)")),
            "{refused:?}"
        );
    }

    const TWO: &str = "http:\n  routers:\n    taken:\n      rule: Host(`app.in.example.org`)\n      service: s\n      tls: {}\n    free:\n      rule: Host(`other.in.example.org`) && PathPrefix(`/x`)\n      service: s\n      tls: {}\n  services:\n    s:\n      loadBalancer:\n        servers:\n          - url: \"unix:///run/s.sock\"\n";

    #[test]
    fn a_router_that_takes_a_workspace_route_is_refused_and_the_others_are_served() {
        let t = translated(TWO);
        assert_eq!(t.routes.len(), 2, "{t:?}");
        let ws = joined(&own(), t);
        let hosts: Vec<(&str, String)> = ws
            .routes
            .iter()
            .map(|r| (r.host.as_str(), r.upstreams_label()))
            .collect();
        assert_eq!(
            hosts,
            [
                ("app.in.example.org", "unix:///run/own.sock".to_owned()),
                ("other.in.example.org", "unix:///run/s.sock".to_owned())
            ],
            "the workspace's own route stays"
        );
        let live = ws.traefik_live.as_deref().unwrap();
        assert_eq!(live.status.routes, 1);
        assert_eq!(live.status.refused.len(), 1);
        let refused = &live.status.refused[0];
        assert!(
            refused.starts_with("d/a.yaml:3: http router `taken`: not served: host `app.in.example.org` / is already served by the workspace's route"),
            "{refused}"
        );
        let other = ws
            .routes
            .iter()
            .find(|r| r.host.starts_with("other"))
            .unwrap();
        assert_eq!(
            live.origins.get(&other.id).map(String::as_str),
            Some("traefik: d/a.yaml:7: http router `free`")
        );
    }

    #[test]
    fn a_router_is_refused_whole_when_one_of_its_frontends_collides() {
        let yaml = "http:\n  routers:\n    both:\n      rule: Host(`new.in.example.org`) || Host(`app.in.example.org`)\n      service: s\n      tls: {}\n  services:\n    s:\n      loadBalancer:\n        servers:\n          - url: \"unix:///run/s.sock\"\n";
        let t = translated(yaml);
        assert_eq!(t.routes.len(), 2, "{t:?}");
        let ws = joined(&own(), t);
        assert_eq!(ws.routes.len(), 1, "nothing of the router is served");
        assert!(ws.routes.iter().all(|r| r.host == "app.in.example.org"));
    }

    #[test]
    fn a_tcp_router_on_a_listeners_port_or_a_taken_port_is_refused() {
        let yaml = "tcp:\n  routers:\n    ssh:\n      entryPoints: [ssh]\n      rule: HostSNI(`*`)\n      service: s\n    db:\n      entryPoints: [db]\n      rule: HostSNI(`*`)\n      service: s\n    adm:\n      entryPoints: [adm]\n      rule: HostSNI(`*`)\n      service: s\n  services:\n    s:\n      loadBalancer:\n        servers:\n          - address: \"10.0.0.1:22\"\n";
        let t = translated(yaml);
        let ws = joined(&own(), t);
        let live = ws.traefik_live.as_deref().unwrap();
        let all = live.status.refused.join("\n");
        assert_eq!(live.status.refused.len(), 2, "{all}");
        assert!(
            all.contains(
                "tcp router `adm`: not served: listen_port 9180 is the agent's admin port"
            ),
            "{all}"
        );
        assert!(
            all.contains(
                "tcp router `ssh`: not served: listen_port 8443 is the https listener's port"
            ),
            "{all}"
        );
        let served: Vec<Option<u16>> = ws.routes.iter().map(Route::listen_port).collect();
        assert_eq!(served, [None, Some(5432)]);
    }

    /// As `check` refuses a workspace's route of its own port under required client
    /// certificates unless it says `client_auth_exempt`, which a Traefik router cannot say.
    #[test]
    fn a_tcp_router_is_refused_while_client_certificates_are_required() {
        let yaml = "tcp:\n  routers:\n    db:\n      entryPoints: [db]\n      rule: HostSNI(`*`)\n      service: s\n  services:\n    s:\n      loadBalancer:\n        servers:\n          - address: \"10.0.0.1:5432\"\n";
        let t = translated(yaml);
        let mut own = own();
        own.listener_policy.client_auth.mode = crate::workspace::ClientAuthMode::Required;
        let ws = joined(&own, t);
        assert_eq!(ws.routes.len(), 1);
        let refused = &ws.traefik_live.as_deref().unwrap().status.refused;
        assert!(
            refused[0].contains("tcp router `db`: not served: its 'tcp route on port 5432 would be open without a client certificate"),
            "{refused:?}"
        );
    }

    /// Orca's emitter output (a `PathPrefix` alone, its host from `tls.domains`, a unix socket,
    /// a health check) becomes the very route the contract makes of the same fields written in
    /// a workspace: the defaults filled here are the contract's.
    #[test]
    fn orcas_route_is_the_route_the_contract_makes_of_the_same_fields() {
        let orca = "http:\n  routers:\n    orca-web:\n      rule: PathPrefix(\"/web\")\n      service: orca-web\n      tls:\n        certResolver: orca\n        domains:\n          - main: \"cluster.in.example.org\"\n  services:\n    orca-web:\n      loadBalancer:\n        servers:\n          - url: \"unix:///run/orca/alloc-1/port-http.sock\"\n        healthCheck: { path: /healthz, interval: 5s, timeout: 1s }\n";
        let t = translated(orca);
        assert_eq!(t.routes.len(), 1, "{t:?}");
        let ws = joined(&own(), t.clone());
        let merged = ws
            .routes
            .iter()
            .find(|r| r.host == "cluster.in.example.org")
            .expect("served");
        let mut fields = t.routes[0].route.clone();
        fields.remove("__priority");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ws.json");
        let text = serde_json::json!({
            "zone": "in.example.org",
            "cluster_issuer": "internal-ca",
            "routes": [Value::Object(fields)],
        });
        std::fs::write(&path, text.to_string()).unwrap();
        let evaluated = crate::evaluate::contract::evaluate(&path).unwrap();
        assert_eq!(&evaluated.routes[0], merged);
        assert!(merged.health.is_some());
    }
}
