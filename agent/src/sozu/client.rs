//! One blocking connection to sozu's command socket: requests with a deadline, the state read
//! back, and bulk state files loaded.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sozu_command_lib::channel::Channel;
use sozu_command_lib::proto::command::{
    request::RequestType, response_content::ContentType, CertificateAndKey, ClientAuthMode,
    FrontendFilters, ListListeners, ListedFrontends, QueryCertificatesFilters, QueryClustersHashes,
    Request, Response, ResponseContent, ResponseStatus, Status, TlsVersion, WorkerRequest,
};

use super::request::{health_check_of, hsts_of, to_request};
use super::SozuError;
use crate::plan::state::{
    Actual, Address, Backend, ClientAuthState, ClusterState, Frontend, ListenerCertificates,
    ListenerSettings, Protocol, StreamFrontend,
};
use crate::plan::Op;
use crate::workspace::{Http2Offer, ID_PREFIX};

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
    /// HTTP and HTTPS frontends (about 135 bytes each, two a route) are listed one protocol
    /// at a time.
    pub frontends_by_protocol: bool,
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
        }
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
        Ok(true)
    }

    pub fn disconnect(&mut self) {
        self.channel = None;
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
        SozuClient::new(&self.path, self.timeout).with_peer(self.peer)
    }

    /// Reads everything the planner compares against: listeners, clusters, frontends, the
    /// backends of the clusters the agent owns, and the certificates.
    ///
    /// The certificates are listed on a connection of their own meanwhile: at 10,000 routes
    /// their listing (each with its chain and key) took 210–300 ms of a 0.6 s resync, which
    /// the loop waits for. sozu's main process answers it while it waits on its workers for the
    /// cluster hashes, and the agent decodes one answer while sozu builds the next.
    ///
    /// Every answer must fit sozu's `max_command_buffer_size` (default 2,000,000 bytes), whatever
    /// the workspace's size: a listing that did not is read in pieces from then on ([`Pieces`]).
    /// What each of sozu 2.3.3's filters costs decided the pieces (at 10,000 routes, measured
    /// from a client of sozu's socket by the `reads` bench):
    /// - frontends by protocol: the same scan as the whole listing, in two answers of half its
    ///   size (1.37 MB each against 2.73 MB); by cluster id, a scan of every frontend per cluster
    ///   (0.31 ms each, 3.1 s for all), so only past the protocols' own limit;
    /// - certificates by fingerprint: every certificate's fingerprint encoded again per query
    ///   (2.5 ms each, 25 s for all); by domain, every certificate parsed and put in a trie per
    ///   query (42 ms each). Neither reads 10,000 certificates in time, and neither finds a
    ///   certificate the agent does not know of. The workers' listing names each host's served
    ///   certificate without its chain or key (0.9 MB a worker against 8.9 MB, 12 against 65
    ///   ms), so it replaces the main state's once that does not fit. What it cannot show is a
    ///   certificate served for no name (left behind under a longer-lived one for every name it
    ///   has): such a certificate stays in sozu unseen until it is served.
    pub fn read_state(&mut self) -> Result<Actual, SozuError> {
        let mut actual = Actual::default();
        let mut sibling = self.sibling();
        sibling.pieces = self.pieces;
        let (rest, certificates) = std::thread::scope(|scope| {
            let certificates = scope.spawn(move || {
                let started = Instant::now();
                let held = sibling.certificates();
                (held, sibling.pieces, started.elapsed().as_secs_f64() * 1e3)
            });
            let rest = self.read_all_but_certificates(&mut actual);
            let certificates = certificates.join().unwrap_or_else(|_| {
                (
                    Err(panicked("QueryCertificatesFromTheState")),
                    self.pieces,
                    0.0,
                )
            });
            (rest, certificates)
        });
        let (held, pieces, certificates_ms) = certificates;
        self.pieces.served_certificates |= pieces.served_certificates;
        let times = rest?;
        let held = held?;
        tracing::debug!(
            listeners_ms = times.listeners,
            frontends_ms = times.frontends,
            hashes_ms = times.hashes,
            clusters_to_read = times.clusters_to_read,
            clusters_ms = times.clusters,
            certificates_ms,
            pieces = ?self.pieces,
            "sozu's state read, by listing (the certificates on a connection of their own)"
        );
        for (&address, &(protocol, _)) in &actual.listeners {
            if protocol == Protocol::Https {
                let on_listener = match &held {
                    // The main state does not say which listener holds which certificate; an
                    // HTTPS listener per workspace makes that moot, and a request naming a
                    // certificate the listener lacks is a no-op in sozu.
                    HeldCertificates::Everywhere(all) => all.clone(),
                    HeldCertificates::ByListener(by) => {
                        by.get(&address).cloned().unwrap_or_default()
                    }
                };
                actual.certificates.insert(address, on_listener);
            }
        }
        Ok(actual)
    }

    /// Listeners, frontends and owned clusters into `actual`; how long each took.
    fn read_all_but_certificates(&mut self, actual: &mut Actual) -> Result<ReadTimes, SozuError> {
        let (mut times, mut since) = (ReadTimes::default(), Instant::now());
        match self.request(RequestType::ListListeners(ListListeners {}))? {
            Some(ResponseContent {
                content_type: Some(ContentType::ListenersList(list)),
            }) => {
                // What both kinds of listener report alike.
                let common =
                    |interface: &Option<String>, expect_proxy, timeouts| ListenerSettings {
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
                            http2: Http2Offer::of(
                                &l.alpn_protocols,
                                l.disable_http11.unwrap_or(false),
                            ),
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
                    actual
                        .listener_settings
                        .insert(address, common(&l.interface, false, timeouts));
                }
            }
            _ => return Err(unexpected("list listeners")),
        }
        times.listeners = lap(&mut since);

        let hashes = self.cluster_hashes()?;
        actual.clusters = hashes.keys().cloned().collect();
        times.hashes = lap(&mut since);

        self.frontends(actual)?;
        times.frontends = lap(&mut since);

        let mut read = std::mem::take(&mut self.clusters_read);
        read.retain(|id, (hash, _)| hashes.get(id) == Some(hash));
        let owned: Vec<(String, u64)> = hashes
            .into_iter()
            .filter(|(id, _)| id.starts_with(ID_PREFIX) && !read.contains_key(id))
            .collect();
        // Kept even if a query below fails: what it holds was read and is still current.
        self.clusters_read = read;
        times.clusters_to_read = owned.len();
        self.read_clusters(owned)?;
        times.clusters = lap(&mut since);
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
        Ok(times)
    }

    /// Every frontend into `actual`, in as few answers as fit sozu's command buffer.
    fn frontends(&mut self, actual: &mut Actual) -> Result<(), SozuError> {
        if !self.pieces.frontends_by_protocol {
            // `tcp` lists the UDP ones too (sozu 2.3.3's filters have no `udp`).
            match self.list_frontends(true, true, true, None) {
                Ok(list) => return add_frontends(actual, list),
                Err(e) if closed_before_answer(&e) => {
                    tracing::info!(
                        "sozu's frontends do not fit its command buffer in one answer: listed \
                         one protocol at a time from now on"
                    );
                    self.pieces.frontends_by_protocol = true;
                }
                Err(e) => return Err(e),
            }
        }
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
                    held.insert(fingerprint, &cert_names(cert));
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
        let mut names: BTreeMap<SocketAddr, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for content in responses.into_values() {
            let Some(ContentType::CertificatesByAddress(list)) = content.content_type else {
                return Err(unexpected("query certificates from workers"));
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
                    held.insert(fingerprint, names);
                }
                (address, held)
            })
            .collect())
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
            ContentType::Clusters(list) => {
                let mut read = ClusterState::default();
                for info in list.vec {
                    read.exists |= info.configuration.is_some();
                    let http = info.http_frontends.into_iter().map(|f| (Protocol::Http, f));
                    let https = info
                        .https_frontends
                        .into_iter()
                        .map(|f| (Protocol::Https, f));
                    read.frontends
                        .extend(http.chain(https).map(|(p, f)| frontend_of(p, f)));
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
                Some(read)
            }
            _ => None,
        })
    }

    /// Sends one planned operation. Closing sessions answers how many are still finishing
    /// (summed over the workers).
    pub fn apply(&mut self, op: &Op) -> Result<Option<u64>, SozuError> {
        let answer = self.request(to_request(op)?)?;
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
        use std::io::Write;
        let file_error = |reason: String| SozuError::BatchFile {
            dir: dir.to_owned(),
            reason,
        };
        if let Some(op) = ops.iter().find(|op| {
            matches!(
                op,
                Op::AddCertificate { .. }
                    | Op::ReplaceCertificate { .. }
                    | Op::RemoveCertificate { .. }
            )
        }) {
            return Err(file_error(format!(
                "`{}` is a certificate operation: a state file never carries one (its key would \
                 be written to disk)",
                op.describe()
            )));
        }
        private_dir(dir).map_err(file_error)?;
        let mut file = tempfile::Builder::new()
            .prefix(".private-ingress-")
            .suffix(".state")
            .tempfile_in(dir)
            .map_err(|e| file_error(e.to_string()))?;
        {
            let mut out = std::io::BufWriter::new(file.as_file_mut());
            for (i, op) in ops.iter().enumerate() {
                let entry = WorkerRequest::new(format!("pi-{i}"), Request::from(to_request(op)?));
                serde_json::to_writer(&mut out, &entry).map_err(|e| file_error(e.to_string()))?;
                out.write_all(b"\n\0")
                    .map_err(|e| file_error(e.to_string()))?;
            }
            out.flush().map_err(|e| file_error(e.to_string()))?;
        }
        let path = file
            .path()
            .to_str()
            .ok_or_else(|| file_error("the path is not UTF-8".into()))?
            .to_owned();
        tracing::debug!(
            entries = ops.len(),
            bytes = file.as_file().metadata().map(|m| m.len()).unwrap_or(0),
            "bulk state file written"
        );
        // sozu's own deadline for a replay grows with its size; so does this one.
        let timeout = self.timeout + Duration::from_millis(ops.len() as u64);
        let answer = self.request_within(RequestType::LoadState(path), timeout)?;
        let expected = ops.len() * workers;
        match acknowledged(&answer.message) {
            Some((ok, 0)) if ok == expected => Ok(()),
            _ => Err(SozuError::BatchIncomplete {
                message: format!("{} ({expected} acknowledgements expected)", answer.message),
            }),
        }
    }
}

