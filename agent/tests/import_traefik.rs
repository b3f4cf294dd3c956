//! `import traefik` with the binary: Orca's directory and Atlas's answer written into a
//! workspace `check` accepts, each router not carried over said with its file, line and reason,
//! and an input that cannot be read writing nothing.

use crate::common::{assert_golden, bin, run};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/import/traefik")
        .join(name)
}

#[test]
fn orcas_directory_and_atlass_answer_import_into_a_workspace_check_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("workspace.ncl");
    let (code, stdout, err) = run(bin()
        .current_dir(fixture(""))
        .args([
            "import",
            "traefik",
            "orca",
            "atlas/config.json",
            "closed.toml",
        ])
        .args(["--zone", "in.example.org", "--output"])
        .arg(&out));
    assert_eq!(code, 1, "{err}");
    assert_eq!(stdout, "");
    for says in [
        "left out: atlas/config.json:14: http router `status`: not served: a router on the HTTPS entry point without `tls` serves plain HTTP there",
        "left out: closed.toml:2: http router `admin`: not served: middleware `office-only`: `ipAllowList` is not carried",
        "left out: closed.toml:8: http router `grafana`: not served: middleware `users`: `basicAuth` is not carried: its users' hashes (MD5 `$apr1$`)",
        "4 routers carried (4 routes), 3 left out",
    ] {
        assert!(err.contains(says), "{says}\n{err}");
    }
    assert!(
        !err.contains("Xr8q3kZm"),
        "a password hash is never shown: {err}"
    );
    let text = std::fs::read_to_string(&out).unwrap();
    assert_golden(&fixture("expected.ncl"), &text, "import traefik");
    let (code, stdout, err) = run(bin().arg("check").arg(&out));
    assert_eq!(code, 0, "{err}\n{text}");
    assert!(
        stdout.contains("4 routes in zone in.example.org"),
        "{stdout}"
    );
}

#[test]
fn every_router_carried_exits_0_and_writes_to_stdout() {
    let (code, stdout, err) = run(bin().current_dir(fixture("")).args([
        "import",
        "traefik",
        "orca",
        "--zone",
        "in.example.org",
    ]));
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("# orca/orca-api.yaml:3: http router `orca-api`"),
        "{stdout}"
    );
    assert!(
        err.contains("2 routers carried (2 routes), 0 left out"),
        "{err}"
    );
}

#[test]
fn an_input_that_cannot_be_read_exits_2_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("workspace.ncl");
    std::fs::write(&out, "previous\n").unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, "http:\n  routers:\n    a: [\n").unwrap();
    for (input, says) in [
        (broken.clone(), "broken.yaml:"),
        (dir.path().join("missing.yaml"), "cannot read"),
    ] {
        let (code, _, err) = run(bin()
            .args(["import", "traefik"])
            .arg(&input)
            .args(["--zone", "in.example.org", "--output"])
            .arg(&out));
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(says), "{says}: {err}");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "previous\n");
    }
}
