//! A kubelet for pods on this machine: runs a pod of the Deployment or StatefulSet that `render
//! --format k8s` writes the way Kubernetes runs it, under the constraints it declares.
//!
//! - [`manifest`] reads the pod template and its ConfigMaps, refusing what is not emulated;
//! - [`image`] resolves the containers' images in an OCI image layout and unpacks them;
//! - [`network`] is the pod's network namespace (loopback, ports, `net.*` sysctls), alone or
//!   wired to a node where the cluster's services listen;
//! - [`volumes`] makes emptyDir, configMap, secret, cert-manager CSI volumes and a StatefulSet's
//!   claims as their writers do;
//! - [`sandbox`] runs each container under bubblewrap as its spec declares;
//! - [`probe`] runs startup, readiness and liveness probes.
//!
//! This module keeps the kubelet's order. Start: volumes, then the init containers in order,
//! a native sidecar (`restartPolicy: Always`) counting as started once its startup probe
//! passes, then every container at once. A container that exits is restarted with the
//! kubelet's back-off (10 s, doubling, at most 5 min); a failed startup or liveness probe kills
//! it first. The pod is Ready when every running container's readiness probe passes.
//! Deletion ([`Pod::delete`]): each container's preStop hook, then SIGTERM, then SIGKILL at
//! the end of `terminationGracePeriodSeconds` (counted from the deletion); the sidecars only
//! once the containers have exited, in reverse order.

pub mod image;
pub mod manifest;
pub mod network;
pub mod probe;
pub mod sandbox;
pub mod volumes;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Container;
use nix::sys::signal::Signal;

pub use image::Images;
pub use manifest::Manifest;
pub use network::{Network, Node};
pub use sandbox::Sandbox;
pub use volumes::Volumes;

use image::PodImages;
use probe::Prober;
use sandbox::EtcFiles;

/// The kubelet's restart back-off: 10 s, doubling, capped at 5 minutes.
const BACKOFF_START: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Poll interval of the harness's own waits.
const TICK: Duration = Duration::from_millis(5);

/// How one run of a container ended.
#[derive(Debug, Clone)]
pub struct Exit {
    /// Since the pod started.
    pub at: Duration,
    /// The exit status bubblewrap passes on for the container's process, or the signal that
    /// ended bubblewrap.
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

struct ContainerState {
    name: String,
    spec: Container,
    sidecar: bool,
    sandbox: Sandbox,
    log: PathBuf,
    /// The running process.
    process: Mutex<Option<sandbox::Process>>,
    runs: AtomicU32,
    exits: Mutex<Vec<Exit>>,
    started_at: Mutex<Option<Duration>>,
    startup_passed_at: Mutex<Option<Duration>>,
    ready: AtomicBool,
    last_probe_failure: Mutex<Option<String>>,
    /// No more restarts: the pod is being deleted or dropped.
    stopping: AtomicBool,
    supervisor: Mutex<Option<JoinHandle<()>>>,
}

impl ContainerState {
    fn running(&self) -> bool {
        lock(&self.process).is_some()
    }

    /// Sends `signal` to the running process, and says why in the container's log.
    fn signal(&self, signal: Signal, why: &str) {
        if let Some(process) = lock(&self.process).as_ref() {
            self.note(&format!("{signal} to PID {} ({why})", process.pid));
            process.signal(signal);
        }
    }

    /// A line of the harness in the container's log.
    fn note(&self, what: &str) {
        use std::io::Write;
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .and_then(|mut f| writeln!(f, "--- kubelet: {what} ---"));
    }
}

/// One container's part in a deletion.
#[derive(Debug, Clone)]
pub struct Stopped {
    pub name: String,
    /// When SIGTERM was sent, since the deletion (after the preStop hook).
    pub sigterm_at: Option<Duration>,
    /// When it exited, since the deletion, with its exit code.
    pub exited_at: Option<Duration>,
    pub code: Option<i32>,
    /// Killed at the end of the grace period.
    pub killed: bool,
}

/// What the cluster gives a pod beyond its manifest.
#[derive(Debug, Default, Clone)]
pub struct Placement {
    /// The pod's ordinal: it is named, and its hostname is, `<workload>-<ordinal>`.
    pub ordinal: u32,
    /// Where the volumes bound to a StatefulSet pod's claims are kept, outliving the pod.
    pub claims: Option<PathBuf>,
    /// The Secrets the pod's volumes name, which the operator creates: name → key → contents.
    pub secrets: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
}

pub struct Pod {
    pub name: String,
    pub started: Instant,
    /// The pod's volumes and logs, removed with it.
    _dir: tempfile::TempDir,
    network: Arc<Network>,
    volumes: Arc<Volumes>,
    containers: Vec<Arc<ContainerState>>,
    grace_period: Duration,
    stopping: Arc<AtomicBool>,
    kubelet: Option<JoinHandle<()>>,
}

impl Pod {
    /// Reads the pod of a `render --format k8s` stream, unpacks the images its containers name
    /// from `images` and makes its volumes, without starting anything. Panics, saying what the
    /// layout holds, when an image reference names nothing in it (a digest it does not hold).
    pub fn prepare(yaml: &str, images: &Images) -> Prepared {
        Pod::prepare_placed(yaml, images, &Placement::default())
    }

