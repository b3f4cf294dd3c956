use std::time::Duration;

use private_ingress_tests::soak::{run, SoakConfig};

/// A short soak of a fixed seed, every run: rotations, bad pairs, workspace edits, sozu and the
/// agent killed and restarted, with checkpoints on what clients see (see the `soak` module).
/// `SOAK_SEED` and `SOAK_SECONDS` replay or lengthen it; `cargo bench -p private-ingress-tests
/// --bench soak` runs long ones.
#[test]
fn a_seeded_soak_of_rotations_edits_and_kills_converges_at_every_checkpoint() {
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_201);
    let seconds = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let report = run(&SoakConfig {
        seed,
        duration: Duration::from_secs(seconds),
        hosts: 12,
        resync: 0,
    });
    eprintln!(
        "soak seed {seed}, {seconds} s: {} checkpoints, slowest convergence {:?}, actions {:?}, \
         {} bytes echoed whole over a TCP stream opened {} time(s), {} WebSocket messages echoed \
         over WebSockets opened {} time(s)",
        report.checkpoints,
        report.slowest_convergence,
        report.actions,
        report.stream_bytes,
        report.stream_opened,
        report.websocket_messages,
        report.websockets_opened
    );
    assert!(report.checkpoints >= 3, "{report:?}");
    assert!(
        report.stream_bytes > 0,
        "no byte went through the 'tcp route: {report:?}"
    );
    assert!(
        report.websocket_messages > 0,
        "no WebSocket message went through the HTTPS route: {report:?}"
    );
    assert!(
        report.failures.is_empty(),
        "seed {seed}: {} failures:\n{}",
        report.failures.len(),
        report.failures.join("\n")
    );
}
