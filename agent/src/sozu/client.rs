//! One blocking connection to sozu's command socket: requests with a deadline, the state read
//! back, and bulk state files loaded.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sozu_command_lib::channel::Channel;
use sozu_command_lib::proto::command::{
    request::RequestType, response_content::ContentType, CountRequests, FrontendFilters,
    ListListeners, ListedFrontends, QueryCertificatesFilters, QueryClustersHashes, Request,
    Response, ResponseContent, ResponseStatus, Status,
};

use super::census::{self, Anchor, Part, Sent, Tally, Verdict};
use super::listing::{self, add_frontends, cert_names, HeldCertificates};
use super::request::to_request;
use super::state_file;
use super::SozuError;
use crate::plan::state::{Actual, ClusterState, ListenerCertificates};
use crate::plan::Op;
use crate::workspace::ID_PREFIX;

/// Buffer sizes for each connection. The buffers start at a page and grow on demand up to the
/// maximum (a state query for tens of thousands of routes fits). The agent keeps
/// `--sozu-connections` connections with two buffers each, and a buffer's pages stay resident once
/// written: at 32 connections, starting at 64 KiB cost about 2 MiB of resident memory at rest,
/// for requests that are a few KiB (a certificate with its chain and key).
const BUFFER_BYTES: u64 = 4 * 1024;
/// Only a bound: sozu's answers for the largest workspaces (every certificate with its chain and
/// key, about 8 KiB a route at most) must fit, as they must in sozu's own buffer
/// ([`crate::render::max_command_buffer_size`]).
const MAX_BUFFER_BYTES: u64 = 1 << 30;

/// What one reading connection read, and why it stopped early if it did.
type ReaderOutcome = (Vec<(String, u64, ClusterState)>, Option<SozuError>);

/// From this many clusters to read by id on, they are read over [`CLUSTER_READERS`] connections
/// of their own.
const PARALLEL_CLUSTER_READS_MIN: usize = 64;
const CLUSTER_READERS: usize = 8;

/// Why a connection closed while an answer was awaited. sozu's main process closes a connection
/// whose answer is larger than its `max_command_buffer_size`, and a listing of the whole state is
/// the answer that grows with the workspace: said, so that an operator whose sozu runs its own
/// configuration knows which setting to raise.
fn closed_reason(request: &str, error: &sozu_command_lib::channel::ChannelError) -> String {
    let reason = super::channel_reason(error);
    let listing = request.starts_with("List") || request.starts_with("Query");
    if listing && matches!(error, sozu_command_lib::channel::ChannelError::NoByteToRead) {
        format!(
            "{reason}; sozu closes the connection when its answer is larger than its \
             `max_command_buffer_size` (its log says `too large for back buffer capacity`): \
             the agent then reads the listing in pieces where sozu's filters allow"
        )
    } else {
        reason
    }
}

/// Which listings no longer fit sozu's command buffer in one answer, and are read in pieces.
/// sozu's main process closes a connection whose answer is larger than its
/// `max_command_buffer_size` (sozu-command-lib 2.3.3, `Channel::write_delimited_message`,
/// `MessageTooLarge`; default 2,000,000 bytes) and sends nothing, so a listing that does not fit
/// is found out once, by the closed connection, and read in pieces from then on. A listing is
/// tried whole first because each of sozu's filters scans its whole state again for every piece
/// (see [`SozuClient::read_state`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pieces {
    /// The main state's certificates, each with its chain and its key (about 0.9 KiB a route
    /// with a self-signed ECDSA certificate, 8 KiB with an RSA chain), are listed from the
    /// workers instead: the certificate each name is served with, without chain or key.
    pub served_certificates: bool,
    /// A protocol's frontends are listed one cluster at a time.
    pub frontends_by_cluster: bool,
}

/// Whether `error` is sozu closing the connection instead of answering: what it does with an
/// answer larger than its command buffer.
fn closed_before_answer(error: &SozuError) -> bool {
    matches!(error, SozuError::Closed { .. })
}

/// How long each part of a state read took (milliseconds), for its debug line.
#[derive(Default)]
struct ReadTimes {
    census: f64,
    certificates: f64,
    listeners: f64,
    frontends: f64,
    hashes: f64,
    clusters: f64,
    clusters_to_read: usize,
}

/// Milliseconds since `since`, which moves on to now.
fn lap(since: &mut Instant) -> f64 {
    let now = Instant::now();
    let ms = (now - *since).as_secs_f64() * 1e3;
    *since = now;
    ms
}