    /// [`Pod::prepare`] for the pod `placement` says: its ordinal, its claims, its Secrets.
    pub fn prepare_placed(yaml: &str, images: &Images, placement: &Placement) -> Prepared {
        let manifest = Manifest::parse(yaml);
        let dir = crate::short_tempdir();
        // The containers' users bind their roots and volumes from here: they may pass through.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod the pod directory");
        std::fs::create_dir(dir.path().join("logs")).expect("create the log directory");
        let containers = dir.path().join("containers");
        std::fs::create_dir(&containers).expect("create the containers' directory");
        std::fs::set_permissions(&containers, std::fs::Permissions::from_mode(0o711))
            .expect("chmod the containers' directory");
        let unpacked = dir.path().join("images");
        std::fs::create_dir(&unpacked).expect("create the images' directory");
        let mut pod_images = PodImages::new(images, &unpacked);
        let volumes = Volumes::create(dir.path(), &manifest, placement);
        let hostname = format!("{}-{}", manifest.name, placement.ordinal);
        let etc = EtcFiles::write(dir.path(), &hostname);
        let sandboxes = manifest
            .init_containers()
            .iter()
            .chain(manifest.containers())
            .map(|spec| {
                assert!(
                    manifest::is_sidecar(spec) || manifest.containers().contains(spec),
                    "the pod harness does not emulate init containers that run to completion ({})",
                    spec.name
                );
                let reference = spec
                    .image
                    .as_deref()
                    .unwrap_or_else(|| panic!("{} has no image", spec.name));
                let image = pod_images
                    .get(reference)
                    .unwrap_or_else(|e| panic!("container {}: {e}", spec.name));
                let sandbox = Sandbox::of(
                    spec,
                    &manifest.spec,
                    &hostname,
                    &volumes,
                    &image,
                    &etc,
                    &containers,
                );
                (spec.name.clone(), sandbox)
            })
            .collect();
        Prepared {
            manifest,
            dir,
            volumes,
            sandboxes,
        }
    }

    /// Starts the pod of a `render --format k8s` stream in `network`: sysctls, volumes, then
    /// the containers in the kubelet's order (on a thread of its own; see [`Pod::wait_ready`]).
    pub fn start(yaml: &str, images: &Images, network: Network) -> Pod {
        Pod::prepare(yaml, images).start(network)
    }

    /// [`Pod::start`] for the pod `placement` says.
    pub fn start_placed(
        yaml: &str,
        images: &Images,
        network: Network,
        placement: &Placement,
    ) -> Pod {
        Pod::prepare_placed(yaml, images, placement).start(network)
    }

    pub fn network(&self) -> &Network {
        &self.network
    }

    /// The CSI volumes' driver: renewals and the fingerprints on disk.
    pub fn volumes(&self) -> &Volumes {
        &self.volumes
    }

    /// Every container's readiness probe passes (a container without one: it runs).
    pub fn is_ready(&self) -> bool {
        self.containers
            .iter()
            .all(|c| c.ready.load(Ordering::SeqCst))
    }

