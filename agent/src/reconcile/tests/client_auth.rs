//! The HTTPS listener's client certificates: the device CA and CRLs, and a set sozu refuses.

use super::*;

/// The HTTPS listener's client certificates as sozu holds them: how many certificates each CRL
/// revokes.
fn crls_held(h: &Harness) -> Vec<usize> {
    use x509_parser::prelude::FromDer;
    let s = h.sozu.0.lock().unwrap();
    let https = s
        .actual
        .listeners
        .iter()
        .find(|(_, (protocol, _))| *protocol == crate::plan::state::Protocol::Https)
        .map(|(address, _)| *address);
    let held = https
        .and_then(|a| s.actual.listener_settings.get(&a))
        .and_then(|l| l.client_auth.clone())
        .unwrap_or_default();
    held.crls
        .iter()
        .map(|pem| {
            let (_, der) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
            let (_, crl) =
                x509_parser::revocation_list::CertificateRevocationList::from_der(&der.contents)
                    .unwrap();
            crl.iter_revoked_certificates().count()
        })
        .collect()
}

/// A workspace asking for client certificates from `/etc/devices/ca.crt` and
/// `/etc/devices/devices.crl`, with one route to A; and the client-auth source's read of them:
/// the CA `devices` and a CRL of it revoking `revoked`, or that CRL refused for `refused`.
fn client_auth_workspace() -> Fact {
    use crate::workspace::{ClientAuth, ClientAuthMode};
    let mut ws = crate::workspace::test_workspace(
        std::path::Path::new("/tls"),
        vec![route(A, ip("10.0.0.1:80"))],
    );
    ws.listener_policy.client_auth = ClientAuth {
        mode: ClientAuthMode::Required,
        ca_file: Some("/etc/devices/ca.crt".into()),
        crl_files: vec!["/etc/devices/devices.crl".into()],
    };
    Fact::Workspace(Ok(Arc::new(ws)))
}

fn client_auth_read(
    devices: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    now: i64,
    revoked: &[u64],
    refused: Option<&str>,
) -> Fact {
    use crate::certs::client_ca::{parse_ca, parse_crl, ClientCaError};
    use std::path::{Path, PathBuf};
    let (ca_file, crl_file) = ("/etc/devices/ca.crt", "/etc/devices/devices.crl");
    let parsed = parse_ca(devices.pem().as_bytes(), Path::new(ca_file), now).unwrap();
    let crl = crate::certs::client_ca::tests::crl_scoped(devices, None, revoked);
    let crl = match refused {
        None => parse_crl(crl.as_bytes(), Path::new(crl_file), &parsed, now),
        Some(reason) => Err(ClientCaError::CrlRefused {
            path: crl_file.into(),
            reason: reason.into(),
        }),
    };
    Fact::ClientAuth(Box::new(crate::sources::client_auth::ClientAuthFiles {
        crls: vec![(PathBuf::from(crl_file), crl)],
        ca: Some((ca_file.into(), Ok(parsed))),
    }))
}

/// At start, a CRL file refused leaves no https listener (none is made without the client
/// certificates the workspace asks for) and `/readyz` says why, for as long as it lasts; the
/// first good read makes the listener at once, not at the next retry of the refused one.
#[tokio::test(start_paused = true)]
async fn no_https_listener_until_the_crls_are_good_and_then_at_once() {
    let h = start(Settings::default());
    h.send(client_auth_workspace());
    h.pair(A, 90);
    let devices = crate::certs::client_ca::tests::ca("devices");
    let now = h.clock.unix();
    h.send(client_auth_read(
        &devices,
        now,
        &[],
        Some("MalformedExtensions"),
    ));
    let status = h
        .until("the listener held back", |s| {
            s.readiness
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("have not all been read good yet"))
        })
        .await;
    assert!(!status.ready);
    // Its retries back off: 1, 2, 4, 8 and 16 s.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(crls_held(&h).is_empty() && !h.status().ready);
    let written = tokio::time::Instant::now();
    h.send(client_auth_read(&devices, now, &[42], None));
    h.until("ready", |s| s.ready).await;
    assert!(
        written.elapsed() < Duration::from_millis(500),
        "the listener waited {:?}",
        written.elapsed()
    );
    assert_eq!(crls_held(&h), [1]);
}

/// sozu refuses the HTTPS listener's new client certificates (a set the agent validated: what
/// its checks cannot foresee, such as a last good CRL that lapsed since): the listener keeps the
/// ones it held and serves on, so the agent stays ready, and the status says that sozu refused
/// the files' set, with sozu's reason, each file showing the version sozu kept. The request is
/// retried with back-off; a newer set goes at once, not at that retry.
#[tokio::test(start_paused = true)]
async fn a_client_auth_set_sozu_refuses_is_shown_with_its_reason_and_a_new_set_goes_at_once() {
    let h = start(Settings::default());
    h.send(client_auth_workspace());
    h.pair(A, 90);
    let devices = crate::certs::client_ca::tests::ca("devices");
    let now = h.clock.unix();
    let read = |revoked: &[u64]| client_auth_read(&devices, now, revoked, None);
    h.send(read(&[]));
    h.until("ready", |s| s.ready).await;
    assert_eq!(crls_held(&h), [0]);

    let reason = "failed to configure client certificate authentication (mTLS): CRL #1 (counted \
                  across client_ca_crls) expired 2 seconds ago: its nextUpdate is past, refresh it";
    h.sozu.0.lock().unwrap().refuse_client_auth = Some(reason.into());
    h.send(read(&[42]));
    let status = h
        .until("sozu's refusal shown", |s| {
            s.sozu
                .client_auth
                .as_ref()
                .is_some_and(|a| a.sozu_refused.is_some())
        })
        .await;
    let auth = status.sozu.client_auth.clone().unwrap_or_default();
    assert_eq!(auth.sozu_refused.as_deref(), Some(reason));
    assert_eq!(auth.crls[0].revoked, Some(0), "the CRL sozu kept: {auth:?}");
    assert_eq!(auth.crls[0].problem, None);
    assert!(status.ready, "{:?}", status.readiness);
    assert_eq!(crls_held(&h), [0]);
    // Retried with back-off, 1 s after the refusal, then 2 s after that one.
    let sent = h.sozu.0.lock().unwrap().client_auth_sent;
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    assert_eq!(h.sozu.0.lock().unwrap().client_auth_sent, sent + 2);
    assert!(h
        .status()
        .sozu
        .client_auth
        .is_some_and(|a| a.sozu_refused.is_some()));

    // A newer set, which sozu takes: sent at once, not at the refusal's next retry (4 s away).
    h.sozu.0.lock().unwrap().refuse_client_auth = None;
    let written = tokio::time::Instant::now();
    h.send(read(&[42, 43]));
    let status = h
        .until("the new set in force", |s| {
            s.sozu
                .client_auth
                .as_ref()
                .is_some_and(|a| a.sozu_refused.is_none() && a.crls[0].revoked == Some(2))
        })
        .await;
    assert!(
        written.elapsed() < Duration::from_millis(500),
        "the new set waited {:?}",
        written.elapsed()
    );
    assert_eq!(crls_held(&h), [2]);
    assert!(status.ready);
}