/// Makes `dir` if it is not there, private to this user (0700), and checks that it is: a state
/// file describes every route, and nobody else may read it or put one there in its place.
fn private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e.to_string()),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o077 != 0 {
        return Err(format!(
            "it must be a directory of this agent's uid {me} with mode 0700 (it is uid {}, \
             mode {:o})",
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// (acknowledged, failed) from sozu 2.3.3's answer to a state load: "Successfully loaded state
/// from path P, N ok messages, M errors".
fn acknowledged(message: &str) -> Option<(usize, usize)> {
    let mut parts = message.rsplit(", ");
    let errors = parts.next()?.strip_suffix(" errors")?.parse().ok()?;
    let ok = parts.next()?.strip_suffix(" ok messages")?.parse().ok()?;
    Some((ok, errors))
}

/// A listener's error pages as sozu lists them (an empty one is no page).
fn answers_of(answers: &BTreeMap<String, String>) -> BTreeMap<String, std::sync::Arc<str>> {
    answers
        .iter()
        .filter(|(_, page)| !page.is_empty())
        .map(|(status, page)| (status.clone(), std::sync::Arc::from(page.as_str())))
        .collect()
}

/// A frontend as sozu lists it.
fn frontend_of(
    protocol: Protocol,
    f: sozu_command_lib::proto::command::RequestHttpFrontend,
) -> Frontend {
    let (hostname, alias) = Frontend::parse_sozu_hostname(&f.hostname);
    let policy = super::request::frontend_policy_of(&f);
    Frontend {
        protocol,
        address: f.address.into(),
        hostname,
        path_prefix: f.path.value,
        cluster_id: f.cluster_id,
        tags: f.tags.into_iter().collect(),
        hsts: super::request::frontend_hsts_of(f.hsts.as_ref()),
        policy,
        alias,
    }
}

/// The certificates a state read found.
enum HeldCertificates {
    /// The main state's, which does not say which listener holds which.
    Everywhere(ListenerCertificates),
    /// The workers', per listener.
    ByListener(BTreeMap<SocketAddr, ListenerCertificates>),
}

/// The frontends of one listing into `actual` (listings may overlap: each is a set).
fn add_frontends(actual: &mut Actual, list: ListedFrontends) -> Result<(), SozuError> {
    let http = list.http_frontends.into_iter().map(|f| (Protocol::Http, f));
    let https = list
        .https_frontends
        .into_iter()
        .map(|f| (Protocol::Https, f));
    for (protocol, f) in http.chain(https) {
        actual.frontends.insert(frontend_of(protocol, f));
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

/// A reading thread of [`SozuClient::read_state`] ended in a panic instead of an answer.
fn panicked(request: &str) -> SozuError {
    SozuError::Channel {
        request: request.into(),
        reason: "the reading thread panicked".into(),
    }
}

fn unexpected(request: &str) -> SozuError {
    SozuError::Unexpected {
        request: request.into(),
    }
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

fn cert_names(cert: &CertificateAndKey) -> BTreeSet<String> {
    if !cert.names.is_empty() {
        return cert.names.iter().map(|n| n.to_ascii_lowercase()).collect();
    }
    crate::certs::names_of_pem(cert.certificate.as_bytes()).unwrap_or_default()
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
            fingerprint: "ab".repeat(32),
            chain: vec!["PEM".to_owned()].into(),
            key: KeyPem::new("-----BEGIN PRIVATE KEY-----".into()),
            not_before: 0,
            not_after: 1,
            names: BTreeSet::from(["a.in.example.org".to_owned()]).into(),
            other_names: std::sync::Arc::from([]),
            issuer: "CN=test".into(),
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

    /// The bulk files' directory is made private, and one that others may read is refused.
    #[test]
    fn state_files_go_in_a_directory_private_to_the_agent() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join(".private-ingress");
        private_dir(&private).unwrap();
        let mode = std::fs::metadata(&private).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).unwrap();
        let refused = private_dir(&private).unwrap_err();
        assert!(refused.contains("mode 0700"), "{refused}");
    }

    #[test]
    fn a_state_load_answer_gives_its_counts() {
        let message = "Successfully loaded state from path /run/sozu/.private-ingress-x.state, \
                       4000 ok messages, 0 errors";
        assert_eq!(acknowledged(message), Some((4000, 0)));
        assert_eq!(
            acknowledged("loading state: 3 ok messages, 1 errors, timed out: false"),
            None,
            "a failure's wording is not a success's"
        );
    }
}