/// A blocking client for one sozu command socket.
pub struct SozuClient {
    path: PathBuf,
    timeout: Duration,
    peer: super::SozuPeer,
    channel: Option<Channel<Request, Response>>,
    /// What was last read of each owned cluster, with the hash sozu gave the cluster then.
    /// sozu's cluster hash covers the cluster (its health check included), its backends and its
    /// frontends, so an unchanged hash means an unchanged read: a resync of an unchanged sozu
    /// asks for no cluster by id.
    clusters_read: BTreeMap<String, (u64, ClusterState)>,
    /// The listings found too large for one answer (see [`Pieces`]): kept for the client's
    /// life, since trying a whole listing again would have sozu build it in vain at every read
    /// (about 65 ms for 10,000 certificates); a sozu restarted with a larger buffer is still
    /// read correctly, in pieces.
    pieces: Pieces,
    /// The agent's requests that change the parts a resync reads only when someone else may
    /// have changed them, counted by every connection to this sozu (see [`census`]).
    tally: Arc<Tally>,
    /// The census each part was last compared with, per [`Part`]: forgotten with the
    /// connection, since another connection may reach another sozu.
    anchors: [Option<Anchor>; census::PARTS],
}

/// How many times a census is asked for before the parts it could not tell are read: a census
/// is exact only when none of the agent's requests of a part was on its way meanwhile.
const CENSUS_TRIES: usize = 3;
/// How long a census waits for the agent's requests on their way to end before it is asked
/// for again.
const CENSUS_QUIET_WAIT: Duration = Duration::from_millis(200);

/// What a resync's read found, and which parts it did not read because only the agent changed
/// them since the last read (they are as the agent's shadow holds them).
#[derive(Debug, Clone, Default)]
pub struct StateRead {
    pub actual: Actual,
    /// The parts not read: [`Part::Clusters`], [`Part::Certificates`], [`Part::Frontends`].
    pub unread: Vec<Part>,
    /// Queries of this read that sozu's main process scattered to its workers (cluster
    /// hashes, clusters by id, served certificates).
    pub worker_queries: u64,
    /// Whether this read listed every frontend (1) or took them from the shadow (0).
    pub frontend_listings: u64,
}

impl SozuClient {
    pub fn new(path: &Path, timeout: Duration) -> SozuClient {
        SozuClient {
            path: path.to_owned(),
            timeout,
            peer: super::SozuPeer::default(),
            channel: None,
            clusters_read: BTreeMap::new(),
            pieces: Pieces::default(),
            tally: Arc::new(Tally::default()),
            anchors: [None; census::PARTS],
        }
    }

    /// Counts the requests this connection sends in `tally`, shared with the agent's other
    /// connections to the same sozu.
    pub fn with_tally(mut self, tally: Arc<Tally>) -> SozuClient {
        self.tally = tally;
        self
    }

    /// The count of requests shared by this connection.
    pub fn tally(&self) -> Arc<Tally> {
        self.tally.clone()
    }

    /// The listings this client reads in pieces.
    pub fn pieces(&self) -> Pieces {
        self.pieces
    }

    /// Talks to a sozu of `peer`'s user only.
    pub fn with_peer(mut self, peer: super::SozuPeer) -> SozuClient {
        self.peer = peer;
        self
    }

    pub fn is_connected(&self) -> bool {
        self.channel.is_some()
    }

    /// Connects if not connected. Returns true when this call opened a new connection.
    pub fn ensure_connected(&mut self) -> Result<bool, SozuError> {
        if self.channel.is_some() {
            return Ok(false);
        }
        let connect_error = |reason: String| SozuError::Connect {
            path: self.path.clone(),
            reason,
        };
        let path = self
            .path
            .to_str()
            .ok_or_else(|| connect_error("the socket path is not UTF-8".into()))?;
        let mut channel = Channel::from_path(path, BUFFER_BYTES, MAX_BUFFER_BYTES)
            .map_err(|e| connect_error(super::channel_reason(&e)))?;
        self.peer
            .check(std::os::fd::AsFd::as_fd(&channel.sock))
            .map_err(connect_error)?;
        channel
            .blocking()
            .map_err(|e| connect_error(super::channel_reason(&e)))?;
        self.channel = Some(channel);
        // A new connection may reach another sozu, whose census starts anew.
        self.anchors = [None; census::PARTS];
        Ok(true)
    }

