//! The listeners' policy (`listeners.*`): client certificates from a device CA with its
//! revocation list, the lowest TLS version, as sozu applies them from the configuration that
//! `render --format sozu-toml` writes.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use private_ingress_tests::devices::DeviceCa;
use private_ingress_tests::live::{
    certificate, eventually, https_get_as, https_get_behind_proxy, promtool_check, sample, Backend,
    Stack,
};
use private_ingress_tests::{agent_bin, run};

const HOST: &str = "grafana.in.example.org";
const TLS12: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];
const TLS13: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
const ANY_TLS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// Renders the workspace of one route to `backend` with `listeners` (Nickel fields of the
/// `listeners` record) into a sozu configuration, and starts sozu from it.
fn sozu_from_rendered(stack: &mut Stack, backend: &Backend, listeners: &str) {
    certificate(&stack.tls_dir(), HOST);
    let route = format!(
        "{{ host = \"{HOST}\", upstream = \"{}\", port = {} }}",
        backend.address.ip(),
        backend.address.port()
    );
    let text = stack
        .workspace_text_of(&[route], "")
        .replace("listeners = {", &format!("listeners = {{ {listeners}"));
    let ws = stack.dir.path().join("ws/workspace.ncl");
    std::fs::write(&ws, &text).unwrap();
    let config = stack.dir.path().join("rendered.toml");
    let (code, _, err) = run(Command::new(agent_bin())
        .arg("render")
        .arg(&ws)
        .args(["--format", "sozu-toml", "--output"])
        .arg(&config)
        .arg("--sozu-socket")
        .arg(stack.socket()));
    assert_eq!(code, 0, "render failed: {err}\n{text}");
    stack.start_sozu_with_config(&config);
}

/// With `client_auth.mode = 'required`: an enrolled device gets 200, a client without a
/// certificate and a revoked device are refused in the handshake, and so is a device of
/// another CA.
#[test]
fn required_client_certificates_let_enrolled_devices_in_and_keep_the_others_out() {
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    let mut ca = DeviceCa::new("devices");
    let laptop = ca.enroll("laptop");
    let lost = ca.enroll("lost-phone");
    let crl = ca.crl(&[lost.serial], time::Duration::days(7));
    let stranger = DeviceCa::new("elsewhere").enroll("stranger");
    let devices = stack.dir.path().join("devices");
    write_devices(&devices, 0, &ca.pem(), &crl);
    sozu_from_rendered(
        &mut stack,
        &backend,
        &client_auth_field("required", &devices),
    );
    let seen = eventually(
        Duration::from_secs(10),
        "the enrolled device served",
        || https_get_as(stack.https, HOST, "/", ANY_TLS, Some(&laptop.identity)).ok(),
    );
    assert_eq!((seen.status, seen.body.as_str()), (200, "app"));
    for (who, identity) in [
        ("no certificate", None),
        ("the revoked device", Some(&lost.identity)),
        ("another CA's device", Some(&stranger.identity)),
    ] {
        let refused = https_get_as(stack.https, HOST, "/", ANY_TLS, identity);
        assert!(refused.is_err(), "{who} got in: {refused:?}");
    }
}

/// With `client_auth.mode = 'optional`: a client without a certificate gets in, an enrolled
/// device too, a revoked one does not.
#[test]
fn optional_client_certificates_let_anonymous_clients_in_but_not_revoked_devices() {
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    let mut ca = DeviceCa::new("devices");
    let laptop = ca.enroll("laptop");
    let lost = ca.enroll("lost-phone");
    let crl = ca.crl(&[lost.serial], time::Duration::days(7));
    let devices = stack.dir.path().join("devices");
    write_devices(&devices, 0, &ca.pem(), &crl);
    sozu_from_rendered(
        &mut stack,
        &backend,
        &client_auth_field("optional", &devices),
    );
    let seen = eventually(
        Duration::from_secs(10),
        "an anonymous client served",
        || https_get_as(stack.https, HOST, "/", ANY_TLS, None).ok(),
    );
    assert_eq!(seen.status, 200);
    let seen = https_get_as(stack.https, HOST, "/", ANY_TLS, Some(&laptop.identity));
    assert_eq!(seen.map(|s| s.status), Ok(200));
    let refused = https_get_as(stack.https, HOST, "/", ANY_TLS, Some(&lost.identity));
    assert!(refused.is_err(), "the revoked device got in: {refused:?}");
}