    /// Waits until the pod is Ready; returns how long it took since it started, or a report of
    /// every container's state on timeout.
    pub fn wait_ready(&self, timeout: Duration) -> Result<Duration, String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.is_ready() {
                return Ok(self.started.elapsed());
            }
            std::thread::sleep(TICK);
        }
        Err(format!(
            "the pod is not Ready after {timeout:?}\n{}",
            self.describe()
        ))
    }

    /// Waits for the first exit of `container`.
    pub fn wait_for_exit(&self, container: &str, timeout: Duration) -> Option<Exit> {
        let c = self.container(container);
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(exit) = lock(&c.exits).first() {
                return Some(exit.clone());
            }
            std::thread::sleep(TICK);
        }
        None
    }

    /// When `container` first started, and when its startup probe passed, since the pod started.
    pub fn timeline(&self, container: &str) -> (Option<Duration>, Option<Duration>) {
        let c = self.container(container);
        (*lock(&c.started_at), *lock(&c.startup_passed_at))
    }

    /// The sandbox `container` runs in.
    pub fn sandbox(&self, container: &str) -> &Sandbox {
        &self.container(container).sandbox
    }

    /// The PID of `container`'s running process, as this machine numbers it.
    pub fn pid(&self, container: &str) -> Option<i32> {
        lock(&self.container(container).process)
            .as_ref()
            .map(|p| p.pid)
    }

    /// What `container` wrote to stdout and stderr, every run of it.
    pub fn logs(&self, container: &str) -> String {
        std::fs::read_to_string(&self.container(container).log).unwrap_or_default()
    }

    /// Kubernetes' deletion of the pod: every container's preStop hook runs and is followed by
    /// SIGTERM; containers still running at the end of the grace period are killed. Sidecars
    /// stop after the containers, last started first. Returns when every process has exited.
    pub fn delete(&mut self) -> Vec<Stopped> {
        self.stopping.store(true, Ordering::SeqCst);
        let deleted = Instant::now();
        let deadline = deleted + self.grace_period;
        let stop = |c: Arc<ContainerState>, deadline: Instant| {
            std::thread::spawn(move || terminate(&c, deleted, deadline))
        };
        let mut stopped: Vec<Stopped> = self
            .containers
            .iter()
            .filter(|c| !c.sidecar)
            .map(|c| stop(c.clone(), deadline))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().expect("stop a container"))
            .collect();
        for c in self.containers.iter().rev().filter(|c| c.sidecar) {
            // A sidecar gets what is left of the grace period, and at least 2 s.
            let deadline = deadline.max(Instant::now() + Duration::from_secs(2));
            stopped.push(stop(c.clone(), deadline).join().expect("stop a sidecar"));
        }
        if let Some(kubelet) = self.kubelet.take() {
            let _ = kubelet.join();
        }
        stopped
    }

    /// Each container's state, exits, last probe failure and the end of its log.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for c in &self.containers {
            out.push_str(&format!(
                "container {}: runs {}, running {}, ready {}, exits {:?}, last probe failure {:?}\n",
                c.name,
                c.runs.load(Ordering::SeqCst),
                c.running(),
                c.ready.load(Ordering::SeqCst),
                lock(&c.exits),
                lock(&c.last_probe_failure),
            ));
            let log = self.logs(&c.name);
            for note in log.lines().filter(|l| l.starts_with("--- kubelet:")) {
                out.push_str(&format!("  {}| {note}\n", c.name));
            }
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            for line in tail.into_iter().rev() {
                out.push_str(&format!("  {}| {line}\n", c.name));
            }
        }
        out
    }

    fn container(&self, name: &str) -> &ContainerState {
        self.containers
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("the pod has no container {name}"))
    }
}

/// A pod whose volumes exist and whose containers' sandboxes are known, not started.
pub struct Prepared {
    pub manifest: Manifest,
    pub dir: tempfile::TempDir,
    pub volumes: Volumes,
    /// Each container's sandbox, by name, in the kubelet's start order.
    pub sandboxes: Vec<(String, Sandbox)>,
}

