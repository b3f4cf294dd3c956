//! The per-route counters made of sozu's records (`api::metrics::write_traffic` renders them).
//! Pure.
//!
//! Label values come from the workspace only: a record names a cluster, which is a route's id
//! or nothing the agent knows; either way the request lands in a series that exists because of
//! the workspace (the route's) or in the one fixed `unmatched` series. The method and the status
//! are bounded ([`super::record::method_label`], [`super::record::Record::status`]). So no
//! `Host` header, path or method a client invents can grow a series.
//!
//! Each route's counts sit behind their own lock: the receiver takes one per record, a scrape
//! one per route for as long as a copy takes, so a scrape never holds up the receiver for long.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::record::{end_label, method_label, AppProtocol, Record};
use crate::workspace::{Route, Upstream, Workspace};

/// The `route` and `host` label of requests that matched no route. Route ids start with `pi-`,
/// hosts hold a dot: neither can be this.
pub const UNMATCHED: &str = "unmatched";

/// Upper bounds of the duration histograms' buckets, in µs: they separate 5 ms, 50 ms, 250 ms,
/// 1 s and 5 s, with a bucket either side of each. `api::metrics` writes them as `le`.
pub const BUCKETS_US: [u64; 13] = [
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000,
];

/// The same bounds as Prometheus writes them (`le`).
pub const BUCKET_LABELS: [&str; 13] = [
    "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5",
    "10",
];

/// The bucket a duration falls in (the last one is `+Inf`).
pub fn bucket(us: u64) -> usize {
    BUCKETS_US.partition_point(|bound| *bound < us)
}

/// Counts per bucket (not cumulative), and the sum.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Histogram {
    pub counts: [u64; BUCKETS_US.len() + 1],
    pub sum_us: u64,
}

impl Histogram {
    pub fn observe(&mut self, us: u64) {
        self.counts[bucket(us)] += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }
}

/// One route's counts since the agent started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// By (method, status, protocol); status 0 where no response was sent. A WebSocket's
    /// upgrade is one (`101`, `http/1.1`); its end is not a request (see `websockets_closed`).
    pub requests: BTreeMap<(&'static str, u16, &'static str), u64>,
    /// Upgrades to a WebSocket: the 101s sozu sent, each when it sent it.
    pub websocket_upgrades: u64,
    /// WebSockets ended, by how ([`super::record::end_label`]). sozu writes a
    /// WebSocket's record when it ends: its bytes are counted then, and its duration (minutes,
    /// hours) is kept out of the request histograms, whose 10 s top bucket and latency alert are
    /// about requests.
    pub websockets_closed: BTreeMap<&'static str, u64>,
    pub duration: Histogram,
    pub backend: Histogram,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// By upstream as the workspace writes it, for routes with several; `other` for a backend
    /// the agent cannot tell (an address its names no longer resolve to).
    pub upstreams: BTreeMap<String, u64>,
    /// A TCP or TLS-passthrough route's connections: no request, so none of the HTTP figures.
    pub tcp: TcpCounts,
}

/// A TCP or TLS-passthrough route's connections, counted when each ends (sozu writes the record
/// then): how many ended and how, and their bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TcpCounts {
    /// By how each ended ([`super::record::end_label`]).
    pub closed: BTreeMap<&'static str, u64>,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// A route's labels and counts.
#[derive(Debug)]
pub struct RouteCounts {
    pub id: String,
    pub host: String,
    /// The route's upstreams as written, when it has several (else empty: no family).
    upstreams: Vec<Upstream>,
    /// `None` until the route's first record: most routes of a large workspace see little or no
    /// traffic, and a route's counts take some 400 bytes (10,000 routes: 4 MiB).
    counts: Mutex<Option<Box<Counts>>>,
}

impl RouteCounts {
    fn new(id: &str, host: &str) -> RouteCounts {
        RouteCounts {
            id: id.to_owned(),
            host: host.to_owned(),
            upstreams: Vec::new(),
            counts: Mutex::new(None),
        }
    }

    /// A copy of the counts.
    pub fn counts(&self) -> Counts {
        self.counts_if_any().unwrap_or_default()
    }