/// `min_tls_version = "1.3"`: a TLS 1.2 client is refused, a TLS 1.3 one served; with the
/// default, both are served.
#[test]
fn a_tls_1_3_minimum_refuses_tls_1_2_clients() {
    let backend = Backend::start("app");
    let mut strict = Stack::new();
    sozu_from_rendered(&mut strict, &backend, "min_tls_version = \"1.3\",");
    let seen = eventually(Duration::from_secs(10), "a TLS 1.3 client served", || {
        https_get_as(strict.https, HOST, "/", TLS13, None).ok()
    });
    assert_eq!(seen.status, 200);
    let refused = https_get_as(strict.https, HOST, "/", TLS12, None);
    assert!(refused.is_err(), "a TLS 1.2 client got in: {refused:?}");

    let mut default = Stack::new();
    sozu_from_rendered(&mut default, &backend, "");
    let seen = eventually(Duration::from_secs(10), "a TLS 1.2 client served", || {
        https_get_as(default.https, HOST, "/", TLS12, None).ok()
    });
    assert_eq!(seen.status, 200);
}

/// Writes the workspace of one route to `backend`, with `listeners` fields.
fn write_workspace(stack: &Stack, backend: &Backend, listeners: &str) {
    let route = format!(
        "{{ host = \"{HOST}\", upstream = \"{}\", port = {} }}",
        backend.address.ip(),
        backend.address.port()
    );
    let text = stack
        .workspace_text_of(&[route], "")
        .replace("listeners = {", &format!("listeners = {{ {listeners}"));
    stack.write_workspace(&text);
}

/// sozu started without listeners: the agent makes them as the workspace says. A TLS 1.3
/// minimum refuses TLS 1.2. Turning on the PROXY protocol applies to the running listeners: a
/// client behind a load balancer that sends the header is served, the backend gets the client's
/// address from it in `X-Forwarded-For` and the access log names it; a connection without the
/// header is refused.
/// Lowering the TLS minimum again is something sozu takes on a new listener only: the agent says
/// a restart is needed, and the listener keeps refusing TLS 1.2 meanwhile.
#[test]
fn the_agent_makes_and_patches_its_listeners_as_the_workspace_says() {
    use std::net::{Ipv4Addr, SocketAddrV4};
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), HOST);
    write_workspace(&stack, &backend, "min_tls_version = \"1.3\",");
    // sozu sends its records to the agent, whose access log goes to its stdout.
    stack.send_traffic();
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(30));
    let seen = https_get_as(stack.https, HOST, "/", TLS13, None);
    assert_eq!(seen.map(|s| s.status), Ok(200));
    let refused = https_get_as(stack.https, HOST, "/", TLS12, None);
    assert!(refused.is_err(), "a TLS 1.2 client got in: {refused:?}");

    write_workspace(
        &stack,
        &backend,
        "min_tls_version = \"1.3\", expect_proxy = true,",
    );
    let client = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 7), 50123);
    let seen = eventually(Duration::from_secs(10), "the PROXY header read", || {
        https_get_behind_proxy(stack.https, HOST, "/headers", client).ok()
    });
    assert_eq!(seen.status, 200, "{seen:?}");
    let forwarded = seen
        .body
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("x-forwarded-for:"))
        .unwrap_or_else(|| panic!("no X-Forwarded-For in what the backend got:\n{}", seen.body));
    assert!(forwarded.contains("192.0.2.7"), "{forwarded}");
    let refused = https_get_as(stack.https, HOST, "/", ANY_TLS, None);
    assert!(
        refused.is_err(),
        "a connection without the header got in: {refused:?}"
    );
    // The access log names the client the header named.
    stack.wait_agent_log("\"client\":\"192.0.2.7:50123\"", Duration::from_secs(10));

    write_workspace(&stack, &backend, "expect_proxy = true,");
    let state = eventually(Duration::from_secs(10), "the restart asked for", || {
        stack.state().filter(|s| {
            s["sozu"]["listeners_need_restart"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
        })
    });
    assert_eq!(
        state["sozu"]["listeners_need_restart"],
        serde_json::json!([format!("{}: min_tls_version", stack.https)])
    );
    let still = https_get_behind_proxy(stack.https, HOST, "/", client);
    assert_eq!(still.map(|s| s.status), Ok(200));
}

/// The device CA and its CRL in a directory the way a Secret volume holds them (AtomicWriter).
fn write_devices(dir: &Path, generation: u32, ca: &str, crl: &str) {
    private_ingress_tests::kubelet::volumes::atomic_write(
        dir,
        &[
            ("ca.crt".into(), ca.as_bytes().to_vec(), 0o444),
            ("devices.crl".into(), crl.as_bytes().to_vec(), 0o444),
        ],
        None,
        generation,
    );
}

/// The `listeners` field asking for client certificates in `mode` from the CA and CRL that
/// [`write_devices`] keeps in `devices`.
fn client_auth_field(mode: &str, devices: &Path) -> String {
    format!(
        "client_auth = {{ mode = '{mode}, ca_file = \"{0}/ca.crt\", crl_files = [\"{0}/devices.crl\"] }},",
        devices.display()
    )
}

