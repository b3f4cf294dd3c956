//! `tls_rotation = 'sozu_managed` end to end: the agent orders certificates from pebble (a real
//! ACME CA) over DNS-01 through BIND (RFC 2136 with TSIG) or a stand-in of Cloudflare's v4 API,
//! and the real sozu serves them. Test settings (`PRIVATE_INGRESS_ACME_TEST_*`, docs/acme.md)
//! shorten the renewal schedule and the back-off; everything else runs as in production.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use private_ingress_tests::acme::{dig, Bind, Challtestsrv, CloudflareStandIn, Pebble, Zone};
use private_ingress_tests::live::{
    eventually, eventually_every, free_port, https_get, https_get_verified, Backend, RouteSpec,
    Stack,
};

const ZONE: &str = "in.example.org";

fn host(i: usize) -> String {
    format!("h{i}.{ZONE}")
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// sozu, BIND serving the workspace zone (TXT updates allowed to the TSIG key) and pebble
/// validating against BIND.
struct Setup {
    stack: Stack,
    bind: Bind,
    pebble: Pebble,
    backend: Backend,
    hosts: Vec<String>,
    tsig_file: PathBuf,
}

/// One route per host, all to `backend`.
fn routes(hosts: &[String], backend: &Backend) -> Vec<RouteSpec> {
    hosts
        .iter()
        .map(|h| RouteSpec {
            host: h.clone(),
            upstream: "127.0.0.1".into(),
            port: Some(backend.address.port()),
        })
        .collect()
}

fn updatable(name: &str, records: &[&str]) -> Zone {
    Zone {
        name: name.into(),
        records: records.iter().map(|r| (*r).to_owned()).collect(),
        updatable: true,
    }
}

impl Setup {
    fn new(hosts: usize) -> Setup {
        Setup::with_zones((0..hosts).map(host).collect(), &[updatable(ZONE, &[])])
    }

    fn with_zones(hosts: Vec<String>, zones: &[Zone]) -> Setup {
        let stack = Stack::new();
        let bind = Bind::start(stack.dir.path(), zones);
        let pebble = Pebble::start(stack.dir.path(), bind.address);
        let tsig_file = stack.dir.path().join("tsig.secret");
        std::fs::write(&tsig_file, format!("{}\n", bind.secret)).unwrap();
        Setup {
            stack,
            bind,
            pebble,
            backend: Backend::start("app"),
            hosts,
            tsig_file,
        }
    }

    fn state_dir(&self) -> PathBuf {
        self.stack.dir.path().join("acme-state")
    }

    /// The `acme` record for BIND with `zone` as the update zone, and more fields in `extra`.
    fn rfc2136(&self, zone: &str, extra: &str) -> String {
        format!(
            "  tls_rotation = 'sozu_managed,\n  acme = {{\n    directory = \"{dir}\",\n    \
             email = \"ops@example.org\",\n    ca_bundle = \"{ca}\",\n    dns01 = {{ provider = 'rfc2136, \
             server = \"{server}\", zone = \"{zone}\", tsig_key_name = \"acme-key\", \
             tsig_secret_file = \"{secret}\" }},\n    propagation = {{ nameservers = [\"{server}\"], \
             timeout = 20 }},\n    state_dir = \"{state}\",\n{extra}  }},",
            dir = self.pebble.directory,
            ca = self.pebble.ca_pem.display(),
            server = self.bind.address,
            secret = self.tsig_file.display(),
            state = self.state_dir().display(),
        )
    }

    fn routes(&self) -> Vec<RouteSpec> {
        routes(&self.hosts, &self.backend)
    }

    fn write_workspace(&self, acme: &str) {
        self.stack
            .write_workspace(&self.stack.workspace_text_with(&self.routes(), acme));
    }

    fn start(&mut self, acme: &str, env: &[(&str, &str)]) {
        self.write_workspace(acme);
        self.stack.start_sozu();
        self.start_agent(env);
    }

    fn start_agent(&mut self, env: &[(&str, &str)]) {
        let mut all = vec![("RUST_LOG", "info,private_ingress=debug")];
        all.extend_from_slice(env);
        self.stack.start_agent_with(&[], &all);
    }

    /// The issuer's status of `host` in /v1/state.
    fn issuer(&self, host: &str) -> serde_json::Value {
        self.stack
            .state()
            .map(|s| s["issuer"]["hosts"][host].clone())
            .unwrap_or_default()
    }

    /// Like [`Setup::served_by_pebble`], `None` while a host is not served so yet.
    fn served_by_pebble_now(&self) -> Option<Vec<String>> {
        let root = self.pebble.root_pem();
        self.hosts
            .iter()
            .map(|h| {
                https_get_verified(self.stack.https, h, "/", &root)
                    .ok()
                    .map(|s| s.fingerprint)
            })
            .collect()
    }

    /// Every host served a certificate that chains to pebble's root and names it; the
    /// fingerprints.
    fn served_by_pebble(&self) -> Vec<String> {
        let root = self.pebble.root_pem();
        self.hosts
            .iter()
            .map(|h| {
                let seen = https_get_verified(self.stack.https, h, "/", &root)
                    .unwrap_or_else(|e| panic!("{h}: {e}\n{}", self.stack.logs()));
                assert_eq!((seen.status, seen.body.as_str()), (200, "app"));
                seen.fingerprint
            })
            .collect()
    }
}

/// From an empty tls dir, every host ends up presenting a certificate chained to pebble's root;
/// `/v1/state` says when each renews and why. Prints the time from the agent's start to every
/// host served (the "order time" of a first issuance).
#[test]
fn a_first_issuance_serves_fifty_hosts_with_certificates_chained_to_the_cas_root() {
    let mut setup = Setup::new(50);
    let acme = setup.rfc2136(ZONE, "");
    let started = Instant::now();
    setup.start(&acme, &[]);
    setup.stack.wait_ready(Duration::from_secs(120));
    let elapsed = started.elapsed();
    let fingerprints = setup.served_by_pebble();
    assert_eq!(fingerprints.len(), 50);
    eprintln!(
        "first issuance: 50 hosts served {:.2} s after the agent started",
        elapsed.as_secs_f64()
    );
    let state = setup.stack.state().unwrap();
    assert_eq!(state["issuer"]["account_ready"], true);
    for h in &setup.hosts {
        let issuer = &state["issuer"]["hosts"][h];
        assert_eq!(issuer["state"], "valid", "{h}: {issuer}");
        let due = issuer["renewal_due"].as_i64().unwrap();
        let until = issuer["valid_until"].as_i64().unwrap();
        assert!(due > now() && due < until, "{h}: {issuer}");
        assert_eq!(issuer["renewal_basis"], "lifetime");
        assert_eq!(issuer["orders_placed"], 1, "{h}: {issuer}");
        // TXT records of the challenge are gone once the CA has looked.
        assert!(
            dig(setup.bind.address, &format!("_acme-challenge.{h}"), "TXT").is_empty(),
            "{h}"
        );
    }
    // Secrets and keys appear nowhere the agent writes.
    let mut secrets = vec![setup.bind.secret.clone()];
    secrets.extend(key_lines(&setup.stack.tls_dir()));
    secrets.extend(key_lines(&setup.state_dir()));
    assert_nothing_leaks(&setup.stack, &secrets);
}

/// The base64 lines of every private key (PEM `tls.key` files) and account key (the
/// `key_pkcs8` of stored accounts) under `dir`.
fn key_lines(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() && !entry.file_name().to_string_lossy().starts_with("..") {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if path.file_name().is_some_and(|n| n == "tls.key") {
                found.extend(
                    text.lines()
                        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
                        .map(str::to_owned),
                );
            }
            if let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) {
                if let Some(key) = json["key_pkcs8"].as_str() {
                    found.push(key[..32.min(key.len())].to_owned());
                }
            }
        }
    }
    found
}