    /// A copy of the counts, `None` before the route's first record.
    fn counts_if_any(&self) -> Option<Counts> {
        self.held().as_deref().cloned()
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Option<Box<Counts>>> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts `record`; `resolve` gives the addresses an upstream name resolves to now.
    pub fn observe(&self, record: &Record, resolve: &dyn Fn(&str) -> Vec<std::net::IpAddr>) {
        let protocol = record.app_protocol();
        let end = || end_label(record.message());
        match protocol {
            AppProtocol::WebSocket => {
                let mut held = self.held();
                let counts = held.get_or_insert_with(Box::default);
                *counts.websockets_closed.entry(end()).or_default() += 1;
                counts.bytes_in = counts.bytes_in.saturating_add(record.bytes_in());
                counts.bytes_out = counts.bytes_out.saturating_add(record.bytes_out());
                return;
            }
            AppProtocol::Tcp => {
                let mut held = self.held();
                let tcp = &mut held.get_or_insert_with(Box::default).tcp;
                *tcp.closed.entry(end()).or_default() += 1;
                tcp.bytes_in = tcp.bytes_in.saturating_add(record.bytes_in());
                tcp.bytes_out = tcp.bytes_out.saturating_add(record.bytes_out());
                return;
            }
            AppProtocol::Http1 | AppProtocol::H2 => {}
        }
        let upstream = (!self.upstreams.is_empty()).then(|| self.upstream_of(record, resolve));
        let status = record.status().unwrap_or(0);
        let key = (method_label(record.method()), status, protocol.label());
        let mut held = self.held();
        let counts = held.get_or_insert_with(Box::default);
        *counts.requests.entry(key).or_default() += 1;
        if status == 101 {
            counts.websocket_upgrades += 1;
        }
        counts.duration.observe(record.duration_us());
        if let Some(us) = record.backend_us() {
            counts.backend.observe(us);
        }
        counts.bytes_in = counts.bytes_in.saturating_add(record.bytes_in());
        counts.bytes_out = counts.bytes_out.saturating_add(record.bytes_out());
        if let Some(Some(label)) = upstream {
            *counts.upstreams.entry(label).or_default() += 1;
        }
    }

    /// Which of the route's upstreams served `record`, from its backend id
    /// (`<route id>-<address>` or `<route id>-unix`, see `desired::backend_id`); `None` when no
    /// backend did (sozu answered itself).
    fn upstream_of(
        &self,
        record: &Record,
        resolve: &dyn Fn(&str) -> Vec<std::net::IpAddr>,
    ) -> Option<String> {
        let suffix = record
            .backend_id()?
            .strip_prefix(self.id.as_str())?
            .strip_prefix('-')?;
        let found = if suffix == "unix" {
            self.upstreams
                .iter()
                .find(|u| matches!(u, Upstream::Unix { .. }))
        } else {
            let address: std::net::SocketAddr = suffix.parse().ok()?;
            self.upstreams.iter().find(|u| match u {
                Upstream::Ip { address: a } => *a == address,
                Upstream::Dns { name, port } => {
                    *port == address.port() && resolve(name).contains(&address.ip())
                }
                Upstream::Unix { .. } => false,
            })
        };
        Some(found.map_or_else(|| "other".to_owned(), ToString::to_string))
    }
}

/// Every route's counts, by cluster id, and the unmatched ones.
#[derive(Debug)]
pub struct Table {
    routes: HashMap<String, Arc<RouteCounts>>,
    pub unmatched: Arc<RouteCounts>,
}

impl Default for Table {
    fn default() -> Table {
        Table {
            routes: HashMap::new(),
            unmatched: Arc::new(RouteCounts::new(UNMATCHED, UNMATCHED)),
        }
    }
}

impl Table {
    /// The table for `workspace`: the routes it keeps carry their counts on from `self` (an edit
    /// does not reset a counter), the routes it drops lose theirs.
    pub fn follow(&self, workspace: &Workspace) -> Table {
        let routes = workspace
            .routes
            .iter()
            .map(|route| (route.id.clone(), self.carried(route)))
            .collect();
        Table {
            routes,
            unmatched: self.unmatched.clone(),
        }
    }

    fn carried(&self, route: &Route) -> Arc<RouteCounts> {
        let upstreams: Vec<Upstream> = if route.upstreams.len() > 1 {
            route.upstreams.iter().map(|u| u.upstream.clone()).collect()
        } else {
            Vec::new()
        };
        match self.routes.get(&route.id) {
            Some(kept) if kept.host == route.host && kept.upstreams == upstreams => kept.clone(),
            kept => {
                let counts = kept.and_then(|k| k.counts_if_any()).map(|mut c| {
                    // An upstream no longer in the route has no series any more.
                    let labels: Vec<String> = upstreams.iter().map(ToString::to_string).collect();
                    c.upstreams
                        .retain(|label, _| label == "other" || labels.contains(label));
                    Box::new(c)
                });
                Arc::new(RouteCounts {
                    id: route.id.clone(),
                    host: route.host.clone(),
                    upstreams,
                    counts: Mutex::new(counts),
                })
            }
        }
    }

    /// Where a record is counted: its route's counts, or the unmatched ones.
    pub fn of(&self, record: &Record) -> &Arc<RouteCounts> {
        record
            .cluster_id()
            .and_then(|id| self.routes.get(id))
            .unwrap_or(&self.unmatched)
    }

    /// Whether `id` is one of the workspace's routes.
    pub fn contains(&self, id: &str) -> bool {
        self.routes.contains_key(id)
    }