/// sozu started without listeners: the agent makes the https listener with the device CA and
/// its CRL, read from a Secret-like volume. An enrolled device gets in, a client without a
/// certificate and a revoked device do not. A new CRL revoking a working device, swapped in as
/// the kubelet swaps a Secret, keeps it out, while another device's requests go on without a
/// failure. An expired CRL and one of another CA are refused with their reason in `/v1/state`,
/// and the last good CRL keeps being applied.
#[test]
fn the_agent_applies_the_device_ca_and_each_new_crl_live_and_keeps_the_last_good_one() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Instant;
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), HOST);
    let mut ca = DeviceCa::new("devices");
    let laptop = ca.enroll("laptop");
    let phone = ca.enroll("phone");
    let lost = ca.enroll("lost-tablet");
    let devices = stack.dir.path().join("devices");
    let first = ca.crl(&[lost.serial], time::Duration::days(7));
    write_devices(&devices, 0, &ca.pem(), &first);
    write_workspace(&stack, &backend, &client_auth_field("required", &devices));
    stack.start_sozu();
    stack.start_agent_with(&["--resync-interval", "1"], &[]);
    stack.wait_ready(Duration::from_secs(30));
    let get = |identity| https_get_as(stack.https, HOST, "/", ANY_TLS, identity);
    assert_eq!(get(Some(&laptop.identity)).map(|s| s.status), Ok(200));
    for (who, identity) in [
        ("no certificate", None),
        ("the revoked tablet", Some(&lost.identity)),
    ] {
        let refused = get(identity);
        assert!(refused.is_err(), "{who} got in: {refused:?}");
    }
    // Both refusals counted, each under its reason.
    let counted = |reason: &str| {
        let metrics = stack.metrics();
        let line = format!("private_ingress_tls_handshake_failures_total{{reason=\"{reason}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    eventually(
        Duration::from_secs(20),
        "the refused handshakes counted",
        || {
            (counted("no_certificates_present") >= 1 && counted("invalid_certificate") >= 1)
                .then_some(())
        },
    );

    // The phone keeps asking throughout; none of its requests may fail.
    let stop = Arc::new(AtomicBool::new(false));
    let phone_load = {
        let (stop, https, identity) = (stop.clone(), stack.https, phone.identity.clone());
        std::thread::spawn(move || {
            let (mut ok, mut failed) = (0u32, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match https_get_as(https, HOST, "/", ANY_TLS, Some(&identity)) {
                    Ok(s) if s.status == 200 => ok += 1,
                    other => failed.push(format!("{other:?}")),
                }
            }
            (ok, failed)
        })
    };
    let second = ca.crl(&[lost.serial, laptop.serial], time::Duration::days(7));
    write_devices(&devices, 1, &ca.pem(), &second);
    let swapped = Instant::now();
    eventually(Duration::from_secs(10), "the laptop revoked", || {
        get(Some(&laptop.identity)).is_err().then_some(())
    });
    println!(
        "a new CRL kept the laptop out {:?} after the swap",
        swapped.elapsed()
    );

    // An expired CRL, then one of another CA: refused, the last good one stays.
    let expired = ca.crl(&[], -time::Duration::hours(1));
    write_devices(&devices, 2, &ca.pem(), &expired);
    let state = eventually(Duration::from_secs(10), "the expired CRL refused", || {
        stack.state().filter(|s| {
            s["sozu"]["client_auth"]["crls"][0]["problem"]
                .as_str()
                .is_some_and(|p| p.contains("has passed"))
        })
    });
    assert!(
        state["sozu"]["client_auth"]["crls"][0]["next_update"]
            .as_i64()
            .is_some_and(|t| t > 0),
        "{state}"
    );
    assert_eq!(state["sozu"]["client_auth"]["ca"]["subject"], "CN=devices");
    // The metric carries the nextUpdate of the CRL in force, and the file's refusal.
    let metrics = stack.metrics();
    let crl_file = format!("{}/devices.crl", devices.display());
    let second_next_update = state["sozu"]["client_auth"]["crls"][0]["next_update"]
        .as_i64()
        .unwrap_or_default();
    assert!(
        metrics.contains(&format!(
            "private_ingress_client_crl_next_update_seconds{{file=\"{crl_file}\"}} {second_next_update}"
        )) && metrics.contains(&format!(
            "private_ingress_client_auth_file_refused{{file=\"{crl_file}\"}} 1"
        )),
        "{metrics}"
    );
    let shown = stack.status_text();
    assert!(
        shown.contains("client certificates: required")
            && shown.contains("CN=devices")
            && shown.contains("2 revoked")
            && shown.contains("has passed: sozu refuses it"),
        "{shown}"
    );
    let foreign = DeviceCa::new("elsewhere").crl(&[], time::Duration::days(7));
    write_devices(&devices, 3, &ca.pem(), &foreign);
    eventually(Duration::from_secs(10), "the foreign CRL refused", || {
        stack.state().filter(|s| {
            s["sozu"]["client_auth"]["crls"][0]["problem"]
                .as_str()
                .is_some_and(|p| p.contains("not signed by the CA"))
        })
    });
    let refused = get(Some(&laptop.identity));
    assert!(refused.is_err(), "the laptop got back in: {refused:?}");
    assert_eq!(get(Some(&phone.identity)).map(|s| s.status), Ok(200));
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = phone_load.join().unwrap();
    assert!(
        failed.is_empty(),
        "{} of the phone's requests failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    assert!(ok > 0, "the phone sent nothing");
    // Settled: what sozu reports back is what the agent sent, so a full read of sozu's state
    // (every second here) finds nothing to send.
    let counters = |s: &serde_json::Value| {
        (
            s["counters"]["resyncs"].as_u64().unwrap_or(0),
            s["counters"]["sozu_requests"].as_u64().unwrap_or(0),
        )
    };
    let (resyncs, requests) = counters(&stack.state().expect("/v1/state"));
    let later = eventually(Duration::from_secs(30), "two more resyncs", || {
        stack.state().filter(|s| counters(s).0 >= resyncs + 2)
    });
    assert_eq!(
        counters(&later).1,
        requests,
        "the agent keeps sending requests"
    );
}

/// A CRL without the CRL Number extension, which RFC 5280 requires in every CRL, as `openssl ca
/// -gencrl` writes one when its configuration names no `crlnumber` file: sozu 2.3.3 refuses it
/// (rustls-webpki's parser), so the agent refuses it before sozu sees it. Swapped in to revoke
/// device B, it leaves the last good CRL in force and says so: B is still let in, and
/// `/v1/state`, `/metrics` and `status` give the file's reason and the CRL in force (revoking
/// nothing), not the one on disk. A proper CRL revoking B then keeps B out at its next
/// connection once the agent shows it in force, and the problem is gone.
#[test]
fn a_crl_without_a_crl_number_is_refused_with_its_reason_and_the_last_good_one_stays() {
    use private_ingress_tests::devices::Device;
    use std::time::Instant;
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), HOST);
    let mut ca = DeviceCa::new("devices");
    let a = ca.enroll("device-a");
    let b = ca.enroll("device-b");
    let devices = stack.dir.path().join("devices");
    write_devices(
        &devices,
        0,
        &ca.pem(),
        &ca.crl(&[], time::Duration::days(7)),
    );
    write_workspace(&stack, &backend, &client_auth_field("required", &devices));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(30));
    let get =
        |device: &Device| https_get_as(stack.https, HOST, "/", ANY_TLS, Some(&device.identity));
    assert_eq!(get(&a).map(|s| s.status), Ok(200));
    assert_eq!(get(&b).map(|s| s.status), Ok(200));
    let crl_of = |s: &serde_json::Value| s["sozu"]["client_auth"]["crls"][0].clone();
    let first = crl_of(&stack.state().expect("/v1/state"));
    assert_eq!(first["revoked"], 0, "{first}");
    let crl_file = format!("{}/devices.crl", devices.display());
    let refused_series = format!("private_ingress_client_auth_file_refused{{file=\"{crl_file}\"}}");

    let no_number = ca.openssl_crl_without_crl_number(&[&b], &stack.dir.path().join("openssl-ca"));
    write_devices(&devices, 1, &ca.pem(), &no_number);
    let state = eventually(Duration::from_secs(10), "the CRL refused", || {
        stack.state().filter(|s| !crl_of(s)["problem"].is_null())
    });
    let problem = crl_of(&state)["problem"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        problem.starts_with(&crl_file)
            && problem.contains("CRL Number")
            && problem.contains("sozu refuses"),
        "{problem}"
    );
    // The CRL in force is still the first one, and the state says so.
    assert_eq!(crl_of(&state)["revoked"], 0, "{state}");
    assert_eq!(
        crl_of(&state)["next_update"],
        first["next_update"],
        "{state}"
    );
    assert!(
        state["sozu"]["client_auth"]["sozu_refused"].is_null(),
        "{state}"
    );
    assert_eq!(state["ready"], true, "{state}");
    let still = get(&b);
    assert_eq!(
        still.map(|s| s.status),
        Ok(200),
        "B's revocation is not in force"
    );
    let metrics = stack.metrics();
    assert_eq!(sample(&metrics, &refused_series), Some(1.0), "{metrics}");
    assert_eq!(
        sample(&metrics, "private_ingress_client_auth_refused_by_sozu"),
        Some(0.0),
        "{metrics}"
    );
    let shown = stack.status_text();
    assert!(
        shown.contains("0 revoked") && shown.contains("CRL Number"),
        "{shown}"
    );

    // A proper CRL revoking B: in force at once, B out at its next connection.
    write_devices(
        &devices,
        2,
        &ca.pem(),
        &ca.crl(&[b.serial], time::Duration::days(7)),
    );
    let written = Instant::now();
    let state = eventually(Duration::from_secs(10), "the proper CRL in force", || {
        stack
            .state()
            .filter(|s| crl_of(s)["problem"].is_null() && crl_of(s)["revoked"] == 1)
    });
    let shown_at = written.elapsed();
    let refused = get(&b);
    let refused_at = written.elapsed();
    assert!(
        refused.is_err(),
        "B got in after its revocation was shown in force: {refused:?}"
    );
    println!(
        "the proper CRL shown in force {shown_at:?} after its write; B refused at its next \
         connection, {refused_at:?} after the write"
    );
    assert!(
        state["sozu"]["client_auth"]["sozu_refused"].is_null(),
        "{state}"
    );
    assert_eq!(get(&a).map(|s| s.status), Ok(200));
    let metrics = stack.metrics();
    assert_eq!(sample(&metrics, &refused_series), Some(0.0), "{metrics}");
    assert_eq!(
        sample(&metrics, "private_ingress_client_auth_refused_by_sozu"),
        Some(0.0),
        "{metrics}"
    );
}

