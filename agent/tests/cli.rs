//! The `private-ingress` binary as a user runs it: exit codes, messages, limits and output files.

use crate::common::{assert_golden, bin, run, run_fed};
use std::path::{Path, PathBuf};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../schema/examples")
}

#[test]
fn check_prints_a_one_line_summary() {
    let (code, out, err) = run(bin().arg("check").arg(examples().join("librecloud.ncl")));
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.contains("7 routes in zone in.librecloud.online, tls_rotation csi_driver"),
        "{out}"
    );
}

#[test]
fn check_exits_1_with_the_diagnostic_on_a_contract_violation() {
    let path = examples().join("bad/host-parent-zone.ncl");
    let (code, out, err) = run(bin().arg("check").arg(&path));
    assert_eq!(code, 1);
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("host-parent-zone.ncl:8:14"), "{err}");
    assert!(
        err.contains("\"grafana.example.org\""),
        "the offending value is shown: {err}"
    );
    assert!(
        err.contains("`in.example.org`"),
        "the expected zone is named: {err}"
    );
}

#[test]
fn check_exits_2_with_one_line_on_a_missing_file() {
    let (code, _, err) = run(bin().args(["check", "/nonexistent/workspace.ncl"]));
    assert_eq!(code, 2);
    assert_eq!(
        err.trim(),
        "error: cannot read workspace /nonexistent/workspace.ncl: no such file"
    );
}

#[test]
fn endless_recursion_is_stopped_at_the_deadline_without_killing_the_caller() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loop.ncl");
    std::fs::write(
        &path,
        "let rec f = fun x => f x in { zone = \"a.b\", routes = [], cluster_issuer = f 0 }",
    )
    .unwrap();
    let (code, _, err) = run(bin().arg("check").arg(&path).args(["--eval-timeout", "1"]));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("took longer than 1 s and was stopped"),
        "{err}"
    );
}

#[test]
fn unbounded_growth_is_stopped_by_the_memory_cap() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("grow.ncl");
    std::fs::write(
        &path,
        "let rec f = fun x => f (x + 1) + 1 in { zone = \"a.b\", routes = [], cluster_issuer = f 0 }",
    )
    .unwrap();
    let (code, _, err) = run(bin().arg("check").arg(&path).args([
        "--eval-memory-mib",
        "1024",
        "--eval-timeout",
        "60",
    ]));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("ran out of memory") || err.contains("overflowed the stack"),
        "{err}"
    );
}

#[test]
fn render_json_is_deterministic_and_sorted() {
    let ws = examples().join("modular/workspace.ncl");
    let (code, first, err) = run(bin().arg("render").arg(&ws).args(["--format", "json"]));
    assert_eq!(code, 0, "{err}");
    let (_, second, _) = run(bin().arg("render").arg(&ws).args(["--format", "json"]));
    assert_eq!(first, second);
    let model: serde_json::Value = serde_json::from_str(&first).unwrap();
    let keys: Vec<_> = model["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{}{}",
                r["host"].as_str().unwrap(),
                r["path_prefix"].as_str().unwrap()
            )
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
}

#[test]
fn render_output_replaces_the_file_only_on_success() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sozu.toml");
    std::fs::write(&out, "previous").unwrap();

    let (code, _, _) = run(bin()
        .arg("render")
        .arg(examples().join("bad/duplicate-route.ncl"))
        .args(["--format", "sozu-toml", "--output"])
        .arg(&out));
    assert_eq!(code, 1);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "previous");

    let (code, stdout, err) = run(bin()
        .arg("render")
        .arg(examples().join("librecloud.ncl"))
        .args(["--format", "sozu-toml", "--output"])
        .arg(&out));
    assert_eq!(code, 0, "{err}");
    assert!(stdout.is_empty());
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.contains("[clusters.\"pi-grafana.in.librecloud.online\"]"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temp file left"
    );
}

