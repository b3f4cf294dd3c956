//! Bad certificate pairs through the running agent: the last good one keeps serving.
//!
//! The rotation issue's bad-input corpus (tests/src/corpus.rs): each kind is swapped into one
//! served host's volume in turn; the agent must report its reason in `/v1/state`, keep the last
//! good certificate in every handshake and keep routing, count each refusal by reason in
//! `/metrics`, leak no key bytes anywhere, and still take the next good pair.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use private_ingress_tests::corpus::{Kind, Volume, HOST};
use private_ingress_tests::live::{eventually, https_get, route_of, Backend, Stack};

/// How long the agent may take to notice a swap and publish its verdict. A host's pass takes a
/// few milliseconds; this is generous so a loaded CI machine does not flake.
const VERDICT: Duration = Duration::from_secs(10);

/// sozu and the agent serving [`HOST`] from a good pair written the AtomicWriter way.
struct Serving {
    stack: Stack,
    backend: Backend,
    volume: Volume,
    /// The fingerprint of the good pair being served.
    good: String,
    /// Every private key written so far.
    keys: Vec<String>,
}

fn serving() -> Serving {
    let mut stack = Stack::new();
    let backend = Backend::start("corpus-backend");
    let mut volume = Volume::new(stack.tls_dir().join(HOST));
    let first = volume.write_good();
    let good = first.fingerprint.expect("a good pair's fingerprint");
    stack.serve_one(HOST, &backend);
    let seen = https_get(stack.https, HOST, "/").expect("HTTPS through sozu");
    assert_eq!(seen.fingerprint, good, "the first good pair is served");
    Serving {
        stack,
        backend,
        volume,
        good,
        keys: first.keys,
    }
}

/// The route's `certificate` object in the agent's `/v1/state`.
fn certificate(state: &serde_json::Value) -> Option<&serde_json::Value> {
    route_of(state, HOST).map(|r| &r["certificate"])
}

/// Polls `/v1/state` until the route reports one of `kind`'s reasons with a message; returns
/// (reason, message). On timeout, panics with the last state seen (the stack prints the logs).
fn refused(stack: &Stack, kind: Kind) -> (String, String) {
    let expected = kind.reason();
    let deadline = Instant::now() + VERDICT;
    loop {
        let state = stack.state();
        if let Some(cert) = state.as_ref().and_then(certificate) {
            if let (Some(reason), Some(error)) =
                (cert["error_reason"].as_str(), cert["error"].as_str())
            {
                if reason == expected {
                    return (reason.to_owned(), error.to_owned());
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "{}: no error_reason {expected} after {VERDICT:?}; last /v1/state:\n{}",
            kind.name(),
            state.map_or("(unreachable)".into(), |s| format!("{s:#}"))
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last good certificate is still what sozu holds and what a fresh handshake presents, and
/// requests still reach the backend.
fn still_serves(stack: &Stack, backend: &Backend, good: &str, kind: Kind) {
    let state = stack.state().expect("/v1/state");
    let served = &certificate(&state).expect("the route in /v1/state")["served_fingerprints"];
    assert_eq!(
        served,
        &serde_json::json!([good]),
        "{}: sozu should hold the last good certificate only; /v1/state:\n{state:#}",
        kind.name()
    );
    let seen = https_get(stack.https, HOST, "/")
        .unwrap_or_else(|e| panic!("{}: HTTPS failed: {e}", kind.name()));
    assert_eq!(
        seen.fingerprint,
        good,
        "{}: the handshake no longer presents the last good certificate",
        kind.name()
    );
    assert_eq!(
        (seen.status, seen.body.as_str()),
        (200, backend.name.as_str()),
        "{}: the request did not reach the backend",
        kind.name()
    );
}

/// The agent is still live: a new good pair reaches the handshake, the route's error clears and
/// requests reach the backend.
fn renews(stack: &Stack, backend: &Backend, volume: &mut Volume) {
    let renewed = volume
        .write_good()
        .fingerprint
        .expect("a good pair's fingerprint");
    eventually(
        VERDICT,
        "the handshake to present the renewed certificate",
        || {
            https_get(stack.https, HOST, "/")
                .ok()
                .filter(|seen| seen.fingerprint == renewed)
        },
    );
    eventually(VERDICT, "the route's certificate error to clear", || {
        let state = stack.state()?;
        let cert = certificate(&state)?;
        (cert["error"].is_null() && cert["error_reason"].is_null()).then_some(())
    });
    let seen = https_get(stack.https, HOST, "/").expect("HTTPS after the renewal");
    assert_eq!(
        (seen.fingerprint.as_str(), seen.status, seen.body.as_str()),
        (renewed.as_str(), 200, backend.name.as_str())
    );
}

/// The `private_ingress_certificate_failures_total` series, by reason.
fn failures_by_reason(metrics: &str) -> BTreeMap<String, u64> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("private_ingress_certificate_failures_total{reason=\""))
        .filter_map(|rest| {
            let (reason, value) = rest.split_once("\"} ")?;
            Some((reason.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// The base64 body lines of a PEM private key: what would show if key bytes leaked.
fn key_lines(pem: &str) -> impl Iterator<Item = &str> {
    pem.lines().filter(|l| {
        l.len() >= 20
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
    })
}

#[test]
fn every_bad_pair_is_refused_with_its_reason_while_the_last_good_one_serves() {
    for pair in Kind::ALL.windows(2) {
        assert!(
            pair[0].reason() != pair[1].reason(),
            "neighbours {:?} and {:?} share a reason: the second step would prove nothing",
            pair[0],
            pair[1]
        );
    }
    let Serving {
        stack,
        backend,
        mut volume,
        good,
        mut keys,
    } = serving();
    let started = Instant::now();

    let mut counted: BTreeMap<String, u64> = BTreeMap::new();
    for kind in Kind::ALL {
        keys.extend(volume.write(kind).keys);
        let (reason, error) = refused(&stack, kind);
        assert!(!error.is_empty(), "{}: an empty error message", kind.name());
        *counted.entry(reason).or_default() += 1;
        still_serves(&stack, &backend, &good, kind);
    }

    // Each refusal counted once, under the reason it was reported with.
    let metrics = stack.metrics();
    assert_eq!(
        failures_by_reason(&metrics),
        counted,
        "private_ingress_certificate_failures_total by reason; /metrics:\n{metrics}"
    );

    // No byte of any key written, good or bad, in anything the agent says.
    let state = stack.state().expect("/v1/state").to_string();
    let logs = stack.agent_logs();
    for key in &keys {
        for line in key_lines(key) {
            for (what, text) in [
                ("logs", &logs),
                ("/v1/state", &state),
                ("/metrics", &metrics),
            ] {
                assert!(
                    !text.contains(line),
                    "key bytes in the agent's {what}: {line}"
                );
            }
        }
    }

    renews(&stack, &backend, &mut volume);
    eprintln!(
        "{} kinds refused and a renewal taken in {:?}",
        Kind::ALL.len(),
        started.elapsed()
    );
}
