//! The only code that talks to sozu's command socket (sozu-command-lib 2.3.3).
//!
//! Every request has a deadline. sozu answers a mutation with `PROCESSING` and then `OK` once
//! every worker applied it, or `FAILURE`; a query answers `OK` with content. Any channel error
//! drops the connection, and the next request reconnects: the caller (the reconcile loop) then
//! re-reads sozu's state, because a new connection may mean a new sozu.
//!
//! Certificate queries on the main state return private keys: they are dropped here, on receipt;
//! only fingerprints and names leave this module.
//!
//! A bulk change (a cold start, a restarted sozu) goes as one state file that sozu loads itself
//! (`LoadState`) instead of thousands of round trips; see [`SozuClient::load_batch`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sozu_command_lib::channel::Channel;
use sozu_command_lib::config::ListenerBuilder;
use sozu_command_lib::proto::command::{
    request::RequestType, response_content::ContentType, ActivateListener, AddBackend,
    AddCertificate, CertificateAndKey, Cluster, FrontendFilters, ListListeners, ListenerType,
    PathRule, QueryCertificatesFilters, QueryClustersHashes, RemoveBackend, RemoveCertificate,
    ReplaceCertificate, Request, RequestHttpFrontend, Response, ResponseContent, ResponseStatus,
    RulePosition, Status, WorkerRequest,
};

use crate::plan::{Op, Outcome};
use crate::state::{Actual, Backend, Certificate, Frontend, ListenerCertificates, Protocol};
use crate::workspace::ID_PREFIX;

/// Buffer sizes for each connection. The buffers start at a page and grow on demand up to the
/// maximum (a state query for tens of thousands of routes fits). The agent keeps
/// `--sozu-connections` connections with two buffers each, and a buffer's pages stay resident once
/// written: at 32 connections, starting at 64 KiB cost about 2 MiB of resident memory at rest,
/// for requests that are a few KiB (a certificate with its chain and key).
const BUFFER_BYTES: u64 = 4 * 1024;
const MAX_BUFFER_BYTES: u64 = 64_000_000;

#[derive(Debug, thiserror::Error)]
pub enum SozuError {
    #[error("cannot connect to sozu at {}: {reason}", path.display())]
    Connect { path: PathBuf, reason: String },
    #[error("sozu connection lost during `{request}`: {reason}")]
    Channel { request: String, reason: String },
    #[error("sozu did not answer `{request}` within {} ms", timeout.as_millis())]
    Timeout { request: String, timeout: Duration },
    #[error("sozu refused `{request}`: {message}")]
    Refused { request: String, message: String },
    #[error("sozu answered `{request}` with unexpected content")]
    Unexpected { request: String },
    #[error("cannot write the bulk state file in {}: {reason}", dir.display())]
    BatchFile { dir: PathBuf, reason: String },
    #[error("sozu loaded the bulk state only in part: {message}")]
    BatchIncomplete { message: String },
}

impl SozuError {
    /// A refusal leaves the connection usable; every other error means reconnecting.
    pub fn is_refusal(&self) -> bool {
        matches!(self, SozuError::Refused { .. })
    }
}

/// A blocking client for one sozu command socket.
pub struct SozuClient {
    path: PathBuf,
    timeout: Duration,
    channel: Option<Channel<Request, Response>>,
    /// The backends of each owned cluster as last read, with the hash sozu gave the cluster then.
    /// sozu's cluster hash covers the cluster, its backends and its frontends, so an unchanged
    /// hash means unchanged backends: a resync of an unchanged sozu asks for no cluster by id.
    clusters_read: BTreeMap<String, (u64, BTreeMap<String, Backend>)>,
}