#[test]
fn render_to_an_unwritable_place_exits_2() {
    let (code, _, err) = run(bin()
        .arg("render")
        .arg(examples().join("librecloud.ncl"))
        .args(["--format", "json", "--output", "/nonexistent/dir/out.json"]));
    assert_eq!(code, 2);
    assert!(
        err.contains("cannot write /nonexistent/dir/out.json"),
        "{err}"
    );
}

#[test]
fn the_reference_example_renders_to_its_golden_files() {
    for (format, golden) in [
        ("json", "librecloud.json"),
        ("sozu-toml", "librecloud.sozu.toml"),
    ] {
        let (code, out, err) = run(bin()
            .arg("render")
            .arg(examples().join("librecloud.ncl"))
            .args(["--format", format]));
        assert_eq!(code, 0, "{err}");
        assert_golden(&examples().join("rendered").join(golden), &out, format);
    }
}

#[test]
fn schema_prints_the_bundled_contract() {
    let (code, out, _) = run(bin().arg("schema"));
    assert_eq!(code, 0);
    let shipped = std::fs::read_to_string(examples().join("../private_ingress.ncl")).unwrap();
    assert_eq!(out, shipped);
}

/// An admin server that answers every request with `body` (or never answers, with `None`).
fn admin_answering(body: Option<String>) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            match &body {
                Some(body) => {
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
                // Read and never answer.
                None => held.push(stream),
            }
        }
    });
    address
}

fn state(ready: bool) -> String {
    serde_json::json!({
        "ready": ready,
        "workspace": { "loaded": true, "zone": "in.example.org", "last_error": null },
        "sozu": { "connected": true, "generation": "connection 1 workers 7", "last_error": null, "last_converged": null },
        "routes": [],
        "counters": {
            "reconciles": 1, "reconcile_errors": 0, "sozu_requests": 0, "sozu_reconnects": 0,
            "workspace_errors": 0, "dns_failures": 0, "certificate_errors": 0,
            "certificate_errors_by_reason": {}, "resyncs": 0, "watch_overflows": 0
        }
    })
    .to_string()
}

/// `status` tells a script what it saw: 0 ready, 1 answering but not ready, 2 not reachable (no
/// one listening), 3 no answer within `--timeout`.
#[test]
fn status_exit_codes_tell_ready_from_not_ready_from_unreachable() {
    let status = |address: String, extra: &[&str]| {
        run(bin()
            .args(["status", "--admin-address", &address])
            .args(extra))
    };
    let (code, out, err) = status(admin_answering(Some(state(true))).to_string(), &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("ready: yes"), "{out}");
    let (code, out, err) = status(admin_answering(Some(state(false))).to_string(), &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.starts_with("ready: no"), "{out}");
    // An http:// URL is the same address.
    let (code, _, err) = status(
        format!("http://{}/", admin_answering(Some(state(true)))),
        &[],
    );
    assert_eq!(code, 0, "{err}");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = closed.local_addr().unwrap().to_string();
    drop(closed);
    let (code, _, err) = status(address, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot reach the agent"), "{err}");

    // An agent that takes the connection and never answers, and one whose connection waits in
    // the listener's backlog, never taken: `status` gives up at its timeout, exits 3, and says
    // where, how long it waited and what to check.
    let never_accepted = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    for address in [
        admin_answering(None).to_string(),
        never_accepted.local_addr().unwrap().to_string(),
    ] {
        let started = std::time::Instant::now();
        let (code, out, err) = status(address.clone(), &["--timeout", "2"]);
        let waited = started.elapsed();
        assert_eq!(code, 3, "{out}{err}");
        assert_eq!(
            err.trim(),
            format!(
                "error: no answer from {address} within 2 s: is it the agent's admin address \
                 (--admin-address), and is the agent, or the `kubectl port-forward` to it, \
                 running? --timeout waits longer"
            )
        );
        assert!(out.is_empty(), "{out}");
        assert!(waited >= std::time::Duration::from_secs(2), "{waited:?}");
        assert!(waited < std::time::Duration::from_secs(30), "{waited:?}");
    }

    let (code, _, err) = status("https://127.0.0.1:9180".into(), &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("plain HTTP"), "{err}");
}

/// A fatal error names each cause once (`error: cannot write …: No such file or directory (os
/// error 2)`), never the cause a second time after the message that already shows it.
#[test]
fn a_failure_names_its_cause_once() {
    let (code, _, err) = run(bin()
        .arg("render")
        .arg(examples().join("librecloud.ncl"))
        .args(["--format", "json", "--output", "/nonexistent/dir/out.json"]));
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err.trim(),
        "error: cannot write /nonexistent/dir/out.json: No such file or directory (os error 2)"
    );

    let dir = tempfile::tempdir().unwrap();
    let agent = |workspace: &Path, admin: &str| {
        run(bin()
            .args(["run", "--log-format", "json", "--workspace"])
            .arg(workspace)
            .arg("--sozu-socket")
            .arg(dir.path().join("sozu.sock"))
            .arg("--tls-dir")
            .arg(dir.path())
            .args(["--admin-address", admin]))
    };
    // The workspace's directory is not there.
    let (code, _, err) = agent(&dir.path().join("gone/workspace.ncl"), "127.0.0.1:0");
    assert_eq!(code, 2, "{err}");
    let last = err.lines().find(|l| l.starts_with("error:"));
    assert_eq!(
        last,
        Some(
            format!(
                "error: cannot watch {}: no such file or directory",
                dir.path().join("gone").display()
            )
            .as_str()
        ),
        "{err}"
    );
    // The admin address is taken.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let (code, _, err) = agent(&examples().join("librecloud.ncl"), &address);
    assert_eq!(code, 2, "{err}");
    let last = err.lines().find(|l| l.starts_with("error:"));
    assert_eq!(
        last,
        Some(
            format!("error: admin server on {address}: Address already in use (os error 98)")
                .as_str()
        ),
        "{err}"
    );
}