/// sozu refuses a set of client certificates the agent validated: the second CRL file's CRL
/// lapses in sozu (its file is then refused as past its `nextUpdate`, its last good version
/// kept), and a new CRL in the first file, revoking the laptop, sends that lapsed CRL again.
/// sozu keeps the set it held, and the agent says so, staying ready: `/v1/state` gives sozu's
/// reason and the first file's CRL sozu kept (revoking nothing), the metric is 1, `status`
/// prints it. A new CRL in the second file makes a set sozu takes: the laptop is kept out, the
/// phone served, the refusal gone.
#[test]
fn a_set_sozu_refuses_anyway_is_reported_with_its_reason_until_sozu_takes_one() {
    use private_ingress_tests::devices::Device;
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), HOST);
    let (mut laptops, mut phones) = (DeviceCa::new("laptops"), DeviceCa::new("phones"));
    let laptop = laptops.enroll("laptop");
    let phone = phones.enroll("phone");
    let devices = stack.dir.path().join("devices");
    let cas = format!("{}{}", laptops.pem(), phones.pem());
    let write = |generation: u32, laptops_crl: &str, phones_crl: &str| {
        private_ingress_tests::kubelet::volumes::atomic_write(
            &devices,
            &[
                ("ca.crt".into(), cas.as_bytes().to_vec(), 0o444),
                ("laptops.crl".into(), laptops_crl.as_bytes().to_vec(), 0o444),
                ("phones.crl".into(), phones_crl.as_bytes().to_vec(), 0o444),
            ],
            None,
            generation,
        );
    };
    let lapsing = phones.crl(&[], time::Duration::seconds(10));
    write(0, &laptops.crl(&[], time::Duration::days(7)), &lapsing);
    write_workspace(
        &stack,
        &backend,
        &format!(
            "client_auth = {{ mode = 'required, ca_file = \"{0}/ca.crt\", crl_files = \
             [\"{0}/laptops.crl\", \"{0}/phones.crl\"] }},",
            devices.display()
        ),
    );
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(30));
    let get =
        |device: &Device| https_get_as(stack.https, HOST, "/", ANY_TLS, Some(&device.identity));
    assert_eq!(get(&laptop).map(|s| s.status), Ok(200));
    let auth_of = |s: &serde_json::Value| s["sozu"]["client_auth"].clone();
    let next_update = auth_of(&stack.state().expect("/v1/state"))["crls"][1]["next_update"]
        .as_i64()
        .expect("the phones' CRL's nextUpdate");
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    eventually(Duration::from_secs(30), "the phones' CRL lapsed", || {
        (now() > next_update as f64 + 1.0).then_some(())
    });

    let revoking = laptops.crl(&[laptop.serial], time::Duration::days(7));
    write(1, &revoking, &lapsing);
    let state = eventually(Duration::from_secs(10), "sozu's refusal shown", || {
        stack
            .state()
            .filter(|s| !auth_of(s)["sozu_refused"].is_null())
    });
    let auth = auth_of(&state);
    let reason = auth["sozu_refused"].as_str().unwrap_or_default();
    assert!(
        reason.contains("CRL #2") && reason.contains("expired"),
        "{reason}"
    );
    assert_eq!(
        auth["crls"][0]["revoked"], 0,
        "the laptops' CRL sozu kept: {auth}"
    );
    assert!(auth["crls"][0]["problem"].is_null(), "{auth}");
    assert!(
        auth["crls"][1]["problem"]
            .as_str()
            .is_some_and(|p| p.contains("has passed")),
        "{auth}"
    );
    assert_eq!(state["ready"], true, "{state}");
    let metrics = stack.metrics();
    assert_eq!(
        sample(&metrics, "private_ingress_client_auth_refused_by_sozu"),
        Some(1.0),
        "{metrics}"
    );
    promtool_check(&metrics).unwrap_or_else(|e| panic!("{e}\n{metrics}"));
    let shown = stack.status_text();
    assert!(
        shown.contains("sozu refused the CA and CRLs the files hold and keeps enforcing the ones it held before")
            && shown.contains("CRL #2"),
        "{shown}"
    );

    // A new CRL for the phones: a set sozu takes.
    write(2, &revoking, &phones.crl(&[], time::Duration::days(7)));
    eventually(Duration::from_secs(10), "the new set in force", || {
        stack.state().filter(|s| {
            let auth = auth_of(s);
            auth["sozu_refused"].is_null()
                && auth["crls"][0]["revoked"] == 1
                && auth["crls"][1]["problem"].is_null()
        })
    });
    let refused = get(&laptop);
    assert!(refused.is_err(), "the revoked laptop got in: {refused:?}");
    assert_eq!(get(&phone).map(|s| s.status), Ok(200));
    let metrics = stack.metrics();
    assert_eq!(
        sample(&metrics, "private_ingress_client_auth_refused_by_sozu"),
        Some(0.0),
        "{metrics}"
    );
}