/// Nothing in /v1/state, /metrics, `status` or the agent's logs contains any of `secrets`.
fn assert_nothing_leaks(stack: &Stack, secrets: &[String]) {
    let mut written = serde_json::to_string(&stack.state().unwrap()).unwrap();
    written.push_str(&stack.metrics());
    let status = std::process::Command::new(private_ingress_tests::agent_bin())
        .args(["status", "--admin-address", &stack.admin.to_string()])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(table.contains("acme: https://"), "{table}");
    written.push_str(&table);
    written.push_str(&stack.agent_logs());
    assert!(secrets.len() >= 3, "too few secrets to mean anything");
    for secret in secrets {
        assert!(
            !written.contains(secret.as_str()),
            "a secret or key found in the agent's output"
        );
    }
    assert!(!written.contains("PRIVATE KEY"));
}

/// Pebble 2.4 offers neither renewal information (ARI) nor profiles. With a profile configured,
/// the order still succeeds with the CA's default, the status says so, and renewal falls back to
/// the lifetime rule. Prints the order time of one host.
#[test]
fn without_ari_or_profiles_at_the_ca_orders_fall_back_cleanly() {
    let mut setup = Setup::new(1);
    let acme = setup.rfc2136(ZONE, "    profile = \"shortlived\",\n");
    setup.start(&acme, &[]);
    setup.stack.wait_ready(Duration::from_secs(60));
    setup.served_by_pebble();
    let state = setup.stack.state().unwrap();
    let issuer = &state["issuer"];
    assert_eq!(issuer["ari_supported"], false, "{issuer}");
    assert!(
        issuer["profile_note"]
            .as_str()
            .is_some_and(|n| n.contains("no profile `shortlived`")),
        "{issuer}"
    );
    let h = &issuer["hosts"][&setup.hosts[0]];
    assert_eq!(h["renewal_basis"], "lifetime");
    // Pebble's 5-year certificate: a third of the lifetime before notAfter, at most a tenth of
    // that margin earlier.
    let (due, until) = (
        h["renewal_due"].as_i64().unwrap(),
        h["valid_until"].as_i64().unwrap(),
    );
    let margin = until - due;
    let third = (until - now()) / 3;
    assert!(
        margin >= third - 86_400 && margin <= third * 11 / 10 + 86_400,
        "{h}"
    );
    eprintln!(
        "first issuance: 1 host, order placed to validated chain in {:.2} s",
        h["last_order_seconds"].as_f64().unwrap()
    );
    let logs = setup.stack.agent_logs();
    assert!(logs.contains("offers no renewal information"), "{logs}");
}