    pub fn disconnect(&mut self) {
        self.channel = None;
        self.anchors = [None; census::PARTS];
    }

    /// Sends one request and waits for its final answer, within the deadline.
    fn request(&mut self, request: RequestType) -> Result<Option<ResponseContent>, SozuError> {
        self.request_within(request, self.timeout)
            .map(|r| r.content)
    }

    fn request_within(
        &mut self,
        request: RequestType,
        timeout: Duration,
    ) -> Result<Response, SozuError> {
        let name = request_name(&request);
        self.ensure_connected()?;
        let result = self.exchange(request, &name, timeout);
        if matches!(&result, Err(e) if !e.is_refusal()) {
            self.channel = None;
        }
        result
    }

    fn exchange(
        &mut self,
        request: RequestType,
        name: &str,
        timeout: Duration,
    ) -> Result<Response, SozuError> {
        let channel = self.channel.as_mut().ok_or_else(|| SozuError::Channel {
            request: name.to_owned(),
            reason: "not connected".into(),
        })?;
        channel
            .write_message(&Request::from(request))
            .map_err(|e| SozuError::Channel {
                request: name.to_owned(),
                reason: super::channel_reason(&e),
            })?;
        let deadline = Instant::now() + timeout;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(SozuError::Timeout {
                    request: name.to_owned(),
                    timeout,
                });
            }
            let response = channel
                .read_message_blocking_timeout(Some(remaining))
                .map_err(|e| {
                    if Instant::now() >= deadline {
                        SozuError::Timeout {
                            request: name.to_owned(),
                            timeout,
                        }
                    } else if matches!(e, sozu_command_lib::channel::ChannelError::NoByteToRead) {
                        SozuError::Closed {
                            request: name.to_owned(),
                            reason: closed_reason(name, &e),
                        }
                    } else {
                        SozuError::Channel {
                            request: name.to_owned(),
                            reason: closed_reason(name, &e),
                        }
                    }
                })?;
            match response.status() {
                ResponseStatus::Processing => continue,
                ResponseStatus::Ok => return Ok(response),
                ResponseStatus::Failure => {
                    return Err(SozuError::Refused {
                        request: name.to_owned(),
                        message: response.message,
                    })
                }
            }
        }
    }

    /// Counters of sozu's workers named `names`, per worker id (no cluster metrics: a small
    /// answer, far below the command buffer an unfiltered dump can overrun). Each worker counts
    /// from its own start.
    pub fn worker_counters(
        &mut self,
        names: &[&str],
    ) -> Result<BTreeMap<String, BTreeMap<String, i64>>, SozuError> {
        use sozu_command_lib::proto::command::{filtered_metrics::Inner, QueryMetricsOptions};
        let content = self.request(RequestType::QueryMetrics(QueryMetricsOptions {
            list: false,
            cluster_ids: Vec::new(),
            backend_ids: Vec::new(),
            metric_names: names.iter().map(|n| (*n).to_owned()).collect(),
            no_clusters: true,
            workers: true,
        }))?;
        let metrics = main_content(content, "query metrics", |c| match c {
            ContentType::Metrics(m) => Some(m),
            _ => None,
        })?;
        Ok(metrics
            .workers
            .into_iter()
            .map(|(id, worker)| {
                let counts = worker
                    .proxy
                    .into_iter()
                    .filter_map(|(name, value)| match value.inner {
                        Some(Inner::Count(n)) => Some((name, n)),
                        Some(Inner::Gauge(n)) => Some((name, i64::try_from(n).unwrap_or(i64::MAX))),
                        _ => None,
                    })
                    .collect();
                (id, counts)
            })
            .collect())
    }

    /// The PIDs of sozu's workers: a new set means sozu (or a worker) restarted.
    pub fn worker_pids(&mut self) -> Result<BTreeSet<i32>, SozuError> {
        match self.request(RequestType::Status(Status {}))? {
            Some(ResponseContent {
                content_type: Some(ContentType::Workers(workers)),
            }) => Ok(workers.vec.iter().map(|w| w.pid).collect()),
            _ => Err(SozuError::Unexpected {
                request: "status".into(),
            }),
        }
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A connection of its own to the same socket, held to the same peer: for a query that runs
    /// beside this connection's.
    pub(crate) fn sibling(&self) -> SozuClient {
        SozuClient::new(&self.path, self.timeout)
            .with_peer(self.peer)
            .with_tally(self.tally.clone())
    }

    /// Reads everything the planner compares against: listeners, clusters, frontends, the
    /// backends of the clusters the agent owns, and the certificates. What the agent's shadow
    /// is made of when it has none (a start, a new sozu).
    pub fn read_state(&mut self) -> Result<Actual, SozuError> {
        self.read(true).map(|read| read.actual)
    }

    /// A resync's read: the listeners, and the clusters, frontends and certificates only when
    /// sozu's census says someone else may have changed them ([`census`]); the rest is as the
    /// agent's shadow holds it ([`StateRead::unread`]).
    ///
    /// Each request is one piece that sozu's main process answers on its own: a rotation or an
    /// edit sent meanwhile on another connection waits behind one piece at most (sozu's main
    /// process answers one request at a time). An unchanged sozu is asked for its census and
    /// its listeners, two small answers from its main process: nothing reaches its workers,
    /// whose threads serve the handshakes, and its main process builds no listing of every
    /// frontend (at 10,000 routes, 17–20 ms of its one thread and 1.4 MB per protocol, which a
    /// rotation waited behind and new connections shared the machine's cores with).
    pub fn read_resync(&mut self) -> Result<StateRead, SozuError> {
        self.read(false)
    }

    /// sozu's census, and the agent's own count of each part at the same moment when it is
    /// exact (none of the agent's requests of the part on its way meanwhile). Asked for again,
    /// after the requests on their way ended, when it is not.
    #[allow(clippy::type_complexity)]
    fn census(
        &mut self,
    ) -> Result<([u64; census::PARTS], [Option<Sent>; census::PARTS]), SozuError> {
        let mut taken = ([0; census::PARTS], [None; census::PARTS]);
        for attempt in 0..CENSUS_TRIES {
            if attempt > 0 {
                self.tally.wait_quiet(CENSUS_QUIET_WAIT);
            }
            let before = self.tally.snapshot();
            let counts = match self.request(RequestType::CountRequests(CountRequests {}))? {
                Some(ResponseContent {
                    content_type: Some(ContentType::RequestCounts(counts)),
                }) => counts.map,
                _ => return Err(unexpected("count requests")),
            };
            let after = self.tally.snapshot();
            let exact = Part::ALL.map(|part| {
                let i = part.index();
                census::exact_at(before[i], after[i])
            });
            taken = (census::counted(&counts), exact);
            if exact.iter().all(Option::is_some) {
                break;
            }
        }
        Ok(taken)
    }

    /// Reads sozu's state, each part only if `everything` or the census says so.
    ///
    /// Every answer must fit sozu's `max_command_buffer_size` (default 2,000,000 bytes), whatever
    /// the workspace's size: a listing that did not is read in pieces from then on ([`Pieces`]).
    /// What each of sozu 2.3.3's filters costs decided the pieces (at 10,000 routes, measured
    /// from a client of sozu's socket by the `reads` bench):
    /// - frontends by protocol: the same scan as the whole listing, in answers of half its size
    ///   (1.37 MB and 17–20 ms each against 2.73 MB and 76 ms), so always by protocol; by
    ///   cluster id, a scan of every frontend per cluster (0.31 ms each, 3.1 s for all), so
    ///   only past the protocols' own limit; by domain, sozu matches any hostname that
    ///   *contains* the filter (`ConfigState::list_frontends`), which does not split the
    ///   frontends into pieces;
    /// - certificates by fingerprint: every certificate's fingerprint encoded again per query
    ///   (2.5 ms each, 25 s for all); by domain, every certificate parsed and put in a trie per
    ///   query (42 ms each, `certificates_serving_domain` in sozu's `requests.rs`). Neither
    ///   reads 10,000 certificates in time, and neither finds a certificate the agent does not
    ///   know of: the whole listing is read, and only when the census says someone else sent a
    ///   certificate request. The workers' listing names each host's served certificate without
    ///   its chain or key (0.9 MB a worker against 8.9 MB), so it replaces the main state's once
    ///   that does not fit. What it cannot show is a certificate served for no name: such a
    ///   certificate stays in sozu unseen until it is served.
    fn read(&mut self, everything: bool) -> Result<StateRead, SozuError> {
        let (mut times, mut since) = (ReadTimes::default(), Instant::now());
        let (counted, exact) = self.census()?;
        times.census = lap(&mut since);
        let mut read_part = Part::ALL.map(|part| {
            let i = part.index();
            everything || census::judge(self.anchors[i], counted[i], exact[i]) == Verdict::Read
        });
        // Frontends listed one cluster at a time need every cluster's id.
        read_part[Part::Clusters.index()] |=
            read_part[Part::Frontends.index()] && self.pieces.frontends_by_cluster;
        let mut read = StateRead::default();
        let actual = &mut read.actual;
        match self.request(RequestType::ListListeners(ListListeners {}))? {
            Some(ResponseContent {
                content_type: Some(ContentType::ListenersList(list)),
            }) => listing::add_listeners(actual, &list),
            _ => return Err(unexpected("list listeners")),
        }
        times.listeners = lap(&mut since);

        if read_part[Part::Clusters.index()] {
            read.worker_queries += self.clusters(actual, &mut times, &mut since)?;
        } else {
            read.unread.push(Part::Clusters);
        }

        if read_part[Part::Frontends.index()] {
            self.frontends(actual)?;
            read.frontend_listings = 1;
        } else {
            read.unread.push(Part::Frontends);
        }
        times.frontends = lap(&mut since);

        if read_part[Part::Certificates.index()] {
            let held = self.certificates()?;
            if matches!(held, HeldCertificates::ByListener(_)) {
                read.worker_queries += 1;
            }
            listing::add_certificates(actual, &held);
        } else {
            read.unread.push(Part::Certificates);
        }
        times.certificates = lap(&mut since);

        // The read is whole: each part's census is now what the next is compared with, where
        // it was exact (otherwise the last exact one stays, and the part is read again).
        for part in Part::ALL {
            let i = part.index();
            if let Some(sent) = exact[i] {
                self.anchors[i] = Some(Anchor {
                    counted: counted[i],
                    sent,
                });
            }
        }
        tracing::debug!(
            census_ms = times.census,
            listeners_ms = times.listeners,
            frontends_ms = times.frontends,
            hashes_ms = times.hashes,
            clusters_to_read = times.clusters_to_read,
            clusters_ms = times.clusters,
            certificates_ms = times.certificates,
            unread = ?read.unread,
            worker_queries = read.worker_queries,
            pieces = ?self.pieces,
            "sozu's state read, by listing"
        );
        Ok(read)
    }

    /// Every cluster's id, and the backends, health checks and policies of the agent's, into
    /// `actual`: the clusters' hashes from sozu's workers, then by id those whose hash
    /// changed since they were last read. How many queries went to the workers.
    fn clusters(
        &mut self,
        actual: &mut Actual,
        times: &mut ReadTimes,
        since: &mut Instant,
    ) -> Result<u64, SozuError> {
        let hashes = self.cluster_hashes()?;
        actual.clusters = hashes.keys().cloned().collect();
        times.hashes = lap(since);

        let mut read = std::mem::take(&mut self.clusters_read);
        read.retain(|id, (hash, _)| hashes.get(id) == Some(hash));
        let owned: Vec<(String, u64)> = hashes
            .into_iter()
            .filter(|(id, _)| id.starts_with(ID_PREFIX) && !read.contains_key(id))
            .collect();
        // Kept even if a query below fails: what it holds was read and is still current.
        self.clusters_read = read;
        times.clusters_to_read = owned.len();
        let queries = 1 + owned.len() as u64;
        self.read_clusters(owned)?;
        times.clusters = lap(since);
        // The frontends of a read cluster are kept for a targeted read only.
        for (_, cluster) in self.clusters_read.values_mut() {
            cluster.frontends = Vec::new();
        }
        for (id, (_, cluster)) in &self.clusters_read {
            actual.backends.insert(id.clone(), cluster.backends.clone());
            if let Some(check) = &cluster.health_check {
                actual.health_checks.insert(id.clone(), check.clone());
            }
            if let Some(policy) = &cluster.policy {
                actual.cluster_policies.insert(id.clone(), policy.clone());
            }
        }
        Ok(queries)
    }

    /// Every frontend into `actual`, one protocol at a time (one cluster at a time past what
    /// fits sozu's command buffer): each answer is a piece sozu's main process builds on its
    /// own, half the whole listing at most.
    fn frontends(&mut self, actual: &mut Actual) -> Result<(), SozuError> {
        // TCP and UDP frontends: one per route of its own port, each port a listener of its own.
        add_frontends(actual, self.list_frontends(false, false, true, None)?)?;
        for (http, https) in [(true, false), (false, true)] {
            if !self.pieces.frontends_by_cluster {
                match self.list_frontends(http, https, false, None) {
                    Ok(list) => {
                        add_frontends(actual, list)?;
                        continue;
                    }
                    Err(e) if closed_before_answer(&e) => {
                        tracing::info!(
                            "sozu's frontends of one protocol do not fit its command buffer in \
                             one answer: listed one cluster at a time from now on (a frontend \
                             that routes to no cluster is not seen)"
                        );
                        self.pieces.frontends_by_cluster = true;
                    }
                    Err(e) => return Err(e),
                }
            }
            let ids: Vec<String> = actual.clusters.iter().cloned().collect();
            for id in ids {
                add_frontends(actual, self.list_frontends(http, https, false, Some(id))?)?;
            }
        }
        Ok(())
    }

    fn list_frontends(
        &mut self,
        http: bool,
        https: bool,
        tcp: bool,
        cluster_id: Option<String>,
    ) -> Result<ListedFrontends, SozuError> {
        match self.request(RequestType::ListFrontends(FrontendFilters {
            http,
            https,
            tcp,
            domain: None,
            cluster_id,
        }))? {
            Some(ResponseContent {
                content_type: Some(ContentType::FrontendList(list)),
            }) => Ok(list),
            _ => Err(unexpected("list frontends")),
        }
    }

    /// The certificates sozu holds: the main state's, or once those do not fit one answer, the
    /// ones its workers serve (see [`Self::read_state`]).
    fn certificates(&mut self) -> Result<HeldCertificates, SozuError> {
        if !self.pieces.served_certificates {
            match self.certificate_summaries() {
                Ok(all) => return Ok(HeldCertificates::Everywhere(all)),
                Err(e) if closed_before_answer(&e) => {
                    tracing::info!(
                        "sozu's certificates with their chains and keys do not fit its command \
                         buffer in one answer: the certificates its workers serve are listed \
                         from now on"
                    );
                    self.pieces.served_certificates = true;
                }
                Err(e) => return Err(e),
            }
        }
        self.served_certificates().map(HeldCertificates::ByListener)
    }

    /// The main state's certificates, by fingerprint, with the names each covers.
    fn certificate_summaries(&mut self) -> Result<ListenerCertificates, SozuError> {
        let certificates = self.request(RequestType::QueryCertificatesFromTheState(
            QueryCertificatesFilters::default(),
        ))?;
        match certificates {
            Some(ResponseContent {
                content_type: Some(ContentType::CertificatesWithFingerprints(found)),
            }) => {
                let mut held = ListenerCertificates::default();
                // The keys are dropped here, with the rest of the response.
                for (fingerprint, cert) in &found.certs {
                    held.insert(fingerprint.as_str(), cert_names(cert));
                }
                Ok(held)
            }
            _ => Err(unexpected("query certificates")),
        }
    }

    /// The certificate each name is served with, per HTTPS listener, as every worker holds them
    /// (a certificate one worker lacks still counts: the main state has it).
    fn served_certificates(
        &mut self,
    ) -> Result<BTreeMap<SocketAddr, ListenerCertificates>, SozuError> {
        let answer = self.request(RequestType::QueryCertificatesFromWorkers(
            QueryCertificatesFilters::default(),
        ))?;
        let responses = match answer.and_then(|c| c.content_type) {
            Some(ContentType::WorkerResponses(responses)) => responses.map,
            _ => return Err(unexpected("query certificates from workers")),
        };
        listing::served_certificates(responses)
    }

    /// Every cluster's hash, as sozu's main process computes it.
    fn cluster_hashes(&mut self) -> Result<BTreeMap<String, u64>, SozuError> {
        let hashes = self.request(RequestType::QueryClustersHashes(QueryClustersHashes {}))?;
        main_content(hashes, "query clusters hashes", |c| match c {
            ContentType::ClusterHashes(h) => Some(h.map.into_iter().collect()),
            _ => None,
        })
    }

    /// Takes `created` as read, under the hashes sozu gives them now: clusters the agent has
    /// just created in bulk, as the agent believes sozu holds them. Without this, the first
    /// resync after a start read every cluster by id (6.4 s at 10,000 routes over 8
    /// connections), and rotations waited for it. The belief is sound for a cluster the agent
    /// created itself, from nothing, moments ago; a change someone else makes to it between
    /// the load and this query is the one that would go unseen, until the cluster's hash next
    /// changes.
    pub fn remember_created(
        &mut self,
        created: Vec<(String, ClusterState)>,
    ) -> Result<(), SozuError> {
        let hashes = self.cluster_hashes()?;
        for (id, state) in created {
            if let Some(&hash) = hashes.get(&id) {
                self.clusters_read.insert(id, (hash, state));
            }
        }
        Ok(())
    }

    /// Reads each of `owned` by id into the cache, on connections of their own when they are
    /// many. sozu answers a cluster query only once its worker has answered too, about 4 ms
    /// each: the first resync after a start at 10,000 routes took 40 s one after the other,
    /// and the loop, which waits for a resync, took no rotation meanwhile. sozu's main process
    /// handles the connections' queries as they come, so they overlap. What was read before a
    /// query failed stays in the cache.
    fn read_clusters(&mut self, owned: Vec<(String, u64)>) -> Result<(), SozuError> {
        let results: Vec<ReaderOutcome> = if owned.len() < PARALLEL_CLUSTER_READS_MIN {
            vec![self.read_each(&owned)]
        } else {
            self.read_each_in_parallel(&owned)
        };
        let mut failure = None;
        for (read, error) in results {
            for (id, hash, cluster) in read {
                self.clusters_read.insert(id, (hash, cluster));
            }
            failure = failure.or(error);
        }
        failure.map_or(Ok(()), Err)
    }

    /// Reads each of `part` on this connection, until one fails.
    fn read_each(&mut self, part: &[(String, u64)]) -> ReaderOutcome {
        let mut read = Vec::with_capacity(part.len());
        for (id, hash) in part {
            match self.cluster_state(id) {
                Ok(cluster) => read.push((id.clone(), *hash, cluster)),
                Err(e) => return (read, Some(e)),
            }
        }
        (read, None)
    }

    /// [`Self::read_each`] over [`CLUSTER_READERS`] connections of their own, one thread each.
    fn read_each_in_parallel(&self, owned: &[(String, u64)]) -> Vec<ReaderOutcome> {
        let chunk = owned.len().div_ceil(CLUSTER_READERS);
        std::thread::scope(|scope| {
            let readers: Vec<_> = owned
                .chunks(chunk)
                .map(|part| {
                    let mut reader = self.sibling();
                    scope.spawn(move || reader.read_each(part))
                })
                .collect();
            readers
                .into_iter()
                .map(|reader| {
                    reader
                        .join()
                        .unwrap_or_else(|_| (Vec::new(), Some(panicked("QueryClusterById"))))
                })
                .collect()
        })
    }

    /// One cluster as sozu's main process holds it: whether it exists, its backends, its health
    /// check, its policy and its frontends.
    pub fn cluster_state(&mut self, id: &str) -> Result<ClusterState, SozuError> {
        let info = self.request(RequestType::QueryClusterById(id.to_owned()))?;
        main_content(info, "query cluster", |c| match c {
            ContentType::Clusters(list) => Some(listing::cluster_state_of(list)),
            _ => None,
        })
    }

    /// Sends one planned operation. Closing sessions answers how many are still finishing
    /// (summed over the workers).
    pub fn apply(&mut self, op: &Op) -> Result<Option<u64>, SozuError> {
        let request = to_request(op)?;
        let kind = request_name(&request);
        self.tally.begin(&kind);
        let answer = self.request(request);
        // Answered OK: sozu's census counted it. Refused or unanswered: it may have or not.
        self.tally.end(&kind, answer.is_ok());
        let answer = answer?;
        if !matches!(op, Op::CloseSessions { .. }) {
            return Ok(None);
        }
        let draining = |content: &ResponseContent| match &content.content_type {
            Some(ContentType::ClosedSessions(closed)) => closed.draining,
            _ => 0,
        };
        Ok(Some(
            match answer.as_ref().and_then(|a| a.content_type.as_ref()) {
                Some(ContentType::WorkerResponses(responses)) => {
                    responses.map.values().map(draining).sum()
                }
                Some(ContentType::ClosedSessions(closed)) => closed.draining,
                _ => 0,
            },
        ))
    }

    /// Sends `ops` as one state file that sozu loads itself (`LoadState`): sozu applies them in
    /// order, as it does its own configuration file, without a round trip each. `dir` must be
    /// readable by sozu at the same path (beside the socket: in a pod, the volume both containers
    /// mount); it is made private to this user (0700), so sozu must run as the same user (as in
    /// the rendered pod) or as root, else bulk loading fails and is turned off. The file is created private to this user and removed as soon as sozu
    /// answers; it never holds a certificate, whose key would then sit on a disk: a certificate
    /// operation is refused before anything is written.
    ///
    /// sozu skips an entry its state refuses without failing the load, so success is taken only
    /// when every entry was acknowledged by each of `workers` workers.
    pub fn load_batch(&mut self, ops: &[Op], dir: &Path, workers: usize) -> Result<(), SozuError> {
        let file = state_file::write(ops, dir)?;
        let path = file
            .path()
            .to_str()
            .ok_or_else(|| SozuError::BatchFile {
                dir: dir.to_owned(),
                reason: "the path is not UTF-8".into(),
            })?
            .to_owned();
        // sozu's own deadline for a replay grows with its size; so does this one.
        let timeout = self.timeout + Duration::from_millis(ops.len() as u64);
        // Each entry is dispatched to sozu's state, and counted in its census, as a request of
        // its own.
        let kinds: Vec<String> = ops
            .iter()
            .filter_map(|op| to_request(op).ok())
            .map(|request| request_name(&request))
            .collect();
        for kind in &kinds {
            self.tally.begin(kind);
        }
        let loaded = self
            .request_within(RequestType::LoadState(path), timeout)
            .and_then(|answer| {
                let expected = ops.len() * workers;
                match state_file::acknowledged(&answer.message) {
                    Some((ok, 0)) if ok == expected => Ok(()),
                    _ => Err(SozuError::BatchIncomplete {
                        message: format!(
                            "{} ({expected} acknowledgements expected)",
                            answer.message
                        ),
                    }),
                }
            });
        for kind in &kinds {
            self.tally.end(kind, loaded.is_ok());
        }
        loaded
    }
}