/// Log fields are words, not Rust's debug notation (`Some(Os { code: 2, kind: NotFound, .. })`,
/// `None`): the JSON lines of an agent whose certificate pair is missing and whose sozu socket is
/// not there yet, two failures it logs and goes on from.
#[test]
fn log_fields_show_no_debug_notation() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace.ncl");
    std::fs::write(
        &workspace,
        format!(
            r#"{{ zone = "in.example.org", cluster_issuer = "ca", tls_dir = "{}",
                  routes = [{{ host = "a.in.example.org", upstream = "127.0.0.1", port = 8080 }}] }}"#,
            dir.path().join("tls").display()
        ),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("tls")).unwrap();
    let mut child = bin()
        .args([
            "run",
            "--log-format",
            "json",
            "--admin-address",
            "127.0.0.1:0",
        ])
        .arg("--workspace")
        .arg(&workspace)
        .arg("--sozu-socket")
        .arg(dir.path().join("sozu.sock"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut seen = Vec::new();
    let wanted = [
        "starting",
        "certificate pair refused",
        "sozu unreachable; retrying",
    ];
    while !wanted
        .iter()
        .all(|w| seen.iter().any(|l: &String| l.contains(w)))
    {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match received.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = seen.join("\n");
    for w in wanted {
        assert!(log.contains(w), "no `{w}` line in\n{log}");
    }
    for line in &seen {
        let entry: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        for (name, value) in entry["fields"].as_object().unwrap() {
            let text = value.to_string();
            for debug in ["Os {", "Some(", "kind: ", "\"None\"", "[\""] {
                assert!(
                    !text.contains(debug),
                    "field `{name}` shows `{debug}`: {line}"
                );
            }
        }
    }
}

/// `-` is standard input, and a workspace that is a pipe or one of the process's descriptors
/// (`/dev/stdin`) is read once: each gives what the file itself gives.
#[test]
fn a_workspace_on_standard_input_is_read_once() {
    let path = examples().join("librecloud.ncl");
    let text = std::fs::read(&path).unwrap();
    let (code, from_file, err) = run(bin().args(["render", "--format", "json"]).arg(&path));
    assert_eq!(code, 0, "{err}");
    for name in ["-", "/dev/stdin", "/proc/self/fd/0"] {
        // Through a pipe.
        let (code, out, err) = run_fed(bin().args(["render", "--format", "json", name]), &text);
        assert_eq!((code, &out), (0, &from_file), "{name}: {err}");
        let (code, out, err) = run_fed(bin().args(["check", name]), &text);
        assert_eq!(code, 0, "{name}: {err}");
        assert_eq!(
            out,
            "ok: <stdin> — 7 routes in zone in.librecloud.online, tls_rotation csi_driver\n"
        );
        // A regular file as standard input: the evaluating child has a standard input of its own.
        let (code, out, err) = run(bin()
            .args(["render", "--format", "json", name])
            .stdin(std::fs::File::open(&path).unwrap()));
        assert_eq!((code, &out), (0, &from_file), "{name} < file: {err}");
    }
    // A named pipe, which can be opened once and read once.
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("workspace.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let writer = {
        let (fifo, text) = (fifo.clone(), text.clone());
        std::thread::spawn(move || std::fs::write(fifo, text))
    };
    let (code, out, err) = run(bin().args(["render", "--format", "json"]).arg(&fifo));
    writer.join().unwrap().unwrap();
    assert_eq!((code, &out), (0, &from_file), "{err}");

    // Its diagnostics name it `<stdin>`.
    let bad = std::fs::read(examples().join("bad/port-zero.ncl")).unwrap();
    let (code, _, err) = run_fed(bin().args(["check", "-"]), &bad);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("┌─ <stdin>:7:83"), "{err}");
    // JSON is read as JSON.
    let json = br#"{ "zone": "in.example.org", "cluster_issuer": "ca", "routes": [] }"#;
    let (code, out, err) = run_fed(bin().args(["check", "-"]), json);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("ok: <stdin> — 0 routes"), "{out}");
}