/// With certificates scheduled as if they lived 20 s, the agent renews on its own at half
/// their life; the new certificate is served with no failed request under load, and the TXT
/// records are gone from BIND afterwards. Prints the time from the pair's swap on disk to the
/// first handshake with it.
#[test]
fn a_renewal_is_served_without_a_failed_request_and_leaves_no_txt_record() {
    let mut setup = Setup::new(1);
    let acme = setup.rfc2136(ZONE, "");
    setup.start(&acme, &[("PRIVATE_INGRESS_ACME_TEST_LIFETIME_SECS", "20")]);
    setup.stack.wait_ready(Duration::from_secs(60));
    let h = setup.hosts[0].clone();
    let first = setup.served_by_pebble()[0].clone();

    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (stop, address, h) = (stop.clone(), setup.stack.https, h.clone());
        std::thread::spawn(move || {
            let (mut ok, mut failed) = (0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match https_get(address, &h, "/") {
                    Ok(s) if s.status == 200 => ok += 1,
                    Ok(s) => failed.push(format!("status {}", s.status)),
                    Err(e) => failed.push(e),
                }
            }
            (ok, failed)
        })
    };
    let data_link = setup.stack.tls_dir().join(&h).join("..data");
    let renewed = eventually_every(
        Duration::from_millis(2),
        Duration::from_secs(40),
        "the renewed certificate served",
        || {
            https_get(setup.stack.https, &h, "/")
                .ok()
                .filter(|s| s.fingerprint != first)
                .map(|s| (s.fingerprint, SystemTime::now()))
        },
    );
    let swapped = std::fs::symlink_metadata(&data_link)
        .unwrap()
        .modified()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = load.join().unwrap();
    assert!(
        failed.is_empty(),
        "{} failed requests: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(ok > 50, "only {ok} requests under load");
    eprintln!(
        "renewal: served {:.1} ms after the ..data swap ({ok} requests under load, none failed)",
        renewed
            .1
            .duration_since(swapped)
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3
    );
    let fingerprints = setup.served_by_pebble();
    assert_eq!(fingerprints[0], renewed.0);
    let issuer = setup.issuer(&h);
    assert!(
        issuer["certificates_issued"].as_u64().unwrap() >= 2,
        "{issuer}"
    );
    assert!(
        dig(setup.bind.address, &format!("_acme-challenge.{h}"), "TXT").is_empty(),
        "a challenge TXT record was left in BIND"
    );
}