/// What sozu does with a CRL it holds once that CRL's `nextUpdate` passes: every handshake
/// fails, enrolled devices' included (sozu 2.3.3 checks CRL expiry). The agent cannot apply an
/// expired CRL either, so the way out is a new CRL, which it applies at once.
#[test]
fn a_crl_that_lapses_in_sozu_fails_every_handshake_until_a_new_one_comes() {
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), HOST);
    let mut ca = DeviceCa::new("devices");
    let laptop = ca.enroll("laptop");
    let devices = stack.dir.path().join("devices");
    let lapsing = ca.crl(&[], time::Duration::seconds(4));
    write_devices(&devices, 0, &ca.pem(), &lapsing);
    write_workspace(&stack, &backend, &client_auth_field("required", &devices));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(30));
    let get = || https_get_as(stack.https, HOST, "/", ANY_TLS, Some(&laptop.identity));
    assert_eq!(get().map(|s| s.status), Ok(200));
    let state = stack.state().expect("/v1/state");
    let next_update = state["sozu"]["client_auth"]["crls"][0]["next_update"]
        .as_i64()
        .expect("the CRL's nextUpdate");
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    eventually(Duration::from_secs(30), "the nextUpdate passed", || {
        (now() > next_update as f64 + 1.0).then_some(())
    });
    let lapsed = get();
    assert!(lapsed.is_err(), "sozu still lets the laptop in: {lapsed:?}");
    write_devices(
        &devices,
        1,
        &ca.pem(),
        &ca.crl(&[], time::Duration::days(7)),
    );
    let seen = eventually(Duration::from_secs(10), "the laptop back in", || get().ok());
    assert_eq!(seen.status, 200);
}

