//! Reads that fit any buffer: what sozu's listings cost, and what a resync's read of sozu's state
//! costs the agent, with sozu's command buffer sized for the workspace and with sozu's default
//! (2,000,000 bytes, which a whole listing of 10,000 routes does not fit).
//!
//! - [`listings`]: each listing the agent's read may use, whole and filtered, timed from a client
//!   of sozu's socket against the agent's sozu, with its answer's size on the wire;
//! - [`resyncs`]: the agent serving `n` routes with a resync every 2 s, and each of its reads of
//!   sozu's state as its debug log times them.

use std::path::Path;
use std::time::{Duration, Instant};

use sozu_command_lib::channel::Channel;
use sozu_command_lib::proto::command::{
    request::RequestType, CountRequests, FrontendFilters, ListListeners, QueryCertificatesFilters,
    QueryClustersHashes, Request, Response, ResponseStatus,
};

use super::ours::{self, Ours};
use super::workload::Pair;

/// One connection to sozu's command socket, as a client of the bench.
pub struct Probe {
    channel: Channel<Request, Response>,
}

/// What one request cost: the time to its final answer and that answer's size on the wire
/// (sozu's 8-byte length prefix included), or why it failed.
pub struct Cost {
    pub took: Duration,
    pub bytes: usize,
    pub error: Option<String>,
}

impl Probe {
    pub fn connect(socket: &Path) -> Result<Probe, String> {
        let mut channel =
            Channel::<Request, Response>::from_path(&socket.to_string_lossy(), 4096, 1 << 30)
                .map_err(|e| format!("connect to {}: {e}", socket.display()))?;
        channel.blocking().map_err(|e| e.to_string())?;
        Ok(Probe { channel })
    }

    pub fn ask(&mut self, request: RequestType) -> Cost {
        use prost::Message;
        let started = Instant::now();
        let failed = |e: String| Cost {
            took: started.elapsed(),
            bytes: 0,
            error: Some(e),
        };
        if let Err(e) = self.channel.write_message(&Request::from(request)) {
            return failed(e.to_string());
        }
        loop {
            match self
                .channel
                .read_message_blocking_timeout(Some(Duration::from_secs(60)))
            {
                Ok(response) => match response.status() {
                    ResponseStatus::Processing => continue,
                    status => {
                        return Cost {
                            took: started.elapsed(),
                            bytes: response.encoded_len() + 8,
                            error: (status == ResponseStatus::Failure)
                                .then(|| response.message.clone()),
                        }
                    }
                },
                Err(e) => return failed(e.to_string()),
            }
        }
    }
}

fn frontends(http: bool, https: bool, tcp: bool, cluster: Option<String>) -> RequestType {
    RequestType::ListFrontends(FrontendFilters {
        http,
        https,
        tcp,
        domain: None,
        cluster_id: cluster,
    })
}

fn certificates(domain: Option<String>, fingerprint: Option<String>) -> RequestType {
    RequestType::QueryCertificatesFromTheState(QueryCertificatesFilters {
        domain,
        fingerprint,
    })
}

/// One listing's cost: the p50 of `samples` requests (each made by `request(i)`), the size of
/// the first answer, and how many such pieces a whole read needs.
pub struct Listing {
    pub name: &'static str,
    pub p50: Duration,
    pub bytes: usize,
    pub pieces: usize,
    pub error: Option<String>,
}

