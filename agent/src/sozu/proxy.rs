//! What sozu is to the reconcile loop ([`Proxy`]), and [`SozuProxy`], the real one: blocking
//! clients on tokio's blocking pool. Queries go through the first connection; a plan's
//! independent requests are spread over all of them, and a bulk change goes as state files
//! ([`super::bulk`]). The loop's tests drive an in-memory fake through the same trait.

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::bulk::{bulk_retry_after, send_bulk, BATCH_MIN};
use super::generation::Generation;
use super::lanes::{lock, send_over, Lane};
use super::socket::SocketWatch;
use super::{Delivered, SozuClient, SozuError};
use crate::plan::state::{Actual, ClusterState};
use crate::plan::{Op, Outcome};

/// What sozu is to the loop.
pub trait Proxy: Send + 'static {
    /// Which sozu answers: see [`super::generation::should_resync`].
    fn generation(&mut self) -> impl Future<Output = Result<Generation, SozuError>> + Send;
    fn read_state(&mut self) -> impl Future<Output = Result<Actual, SozuError>> + Send;
    /// One cluster as sozu holds it: a targeted resync after someone else changed it.
    fn read_cluster(
        &mut self,
        id: String,
    ) -> impl Future<Output = Result<ClusterState, SozuError>> + Send;
    /// Sends `ops` (see [`super::phases::send_in_phases`]) and says what became of each,
    /// and how each went (see [`Delivered`]).
    fn apply(&mut self, ops: Vec<Op>) -> impl Future<Output = Delivered> + Send;
    /// Sends `ops` beside the loop: the send owns what it needs, so that the loop can take up a
    /// rotation while sozu answers them and send it past them ([`Proxy::apply_past`]). A change
    /// that goes in bulk is handed back, for the loop to await [`Proxy::apply`] with it. A proxy
    /// that cannot send beside the loop hands every change back.
    fn send_beside(&mut self, ops: Vec<Op>) -> Result<SendBeside, Vec<Op>> {
        Err(ops)
    }
    /// Sends `ops` while a send beside the loop ([`Proxy::send_beside`]) is under way, on a
    /// connection that send does not use, one request at a time.
    fn apply_past(&mut self, ops: Vec<Op>) -> impl Future<Output = Delivered> + Send {
        self.apply(ops)
    }
    /// Takes `created`, clusters the agent has just created in bulk, as already read (see
    /// [`SozuClient::remember_created`]). A proxy with nothing to remember has nothing to do.
    fn remember_created(
        &mut self,
        created: Vec<(String, ClusterState)>,
    ) -> impl Future<Output = Result<(), SozuError>> + Send {
        let _ = created;
        async { Ok(()) }
    }
    /// Reads sozu's state beside the loop: the read owns what it needs and runs on a connection
    /// the loop's requests do not use, so a rotation sent meanwhile does not wait for it (see
    /// the loop's resync). Parts that only the agent changed since the last read may be left
    /// unread ([`StateRead::unread`]): they are as the shadow holds them.
    fn read_state_beside(&mut self) -> ReadBeside;
    /// Whether a wait for sozu should end now: a sozu listens at a socket the agent has not
    /// tried yet (see [`super::socket`]). A proxy that cannot tell says no: the back-off and the
    /// socket's watch decide.
    fn listening_again(&mut self) -> impl Future<Output = bool> + Send {
        async { false }
    }
}

/// A send of a change that owns what it needs: the loop holds it while it goes on.
pub type SendBeside = std::pin::Pin<Box<dyn Future<Output = Delivered> + Send>>;

/// A read of sozu's state that owns what it needs: the loop holds it while it goes on.
pub type ReadBeside = std::pin::Pin<Box<dyn Future<Output = Result<StateRead, SozuError>> + Send>>;

pub use super::client::StateRead;

/// The connection that reads sozu's state, and the sozu connection it was made under: a read
/// beside the loop holds it for the read's length, so the loop never waits on its lock; it
/// reconnects by itself when the loop has found a new sozu.
type Reader = Arc<Mutex<(SozuClient, u64)>>;