/// A workspace on standard input imports from the current directory, the root of what it may
/// read; the Kubernetes ConfigMap ships it as `workspace.ncl` beside what it imports.
#[test]
fn imports_from_standard_input_resolve_from_the_current_directory() {
    let modular = examples().join("modular");
    let text = std::fs::read(modular.join("workspace.ncl")).unwrap();
    let (code, out, err) = run_fed(bin().args(["check", "-"]).current_dir(&modular), &text);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("ok: <stdin> — 4 routes"), "{out}");

    // From elsewhere, `routes.ncl` is not beside it.
    let (code, _, err) = run_fed(bin().args(["check", "-"]).current_dir(examples()), &text);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("import of routes.ncl failed"), "{err}");
    // And nothing outside the current directory is imported.
    let (code, _, err) = run_fed(
        bin().args(["check", "-"]).current_dir(&modular),
        b"{ zone = \"in.example.org\", cluster_issuer = \"ca\", routes = import \"../plain.json\" }",
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("`../plain.json` leads out of it"), "{err}");

    let (code, manifests, err) = run_fed(
        bin()
            .args(["render", "--format", "k8s", "-"])
            .current_dir(&modular),
        &text,
    );
    assert_eq!(code, 0, "{err}");
    let (_, from_file, err) = run(bin()
        .args(["render", "--format", "k8s"])
        .arg(modular.join("workspace.ncl")));
    assert_eq!(manifests, from_file, "{err}");
}