/// The just recipes for a test setup's device CA, used as an operator would: `device-ca`,
/// `device-enroll` for two devices, the agent serving both, then `device-revoke` of one: the
/// CRL the recipe rewrites is taken at once, the revoked device is kept out and the other one
/// served.
#[test]
fn the_device_recipes_enroll_and_revoke_devices_the_agent_applies() {
    use private_ingress_tests::live::ClientIdentity;
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), HOST);
    let out = stack.dir.path().join("out");
    let just = |args: &[&str]| {
        let (code, stdout, err) = run(Command::new("just")
            .arg("--justfile")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/justfile"))
            .args(args)
            .env("OUT", &out));
        assert_eq!(code, 0, "just {args:?}: {stdout}{err}");
    };
    just(&["device-ca"]);
    just(&["device-enroll", "laptop"]);
    just(&["device-enroll", "phone"]);
    let devices = out.join("devices");
    let identity = |name: &str| ClientIdentity {
        chain_pem: std::fs::read_to_string(devices.join(format!("{name}.crt"))).unwrap(),
        key_pem: std::fs::read_to_string(devices.join(format!("{name}.key"))).unwrap(),
    };
    let (laptop, phone) = (identity("laptop"), identity("phone"));
    write_workspace(&stack, &backend, &client_auth_field("required", &devices));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(30));
    let get = |identity| https_get_as(stack.https, HOST, "/", ANY_TLS, identity);
    assert_eq!(get(Some(&laptop)).map(|s| s.status), Ok(200));
    assert_eq!(get(Some(&phone)).map(|s| s.status), Ok(200));

    just(&["device-revoke", "laptop"]);
    eventually(Duration::from_secs(10), "the laptop revoked", || {
        get(Some(&laptop)).is_err().then_some(())
    });
    assert_eq!(get(Some(&phone)).map(|s| s.status), Ok(200));
}