pub struct SozuProxy {
    lanes: Vec<Lane>,
    /// State reads, on a connection of their own (with what it has read of each cluster).
    reader: Reader,
    /// The connection of the requests that go past a change under way (a rotation sent while
    /// sozu answers an edit's requests on the lanes): see [`Proxy::apply_past`].
    spare: Lane,
    /// Which socket the first lane last connected to, or tried to.
    socket: Option<SocketWatch>,
    /// Counts the connections the first lane opened: each may be to another sozu.
    connection: u64,
    /// Where bulk state files go (see [`SozuClient::load_batch`]); `None`: never in bulk.
    batch_dir: Option<PathBuf>,
    /// Bulk loads sozu did not complete in a row, and until when changes go one request at a
    /// time because of them ([`super::bulk::bulk_retry_after`]).
    bulk_failures: u32,
    bulk_paused_until: Option<std::time::Instant>,
    /// sozu's worker count, as of the last generation check.
    workers: usize,
}

impl SozuProxy {
    /// `clients` are connections to the same socket (at least one).
    pub fn new(clients: Vec<SozuClient>) -> SozuProxy {
        let socket = clients.first().map(|c| SocketWatch::new(c.path()));
        // Every connection counts the requests it sends in one tally, which the reader's
        // census is compared with (see [`super::census`]).
        let tally = clients.first().map(SozuClient::tally).unwrap_or_default();
        let clients: Vec<SozuClient> = clients
            .into_iter()
            .map(|c| c.with_tally(tally.clone()))
            .collect();
        let reader = clients
            .first()
            .map(SozuClient::sibling)
            .unwrap_or_else(|| SozuClient::new(std::path::Path::new(""), Default::default()));
        let spare = Arc::new(Mutex::new(reader.sibling()));
        SozuProxy {
            reader: Arc::new(Mutex::new((reader, 0))),
            spare,
            socket,
            lanes: clients
                .into_iter()
                .map(|c| Arc::new(Mutex::new(c)))
                .collect(),
            connection: 0,
            batch_dir: None,
            bulk_failures: 0,
            bulk_paused_until: None,
            workers: 1,
        }
    }

    /// Sends bulk changes as state files written in `dir` (which sozu must read at the same path).
    pub fn with_batches(mut self, dir: PathBuf) -> SozuProxy {
        self.batch_dir = Some(dir);
        self
    }

    /// Runs `f` on the reading connection, reconnected first if the loop found a new sozu
    /// since it last connected.
    fn with_reader<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut SozuClient) -> Result<T, SozuError> + Send + 'static,
    ) -> impl Future<Output = Result<T, SozuError>> + Send + 'static {
        let (reader, connection) = (self.reader.clone(), self.connection);
        async move {
            tokio::task::spawn_blocking(move || {
                let mut held = reader.lock().unwrap_or_else(|p| p.into_inner());
                let (client, under) = &mut *held;
                if *under != connection {
                    client.disconnect();
                    *under = connection;
                }
                f(client)
            })
            .await
            .map_err(|e| SozuError::Task {
                reason: e.to_string(),
            })?
        }
    }

    async fn with_first<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut SozuClient) -> Result<T, SozuError> + Send + 'static,
    ) -> Result<T, SozuError> {
        let lane = self.lanes.first().cloned().ok_or_else(|| SozuError::Task {
            reason: "no sozu connection configured".into(),
        })?;
        tokio::task::spawn_blocking(move || f(&mut lock(&lane)))
            .await
            .map_err(|e| SozuError::Task {
                reason: e.to_string(),
            })?
    }
}

impl Proxy for SozuProxy {
    async fn generation(&mut self) -> Result<Generation, SozuError> {
        let socket = self.socket.as_mut().and_then(SocketWatch::trying);
        let connected = self
            .with_first(|c| {
                let new = c.ensure_connected()?;
                Ok((new, c.worker_pids()?))
            })
            .await;
        let refused = matches!(connected, Err(SozuError::Connect { .. }));
        if let Some(watch) = &mut self.socket {
            if refused || matches!(connected, Ok((true, _))) {
                watch.tried(socket, refused);
            }
        }
        let (new_connection, workers) = connected?;
        if new_connection {
            self.connection += 1;
            // The other lanes may still talk to the previous sozu: reconnect them too.
            for lane in self.lanes[1..].iter().chain([&self.spare]) {
                lock(lane).disconnect();
            }
        }
        self.workers = workers.len().max(1);
        Ok(Generation {
            connection: self.connection,
            workers,
        })
    }

    async fn read_state(&mut self) -> Result<Actual, SozuError> {
        self.with_reader(|c| c.read_state()).await
    }

