//! `import ingress` and `import gateway` with the binary: what they write is what `check`
//! accepts, what they leave out is said, and a bad input writes nothing.

use crate::common::{assert_golden, bin, run};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/import")
        .join(name)
}

/// The seed's Ingresses: written, accepted by `check`, the users file beside the workspace
/// (0600, the SHA-256 of the password), and what was left out on stderr with exit 1.
#[test]
fn the_seeds_ingresses_import_into_a_workspace_check_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("workspace.ncl");
    let (code, stdout, err) = run(bin()
        .current_dir(fixture(""))
        .args(["import", "ingress", "seed-ingress.yaml"])
        .args(["--zone", "in.librecloud.online", "--output"])
        .arg(&out));
    assert_eq!(code, 1, "{err}");
    assert_eq!(stdout, "");
    assert!(
        err.contains("left out: Secret longhorn-system/longhorn-auth"),
        "{err}"
    );
    assert!(
        err.contains(
            "the user `ops` left out: its password is kept as an Apache MD5 ($apr1$) hash"
        ),
        "{err}"
    );
    assert!(
        err.contains("the annotation `proxy-body-size` left out"),
        "{err}"
    );
    assert!(
        !err.contains("$apr1$Xr8q") && !err.contains("longhorn-admin"),
        "{err}"
    );
    assert!(err.contains("3 routes carried, 2 left out"), "{err}");

    let text = std::fs::read_to_string(&out).unwrap();
    assert_golden(&fixture("seed-ingress.ncl"), &text, "import ingress");
    let users = dir.path().join("longhorn-system-longhorn-auth.users");
    let meta = std::fs::metadata(&users).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // sha256("longhorn-admin")
    let expected = {
        let (_, hash, _) =
            run(std::process::Command::new("sh")
                .args(["-c", "printf %s longhorn-admin | sha256sum"]));
        format!("admin:{}\n", hash.split_whitespace().next().unwrap())
    };
    assert_eq!(std::fs::read_to_string(&users).unwrap(), expected);

    let (code, stdout, err) = run(bin().arg("check").arg(&out));
    assert_eq!(code, 0, "{err}\n{text}");
    assert!(
        stdout.contains("3 routes in zone in.librecloud.online"),
        "{stdout}"
    );
}

#[test]
fn the_seeds_httproutes_import_into_a_workspace_check_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let (code, text, err) = run(bin()
        .current_dir(fixture(""))
        .args(["import", "gateway", "seed-gateway.yaml"])
        .args(["--zone", "in.librecloud.online"]));
    assert_eq!(code, 0, "{err}");
    assert_golden(&fixture("seed-gateway.ncl"), &text, "import gateway");
    let out = dir.path().join("workspace.ncl");
    std::fs::write(&out, &text).unwrap();
    let (code, stdout, err) = run(bin().arg("check").arg(&out));
    assert_eq!(code, 0, "{err}\n{text}");
    assert!(
        stdout.contains("3 routes in zone in.librecloud.online"),
        "{stdout}"
    );
}

/// Each kind of bad input: exit 2, the document and field named, and the output left as it was.
#[test]
fn a_bad_input_is_named_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("workspace.ncl");
    std::fs::write(&out, "previous\n").unwrap();
    let seed = std::fs::read_to_string(fixture("seed-ingress.yaml")).unwrap();
    for (name, text, says) in [
        (
            "unknown-kind.yaml",
            format!("{seed}---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{ name: grafana }}\n"),
            "unknown-kind.yaml, document 6, kind: unknown kind `Deployment`",
        ),
        (
            "missing-service.yaml",
            seed.replace("name: grafana, namespace: observability", "name: grafana-old, namespace: observability"),
            "missing-service.yaml, document 1) spec.rules[0].http.paths[0].backend.service.port: Service observability/grafana is not in the input",
        ),
        (
            "port-name.yaml",
            seed.replace("{ name: web, port: 9090", "{ name: http, port: 9090"),
            "spec.rules[0].http.paths[0].backend.service.port: Service observability/prometheus has no port named `web`",
        ),
        (
            "malformed.yaml",
            format!("{seed}---\nkind: Ingress\nmetadata: {{ name: [oops\n"),
            "malformed.yaml, document 6 (line ",
        ),
    ] {
        let input = dir.path().join(name);
        std::fs::write(&input, text).unwrap();
        let (code, stdout, err) = run(bin()
            .args(["import", "ingress"])
            .arg(&input)
            .args(["--zone", "in.librecloud.online", "-o"])
            .arg(&out));
        assert_eq!(code, 2, "{name}: {err}");
        assert_eq!(stdout, "", "{name}");
        assert!(err.contains(says) && err.contains("(nothing was written)"), "{name}: {err}");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "previous\n", "{name}");
        assert!(!dir.path().join("longhorn-system-longhorn-auth.users").exists(), "{name}");
    }
    let (code, _, err) = run(bin().args([
        "import",
        "gateway",
        "/nonexistent/routes.yaml",
        "--zone",
        "in.example.org",
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("cannot read /nonexistent/routes.yaml"),
        "{err}"
    );
}
