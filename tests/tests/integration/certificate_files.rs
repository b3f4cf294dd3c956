//! Certificate pairs named by path (the workspace's `certificates`), through a real sozu: a pair
//! serves every route host its names cover in place of the tls dir's, a rotation (a file renamed
//! into place, certbot's links swapped) is served by the next handshakes, and a half-written key
//! keeps the last good certificate served while the status says why.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use private_ingress_tests::live::{
    atomic_write, certificate, eventually, fingerprint_of_pem, https_get, route_of, Backend, Stack,
};

/// How long a start may take before the test calls the agent wedged (see `backends.rs`).
const READY: Duration = Duration::from_secs(60);
/// A bound on a rotation's switch, generous for a loaded machine: what it took is printed
/// (the figure docs/contract.md gives), and it is the measure, not this bound.
const SWITCH: Duration = Duration::from_secs(10);

/// A pair for `names`, with `key` (a new key when `None`): (certificate PEM, key PEM).
fn pair(names: &[&str], key: Option<&rcgen::KeyPair>) -> (String, String, rcgen::KeyPair) {
    let key = match key {
        Some(k) => rcgen::KeyPair::from_pem(&k.serialize_pem()).unwrap(),
        None => rcgen::KeyPair::generate().unwrap(),
    };
    let params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    let crt = params.self_signed(&key).unwrap().pem();
    (crt, key.serialize_pem(), key)
}

/// Writes `text` to `path` the atomic way: a temporary file beside it, renamed over it.
fn rename_into_place(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Points the link `link` at `target` the way certbot and cert-manager swap links: a new link
/// beside it, renamed over it.
fn swap_link(link: &Path, target: &Path) {
    let tmp = link.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, link).unwrap();
}

/// The fingerprint a handshake for `host` gets.
fn served(stack: &Stack, host: &str) -> String {
    https_get(stack.https, host, "/")
        .unwrap_or_else(|e| panic!("{host}: {e}"))
        .fingerprint
}

/// Handshakes for `host` from `since` until one gets `new`: every one before got `old`. Returns
/// how long after `since` the new certificate was first served.
fn switch(stack: &Stack, host: &str, old: &str, new: &str, since: Instant) -> Duration {
    loop {
        let seen = served(stack, host);
        if seen == new {
            return since.elapsed();
        }
        assert_eq!(seen, old, "{host}: a third certificate");
        assert!(
            since.elapsed() < SWITCH,
            "{host}: never switched; the agent's state: {:?}",
            stack.state()
        );
    }
}

/// The `certificate` of `host`'s route in `/v1/state`.
fn certificate_state(stack: &Stack, host: &str) -> serde_json::Value {
    let state = stack.state().expect("/v1/state");
    route_of(&state, host)
        .map(|r| r["certificate"].clone())
        .unwrap_or_else(|| panic!("{host} not in {state}"))
}

/// sozu and the agent serving `hosts` (one backend), with `certificates` as given.
fn serving(stack: &mut Stack, hosts: &[&str], certificates: &str) -> Backend {
    let backend = Backend::start("app");
    let routes: Vec<String> = hosts
        .iter()
        .map(|h| {
            format!(
                "{{ host = \"{h}\", upstream = \"{}\", port = {} }}",
                backend.address.ip(),
                backend.address.port()
            )
        })
        .collect();
    stack.write_workspace(
        &stack.workspace_text_of(&routes, &format!("  certificates = [{certificates}],\n")),
    );
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(READY);
    backend
}