    async fn read_cluster(&mut self, id: String) -> Result<ClusterState, SozuError> {
        self.with_reader(move |c| c.cluster_state(&id)).await
    }

    async fn remember_created(
        &mut self,
        created: Vec<(String, ClusterState)>,
    ) -> Result<(), SozuError> {
        self.with_reader(move |c| c.remember_created(created)).await
    }

    fn read_state_beside(&mut self) -> ReadBeside {
        Box::pin(self.with_reader(|c| c.read_resync()))
    }

    /// A `stat` of the socket, and after a refused connection one connection tried (both
    /// microseconds on a UNIX socket).
    async fn listening_again(&mut self) -> bool {
        let Some(watch) = &mut self.socket else {
            return false;
        };
        let now = super::socket::SocketIdentity::of(watch.path());
        let path = watch.path().to_owned();
        watch.listening_again(now, || {
            std::os::unix::net::UnixStream::connect(&path).is_ok()
        })
    }

    /// A change of [`BATCH_MIN`] requests or more goes in bulk ([`send_bulk`]). When sozu does
    /// not load a state file in full, the file's requests count as not sent (the loop reads
    /// sozu's state again) and bulk loading pauses: from then on, one request at a time, each
    /// refusal reported on its own, until the back-off ends (30 s, doubling with each failure in
    /// a row up to an hour); the first bulk change after it is tried in bulk again.
    async fn apply(&mut self, ops: Vec<Op>) -> Delivered {
        let count = ops.len();
        let lanes = self.lanes.clone();
        let batch = self.batch(count);
        let result = tokio::task::spawn_blocking(move || match batch {
            Some((dir, workers)) => send_bulk(&lanes, &ops, &dir, workers),
            None => (Delivered::one_by_one(send_over(&lanes, &ops)), None),
        })
        .await;
        match result {
            Ok((delivered, None)) => {
                if delivered.files > 0 && self.bulk_failures > 0 {
                    tracing::info!(
                        failures = self.bulk_failures,
                        "sozu loaded a bulk change again; bulk changes go as state files"
                    );
                    self.bulk_failures = 0;
                    self.bulk_paused_until = None;
                }
                delivered
            }
            Ok((delivered, Some(reason))) => {
                self.bulk_failures = self.bulk_failures.saturating_add(1);
                let wait = bulk_retry_after(self.bulk_failures);
                self.bulk_paused_until = Some(std::time::Instant::now() + wait);
                tracing::warn!(
                    error = %reason,
                    failures = self.bulk_failures,
                    retry_in_s = wait.as_secs(),
                    "sozu did not load the bulk change; sending requests one at a time, and a \
                     bulk change again in {} s",
                    wait.as_secs()
                );
                delivered
            }
            Err(e) => Delivered::one_by_one(vec![Outcome::NotSent(e.to_string()); count]),
        }
    }

    /// Every change but a bulk one (see [`SozuProxy::apply`]).
    fn send_beside(&mut self, ops: Vec<Op>) -> Result<SendBeside, Vec<Op>> {
        if self.batch(ops.len()).is_some() {
            return Err(ops);
        }
        Ok(Box::pin(send_blocking(self.lanes.clone(), ops)))
    }

    async fn apply_past(&mut self, ops: Vec<Op>) -> Delivered {
        send_blocking(vec![self.spare.clone()], ops).await
    }
}

impl SozuProxy {
    /// Where a change of `count` requests goes in bulk, and over how many workers; `None`: it
    /// goes one request at a time.
    fn batch(&self, count: usize) -> Option<(PathBuf, usize)> {
        let now = std::time::Instant::now();
        let paused = self.bulk_paused_until.is_some_and(|until| now < until);
        self.batch_dir
            .clone()
            .filter(|_| count >= BATCH_MIN && !paused)
            .map(|dir| (dir, self.workers))
    }
}

/// Sends `ops` over `lanes` one request at a time, on tokio's blocking pool.
async fn send_blocking(lanes: Vec<Lane>, ops: Vec<Op>) -> Delivered {
    let count = ops.len();
    match tokio::task::spawn_blocking(move || send_over(&lanes, &ops)).await {
        Ok(outcomes) => Delivered::one_by_one(outcomes),
        Err(e) => Delivered::one_by_one(vec![Outcome::NotSent(e.to_string()); count]),
    }
}