/// A wrong TSIG key: the renewal fails, is reported with its reason, backs off (1 min, 10 min,
/// ... scaled down 60 times here), and the last good certificate keeps serving; the right key
/// back, it recovers on its own. Prints the back-off schedule as observed.
#[test]
fn a_wrong_tsig_key_is_reported_backs_off_and_the_last_good_certificate_keeps_serving() {
    let mut setup = Setup::new(1);
    let acme = setup.rfc2136(ZONE, "");
    setup.start(
        &acme,
        &[
            // The first renewal about 10 s after the first issuance: time to swap the key.
            ("PRIVATE_INGRESS_ACME_TEST_LIFETIME_SECS", "20"),
            ("PRIVATE_INGRESS_ACME_TEST_BACKOFF_SCALE", "60"),
        ],
    );
    setup.stack.wait_ready(Duration::from_secs(60));
    let h = setup.hosts[0].clone();
    setup.served_by_pebble();
    // Another key of the same name and algorithm: BIND refuses its signature.
    std::fs::write(
        &setup.tsig_file,
        "c2VjcmV0IHRoYXQgQklORCBkb2VzIG5vdCBrbm93IGF0IGFsbA==\n",
    )
    .unwrap();

    let mut schedule = Vec::new();
    let mut seen_failures = 0;
    let mut kept: Option<String> = None;
    eventually(Duration::from_secs(60), "two failed renewals", || {
        let issuer = setup.issuer(&h);
        let failures = issuer["backoff"]["failures"].as_u64().unwrap_or(0);
        if failures > seen_failures {
            let until = issuer["backoff"]["until"].as_i64().unwrap();
            schedule.push((failures, until - now()));
            seen_failures = failures;
            assert_eq!(issuer["backoff"]["reason"], "dns_update", "{issuer}");
            assert_eq!(issuer["state"], "backing_off", "{issuer}");
            let error = issuer["last_error"].as_str().unwrap_or_default();
            assert!(
                error.contains("NOTAUTH") || error.contains("TSIG"),
                "{error}"
            );
            // The last good certificate is still the one served.
            let served = https_get(setup.stack.https, &h, "/").unwrap().fingerprint;
            assert_eq!(kept.get_or_insert_with(|| served.clone()), &served);
        }
        (seen_failures >= 2).then_some(())
    });
    eprintln!(
        "back-off after failures (failures, seconds left when seen, scaled 60x): {schedule:?}"
    );
    // 1 min and 10 min scaled 60 times, ±10%, seen up to a poll late. The first is kept in
    // whole seconds, so it shows for under a second and a loaded machine can miss it: its log
    // line says it either way. The second shows for about ten seconds.
    for &(failures, left) in &schedule {
        match failures {
            1 => assert!(left <= 2, "{schedule:?}"),
            2 => assert!((6..=11).contains(&left), "{schedule:?}"),
            _ => {}
        }
    }
    assert!(
        schedule.iter().any(|&(failures, _)| failures == 2),
        "{schedule:?}"
    );
    let logs = setup.stack.agent_logs();
    assert!(
        logs.lines().any(|l| l.contains("order failed; backing off")
            && l.contains("failures=1 ")
            && l.contains("retry_in_s=1 ")),
        "{logs}"
    );
    let issuer = setup.issuer(&h);
    assert!(
        issuer["orders_failed"]["dns_update"].as_u64().unwrap() >= 2,
        "{issuer}"
    );
    // The failed attempts resumed one order: no order per retry. (On a loaded machine a
    // renewal can succeed before the key is swapped: one more certificate, one more order.)
    let issued = issuer["certificates_issued"].as_u64().unwrap();
    assert!(
        issuer["orders_placed"].as_u64().unwrap() <= issued + 1,
        "{issuer}"
    );
    let metrics = setup.stack.metrics();
    if let Err(e) = private_ingress_tests::live::promtool_check(&metrics) {
        panic!("{e}\n{metrics}");
    }
    assert!(
        metrics.contains(&format!(
            "private_ingress_acme_order_failures_total{{host=\"{h}\",reason=\"dns_update\"}}"
        )),
        "{metrics}"
    );

    std::fs::write(&setup.tsig_file, format!("{}\n", setup.bind.secret)).unwrap();
    let kept = kept.unwrap();
    assert_eq!(
        setup.served_by_pebble()[0],
        kept,
        "the last good certificate chains to the CA"
    );
    eventually(
        Duration::from_secs(30),
        "the renewal succeeding with the right key",
        || {
            https_get(setup.stack.https, &h, "/")
                .ok()
                .filter(|s| s.fingerprint != kept)
        },
    );
    assert!(setup.issuer(&h)["backoff"].is_null());
}