/// `render --output -` is standard output, not a file named `-`.
#[test]
fn render_output_dash_is_standard_output() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = run(bin()
        .args(["render", "--format", "json", "--output", "-"])
        .arg(examples().join("librecloud.ncl"))
        .current_dir(dir.path()));
    assert_eq!(code, 0, "{err}");
    let model: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(model["zone"], "in.librecloud.online");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    // `run` reads its workspace again at every change, which standard input cannot be.
    let (code, _, err) = run(bin().args(["run", "--workspace", "-", "--sozu-socket", "s.sock"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("give a file, not `-`"), "{err}");
}

/// A reader that stops reading (`private-ingress man | head`) is no error for a command that
/// writes to standard output: it exits as it would have, saying nothing. Each command here
/// writes into a pipe whose reading end is closed before it starts, so its first write fails.
#[test]
fn a_closed_pipe_on_stdout_is_no_error() {
    let ready = admin_answering(Some(state(true))).to_string();
    let not_ready = admin_answering(Some(state(false))).to_string();
    let librecloud = examples().join("librecloud.ncl");
    let librecloud = librecloud.to_str().unwrap();
    for (args, expected) in [
        (vec!["man"], 0),
        (vec!["completions", "bash"], 0),
        (vec!["schema"], 0),
        (vec!["check", librecloud], 0),
        (vec!["render", librecloud, "--format", "json"], 0),
        (vec!["render", librecloud, "--format", "sozu-toml"], 0),
        (vec!["status", "--admin-address", &ready], 0),
        (vec!["status", "--admin-address", &not_ready, "--json"], 1),
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let output = bin()
            .args(&args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(expected), "{args:?}: {err}");
        assert!(
            !err.contains("error") && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}

/// A workspace in `dir` of one route of its own port, `protocol` on `listen_port`, images
/// named so that `render --format k8s` renders it.
fn port_route_workspace(dir: &Path, name: &str, protocol: &str, listen_port: u16) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "{{\n  zone = \"in.example.org\",\n  cluster_issuer = \"internal-ca\",\n  deploy = {{ sozu_image = \"registry.example.org/sozu@sha256:{0}\", agent_image = \"registry.example.org/private-ingress@sha256:{0}\" }},\n  routes = [\n    {{ host = \"git.in.example.org\", protocol = '{protocol}, listen_port = {listen_port}, upstream = \"10.0.0.1\", port = 22 }},\n  ],\n}}\n",
            "0".repeat(64)
        ),
    )
    .unwrap();
    path
}

/// No route may listen on a port the pod itself uses: the agent's admin port, as `check` and
/// `render` take it from the same `--admin-address` / PRIVATE_INGRESS_ADMIN_ADDRESS that `run`
/// reads (9180 unless given), and the access-log receiver's (`traffic.listen`, 9181). Each is
/// refused at the route's `listen_port`, with file and line; `render --format k8s` refuses the
/// rendered pod's own admin port, 9180, whatever the flag says.
#[test]
fn a_route_on_a_port_the_pod_uses_is_refused_with_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let on_admin = port_route_workspace(dir.path(), "admin.ncl", "tcp", 9180);
    let refused = |command: &mut std::process::Command, message: &str, file: &str| {
        let (code, out, err) = run(command);
        assert_eq!(code, 1, "{command:?}: {out}{err}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains(message), "{command:?}: {err}");
        assert!(
            err.contains(&format!("{file}:6:67")),
            "with its position: {err}"
        );
    };
    let admin = "routes[0]: listen_port 9180 is the agent's admin port";
    refused(bin().arg("check").arg(&on_admin), admin, "admin.ncl");
    for format in ["sozu-toml", "k8s", "json"] {
        refused(
            bin().args(["render", "--format", format]).arg(&on_admin),
            admin,
            "admin.ncl",
        );
    }
    // The agent elsewhere, by flag or environment: 9180 is free for a route, and the agent's
    // port is not.
    let (code, _, err) = run(bin()
        .arg("check")
        .arg(&on_admin)
        .args(["--admin-address", "127.0.0.1:9280"]));
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(bin()
        .arg("check")
        .arg(&on_admin)
        .env("PRIVATE_INGRESS_ADMIN_ADDRESS", "0.0.0.0:9280"));
    assert_eq!(code, 0, "{err}");
    let on_9280 = port_route_workspace(dir.path(), "moved.ncl", "udp", 9280);
    for format in [None, Some("sozu-toml")] {
        let mut command = bin();
        match format {
            None => command.arg("check"),
            Some(format) => command.args(["render", "--format", format]),
        };
        refused(
            command
                .arg(&on_9280)
                .env("PRIVATE_INGRESS_ADMIN_ADDRESS", "0.0.0.0:9280"),
            "routes[0]: listen_port 9280 is the agent's admin port",
            "moved.ncl",
        );
    }
    // The rendered pod's agent listens on 9180, whatever the flag says.
    refused(
        bin()
            .args(["render", "--format", "k8s"])
            .arg(&on_admin)
            .args(["--admin-address", "127.0.0.1:9280"]),
        "routes[0]: listen_port 9180 is the rendered pod's admin port",
        "admin.ncl",
    );
    let on_records = port_route_workspace(dir.path(), "records.ncl", "udp", 9181);
    refused(
        bin().arg("check").arg(&on_records),
        "routes[0]: listen_port 9181 is the access-log receiver's port (traffic.listen)",
        "records.ncl",
    );
}

