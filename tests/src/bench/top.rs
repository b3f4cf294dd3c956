//! `top` attached to a running agent, for the benches: on a pseudo-terminal of its own (a real
//! screen, drawn and diffed as a person's would be), reading `/v1/state` every `refresh` and
//! following `/v1/events`. And what it costs the agent: the agent's CPU over a while with no
//! client, then with one `top`, beside the reference the target is stated in, a Prometheus
//! scrape (gzip, as Prometheus asks), and what one `/v1/state` costs answered whole or `304`.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::mass::cpu;
use super::ours;
use super::workload::Pair;
use crate::live::Backend;
use crate::tui::Tui;

/// `top` on a 40 × 120 terminal, against the agent at `admin`, once its first screen is drawn.
pub fn attach(admin: SocketAddr, refresh: Duration) -> Tui {
    let mut command = Command::new(crate::agent_bin());
    command
        .args(["top", "--refresh", &format!("{}", refresh.as_secs_f64())])
        .arg("--admin-address")
        .arg(admin.to_string());
    let tui = Tui::start(&mut command, 40, 120);
    tui.wait_for(&["private-ingress top", "ready"], Duration::from_secs(120));
    tui
}

pub struct Cost {
    pub routes: usize,
    pub measured: Duration,
    /// The agent's CPU (user + system) over `measured`, with no client, then with `top`.
    pub idle: Duration,
    pub attached: Duration,
    /// `top`'s own CPU over the same `measured`.
    pub top_itself: Duration,
    pub refresh: Duration,
    /// The agent's CPU for one `/metrics` scrape (gzip), one `/v1/state` answered whole after a
    /// change, and one answered `304`; and `/v1/state`'s size.
    pub scrape: Duration,
    pub state_full: Duration,
    pub state_304: Duration,
    pub state_bytes: usize,
    /// Requests a second the load thread sent, spread over the routes (the traffic moves, so
    /// `/v1/state` changes at every read).
    pub load_rate: f64,
}

fn host(i: usize) -> String {
    format!("t{i}.in.example.org")
}

/// The agent at `routes` routes with traffic, its CPU over `minutes` without then with `top`.
pub fn cost(routes: usize, measured: Duration, refresh: Duration) -> Result<Cost, String> {
    assert!(routes > 0, "at least one route");
    let backend = Backend::start("app");
    let pairs: Vec<Pair> = (0..routes).map(|i| Pair::new(&host(i))).collect();
    let hosts: Vec<(String, &Pair)> = pairs
        .iter()
        .enumerate()
        .map(|(i, p)| (host(i), p))
        .collect();
    let ours = ours::serve_sending_traffic(&hosts, backend.address, "warn")?;
    let pid = ours.stack.agent_pid().ok_or("the agent is not running")?;
    let (https, admin) = (ours.stack.https, ours.stack.admin);

    // Traffic throughout, the same in both phases: about 20 requests a second, route after
    // route, so that every read of `/v1/state` finds the figures moved.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut sent, started) = (0usize, Instant::now());
            while !stop.load(Ordering::Relaxed) {
                let _ = crate::live::https_get(https, &host(sent % routes), "/");
                sent += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            sent as f64 / started.elapsed().as_secs_f64()
        })
    };
    // Settled: the start's work done, the first records counted.
    std::thread::sleep(Duration::from_secs(10));

    let before = cpu(pid);
    std::thread::sleep(measured);
    let idle = cpu(pid).saturating_sub(before);

    let tui = attach(admin, refresh);
    let top_pid = tui.pid();
    std::thread::sleep(refresh * 2);
    let (before, top_before) = (cpu(pid), cpu(top_pid));
    std::thread::sleep(measured);
    let attached = cpu(pid).saturating_sub(before);
    let top_itself = cpu(top_pid).saturating_sub(top_before);
    drop(tui);

    // The references, one request at a time, averaged over enough to see past 10 ms ticks.
    let per = |n: u32, mut request: Box<dyn FnMut() -> Result<usize, String>>| {
        let before = cpu(pid);
        let mut bytes = 0;
        for _ in 0..n {
            bytes = request()?;
            // The traffic figures move at least every second: each full read is a new body.
        }
        Ok::<_, String>(((cpu(pid).saturating_sub(before)) / n, bytes))
    };
    let (scrape, _) = per(
        20,
        Box::new(move || get(admin, "/metrics", &[("Accept-Encoding", "gzip")]).map(|(_, b)| b)),
    )?;
    // A whole `/v1/state` after a change: the traffic moves every second, so one a second.
    let (state_full, state_bytes) = per(
        10,
        Box::new(move || {
            std::thread::sleep(Duration::from_millis(1_100));
            get(admin, "/v1/state", &[]).map(|(_, b)| b)
        }),
    )?;
    // `304`s: the load stopped, the tag of the body as it is now sent back. The figures still
    // move as the window slides, every 5 s at most: a tag gone stale is taken again.
    stop.store(true, Ordering::Relaxed);
    let load_rate = load.join().map_err(|_| "the load thread panicked")?;
    let (mut not_modified, mut asked) = (0u32, 0u32);
    let (_, mut etag) = get_etag(admin)?;
    let before = cpu(pid);
    while not_modified < 500 && asked < 2_000 {
        asked += 1;
        match get(admin, "/v1/state", &[("If-None-Match", &etag)])? {
            (304, _) => not_modified += 1,
            _ => etag = get_etag(admin)?.1,
        }
    }
    // The few whole bodies among them are counted in: an upper bound.
    let state_304 = cpu(pid).saturating_sub(before) / not_modified.max(1);
    Ok(Cost {
        routes,
        measured,
        idle,
        attached,
        top_itself,
        refresh,
        scrape,
        state_full,
        state_304,
        state_bytes,
        load_rate,
    })
}

/// One GET: (status, body length).
fn get(admin: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Result<(u16, usize), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut request = agent.get(&format!("http://{admin}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut response = request.call().map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_vec()
        .map_err(|e| e.to_string())?;
    Ok((status, body.len()))
}

/// `/v1/state` read whole: its length and its entity tag.
fn get_etag(admin: SocketAddr) -> Result<(usize, String), String> {
    let mut response = ureq::get(&format!("http://{admin}/v1/state"))
        .call()
        .map_err(|e| e.to_string())?;
    let etag = response
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .ok_or("no ETag on /v1/state")?
        .to_owned();
    let len = response
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_vec()
        .map_err(|e| e.to_string())?
        .len();
    Ok((len, etag))
}