/// `listeners.interface` binds the listeners to one interface (here the loopback one, whose
/// address they listen on: served), and a name no interface has is refused by sozu, shown in
/// `/v1/state`, and serves nothing. `listeners.timeouts.request` closes a client that does not
/// finish its request head in time (1 s here; sozu's default is 10 s).
#[test]
fn an_interface_binds_the_listeners_and_the_request_timeout_closes_slow_clients() {
    use private_ingress_tests::live::KeepAlive;
    use std::time::Instant;
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), HOST);
    write_workspace(
        &stack,
        &backend,
        "interface = \"lo\", timeouts.request = 1,",
    );
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(30));
    assert_eq!(
        https_get_as(stack.https, HOST, "/", ANY_TLS, None).map(|s| s.status),
        Ok(200)
    );
    let mut slow = KeepAlive::connect(stack.https, HOST).expect("a TLS connection");
    slow.send_partial_head().expect("half a request head");
    let sent = Instant::now();
    let answer = slow
        .read_until_closed(Duration::from_secs(30))
        .expect("the connection closed by sozu");
    let closed = sent.elapsed();
    println!("a request head left unfinished closed after {closed:?}: {answer:?}");
    assert!(
        closed < Duration::from_secs(8),
        "closed after {closed:?}, not the 1 s asked for"
    );

    let mut elsewhere = Stack::new();
    certificate(&elsewhere.tls_dir(), HOST);
    write_workspace(&elsewhere, &backend, "interface = \"pi-absent0\",");
    elsewhere.start_sozu();
    elsewhere.start_agent();
    let state = eventually(Duration::from_secs(30), "the listener refused", || {
        elsewhere
            .state()
            .filter(|s| s.to_string().contains("pi-absent0"))
    });
    assert_eq!(state["ready"], false, "{state}");
    let refused = https_get_as(elsewhere.https, HOST, "/", ANY_TLS, None);
    assert!(refused.is_err(), "served without its listener: {refused:?}");
}

/// What a backend learns of the device that connected: nothing. sozu 2.3.3 checks the client
/// certificate in the handshake and forwards none of it (no subject, serial or fingerprint in
/// any header); a header a client sends under a name other proxies use for that
/// (`X-Forwarded-Client-Cert`, Envoy's) reaches the backend as the client wrote it, unless the
/// workspace removes it, as docs/contract.md shows.
#[test]
fn a_backend_learns_nothing_of_the_client_certificate_and_a_forged_one_is_removed_when_asked() {
    use private_ingress_tests::live::{fingerprint_of_pem, https_get_as_sending};
    let backend = Backend::start("app");
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), HOST);
    let mut ca = DeviceCa::new("devices");
    let laptop = ca.enroll("laptop-of-ana");
    let devices = stack.dir.path().join("devices");
    write_devices(
        &devices,
        0,
        &ca.pem(),
        &ca.crl(&[], time::Duration::days(7)),
    );
    write_workspace(&stack, &backend, &client_auth_field("required", &devices));
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(30));
    let forged = ("X-Forwarded-Client-Cert", "Subject=\"CN=admin\"");
    let head = || {
        eventually(Duration::from_secs(30), "the device served", || {
            https_get_as_sending(stack.https, HOST, "/headers", &laptop.identity, &[forged])
                .ok()
                .filter(|s| s.status == 200)
        })
        .body
    };
    let seen = head();
    let fingerprint = fingerprint_of_pem(&laptop.identity.chain_pem);
    for trace in [
        "laptop-of-ana".to_owned(),
        fingerprint.clone(),
        fingerprint.to_uppercase(),
        format!("{:x}", laptop.serial),
        laptop.serial.to_string(),
    ] {
        assert!(
            !seen.contains(&trace),
            "{trace} reached the backend:\n{seen}"
        );
    }
    assert!(
        seen.contains("X-Forwarded-Client-Cert: Subject=\"CN=admin\""),
        "a client's header goes through as written:\n{seen}"
    );

    let text = std::fs::read_to_string(stack.workspace_path())
        .unwrap()
        .replace(
            "routes = [",
            "headers.request.remove = [\"X-Forwarded-Client-Cert\"],\n  routes = [",
        );
    stack.write_workspace(&text);
    let seen = eventually(Duration::from_secs(30), "the forged header removed", || {
        let seen = head();
        (!seen.to_lowercase().contains("x-forwarded-client-cert")).then_some(seen)
    });
    assert!(seen.starts_with("GET /headers"), "{seen}");
}