impl Prepared {
    /// Starts the pod in `network`: its sysctls, then its containers in the kubelet's order.
    pub fn start(self, network: Network) -> Pod {
        let Prepared {
            manifest,
            dir,
            volumes,
            sandboxes,
        } = self;
        for sysctl in manifest
            .spec
            .security_context
            .as_ref()
            .and_then(|s| s.sysctls.as_deref())
            .unwrap_or_default()
        {
            network.set_sysctl(&sysctl.name, &sysctl.value);
        }
        let containers: Vec<Arc<ContainerState>> = manifest
            .init_containers()
            .iter()
            .chain(manifest.containers())
            .zip(sandboxes)
            .map(|(spec, (_, sandbox))| {
                Arc::new(ContainerState {
                    name: spec.name.clone(),
                    spec: spec.clone(),
                    sidecar: manifest::is_sidecar(spec),
                    sandbox,
                    log: dir.path().join("logs").join(format!("{}.log", spec.name)),
                    process: Mutex::new(None),
                    runs: AtomicU32::new(0),
                    exits: Mutex::new(Vec::new()),
                    started_at: Mutex::new(None),
                    startup_passed_at: Mutex::new(None),
                    ready: AtomicBool::new(false),
                    last_probe_failure: Mutex::new(None),
                    stopping: AtomicBool::new(false),
                    supervisor: Mutex::new(None),
                })
            })
            .collect();
        let volumes = Arc::new(volumes);
        let grace_period = Duration::from_secs(
            manifest
                .spec
                .termination_grace_period_seconds
                .map_or(30, |s| u64::try_from(s).unwrap_or(30)),
        );
        let mut pod = Pod {
            name: manifest.name.clone(),
            started: Instant::now(),
            _dir: dir,
            network: Arc::new(network),
            volumes,
            containers,
            grace_period,
            stopping: Arc::new(AtomicBool::new(false)),
            kubelet: None,
        };
        let (containers, network, stopping, started) = (
            pod.containers.clone(),
            pod.network.clone(),
            pod.stopping.clone(),
            pod.started,
        );
        pod.kubelet = Some(std::thread::spawn(move || {
            for c in &containers {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                supervise(c.clone(), network.clone(), started);
                // The next container starts once a sidecar's startup probe has passed.
                if c.sidecar && c.spec.startup_probe.is_some() {
                    while lock(&c.startup_passed_at).is_none() {
                        if stopping.load(Ordering::SeqCst) {
                            return;
                        }
                        std::thread::sleep(TICK);
                    }
                }
            }
        }));
        pod
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if std::thread::panicking() {
            eprintln!("{}", self.describe());
        }
        if let Some(kubelet) = self.kubelet.take() {
            let _ = kubelet.join();
        }
        for c in &self.containers {
            c.stopping.store(true, Ordering::SeqCst);
            let Some(supervisor) = lock(&c.supervisor).take() else {
                continue;
            };
            // PID 1 of a PID namespace: killing it ends every process in it (sozu's workers).
            // Again until the supervisor is done, in case it was starting a run (the pidfd
            // makes a repeated signal harmless).
            while !supervisor.is_finished() {
                c.signal(Signal::SIGKILL, "pod dropped");
                std::thread::sleep(TICK * 10);
            }
            let _ = supervisor.join();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `c` and restarts it when it exits, with the kubelet's back-off, until it is stopping.
fn supervise(c: Arc<ContainerState>, network: Arc<Network>, pod_started: Instant) {
    let state = c.clone();
    let handle = std::thread::spawn(move || {
        network.enter();
        let mut backoff = BACKOFF_START;
        loop {
            if c.stopping.load(Ordering::SeqCst) {
                return;
            }
            let run = c.runs.fetch_add(1, Ordering::SeqCst) + 1;
            c.note(&format!("run {run}"));
            let mut running = match sandbox::spawn(c.sandbox.command(), &c.log) {
                Ok(running) => running,
                Err(e) => panic!("cannot start container {}: {e}", c.name),
            };
            *lock(&c.process) = Some(running.process.clone());
            lock(&c.started_at).get_or_insert(pod_started.elapsed());
            let probes = start_probes(&c, run, &network, pod_started);
            let status = running.child.wait().expect("wait for a container");
            *lock(&c.process) = None;
            c.ready.store(false, Ordering::SeqCst);
            lock(&c.exits).push(Exit {
                at: pod_started.elapsed(),
                code: status.code(),
                signal: std::os::unix::process::ExitStatusExt::signal(&status),
            });
            c.note(&format!("exited: {status}"));
            let _ = probes.join();
            let wake = Instant::now() + backoff;
            while Instant::now() < wake {
                if c.stopping.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(TICK * 10);
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    });
    *lock(&state.supervisor) = Some(handle);
}

/// The probes of one run of `c`: startup first (when declared), then readiness and liveness,
/// until the run ends.
fn start_probes(
    c: &Arc<ContainerState>,
    run: u32,
    network: &Arc<Network>,
    pod_started: Instant,
) -> JoinHandle<()> {
    let (c, network) = (c.clone(), network.clone());
    std::thread::spawn(move || {
        network.enter();
        let alive = || c.runs.load(Ordering::SeqCst) == run && c.running();
        let spec = &c.spec;
        if let Some(startup) = &spec.startup_probe {
            if !run_startup_probe(&c, &Prober::new(startup, spec), &alive, pod_started) {
                return;
            }
        }
        let readiness = spec.readiness_probe.as_ref().map(|p| Prober::new(p, spec));
        let liveness = spec.liveness_probe.as_ref().map(|p| Prober::new(p, spec));
        if readiness.is_none() {
            c.ready.store(true, Ordering::SeqCst);
        }
        std::thread::scope(|scope| {
            if let Some(liveness) = &liveness {
                scope.spawn(|| {
                    network.enter();
                    run_probe_loop(&c, "liveness", liveness, &alive);
                });
            }
            if let Some(readiness) = &readiness {
                run_probe_loop(&c, "readiness", readiness, &alive);
            }
        });
    })
}

/// Probes until the startup probe passes (true) or fails `failureThreshold` times in a row, which
/// kills the container (false).
fn run_startup_probe(
    c: &ContainerState,
    prober: &Prober,
    alive: &(impl Fn() -> bool + Sync),
    pod_started: Instant,
) -> bool {
    std::thread::sleep(prober.initial_delay);
    let mut failures = 0;
    while alive() {
        let next = Instant::now() + prober.period;
        match prober.probe() {
            Ok(()) => {
                lock(&c.startup_passed_at).get_or_insert(pod_started.elapsed());
                return true;
            }
            Err(e) => {
                failures += 1;
                *lock(&c.last_probe_failure) = Some(format!("startup: {e}"));
                if failures >= prober.failure_threshold {
                    c.signal(Signal::SIGKILL, "startup probe failed");
                    return false;
                }
            }
        }
        sleep_until(next, alive);
    }
    false
}

/// Readiness sets the container's Ready flag; liveness kills the container after
/// `failureThreshold` failures in a row.
fn run_probe_loop(
    c: &ContainerState,
    kind: &str,
    prober: &Prober,
    alive: &(impl Fn() -> bool + Sync),
) {
    std::thread::sleep(prober.initial_delay);
    let (mut successes, mut failures) = (0, 0);
    while alive() {
        let next = Instant::now() + prober.period;
        match prober.probe() {
            Ok(()) => {
                successes += 1;
                failures = 0;
                if kind == "readiness" && successes >= prober.success_threshold {
                    c.ready.store(true, Ordering::SeqCst);
                }
            }
            Err(e) => {
                successes = 0;
                failures += 1;
                *lock(&c.last_probe_failure) = Some(format!("{kind}: {e}"));
                if failures >= prober.failure_threshold {
                    if kind == "readiness" {
                        c.ready.store(false, Ordering::SeqCst);
                    } else {
                        c.signal(Signal::SIGKILL, "liveness probe failed");
                        return;
                    }
                }
            }
        }
        sleep_until(next, alive);
    }
}

fn sleep_until(when: Instant, alive: &impl Fn() -> bool) {
    while Instant::now() < when && alive() {
        std::thread::sleep(TICK);
    }
}

/// One container's deletion: its preStop hook (a sleep), SIGTERM, SIGKILL at `deadline`.
fn terminate(c: &ContainerState, deleted: Instant, deadline: Instant) -> Stopped {
    c.stopping.store(true, Ordering::SeqCst);
    let pre_stop = c
        .spec
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .and_then(|h| h.sleep.as_ref())
        .map(|s| Duration::from_secs(u64::try_from(s.seconds).unwrap_or(0)));
    if let Some(pause) = pre_stop {
        let until = (Instant::now() + pause).min(deadline);
        while Instant::now() < until && c.running() {
            std::thread::sleep(TICK);
        }
    }
    let mut sigterm_at = None;
    if c.running() {
        c.signal(Signal::SIGTERM, "deletion");
        sigterm_at = Some(deleted.elapsed());
    }
    let exited = |c: &ContainerState| !c.running();
    while !exited(c) && Instant::now() < deadline {
        std::thread::sleep(TICK);
    }
    let killed = !exited(c);
    if killed {
        c.signal(Signal::SIGKILL, "grace period over");
        while !exited(c) {
            std::thread::sleep(TICK);
        }
    }
    let exited_at = Some(deleted.elapsed());
    if let Some(supervisor) = lock(&c.supervisor).take() {
        let _ = supervisor.join();
    }
    Stopped {
        name: c.name.clone(),
        sigterm_at,
        exited_at,
        code: lock(&c.exits).last().and_then(|e| e.code),
        killed,
    }
}