/// A reading thread of [`SozuClient::read_state`] ended in a panic instead of an answer.
fn panicked(request: &str) -> SozuError {
    SozuError::Channel {
        request: request.into(),
        reason: "the reading thread panicked".into(),
    }
}

fn unexpected(request: &str) -> SozuError {
    SozuError::unexpected(request)
}

/// Scattered queries answer with one entry per worker plus `main`, the main process's state.
fn main_content<T>(
    content: Option<ResponseContent>,
    request: &str,
    extract: impl FnOnce(ContentType) -> Option<T>,
) -> Result<T, SozuError> {
    let content = content
        .and_then(|c| c.content_type)
        .ok_or_else(|| unexpected(request))?;
    let content = match content {
        ContentType::WorkerResponses(mut responses) => responses
            .map
            .remove("main")
            .and_then(|c| c.content_type)
            .ok_or_else(|| unexpected(request))?,
        other => other,
    };
    extract(content).ok_or_else(|| unexpected(request))
}

/// The request's kind only (sozu's own short name): its fields may hold key material.
pub(crate) fn request_name(request: &RequestType) -> String {
    sozu_command_lib::proto::display::format_request_type(request).to_owned()
}
#[cfg(test)]
mod tests {
    use super::*;

    /// No key is ever written to a file: a certificate in a bulk change is refused before the
    /// file exists, and before sozu is asked anything.
    #[test]
    fn a_state_file_never_carries_a_certificate() {
        use crate::plan::state::{Certificate, KeyPem};
        let dir = tempfile::tempdir().unwrap();
        let mut client = SozuClient::new(&dir.path().join("absent.sock"), Duration::from_secs(1));
        let certificate = Certificate {
            fingerprint: "ab".repeat(32).into(),
            chain: vec!["PEM".to_owned()].into(),
            key: KeyPem::new("-----BEGIN PRIVATE KEY-----".into()),
            not_before: 0,
            not_after: 1,
            names: BTreeSet::from(["a.in.example.org".to_owned()]).into(),
            other_names: std::sync::Arc::from([]),
            issuer: "CN=test".into(),
            listed: None,
        };
        let ops = [
            Op::AddCluster {
                id: "pi-a".into(),
                policy: None,
            },
            Op::AddCertificate {
                address: "127.0.0.1:8443".parse().unwrap(),
                certificate,
            },
        ];
        let error = client.load_batch(&ops, dir.path(), 1).unwrap_err();
        assert!(
            matches!(&error, SozuError::BatchFile { reason, .. } if reason.contains("certificate")),
            "{error}"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