/// An admin server's `/v1/state` whose texts carry terminal controls, as a CA's subject, a
/// file's name or an error can: U+009B (a C1 CSI, which serde_json writes raw), ESC, DEL.
fn state_with_controls() -> serde_json::Value {
    let mut state: serde_json::Value = serde_json::from_str(&state(false)).unwrap();
    state["sozu"]["last_error"] = "sozu \u{9b}2J gone".into();
    state["sozu"]["client_auth"] = serde_json::json!({
        "mode": "required",
        "ca": { "file": "/devices/ca\u{1b}[31m.crt", "subject": "CN=devices\u{9b}31m", "not_after": null, "problem": null },
        "crls": [],
    });
    state["readiness"] = serde_json::json!({
        "mode": "serving", "ready": false, "routes_not_served": 0, "reason": "sozu: \u{9b}2J\u{7f}",
    });
    state
}

/// Every text `status` prints is cleaned as `top` cleans it: its table shows no control
/// character but its line feeds, and `--json` escapes U+009B and DEL (which serde_json leaves
/// raw) so that it stays JSON and reads as the same document.
#[test]
fn status_prints_no_terminal_control_in_its_table_or_its_json() {
    let state = state_with_controls();
    let raw = state.to_string();
    assert!(
        raw.contains('\u{9b}'),
        "serde_json writes U+009B raw: {raw:?}"
    );
    let admin = admin_answering(Some(raw)).to_string();
    let controls = |text: &str| -> Vec<char> {
        text.chars()
            .filter(|c| c.is_control() && *c != '\n')
            .collect()
    };
    let (code, out, err) = run(bin().args(["status", "--admin-address", &admin]));
    assert_eq!(code, 1, "{err}");
    assert_eq!(controls(&out), Vec::<char>::new(), "{out:?}");
    assert!(out.contains("CN=devices\\u{9b}31m"), "{out}");
    let (code, out, err) = run(bin().args(["status", "--json", "--admin-address", &admin]));
    assert_eq!(code, 1, "{err}");
    assert_eq!(controls(&out), Vec::<char>::new(), "{out:?}");
    assert!(out.contains("CN=devices\\u009b31m"), "{out}");
    let read: serde_json::Value = serde_json::from_str(&out).expect("still JSON");
    assert_eq!(read, state);
}

/// `check`'s summary and every error name a file as the user gave it, its controls escaped.
#[test]
fn check_and_its_errors_print_no_terminal_control() {
    let dir = tempfile::tempdir().unwrap();
    let named = dir.path().join("ws\u{1b}]0;owned\u{7}\u{9b}2J.ncl");
    std::fs::copy(examples().join("librecloud.ncl"), &named).unwrap();
    let controls = |text: &str| -> Vec<char> {
        text.chars()
            .filter(|c| c.is_control() && *c != '\n')
            .collect()
    };
    let (code, out, err) = run(bin().arg("check").arg(&named));
    assert_eq!(code, 0, "{err}");
    assert_eq!(controls(&out), Vec::<char>::new(), "{out:?}");
    assert!(
        out.contains("ws\\u{1b}]0;owned\\u{7}\\u{9b}2J.ncl"),
        "{out}"
    );
    let missing = dir.path().join("gone\u{9b}2J/ws.ncl");
    let (code, out, err) = run(bin().arg("check").arg(&missing));
    assert_eq!(code, 2, "{out}{err}");
    assert_eq!(controls(&err), Vec::<char>::new(), "{err:?}");
    assert!(err.contains("gone\\u{9b}2J"), "{err}");
}