/// With `client_auth.mode = 'required`, a route of its own port is open to every client that
/// reaches it: sozu's TCP listener verifies no client certificate (`lib/src/tcp.rs`,
/// `TcpListener::new`: no TLS configuration). So the workspace must say so on the route
/// (`client_auth_exempt = true`), and `status` warns of it, while HTTPS without a certificate
/// stays refused. What `status` prints of the device CA's subject is safe for a terminal: a C1
/// control in it (U+009B, a terminal's CSI) is escaped, in the table and in the JSON, which
/// still reads as the same subject.
#[test]
fn a_stream_route_exempt_from_client_certificates_is_open_and_said_so() {
    use std::io::{Read, Write};
    let backend = Backend::start("app");
    let upstream = private_ingress_tests::live::echo_backend();
    let mut stack = Stack::new();
    certificate(&stack.tls_dir(), HOST);
    let subject = "devices\u{9b}31m";
    let mut ca = DeviceCa::new(subject);
    let crl = ca.crl(&[], time::Duration::days(7));
    let devices = stack.dir.path().join("devices");
    write_devices(&devices, 0, &ca.pem(), &crl);
    let listen = private_ingress_tests::live::free_port();
    let routes = [
        format!(
            "{{ host = \"{HOST}\", upstream = \"{}\", port = {} }}",
            backend.address.ip(),
            backend.address.port()
        ),
        format!(
            "{{ host = \"db.in.example.org\", protocol = 'tcp, listen_port = {listen}, upstream = \"{}\", port = {}, client_auth_exempt = true }}",
            upstream.ip(),
            upstream.port()
        ),
    ];
    let text = stack.workspace_text_of(&routes, "").replace(
        "listeners = {",
        &format!("listeners = {{ {}", client_auth_field("required", &devices)),
    );
    // Without the exemption, `check` refuses the route, at its position.
    let unsaid = stack.dir.path().join("ws/unsaid.ncl");
    std::fs::write(&unsaid, text.replace(", client_auth_exempt = true", "")).unwrap();
    let (code, out, err) = run(Command::new(agent_bin()).arg("check").arg(&unsaid));
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("routes[1]: the 'tcp route `db.in.example.org` would be open without a client certificate"),
        "{err}"
    );
    assert!(err.contains("unsaid.ncl:"), "{err}");
    // With it, `check` passes and warns.
    stack.write_workspace(&text);
    let (code, out, err) = run(Command::new(agent_bin())
        .arg("check")
        .arg(stack.workspace_path()));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains(&format!(
            "warning: the 'tcp route `db.in.example.org` on port {listen} is exempt from listeners.client_auth"
        )),
        "{err}"
    );
    stack.start_sozu();
    stack.start_agent();
    stack.wait_ready(Duration::from_secs(30));

    let refused = https_get_as(stack.https, HOST, "/", ANY_TLS, None);
    assert!(
        refused.is_err(),
        "HTTPS without a certificate got in: {refused:?}"
    );
    let echoed = eventually(Duration::from_secs(30), "the TCP route echoing", || {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", listen)).ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        conn.write_all(b"no certificate").ok()?;
        let mut buf = [0u8; 14];
        conn.read_exact(&mut buf).ok()?;
        Some(buf)
    });
    assert_eq!(&echoed, b"no certificate", "the exempt route is open");

    let status = stack.status_text();
    assert!(
        status.contains(&format!(
            "warning: the 'tcp route `db.in.example.org` on port {listen} is exempt from listeners.client_auth"
        )),
        "{status}"
    );
    let shown = |text: &str| {
        text.chars()
            .find(|c| c.is_control() && *c != '\n' && *c != '\t')
    };
    assert_eq!(shown(&status), None, "{status:?}");
    let (code, json, err) = run(Command::new(agent_bin())
        .args(["status", "--json", "--admin-address"])
        .arg(stack.admin.to_string()));
    assert_eq!(code, 0, "{err}");
    assert_eq!(shown(&json), None, "{json:?}");
    let state: serde_json::Value = serde_json::from_str(&json).expect("status --json is JSON");
    let ca_subject = state["sozu"]["client_auth"]["ca"]["subject"]
        .as_str()
        .unwrap();
    assert!(ca_subject.contains(subject), "{ca_subject:?}");
}