fn certs_dir(stack: &Stack) -> PathBuf {
    let dir = stack.workspace_path().parent().unwrap().join("certs");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One wildcard pair, named relative to the workspace, serves both hosts it covers, and wins
/// over a host's own pair in the tls dir; a host one label deeper is not covered and keeps its
/// tls dir pair. The status names the file.
#[test]
fn a_wildcard_pair_named_by_path_serves_every_host_it_covers() {
    let mut stack = Stack::new();
    let certs = certs_dir(&stack);
    let (crt, key, _) = pair(&["*.in.example.org"], None);
    std::fs::write(certs.join("wild.crt"), &crt).unwrap();
    std::fs::write(certs.join("wild.key"), &key).unwrap();
    let wild = fingerprint_of_pem(&crt);
    let (a, b, deep) = (
        "a.in.example.org",
        "b.in.example.org",
        "deep.b.in.example.org",
    );
    let own_a = certificate(&stack.tls_dir(), a);
    let own_deep = certificate(&stack.tls_dir(), deep);
    let backend = serving(
        &mut stack,
        &[a, b, deep],
        r#"{ cert_file = "certs/wild.crt", key_file = "certs/wild.key" }"#,
    );
    assert_eq!(
        served(&stack, a),
        wild,
        "the pair wins over a's tls dir pair"
    );
    assert_ne!(own_a, wild);
    assert_eq!(served(&stack, b), wild);
    assert_eq!(served(&stack, deep), own_deep, "one label deep only");

    let file = certs.join("wild.crt").display().to_string();
    for host in [a, b] {
        let c = certificate_state(&stack, host);
        assert_eq!(c["file"], file.as_str(), "{host}: {c}");
        assert_eq!(c["disk_fingerprint"], wild.as_str(), "{host}: {c}");
        assert_eq!(
            c["served_fingerprints"],
            serde_json::json!([wild]),
            "{host}: {c}"
        );
    }
    assert!(certificate_state(&stack, deep).get("file").is_none());
    let status = stack.status_text();
    assert!(
        status.contains(&format!(
            "note: the certificate of {a} is the pair of `certificates` {file}"
        )),
        "{status}"
    );

    // A host added to the workspace is covered too: the one certificate now names it beside
    // the others, and sozu holds it once.
    let c = "c.in.example.org";
    let routes = |hosts: &[&str]| -> Vec<String> {
        hosts
            .iter()
            .map(|h| {
                format!(
                    "{{ host = \"{h}\", upstream = \"{}\", port = {} }}",
                    backend.address.ip(),
                    backend.address.port()
                )
            })
            .collect()
    };
    let listed =
        "  certificates = [{ cert_file = \"certs/wild.crt\", key_file = \"certs/wild.key\" }],\n";
    stack.write_workspace(&stack.workspace_text_of(&routes(&[a, b, deep, c]), listed));
    eventually(
        Duration::from_secs(30),
        "the added host served the pair",
        || {
            https_get(stack.https, c, "/")
                .ok()
                .filter(|s| s.fingerprint == wild && s.status == 200)
        },
    );
    for host in [a, b] {
        assert_eq!(served(&stack, host), wild, "{host} keeps it");
    }

    // The pair taken out of the workspace: a host with a pair of its own gets it back.
    stack.write_workspace(&stack.workspace_text_of(&routes(&[a, b, deep, c]), ""));
    eventually(Duration::from_secs(30), "a's own pair served again", || {
        (served(&stack, a) == own_a).then_some(())
    });
    assert!(certificate_state(&stack, a).get("file").is_none());
}

/// A pair rotated by a file renamed into place (the key kept, as cert-manager's
/// `reuse-private-key` and many renewals do), and a certbot `live/` directory whose links are
/// swapped to a new key and certificate: each is served by the next handshakes. The time from
/// the rename to the first handshake that gets the new certificate is printed.
#[test]
fn a_pair_rotated_in_place_or_by_its_links_is_served_at_once() {
    let mut stack = Stack::new();
    let certs = certs_dir(&stack);
    let (plain, linked) = ("plain.in.example.org", "linked.in.example.org");
    let (crt, key, kept) = pair(&[plain], None);
    std::fs::write(certs.join("plain.crt"), &crt).unwrap();
    std::fs::write(certs.join("plain.key"), &key).unwrap();
    // certbot's layout: live/<name>/{fullchain,privkey}.pem link into archive/<name>/.
    let (live, archive) = (certs.join("live/linked"), certs.join("archive/linked"));
    std::fs::create_dir_all(&live).unwrap();
    std::fs::create_dir_all(&archive).unwrap();
    let (linked_crt, linked_key, _) = pair(&[linked], None);
    std::fs::write(archive.join("fullchain1.pem"), &linked_crt).unwrap();
    std::fs::write(archive.join("privkey1.pem"), &linked_key).unwrap();
    std::os::unix::fs::symlink(
        "../../archive/linked/fullchain1.pem",
        live.join("fullchain.pem"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        "../../archive/linked/privkey1.pem",
        live.join("privkey.pem"),
    )
    .unwrap();
    let _backend = serving(
        &mut stack,
        &[plain, linked],
        r#"{ cert_file = "certs/plain.crt", key_file = "certs/plain.key" },
           { cert_file = "certs/live/linked/fullchain.pem", key_file = "certs/live/linked/privkey.pem" }"#,
    );
    let mut old = fingerprint_of_pem(&crt);
    assert_eq!(served(&stack, plain), old);
    let mut old_linked = fingerprint_of_pem(&linked_crt);
    assert_eq!(served(&stack, linked), old_linked);

    let mut took = Vec::new();
    for generation in 2..=4 {
        let (crt, _, _) = pair(&[plain], Some(&kept));
        let new = fingerprint_of_pem(&crt);
        let since = Instant::now();
        rename_into_place(&certs.join("plain.crt"), &crt);
        took.push(switch(&stack, plain, &old, &new, since));
        old = new;

        // certbot renews: new files in archive/, then each link re-pointed (the key first).
        let (crt, key, _) = pair(&[linked], None);
        std::fs::write(archive.join(format!("fullchain{generation}.pem")), &crt).unwrap();
        std::fs::write(archive.join(format!("privkey{generation}.pem")), &key).unwrap();
        let new = fingerprint_of_pem(&crt);
        swap_link(
            &live.join("privkey.pem"),
            Path::new(&format!("../../archive/linked/privkey{generation}.pem")),
        );
        let since = Instant::now();
        swap_link(
            &live.join("fullchain.pem"),
            Path::new(&format!("../../archive/linked/fullchain{generation}.pem")),
        );
        took.push(switch(&stack, linked, &old_linked, &new, since));
        old_linked = new;
    }
    eprintln!("rename or link swap → new certificate served: {took:?}");
    let c = certificate_state(&stack, linked);
    assert_eq!(
        c["served_fingerprints"],
        serde_json::json!([old_linked]),
        "{c}"
    );
    assert!(
        c["error"].is_null(),
        "valid again once both links moved: {c}"
    );
}

/// A key written in place and cut short (a writer that died, a disk full): the pair is refused,
/// its hosts keep the last good certificate, and the status says which file and why without a
/// byte of the key. The whole key written again serves the new pair.
#[test]
fn a_half_written_key_keeps_the_last_good_certificate_and_shows_why() {
    let mut stack = Stack::new();
    let certs = certs_dir(&stack);
    let hosts = ["a.in.example.org", "b.in.example.org"];
    let (crt, key, _) = pair(&["*.in.example.org"], None);
    std::fs::write(certs.join("wild.crt"), &crt).unwrap();
    std::fs::write(certs.join("wild.key"), &key).unwrap();
    let first = fingerprint_of_pem(&crt);
    let _backend = serving(
        &mut stack,
        &hosts,
        r#"{ cert_file = "certs/wild.crt", key_file = "certs/wild.key" }"#,
    );

    let (new_crt, new_key, _) = pair(&["*.in.example.org"], None);
    std::fs::write(certs.join("wild.crt"), &new_crt).unwrap();
    std::fs::write(certs.join("wild.key"), &new_key[..new_key.len() / 2]).unwrap();
    let key_path = certs.join("wild.key").display().to_string();
    for host in hosts {
        // The certificate written first is refused too (it does not match the old key) until
        // the key is: what is shown last is the cut key.
        let c = eventually(
            Duration::from_secs(30),
            "the cut key's refusal shown",
            || {
                let c = certificate_state(&stack, host);
                (c["error"].is_string() && c["error_reason"] != "key_mismatch").then_some(c)
            },
        );
        let error = c["error"].as_str().unwrap();
        assert_eq!(error, format!("{key_path}: no private key found"), "{host}");
        assert!(!error.contains(&new_key[40..80]), "{error}");
        assert_eq!(served(&stack, host), first, "{host}: the last good one");
    }
    let status = stack.status_text();
    assert!(status.contains(&key_path), "{status}");
    assert!(!status.contains(&new_key[40..80]), "{status}");

    std::fs::write(certs.join("wild.key"), &new_key).unwrap();
    let new = fingerprint_of_pem(&new_crt);
    for host in hosts {
        switch(&stack, host, &first, &new, Instant::now());
    }
    assert!(certificate_state(&stack, hosts[0])["error"].is_null());
}

/// A pair whose files are not there yet when the workspace is loaded (a secret mounted later,
/// certbot's first run) covers nothing: its host is served its pair in the tls dir. Once the
/// files are written, the pair is read and takes the host over; a Kubernetes volume's `..data`
/// swap under the named paths is then served as well.
#[test]
fn a_pair_written_after_the_workspace_takes_its_hosts_over_when_it_appears() {
    let mut stack = Stack::new();
    let certs = certs_dir(&stack);
    let volume = certs.join("volume");
    std::fs::create_dir_all(&volume).unwrap();
    let host = "late.in.example.org";
    let own = certificate(&stack.tls_dir(), host);
    let _backend = serving(
        &mut stack,
        &[host],
        r#"{ cert_file = "certs/volume/tls.crt", key_file = "certs/volume/tls.key" }"#,
    );
    assert_eq!(
        served(&stack, host),
        own,
        "nothing named yet: the tls dir's"
    );

    // The volume is populated the way kubelet and cert-manager's CSI driver do it.
    let (crt, key, _) = pair(&[host], None);
    let listed = fingerprint_of_pem(&crt);
    atomic_write(&volume, &crt, &key, 1);
    switch(&stack, host, &own, &listed, Instant::now());
    let c = certificate_state(&stack, host);
    assert_eq!(
        c["file"],
        volume.join("tls.crt").display().to_string().as_str(),
        "{c}"
    );

    let (crt, key, _) = pair(&[host], None);
    let renewed = fingerprint_of_pem(&crt);
    let since = Instant::now();
    atomic_write(&volume, &crt, &key, 2);
    let took = switch(&stack, host, &listed, &renewed, since);
    eprintln!("..data swap → new certificate served: {took:?}");
}

/// A pair's directory removed and made again (a volume remounted, a directory replaced by a
/// script) takes its watch with it: the new pair is read at the next resync, the safety net
/// docs/contract.md names, while the last good certificate serves meanwhile.
#[test]
fn a_pair_whose_directory_is_made_again_is_read_at_the_next_resync() {
    let mut stack = Stack::new();
    let certs = certs_dir(&stack);
    let dir = certs.join("pair");
    std::fs::create_dir_all(&dir).unwrap();
    let host = "again.in.example.org";
    let (crt, key, _) = pair(&[host], None);
    std::fs::write(dir.join("tls.crt"), &crt).unwrap();
    std::fs::write(dir.join("tls.key"), &key).unwrap();
    let first = fingerprint_of_pem(&crt);
    let backend = Backend::start("app");
    let route = format!(
        "{{ host = \"{host}\", upstream = \"{}\", port = {} }}",
        backend.address.ip(),
        backend.address.port()
    );
    stack.write_workspace(&stack.workspace_text_of(
        &[route],
        "  certificates = [{ cert_file = \"certs/pair/tls.crt\", key_file = \"certs/pair/tls.key\" }],\n",
    ));
    stack.start_sozu();
    stack.start_agent_with(&["--resync-interval", "1"], &[]);
    stack.wait_ready(READY);
    assert_eq!(served(&stack, host), first);

    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let (crt, key, _) = pair(&[host], None);
    std::fs::write(dir.join("tls.key"), &key).unwrap();
    std::fs::write(dir.join("tls.crt"), &crt).unwrap();
    let took = switch(
        &stack,
        host,
        &first,
        &fingerprint_of_pem(&crt),
        Instant::now(),
    );
    eprintln!("directory made again → new certificate served: {took:?}");
}