/// The CA down when the agent starts: the account cannot be opened, which the status shows;
/// once the CA is back, certificates are ordered and served without restarting the agent. Then
/// the CA goes down again at renewal time and comes back having lost everything (pebble keeps
/// no state): the renewal fails, backs off, and succeeds with a new account.
#[test]
fn the_ca_down_then_back_recovers_without_a_restart() {
    let mut setup = Setup::new(2);
    setup.pebble.stop();
    let acme = setup.rfc2136(ZONE, "");
    setup.start(
        &acme,
        &[
            // Every back-off step within seconds (6 h become 3.6 s): the test waits for what
            // follows the failures, not for the schedule, which another test observes.
            ("PRIVATE_INGRESS_ACME_TEST_BACKOFF_SCALE", "6000"),
            ("PRIVATE_INGRESS_ACME_TEST_LIFETIME_SECS", "16"),
        ],
    );
    let error = eventually(
        Duration::from_secs(30),
        "the unreachable CA reported",
        || {
            setup
                .stack
                .state()
                .and_then(|s| s["issuer"]["last_error"].as_str().map(str::to_owned))
        },
    );
    assert!(error.contains("cannot be reached"), "{error}");
    assert!(!setup.stack.ready());
    setup.pebble.resume();
    setup.stack.wait_ready(Duration::from_secs(60));
    let first = setup.served_by_pebble();
    assert!(setup.stack.state().unwrap()["issuer"]["last_error"].is_null());

    setup.pebble.stop();
    let h = setup.hosts[0].clone();
    // Back-offs are kept in whole seconds and scaled down to 1 s here, so one is shown for
    // anywhere between a few milliseconds and a second after its failure. The CA stays down,
    // so failures repeat and one of their back-offs is seen.
    let failed = eventually(
        Duration::from_secs(30),
        "a renewal failing on the CA's absence, backing off",
        || {
            let issuer = setup.issuer(&h);
            (!issuer["backoff"].is_null()).then_some(issuer)
        },
    );
    assert_eq!(failed["backoff"]["reason"], "ca_unreachable", "{failed}");
    assert!(
        failed["orders_failed"]["ca_unreachable"].as_u64() >= Some(1),
        "{failed}"
    );
    assert_eq!(
        https_get(setup.stack.https, &h, "/").unwrap().fingerprint,
        first[0]
    );
    setup.pebble.resume();
    eventually(
        Duration::from_secs(60),
        "renewals from the restarted CA",
        || {
            setup
                .served_by_pebble_now()
                .filter(|now| now.iter().zip(&first).all(|(a, b)| a != b))
        },
    );
    let logs = setup.stack.agent_logs();
    assert!(logs.contains("no longer knows the account"), "{logs}");
}

/// `_acme-challenge.<host>` is a CNAME into a zone of its own, the only one the key may update
/// (the workspace zone takes no updates at all): the record is written there, and removed.
#[test]
fn a_cname_delegated_challenge_is_followed() {
    let delegated = format!("d.{ZONE}");
    let cname = "_acme-challenge.d IN CNAME d.acme.example.net.".to_owned();
    let mut setup = Setup::with_zones(
        vec![delegated.clone()],
        &[
            Zone {
                name: ZONE.into(),
                records: vec![cname],
                updatable: false,
            },
            updatable("acme.example.net", &[]),
        ],
    );
    let acme = setup.rfc2136("acme.example.net", "");
    setup.start(&acme, &[]);
    setup.stack.wait_ready(Duration::from_secs(60));
    setup.served_by_pebble();
    assert!(dig(setup.bind.address, "d.acme.example.net", "TXT").is_empty());
    let logs = setup.stack.agent_logs();
    assert!(
        logs.contains("following the _acme-challenge CNAME"),
        "{logs}"
    );
}

