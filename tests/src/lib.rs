//! Harness for integration tests: locates the pinned sozu, a fresh agent binary and the container
//! images made of both, makes short temporary directories (UNIX socket paths are limited to ~100
//! bytes) and test certificates; runs the rendered pod as a kubelet would ([`kubelet`]) and puts
//! HTTPS load on it ([`load`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The sozu version the project is tested against; `scripts/ensure-sozu` installs it.
pub const SOZU_VERSION: &str = "2.3.3";

/// The pinned sozu binary: `$SOZU_BIN`, else the cache `scripts/ensure-sozu` builds into.
pub fn sozu_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("SOZU_BIN") {
        return PathBuf::from(path);
    }
    let cache = std::env::var_os("SOZU_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("private-ingress"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/private-ingress"))
        })
        .expect("neither SOZU_BIN, SOZU_CACHE_DIR, XDG_CACHE_HOME nor HOME is set");
    let bin = cache.join(format!("sozu-{SOZU_VERSION}/bin/sozu"));
    assert!(
        bin.is_file(),
        "sozu {SOZU_VERSION} not found at {}: run scripts/ensure-sozu (or scripts/test), or set SOZU_BIN",
        bin.display()
    );
    bin
}

/// The `private-ingress` binary: `$PRIVATE_INGRESS_BIN` when set (scripts/test points it at the
/// binary it has just built), else built once per test run with the profile of the tests
/// themselves, so a test never runs a stale agent. A debug build (the tests') has the
/// `test-hooks` feature, which the ACME and supervision tests need; a release build (the
/// benches') is the product as users get it.
pub fn agent_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(path) = std::env::var_os("PRIVATE_INGRESS_BIN") {
            return PathBuf::from(path);
        }
        let exe = std::env::current_exe().expect("current_exe");
        // target/<profile>/deps/<test binary>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test binary lives in target/<profile>/deps");
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build.args([
            "build",
            "--quiet",
            "-p",
            "private-ingress",
            "--bin",
            "private-ingress",
        ]);
        if release {
            build.arg("--release");
        } else {
            build.args(["--features", "test-hooks"]);
        }
        // Cargo describes the running test's package in the environment. Passed on to this
        // build, that counts as a changed environment for build scripts that watch it (ring's
        // does), and the test build and this one would rebuild those crates for each other every
        // time. The user's own cargo settings (CARGO_HOME, CARGO_TARGET_DIR, …) stay.
        const SET_FOR_THE_TEST: [&str; 6] = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
        ];
        for (name, _) in std::env::vars_os() {
            let name_str = name.to_string_lossy();
            if SET_FOR_THE_TEST.iter().any(|p| name_str.starts_with(p)) {
                build.env_remove(&name);
            }
        }
        let status = build.status().expect("run cargo build");
        assert!(status.success(), "building private-ingress failed");
        profile_dir.join("private-ingress")
    })
}

/// The OCI image layout holding the agent image (`private-ingress:<version>`, made of
/// [`agent_bin`]) and the sozu image (`sozu:<version>`, made of [`sozu_bin`]):
/// `$PRIVATE_INGRESS_IMAGES` when set (scripts/test builds it from the binaries it tests), else
/// built once per test run by `scripts/build-images`, the script that builds the release
/// images, into `target/<profile>/test-images`.
pub fn image_layout() -> &'static Path {
    static LAYOUT: OnceLock<PathBuf> = OnceLock::new();
    LAYOUT.get_or_init(|| {
        if let Some(path) = std::env::var_os("PRIVATE_INGRESS_IMAGES") {
            let path = PathBuf::from(path);
            assert!(
                path.join("index.json").is_file(),
                "PRIVATE_INGRESS_IMAGES={}: no OCI image layout there (no index.json); \
                 scripts/build-images --agent-bin <agent> --sozu-bin <sozu> --out <dir> builds one",
                path.display()
            );
            return path;
        }
        let exe = std::env::current_exe().expect("current_exe");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("test binary lives in target/<profile>/deps");
        let out = profile_dir.join("test-images");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-images");
        let (code, stdout, stderr) = run(Command::new(script)
            .arg("--agent-bin")
            .arg(agent_bin())
            .arg("--sozu-bin")
            .arg(sozu_bin())
            .arg("--out")
            .arg(&out));
        assert_eq!(code, 0, "scripts/build-images failed:\n{stdout}\n{stderr}");
        out
    })
}

/// A temporary directory with a short path under /tmp.
pub fn short_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("pi-")
        .tempdir_in("/tmp")
        .expect("create a temporary directory")
}

/// Writes a self-signed certificate for `host` as `<tls_dir>/<host>/{tls.crt,tls.key}`, the layout
/// the CSI driver produces, and returns the certificate PEM.
pub fn write_certificate(tls_dir: &Path, host: &str) -> String {
    let certified = rcgen::generate_simple_self_signed(vec![host.to_owned()])
        .expect("generate a test certificate");
    let dir = tls_dir.join(host);
    std::fs::create_dir_all(&dir).expect("create the host directory");
    let pem = certified.cert.pem();
    std::fs::write(dir.join("tls.crt"), &pem).expect("write tls.crt");
    std::fs::write(dir.join("tls.key"), certified.signing_key.serialize_pem())
        .expect("write tls.key");
    pem
}

/// Runs a command and returns (exit code, stdout, stderr); the command line goes with any panic.
pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd
        .output()
        .unwrap_or_else(|err| panic!("cannot run {cmd:?}: {err}"));
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

pub mod acme;
pub mod admin_clients;
pub mod bench;
pub mod corpus;
pub mod devices;
pub mod kubelet;
pub mod live;
pub mod load;
pub mod soak;
pub mod tui;