impl SozuClient {
    pub fn new(path: &Path, timeout: Duration) -> SozuClient {
        SozuClient {
            path: path.to_owned(),
            timeout,
            channel: None,
            clusters_read: BTreeMap::new(),
        }
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
            .map_err(|e| connect_error(e.to_string()))?;
        channel
            .blocking()
            .map_err(|e| connect_error(e.to_string()))?;
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
                reason: e.to_string(),
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
                    } else {
                        SozuError::Channel {
                            request: name.to_owned(),
                            reason: e.to_string(),
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

    /// Reads everything the planner compares against: listeners, clusters, frontends, the
    /// backends of the clusters the agent owns, and the certificates of the main state.
    pub fn read_state(&mut self) -> Result<Actual, SozuError> {
        let mut actual = Actual::default();

        match self.request(RequestType::ListListeners(ListListeners {}))? {
            Some(ResponseContent {
                content_type: Some(ContentType::ListenersList(list)),
            }) => {
                for l in list.http_listeners.values() {
                    actual
                        .listeners
                        .insert(l.address.into(), (Protocol::Http, l.active));
                }
                for l in list.https_listeners.values() {
                    actual
                        .listeners
                        .insert(l.address.into(), (Protocol::Https, l.active));
                }
            }
            _ => return Err(unexpected("list listeners")),
        }

        match self.request(RequestType::ListFrontends(FrontendFilters {
            http: true,
            https: true,
            tcp: false,
            domain: None,
            cluster_id: None,
        }))? {
            Some(ResponseContent {
                content_type: Some(ContentType::FrontendList(list)),
            }) => {
                let http = list.http_frontends.into_iter().map(|f| (Protocol::Http, f));
                let https = list
                    .https_frontends
                    .into_iter()
                    .map(|f| (Protocol::Https, f));
                for (protocol, f) in http.chain(https) {
                    actual.frontends.insert(Frontend {
                        protocol,
                        address: f.address.into(),
                        hostname: f.hostname,
                        path_prefix: f.path.value,
                        cluster_id: f.cluster_id,
                        tags: f.tags.into_iter().collect(),
                    });
                }
            }
            _ => return Err(unexpected("list frontends")),
        }

        let hashes = self.request(RequestType::QueryClustersHashes(QueryClustersHashes {}))?;
        let hashes: BTreeMap<String, u64> =
            main_content(hashes, "query clusters hashes", |c| match c {
                ContentType::ClusterHashes(h) => Some(h.map.into_iter().collect()),
                _ => None,
            })?;
        actual.clusters = hashes.keys().cloned().collect();

        let mut read = std::mem::take(&mut self.clusters_read);
        read.retain(|id, (hash, _)| hashes.get(id) == Some(hash));
        for (id, (_, backends)) in &read {
            actual.backends.insert(id.clone(), backends.clone());
        }
        let owned: Vec<(String, u64)> = hashes
            .into_iter()
            .filter(|(id, _)| id.starts_with(ID_PREFIX) && !read.contains_key(id))
            .collect();
        // Kept even if a query below fails: what it holds was read and is still current.
        self.clusters_read = read;
        for (id, hash) in owned {
            let info = self.request(RequestType::QueryClusterById(id.clone()))?;
            let backends: BTreeMap<String, Backend> =
                main_content(info, "query cluster", |c| match c {
                    ContentType::Clusters(list) => Some(
                        list.vec
                            .into_iter()
                            .flat_map(|info| info.backends)
                            .map(|b| {
                                (
                                    b.backend_id.clone(),
                                    Backend {
                                        id: b.backend_id,
                                        address: b.address.into(),
                                        unix_path: b.unix_path.map(PathBuf::from),
                                    },
                                )
                            })
                            .collect(),
                    ),
                    _ => None,
                })?;
            self.clusters_read
                .insert(id.clone(), (hash, backends.clone()));
            actual.backends.insert(id, backends);
        }

        let certificates = self.request(RequestType::QueryCertificatesFromTheState(
            QueryCertificatesFilters::default(),
        ))?;
        let summaries = match certificates {
            Some(ResponseContent {
                content_type: Some(ContentType::CertificatesWithFingerprints(found)),
            }) => {
                let mut held = ListenerCertificates::default();
                // The keys are dropped here, with the rest of the response.
                for (fingerprint, cert) in &found.certs {
                    held.insert(fingerprint, &cert_names(cert));
                }
                held
            }
            _ => return Err(unexpected("query certificates")),
        };
        // The main state does not say which listener holds which certificate; an HTTPS listener
        // per workspace makes that moot, and a request naming a certificate the listener lacks is
        // a no-op in sozu.
        for (&address, &(protocol, _)) in &actual.listeners {
            if protocol == Protocol::Https {
                actual.certificates.insert(address, summaries.clone());
            }
        }
        Ok(actual)
    }

    /// Sends one planned operation.
    pub fn apply(&mut self, op: &Op) -> Result<(), SozuError> {
        self.request(to_request(op)?).map(|_| ())
    }

    /// Sends `ops` as one state file that sozu loads itself (`LoadState`): sozu applies them in
    /// order, as it does its own configuration file, without a round trip each. `dir` must be
    /// readable by sozu at the same path (the socket's directory: in a pod, the volume both
    /// containers mount). The file holds certificate keys; it is created private to this user
    /// and removed as soon as sozu answers.
    ///
    /// sozu skips an entry its state refuses without failing the load, so success is taken only
    /// when every entry was acknowledged by each of `workers` workers.
    pub fn load_batch(&mut self, ops: &[Op], dir: &Path, workers: usize) -> Result<(), SozuError> {
        use std::io::Write;
        let file_error = |reason: String| SozuError::BatchFile {
            dir: dir.to_owned(),
            reason,
        };
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

/// (acknowledged, failed) from sozu 2.3.3's answer to a state load: "Successfully loaded state
/// from path P, N ok messages, M errors".
fn acknowledged(message: &str) -> Option<(usize, usize)> {
    let mut parts = message.rsplit(", ");
    let errors = parts.next()?.strip_suffix(" errors")?.parse().ok()?;
    let ok = parts.next()?.strip_suffix(" ok messages")?.parse().ok()?;
    Some((ok, errors))
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
fn request_name(request: &RequestType) -> String {
    sozu_command_lib::proto::display::format_request_type(request).to_owned()
}

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
        } => RequestType::AddBackend(AddBackend {
            cluster_id: cluster_id.clone(),
            backend_id: backend.id.clone(),
            address: backend.address.into(),
            unix_path: backend
                .unix_path
                .as_ref()
                .map(|p| p.to_string_lossy().into_owned()),
            ..Default::default()
        }),
        Op::RemoveBackend {
            cluster_id,
            backend,
        } => RequestType::RemoveBackend(RemoveBackend {
            cluster_id: cluster_id.clone(),
            backend_id: backend.id.clone(),
            address: backend.address.into(),
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

/// [`crate::reconcile::Proxy`] over a real sozu: blocking clients on tokio's blocking pool. Queries
/// go through the first connection; a plan's independent requests are spread over all of them.
pub struct SozuProxy {
    clients: Vec<std::sync::Arc<std::sync::Mutex<SozuClient>>>,
    epoch: u64,
    /// Where bulk state files go (see [`SozuClient::load_batch`]); `None`: never in bulk.
    batch_dir: Option<PathBuf>,
    /// sozu's worker count, as of the last generation check.
    workers: usize,
}

/// From this many requests on, a change goes as one state file: a cold start or a restarted sozu
/// of a dozen routes and up, never a rotation or an edit of a few routes.
const BATCH_MIN: usize = 64;

impl SozuProxy {
    /// `clients` are connections to the same socket (at least one).
    pub fn new(clients: Vec<SozuClient>) -> SozuProxy {
        SozuProxy {
            clients: clients
                .into_iter()
                .map(|c| std::sync::Arc::new(std::sync::Mutex::new(c)))
                .collect(),
            epoch: 0,
            batch_dir: None,
            workers: 1,
        }
    }

    /// Sends bulk changes as state files written in `dir` (which sozu must read at the same path).
    pub fn with_batches(mut self, dir: PathBuf) -> SozuProxy {
        self.batch_dir = Some(dir);
        self
    }

    /// Sends `ops` over every lane, phase after phase, one request each.
    fn send(clients: &[std::sync::Arc<std::sync::Mutex<SozuClient>>], ops: &[Op]) -> Vec<Outcome> {
        crate::plan::send_in_phases(ops, clients.len(), |lane, op| {
            let mut client = clients[lane].lock().unwrap_or_else(|p| p.into_inner());
            match client.apply(op) {
                Ok(()) => Ok(()),
                Err(SozuError::Refused { message, .. }) => {
                    Err(crate::plan::SendError::Refused(message))
                }
                Err(e) => Err(crate::plan::SendError::Broken(e.to_string())),
            }
        })
    }

    async fn with_client<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut SozuClient) -> T + Send + 'static,
    ) -> Result<T, String> {
        let client = self
            .clients
            .first()
            .cloned()
            .ok_or_else(|| "no sozu connection configured".to_owned())?;
        tokio::task::spawn_blocking(move || {
            let mut guard = client.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut guard)
        })
        .await
        .map_err(|e| format!("sozu client task failed: {e}"))
    }
}

impl crate::reconcile::Proxy for SozuProxy {
    async fn generation(&mut self) -> Result<String, String> {
        let (new_connection, pids) = self
            .with_client(|c| {
                let new = c.ensure_connected()?;
                Ok::<_, SozuError>((new, c.worker_pids()?))
            })
            .await?
            .map_err(|e| e.to_string())?;
        if new_connection {
            self.epoch += 1;
            // The other lanes may still talk to the previous sozu: reconnect them too.
            for client in &self.clients[1..] {
                client
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .disconnect();
            }
        }
        self.workers = pids.len().max(1);
        Ok(format!("connection {} workers {:?}", self.epoch, pids))
    }

    async fn read_state(&mut self) -> Result<Actual, String> {
        self.with_client(|c| c.read_state())
            .await?
            .map_err(|e| e.to_string())
    }

    /// A bulk change: listeners and certificates one request each, then everything else as one
    /// state file, in plan order. Listeners go first because sozu loads a state file's listeners
    /// with checks of their own; certificates go by request so that no key is ever written to a
    /// file (and they depend on nothing but their listener, so sending them before clusters keeps
    /// every HTTPS frontend after its certificate); a refused certificate keeps its host's frontends
    /// out of the file. When sozu does not load the file in full, the file's requests count as
    /// not sent (the loop reads sozu's state again) and bulk loading is turned off for good: from
    /// then on, one request at a time, each refusal reported on its own.
    async fn apply(&mut self, ops: Vec<Op>) -> Vec<Outcome> {
        let count = ops.len();
        let clients = self.clients.clone();
        let batch = self
            .batch_dir
            .clone()
            .filter(|_| count >= BATCH_MIN)
            .map(|dir| (dir, self.workers));
        let result = tokio::task::spawn_blocking(move || match batch {
            Some((dir, workers)) => send_bulk(&clients, &ops, &dir, workers),
            None => (SozuProxy::send(&clients, &ops), None),
        })
        .await;
        match result {
            Ok((outcomes, None)) => outcomes,
            Ok((outcomes, Some(reason))) => {
                tracing::warn!(error = %reason,
                    "sozu did not load the bulk change; sending requests one at a time from now on");
                self.batch_dir = None;
                outcomes
            }
            Err(e) => vec![Outcome::NotSent(e.to_string()); count],
        }
    }
}

/// How one operation of a bulk change is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// One request each: listeners (sozu checks a state file's listeners its own way) and
    /// certificates (so that no key is ever written to a file).
    Request,
    /// In the first state file, loaded while the certificates go: new clusters and backends
    /// depend on nothing and nothing routes to them yet.
    Early,
    /// In the second state file, once the certificates are in: frontends (an HTTPS frontend
    /// needs its certificate) and every removal.
    Late,
}

fn delivery_of(op: &Op) -> Delivery {
    match op {
        Op::AddListener { .. }
        | Op::ActivateListener { .. }
        | Op::AddCertificate { .. }
        | Op::ReplaceCertificate { .. }
        | Op::RemoveCertificate { .. } => Delivery::Request,
        Op::AddCluster { .. } | Op::AddBackend { .. } => Delivery::Early,
        Op::RemoveFrontend(_)
        | Op::AddFrontend(_)
        | Op::RemoveBackend { .. }
        | Op::RemoveCluster { .. } => Delivery::Late,
    }
}

/// A bulk change (see [`SozuProxy::apply`]): what became of each of `ops`, and why a state file
/// failed, if one did.
///
/// sozu's main process and its worker each take their turn on every certificate request, so
/// neither is busy all the time; the first file (new clusters and backends) fills those gaps
/// instead of waiting its turn after them. It goes on its own connection, the certificates on
/// the others.
fn send_bulk(
    clients: &[std::sync::Arc<std::sync::Mutex<SozuClient>>],
    ops: &[Op],
    dir: &Path,
    workers: usize,
) -> (Vec<Outcome>, Option<String>) {
    let pick = |delivery: Delivery| -> Vec<Op> {
        ops.iter()
            .filter(|op| delivery_of(op) == delivery)
            .cloned()
            .collect()
    };
    let (requests, early, late) = (
        pick(Delivery::Request),
        pick(Delivery::Early),
        pick(Delivery::Late),
    );
    let load = |client: &std::sync::Arc<std::sync::Mutex<SozuClient>>, file: &[Op], what: &str| {
        if file.is_empty() {
            return Ok(());
        }
        let mut client = client.lock().unwrap_or_else(|p| p.into_inner());
        let started = Instant::now();
        client.load_batch(file, dir, workers)?;
        tracing::debug!(
            requests = file.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "{what} loaded by sozu from a state file"
        );
        Ok::<(), SozuError>(())
    };
    let send_requests = |lanes: &[std::sync::Arc<std::sync::Mutex<SozuClient>>]| {
        let started = Instant::now();
        let outcomes = SozuProxy::send(lanes, &requests);
        tracing::debug!(
            requests = requests.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "listeners and certificates sent"
        );
        outcomes
    };
    let (request_outcomes, early_result) = match clients {
        [first, rest @ ..] if !rest.is_empty() => std::thread::scope(|scope| {
            let early_load = scope.spawn(|| load(first, &early, "clusters and backends"));
            let outcomes = send_requests(rest);
            let early_result = early_load.join().unwrap_or_else(|_| {
                Err(SozuError::BatchFile {
                    dir: dir.to_owned(),
                    reason: "the loading thread panicked".into(),
                })
            });
            (outcomes, early_result)
        }),
        // One connection: one thing at a time.
        _ => {
            let early_result = clients
                .first()
                .map_or(Ok(()), |c| load(c, &early, "clusters and backends"));
            (send_requests(clients), early_result)
        }
    };

    let broken = request_outcomes.iter().find_map(|o| match o {
        Outcome::NotSent(reason) => Some(reason.clone()),
        _ => None,
    });
    // A refused certificate holds back its host's frontends, as one request at a time would.
    let refused: Vec<&Op> = requests
        .iter()
        .zip(&request_outcomes)
        .filter(|(_, o)| matches!(o, Outcome::Refused(_)))
        .map(|(op, _)| op)
        .collect();
    let held = |op: &Op| refused.iter().any(|r| crate::plan::depends_on(op, r));
    let late: Vec<Op> = late.into_iter().filter(|op| !held(op)).collect();

    let mut failure = None;
    let early_outcome = match early_result {
        Ok(()) => Outcome::Applied,
        Err(e) => {
            failure = Some(e.to_string());
            Outcome::NotSent(e.to_string())
        }
    };
    let late_outcome = match (&broken, &early_outcome) {
        (Some(reason), _) | (None, Outcome::NotSent(reason)) => Outcome::NotSent(reason.clone()),
        _ => match clients
            .first()
            .map_or(Ok(()), |c| load(c, &late, "frontends and removals"))
        {
            Ok(()) => Outcome::Applied,
            Err(e) => {
                failure = Some(e.to_string());
                Outcome::NotSent(e.to_string())
            }
        },
    };
    if failure.is_none() && broken.is_none() && (!early.is_empty() || !late.is_empty()) {
        tracing::info!(
            requests = early.len() + late.len(),
            "bulk change loaded by sozu from state files"
        );
    }

    // Back in plan order.
    let mut request_outcomes = request_outcomes.into_iter();
    let outcomes = ops
        .iter()
        .map(|op| match delivery_of(op) {
            Delivery::Request => request_outcomes.next().unwrap_or(Outcome::Skipped),
            Delivery::Early => early_outcome.clone(),
            Delivery::Late if held(op) => Outcome::Skipped,
            Delivery::Late => late_outcome.clone(),
        })
        .collect();
    (outcomes, failure)
}

#[cfg(test)]
mod tests {
    use super::*;

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