/// Cloudflare: the client speaks the documented v4 endpoints (zone lookup, create, list and
/// delete DNS records) over HTTPS, as the real API does, to a stand-in with a CA of its own that
/// publishes the TXT records through pebble-challtestsrv, so a whole order goes through the
/// Cloudflare code path. The agent trusts that CA the way a user would (`SSL_CERT_FILE`). The
/// token only ever travels in the Authorization header.
#[test]
fn cloudflare_orders_go_through_the_documented_v4_endpoints() {
    let stack = Stack::new();
    let dns = Arc::new(Challtestsrv::start(stack.dir.path()));
    let pebble = Pebble::start(stack.dir.path(), dns.dns);
    let token = "cf-test-token-0123456789abcdefghijklmnop";
    let token_file = stack.dir.path().join("cloudflare.token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let api =
        CloudflareStandIn::start(stack.dir.path(), token, &["example.org", ZONE], dns.clone());
    assert!(api.url.starts_with("https://"), "{}", api.url);
    let backend = Backend::start("app");
    let hosts: Vec<String> = (0..2).map(host).collect();
    let routes = routes(&hosts, &backend);
    let acme = format!(
        "  tls_rotation = 'sozu_managed,\n  acme = {{\n    directory = \"{}\",\n    ca_bundle = \"{}\",\n    \
         dns01 = {{ provider = 'cloudflare, api_token_file = \"{}\" }},\n    \
         propagation = {{ nameservers = [\"{}\"] }},\n    state_dir = \"{}\",\n  }},",
        pebble.directory,
        pebble.ca_pem.display(),
        token_file.display(),
        dns.dns,
        stack.dir.path().join("acme-state").display()
    );
    let mut stack = stack;
    stack.write_workspace(&stack.workspace_text_with(&routes, &acme));
    stack.start_sozu();
    stack.start_agent_with(
        &[],
        &[
            ("RUST_LOG", "info,private_ingress=debug"),
            ("PRIVATE_INGRESS_ACME_TEST_CLOUDFLARE_API", &api.url),
            ("SSL_CERT_FILE", &api.ca_pem.display().to_string()),
            // pebble refuses 5% of nonces on purpose; a failure it causes costs a second, not
            // the minute of a first back-off.
            ("PRIVATE_INGRESS_ACME_TEST_BACKOFF_SCALE", "60"),
        ],
    );
    stack.wait_ready(Duration::from_secs(60));
    let root = pebble.root_pem();
    for h in &hosts {
        https_get_verified(stack.https, h, "/", &root).unwrap_or_else(|e| panic!("{h}: {e}"));
    }
    let log = api.log.lock().unwrap().clone();
    for call in [
        "GET /zones",
        "POST /zones/zone0001/dns_records",
        "GET /zones/zone0001/dns_records",
    ] {
        assert!(
            log.calls.iter().any(|c| c == call),
            "{call} not in {:?}",
            log.calls
        );
    }
    let deletes = log
        .calls
        .iter()
        .filter(|c| c.starts_with("DELETE /zones/zone0001/dns_records/"))
        .count();
    assert_eq!(deletes, 2, "{:?}", log.calls);
    assert_eq!(log.unauthorized, 0);
    assert!(
        api.records.lock().unwrap().is_empty(),
        "records left at the API"
    );
    let mut secrets = vec![token.to_owned()];
    secrets.extend(key_lines(&stack.tls_dir()));
    secrets.extend(key_lines(&stack.dir.path().join("acme-state")));
    assert_nothing_leaks(&stack, &secrets);
}

/// A restarted agent finds its account and certificates in the state directory: with its tls dir
/// emptied (a memory-backed volume after a pod restart) it serves the same certificates again and
/// places no order. A second agent on the same state directory fails at once, saying why.
#[test]
fn a_restarted_agent_reuses_its_account_and_certificates_and_orders_nothing() {
    let mut setup = Setup::new(2);
    let acme = setup.rfc2136(ZONE, "");
    setup.start(&acme, &[]);
    setup.stack.wait_ready(Duration::from_secs(60));
    let before = setup.served_by_pebble();

    // A second agent on the same state directory.
    let admin = format!("127.0.0.1:{}", free_port());
    let second = std::process::Command::new(private_ingress_tests::agent_bin())
        .arg("run")
        .arg("--workspace")
        .arg(setup.stack.workspace_path())
        .arg("--sozu-socket")
        .arg(setup.stack.socket())
        .args(["--admin-address", &admin])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{stderr}");
    assert!(stderr.contains("is in use by another agent"), "{stderr}");

    assert!(setup.stack.stop_agent());
    std::fs::remove_dir_all(setup.stack.tls_dir()).unwrap();
    std::fs::create_dir_all(setup.stack.tls_dir()).unwrap();
    setup.start_agent(&[]);
    setup.stack.wait_ready(Duration::from_secs(30));
    assert_eq!(setup.served_by_pebble(), before);
    for h in &setup.hosts {
        let issuer = eventually(Duration::from_secs(10), "the issuer's status", || {
            Some(setup.issuer(h)).filter(|i| !i.is_null())
        });
        assert_eq!(issuer["orders_placed"], 0, "{h}: {issuer}");
        assert_eq!(issuer["state"], "valid", "{h}: {issuer}");
    }
    let accounts = std::fs::read_dir(setup.state_dir().join("accounts"))
        .unwrap()
        .count();
    assert_eq!(accounts, 1);
}

/// A second replica beside `setup`'s agent: its own sozu, its own state directory, the same
/// hosts, one CA and one DNS server. Both agents are started at the same moment, with `env`,
/// and are Ready when this returns.
fn second_replica(setup: &mut Setup, env: &[(&str, &str)]) -> Stack {
    let acme = setup.rfc2136(ZONE, "");
    let mut other = Stack::new();
    let other_state = other.dir.path().join("acme-state");
    let other_acme = acme.replace(
        &setup.state_dir().display().to_string(),
        &other_state.display().to_string(),
    );
    assert_ne!(acme, other_acme);
    setup.write_workspace(&acme);
    other.write_workspace(&other.workspace_text_with(&setup.routes(), &other_acme));
    setup.stack.start_sozu();
    other.start_sozu();
    setup.start_agent(env);
    other.start_agent_with(&[], env);
    setup.stack.wait_ready(Duration::from_secs(120));
    other.wait_ready(Duration::from_secs(120));
    other
}

/// Two replicas of `'sozu_managed`, each with its own sozu and its own state (as a StatefulSet
/// with a volume per pod runs them), started at the same moment for the same hosts against one
/// CA and one DNS server: each validates with its own TXT value beside the other's, both serve
/// CA-issued certificates for every host, no order fails, no challenge value is left, and the
/// CA issued one certificate per host per replica. One of them rescheduled (new sozu, empty tls
/// dir, same state) serves the same certificates and costs no order.
#[test]
fn two_replicas_ordering_the_same_hosts_at_once_both_serve_and_a_rescheduled_one_orders_nothing() {
    let mut setup = Setup::new(3);
    let env = [("RUST_LOG", "info,private_ingress=debug")];
    let mut other = second_replica(&mut setup, &env);

    let root = setup.pebble.root_pem();
    let mine = setup.served_by_pebble();
    let theirs: Vec<String> = setup
        .hosts
        .iter()
        .map(|h| {
            let seen = https_get_verified(other.https, h, "/", &root)
                .unwrap_or_else(|e| panic!("{h} on the other replica: {e}\n{}", other.logs()));
            assert_eq!((seen.status, seen.body.as_str()), (200, "app"));
            seen.fingerprint
        })
        .collect();
    // Each ordered its own certificate: two orders per host at the CA, one per replica.
    for (h, (a, b)) in setup.hosts.iter().zip(mine.iter().zip(&theirs)) {
        assert_ne!(a, b, "{h}: both replicas serve one certificate");
    }
    for (stack, who) in [(&setup.stack, "first"), (&other, "second")] {
        let state = stack.state().expect("/v1/state");
        for h in &setup.hosts {
            let issuer = &state["issuer"]["hosts"][h.as_str()];
            assert_eq!(issuer["state"], "valid", "{who} {h}: {issuer}");
            assert_eq!(issuer["orders_placed"], 1, "{who} {h}: {issuer}");
            assert!(
                issuer["orders_failed"]
                    .as_object()
                    .is_none_or(|failed| failed.is_empty()),
                "{who} {h}: {issuer}"
            );
        }
    }
    for h in &setup.hosts {
        assert!(
            dig(setup.bind.address, &format!("_acme-challenge.{h}"), "TXT").is_empty(),
            "{h}: a challenge value is left"
        );
    }
    // What the design costs at the CA: one certificate per host per replica.
    assert_eq!(setup.pebble.issued(), 2 * setup.hosts.len());

    // The second replica rescheduled: a new pod, so a new sozu and an empty memory-backed tls
    // dir, with the same claim. It serves the certificates it had, from its state, and the CA
    // issues nothing more.
    assert!(other.stop_agent());
    other.kill_sozu();
    std::fs::remove_dir_all(other.tls_dir()).unwrap();
    std::fs::create_dir_all(other.tls_dir()).unwrap();
    other.start_sozu();
    other.start_agent_with(&[], &env);
    other.wait_ready(Duration::from_secs(60));
    for (h, before) in setup.hosts.iter().zip(&theirs) {
        let seen = https_get_verified(other.https, h, "/", &root)
            .unwrap_or_else(|e| panic!("{h} on the rescheduled replica: {e}\n{}", other.logs()));
        assert_eq!(&seen.fingerprint, before, "{h}: the same certificate");
        let issuer = &other.state().expect("/v1/state")["issuer"]["hosts"][h.as_str()];
        assert_eq!(issuer["orders_placed"], 0, "{h}: {issuer}");
    }
    assert_eq!(setup.pebble.issued(), 2 * setup.hosts.len(), "no new order");
}

/// Both replicas renew the same hosts: each renews every host once, at its own due time and
/// not before, so the CA issues one certificate per host per replica again, and both serve
/// their renewals. (How far apart the two fall is the jitter's, a tenth of the margin: a
/// second or so at this test's 20-second lifetime, 3 days for a 90-day certificate, shown by
/// `acme::issuer::tests::replicas_renew_the_same_host_each_once_at_its_own_time`.)
#[test]
fn two_replicas_renew_the_same_hosts_each_once_at_its_own_time() {
    let mut setup = Setup::new(2);
    let env = [
        ("RUST_LOG", "info,private_ingress=debug"),
        ("PRIVATE_INGRESS_ACME_TEST_LIFETIME_SECS", "20"),
    ];
    let other = second_replica(&mut setup, &env);
    let stacks = [&setup.stack, &other];
    let root = setup.pebble.root_pem();
    let unix_now = || {
        SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    // Per replica and host: the renewal due, the certificate served now, and when another one
    // was first seen served.
    let mut watched: Vec<(usize, String, i64, String, Option<f64>)> = Vec::new();
    for (replica, stack) in stacks.iter().enumerate() {
        let state = stack.state().expect("/v1/state");
        for h in &setup.hosts {
            let due = state["issuer"]["hosts"][h.as_str()]["renewal_due"]
                .as_i64()
                .unwrap_or_else(|| panic!("{h}: {state}"));
            let first = https_get_verified(stack.https, h, "/", &root)
                .unwrap_or_else(|e| panic!("{h}: {e}"))
                .fingerprint;
            watched.push((replica, h.clone(), due, first, None));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    while watched.iter().any(|w| w.4.is_none()) {
        assert!(
            Instant::now() < deadline,
            "renewals not all served: {watched:?}"
        );
        for (replica, h, _, first, seen) in watched.iter_mut().filter(|w| w.4.is_none()) {
            let served = https_get_verified(stacks[*replica].https, h, "/", &root);
            if served.is_ok_and(|s| s.fingerprint != *first) {
                *seen = Some(unix_now());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (replica, h, due, _, seen) in &watched {
        let seen = seen.unwrap_or_default();
        assert!(
            seen >= *due as f64,
            "replica {replica}, {h}: renewed before its due time {due} (served at {seen:.1})"
        );
        eprintln!(
            "replica {replica}, {h}: due {due}, renewal served {:.1} s after",
            seen - *due as f64
        );
    }
    // What the CA issued is what the replicas ordered, each host by each replica (renewals go on
    // every 10 s or so here: counted between two equal readings of pebble's log).
    let (issued, ordered) = eventually(Duration::from_secs(30), "a steady count", || {
        let before = setup.pebble.issued();
        let ordered: u64 = stacks
            .iter()
            .filter_map(|stack| stack.state())
            .flat_map(|state| {
                setup
                    .hosts
                    .iter()
                    .map(|h| {
                        state["issuer"]["hosts"][h.as_str()]["certificates_issued"]
                            .as_u64()
                            .unwrap_or(0)
                    })
                    .collect::<Vec<_>>()
            })
            .sum();
        (setup.pebble.issued() == before).then_some((before, ordered))
    });
    assert_eq!(
        issued as u64, ordered,
        "pebble issued what the replicas ordered"
    );
    assert!(issued >= 2 * 2 * setup.hosts.len(), "{issued}");
    for stack in stacks {
        let state = stack.state().expect("/v1/state");
        for h in &setup.hosts {
            let issuer = &state["issuer"]["hosts"][h.as_str()];
            assert!(
                issuer["orders_failed"]
                    .as_object()
                    .is_none_or(|o| o.is_empty()),
                "{h}: {issuer}"
            );
        }
    }
}