fn measure(
    probe: &mut Probe,
    name: &'static str,
    samples: usize,
    pieces: usize,
    request: impl Fn(usize) -> RequestType,
) -> Listing {
    let mut took = Vec::new();
    let (mut bytes, mut error) = (0, None);
    for i in 0..samples {
        let cost = probe.ask(request(i));
        if i == 0 {
            bytes = cost.bytes;
        }
        if cost.error.is_some() {
            error = cost.error;
            break;
        }
        took.push(cost.took);
    }
    took.sort();
    Listing {
        name,
        p50: took
            .get(took.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or_default(),
        bytes,
        pieces,
        error,
    }
}

pub fn host(i: usize) -> String {
    format!("s{i}.in.example.org")
}

fn cluster(i: usize) -> String {
    format!("pi-{}", host(i))
}

/// Each listing, whole and in pieces, against the sozu of `ours` (`n` routes, each host's
/// certificate in `pairs`).
pub fn listings(ours: &Ours, n: usize, pairs: &[Pair]) -> Result<Vec<Listing>, String> {
    let mut probe = Probe::connect(&ours.stack.socket())?;
    let (sample, slow) = (n.min(200), n.min(20));
    Ok(vec![
        measure(&mut probe, "request census (main process)", 5, 1, |_| {
            RequestType::CountRequests(CountRequests {})
        }),
        measure(&mut probe, "listeners", 5, 1, |_| {
            RequestType::ListListeners(ListListeners {})
        }),
        measure(&mut probe, "cluster hashes (main + workers)", 5, 1, |_| {
            RequestType::QueryClustersHashes(QueryClustersHashes {})
        }),
        measure(&mut probe, "frontends, whole", 5, 1, |_| {
            frontends(true, true, true, None)
        }),
        measure(&mut probe, "frontends, HTTP", 5, 1, |_| {
            frontends(true, false, false, None)
        }),
        measure(&mut probe, "frontends, HTTPS", 5, 1, |_| {
            frontends(false, true, false, None)
        }),
        measure(&mut probe, "frontends, TCP and UDP", 5, 1, |_| {
            frontends(false, false, true, None)
        }),
        measure(
            &mut probe,
            "frontends, one cluster (per piece)",
            sample,
            n,
            |i| frontends(true, true, false, Some(cluster(i))),
        ),
        measure(
            &mut probe,
            "certificates of the main state, whole",
            5,
            1,
            |_| certificates(None, None),
        ),
        measure(
            &mut probe,
            "certificates, one fingerprint (per piece)",
            sample,
            n,
            |i| certificates(None, Some(pairs[i].fingerprint.clone())),
        ),
        measure(
            &mut probe,
            "certificates, one domain (per piece)",
            slow,
            n,
            |i| certificates(Some(host(i)), None),
        ),
        measure(
            &mut probe,
            "certificates the workers serve, whole",
            5,
            1,
            |_| RequestType::QueryCertificatesFromWorkers(QueryCertificatesFilters::default()),
        ),
        measure(
            &mut probe,
            "one cluster by id, scattered (per piece)",
            sample,
            n,
            |i| RequestType::QueryClusterById(cluster(i)),
        ),
    ])
}

/// sozu and the agent `bin` (this build's when `None`) serving `hosts`, with a resync every 2 s
/// and its reads timed in its log; sozu with its default command buffer when `default_buffer`.
pub fn serve(
    bin: Option<&Path>,
    hosts: &[(String, &Pair)],
    backend: std::net::SocketAddr,
    default_buffer: bool,
) -> Result<Ours, String> {
    ours::serve_as(
        hosts,
        backend,
        &ours::Options {
            bin,
            log: "warn,private_ingress::reconcile::sync=debug,private_ingress::sozu::client=debug",
            args: &["--resync-interval", "2"],
            default_buffer,
            ..ours::Options::default()
        },
    )
}

/// What the resyncs of one agent read over a stretch of time.
pub struct Resyncs {
    /// Each read of sozu's state after the start's, in ms (the agent's log).
    pub reads: Vec<f64>,
    /// Resync passes begun over the same stretch.
    pub resyncs: u64,
    /// The error `/v1/state` showed last, if any.
    pub last_error: Option<String>,
    /// The agent's log lines about the listings it reads in pieces.
    pub pieces: Vec<String>,
}

/// Watches `ours` for `stretch` after it was ready.
pub fn resyncs(ours: &Ours, stretch: Duration) -> Resyncs {
    let counter = |ours: &Ours| {
        ours.stack
            .state()
            .and_then(|s| s["counters"]["resyncs"].as_u64())
            .unwrap_or(0)
    };
    let before_log = ours::split_lines(&ours.stack.agent_logs(), "sozu's state read").len();
    let before = counter(ours);
    std::thread::sleep(stretch);
    let log = ours.stack.agent_logs();
    let state = ours.stack.state();
    Resyncs {
        reads: ours::split_lines(&log, "sozu's state read")
            .into_iter()
            .skip(before_log)
            .collect(),
        resyncs: counter(ours).saturating_sub(before),
        last_error: state.and_then(|s| s["sozu"]["last_error"].as_str().map(str::to_owned)),
        pieces: log
            .lines()
            .filter(|l| l.contains("do not fit its command buffer"))
            .map(|l| l.rsplit_once("INFO ").map_or(l, |(_, m)| m).to_owned())
            .collect(),
    }
}

/// What `/metrics` scrapes cost one agent, plain and gzip: each scrape's wall time as a client
/// sees it, the agent's CPU per scrape (user + system, 10 ms ticks, averaged), and the body's
/// size. The agent resyncs every 2 s ([`serve`]), so some scrapes follow a change and some do
/// not, as with a Prometheus scraping it.
pub struct Scrapes {
    /// (plain, gzip): the wall time of each scrape.
    pub took: [Vec<Duration>; 2],
    /// (plain, gzip): the agent's CPU per scrape.
    pub cpu: [Duration; 2],
    /// (plain, gzip): the last body's size on the wire.
    pub bytes: [usize; 2],
}

/// `count` scrapes each way, one after the other, plain first.
pub fn scrapes(ours: &Ours, count: usize) -> Result<Scrapes, String> {
    let admin = ours.stack.admin;
    let pid = ours.stack.agent_pid().ok_or("the agent is not running")?;
    let scrape = |gzip: bool| -> Result<usize, String> {
        let mut request = ureq::get(&format!("http://{admin}/metrics"));
        if gzip {
            request = request.header("Accept-Encoding", "gzip");
        }
        request
            .call()
            .and_then(|mut r| r.body_mut().with_config().limit(u64::MAX).read_to_vec())
            .map(|b| b.len())
            .map_err(|e| e.to_string())
    };
    let mut out = Scrapes {
        took: [Vec::new(), Vec::new()],
        cpu: [Duration::ZERO; 2],
        bytes: [0; 2],
    };
    for (k, gzip) in [false, true].into_iter().enumerate() {
        let before = super::mass::cpu(pid);
        for _ in 0..count {
            let started = Instant::now();
            out.bytes[k] = scrape(gzip)?;
            out.took[k].push(started.elapsed());
        }
        out.cpu[k] = super::mass::cpu(pid).saturating_sub(before) / count.max(1) as u32;
    }
    Ok(out)
}