    /// Every route with a copy of its counts, in the order of their ids, then the unmatched
    /// ones: what a scrape renders, each route's lock held only for its copy.
    pub fn snapshot(&self) -> Vec<(Arc<RouteCounts>, Counts)> {
        let mut all: Vec<_> = self.routes.values().cloned().collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all.push(self.unmatched.clone());
        all.into_iter()
            .map(|r| {
                let counts = r.counts();
                (r, counts)
            })
            .collect()
    }
}

/// The stream's own counters, as `/metrics` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamFigures {
    pub records: u64,
    pub malformed: u64,
    pub rejected: u64,
    pub lost: u64,
    pub access_log_dropped: u64,
    /// Unix seconds of the latest record.
    pub last_record: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::record::{decode, tests::record};
    use crate::workspace::{test_route, test_workspace};

    fn table() -> Table {
        let ws = test_workspace(
            std::path::Path::new("/tls"),
            vec![test_route(
                "a.in.example.org",
                Upstream::Ip {
                    address: "127.0.0.1:80".parse().unwrap(),
                },
            )],
        );
        Table::default().follow(&ws)
    }

    #[test]
    fn a_route_with_several_upstreams_counts_each_by_its_backends() {
        use crate::workspace::RouteUpstream;
        let mut route = test_route(
            "a.in.example.org",
            Upstream::Ip {
                address: "10.0.0.1:80".parse().unwrap(),
            },
        );
        route.upstreams.push(RouteUpstream {
            upstream: Upstream::Dns {
                name: "b.svc".into(),
                port: 80,
            },
            weight: 1,
            drain: false,
        });
        let table =
            Table::default().follow(&test_workspace(std::path::Path::new("/tls"), vec![route]));
        let resolve = |name: &str| {
            if name == "b.svc" {
                vec!["10.0.0.2".parse().unwrap()]
            } else {
                Vec::new()
            }
        };
        for backend in [
            Some("pi-a.in.example.org-10.0.0.1:80"),
            Some("pi-a.in.example.org-10.0.0.2:80"),
            Some("pi-a.in.example.org-10.0.0.2:80"),
            Some("pi-a.in.example.org-10.0.0.9:80"),
            None,
        ] {
            let mut r = decode(&record(Some("pi-a.in.example.org"), "GET", 200, 1)).unwrap();
            r.0.backend_id = backend.map(Into::into);
            table.of(&r).observe(&r, &resolve);
        }
        let upstreams = table
            .of(&decode(&record(Some("pi-a.in.example.org"), "GET", 200, 1)).unwrap())
            .counts()
            .upstreams;
        let expected = [("10.0.0.1:80", 1), ("b.svc:80", 2), ("other", 1)]
            .map(|(upstream, n)| (upstream.to_owned(), n));
        assert_eq!(upstreams, BTreeMap::from(expected));
    }

    #[test]
    fn a_tcp_connection_is_counted_as_one_not_as_a_request() {
        use crate::traffic::record::tests::tcp_record;
        let table = table();
        let id = "pi-a.in.example.org";
        for message in [None, None, Some("frontend socket timeout")] {
            let r = decode(&tcp_record(id, message)).unwrap();
            table.of(&r).observe(&r, &|_| Vec::new());
        }
        let counts = table.of(&decode(&tcp_record(id, None)).unwrap()).counts();
        assert!(counts.requests.is_empty(), "{counts:?}");
        assert_eq!(counts.duration, Histogram::default());
        assert_eq!((counts.bytes_in, counts.bytes_out), (0, 0));
        assert_eq!(
            counts.tcp.closed,
            BTreeMap::from([("closed", 2), ("idle_timeout", 1)])
        );
        assert_eq!((counts.tcp.bytes_in, counts.tcp.bytes_out), (900, 12_000));
    }

    #[test]
    fn bucket_bounds_are_inclusive_as_le_says() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1_000), 0);
        assert_eq!(bucket(1_001), 1);
        assert_eq!(bucket(10_000_000), 12);
        assert_eq!(bucket(10_000_001), 13);
    }

    #[test]
    fn an_edit_keeps_the_counts_of_the_routes_it_keeps() {
        let table = table();
        let r = decode(&record(Some("pi-a.in.example.org"), "GET", 200, 1)).unwrap();
        table.of(&r).observe(&r, &|_| Vec::new());
        let mut ws = test_workspace(std::path::Path::new("/tls"), Vec::new());
        ws.routes.push(test_route(
            "a.in.example.org",
            Upstream::Ip {
                address: "127.0.0.2:80".parse().unwrap(),
            },
        ));
        ws.routes.push(test_route(
            "b.in.example.org",
            Upstream::Ip {
                address: "127.0.0.2:80".parse().unwrap(),
            },
        ));
        let next = table.follow(&ws);
        assert_eq!(next.of(&r).counts().requests.values().sum::<u64>(), 1);
        let gone = test_workspace(std::path::Path::new("/tls"), Vec::new());
        let last = next.follow(&gone);
        assert!(Arc::ptr_eq(last.of(&r), &last.unmatched));
    }
}
