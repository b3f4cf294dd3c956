//! `private-ingress status`: fetches a running agent's `/v1/state` ([`crate::document`]) and
//! prints it: one row per route, then the upstreams, the DNS names and the issuer's hosts. The
//! tables are built by pure functions, tested on their own.

use std::fmt::Write as _;

use crate::document::{BackendHealth, Document, IssuerStatus, RouteStatus, TrafficStatus, Waiting};

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("cannot reach the agent at {address}: {reason}")]
    Unreachable { address: String, reason: String },
    #[error(
        "no answer from {address} within {} s: is it the agent's admin address (--admin-address), \
         and is the agent, or the `kubectl port-forward` to it, running? --timeout waits longer",
        timeout.as_secs_f64()
    )]
    NoAnswer {
        address: String,
        timeout: std::time::Duration,
    },
    #[error("the agent at {address} answered something that is not its state: {reason}")]
    Malformed { address: String, reason: String },
    #[error("cannot write to stdout: {0}")]
    Stdout(std::io::Error),
}

/// `status`: the agent's state as a table, or as its JSON (`--json`); exit 2 when the agent is
/// not ready, so that a script can tell.
pub fn run(
    admin_address: &str,
    json: bool,
    timeout_s: f64,
) -> Result<std::process::ExitCode, StatusError> {
    let (body, status) = fetch(admin_address, std::time::Duration::from_secs_f64(timeout_s))?;
    let text = if json {
        // JSON, still: its C1 controls escaped, as a parser reads them.
        format!("{}\n", crate::text::json_for_terminal(&body))
    } else {
        table(&status)
    };
    super::output::print(text).map_err(StatusError::Stdout)?;
    Ok(if status.ready {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(super::exit::NOT_READY)
    })
}

/// `/v1/state` of the agent at `admin_address` (`host:port`, or an `http://` URL: the admin
/// server speaks plain HTTP), answered within `timeout`.
pub fn fetch(
    admin_address: &str,
    timeout: std::time::Duration,
) -> Result<(String, Document), StatusError> {
    let unreachable = |reason: String| StatusError::Unreachable {
        address: admin_address.to_owned(),
        reason,
    };
    let url = format!("{}/v1/state", base_url(admin_address)?);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .build()
        .into();
    let body = agent
        .get(&url)
        .call()
        .and_then(|mut r| r.body_mut().read_to_string())
        .map_err(|e| match e {
            ureq::Error::Timeout(_) => StatusError::NoAnswer {
                address: admin_address.to_owned(),
                timeout,
            },
            e => unreachable(e.to_string()),
        })?;
    let status = serde_json::from_str(&body).map_err(|e| StatusError::Malformed {
        address: admin_address.to_owned(),
        reason: e.to_string(),
    })?;
    Ok((body, status))
}

/// `http://host:port` of the admin server at `admin_address` (`host:port`, or an `http://`
/// URL: the admin server speaks plain HTTP).
pub(crate) fn base_url(admin_address: &str) -> Result<String, StatusError> {
    let address = admin_address.trim_end_matches('/');
    match address.split_once("://") {
        None => Ok(format!("http://{address}")),
        Some(("http", rest)) => Ok(format!("http://{rest}")),
        Some((scheme, _)) => Err(StatusError::Unreachable {
            address: admin_address.to_owned(),
            reason: format!("the admin server speaks plain HTTP, not {scheme}: give its host:port"),
        }),
    }
}

fn short(fingerprint: &str) -> &str {
    fingerprint.get(..12).unwrap_or(fingerprint)
}

fn date(unix: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(unix) {
        Ok(t) => format!("{:04}-{:02}-{:02}", t.year(), u8::from(t.month()), t.day()),
        Err(_) => unix.to_string(),
    }
}

/// "yes", "yes (1 route not served)", "no (why)": what `/readyz` answers, and why. An older
/// agent's document has no readiness detail, only `ready`.
fn readiness(status: &Document) -> String {
    let detail = &status.readiness;
    let answer = if status.ready { "yes" } else { "no" };
    match (&detail.reason, detail.routes_not_served) {
        (Some(reason), _) if !status.ready => format!("{answer} ({reason})"),
        (_, 0) => answer.to_owned(),
        (_, 1) => format!("{answer} (1 route not served)"),
        (_, n) => format!("{answer} ({n} routes not served)"),
    }
}

/// The table: a header line about the agent, then one row per route. Every text in it is shown
/// with its control characters escaped (line feeds aside, which end its lines): a status carries
/// text a workspace, a file, a certificate or sozu chose, and a terminal must not act on it.
pub fn table(status: &Document) -> String {
    let out = tables(status);
    crate::text::clean(&out, usize::MAX)
}

fn tables(status: &Document) -> String {
    let mut out = String::new();
    let line = |text: String| crate::text::clean_line(&text, crate::text::MAX_LINE_BYTES);
    let _ = writeln!(
        out,
        "ready: {}   workspace: {}   sozu: {}",
        line(readiness(status)),
        match (&status.workspace.zone, &status.workspace.last_error) {
            (Some(zone), None) => format!("zone {zone}"),
            (Some(zone), Some(_)) => format!("zone {zone} (latest edit rejected, see below)"),
            (None, _) => "not loaded".into(),
        },
        match (&status.sozu.generation, &status.sozu.last_error) {
            (_, Some(e)) => line(format!("error: {e}")),
            (Some(_), None) => "in sync".into(),
            (None, None) => "not connected yet".into(),
        }
    );
    if let Some(e) = &status.workspace.last_error {
        let e = crate::text::clean(e, crate::text::MAX_DIAGNOSTIC_BYTES);
        let _ = writeln!(out, "workspace error:\n{e}");
    }
    let headers = [
        "HOST",
        "PATH",
        "UPSTREAM",
        "BACKENDS",
        "SERVED",
        "ON DISK",
        "NOT AFTER",
        "STATE",
        "LAST ERROR",
    ];
    let rows: Vec<[String; 9]> = status
        .routes
        .iter()
        .map(|r| {
            let backends = if r.backends_actual.is_empty() {
                "-".to_owned()
            } else {
                r.backends_actual.join(",")
            };
            [
                r.host.clone(),
                r.place(),
                r.upstream.clone(),
                backends,
                r.certificate
                    .served_fingerprints
                    .iter()
                    .map(|f| short(f))
                    .collect::<Vec<_>>()
                    .join(",")
                    .if_empty("-"),
                r.certificate
                    .disk_fingerprint
                    .as_deref()
                    .map(short)
                    .unwrap_or("-")
                    .to_owned(),
                match (r.certificate.disk_not_after, r.certificate.expiring_soon) {
                    (Some(t), true) => format!("{} (expiring)", date(t)),
                    (Some(t), false) => date(t),
                    (None, _) => "-".into(),
                },
                state_of(r),
                r.last_error.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    write_table(&mut out, &headers, &rows);
    // A pair of the tls dir that names more than its host is served for its host alone, a pair
    // of `certificates` for every host it covers: said once per host.
    let mut noted = std::collections::BTreeSet::new();
    for r in &status.routes {
        if !noted.insert(&r.host) {
            continue;
        }
        let line = if let Some(file) = &r.certificate.file {
            // A pair of `certificates`: served for every route host it covers.
            format!(
                "note: the certificate of {} is the pair of `certificates` {file}",
                r.host
            )
        } else if !r.certificate.other_names.is_empty() {
            format!(
                "note: the pair of {} also names {}; it is served for {} only",
                r.host,
                r.certificate.other_names.join(", "),
                r.host
            )
        } else {
            continue;
        };
        let _ = writeln!(
            out,
            "{}",
            crate::text::clean_line(&line, crate::text::MAX_LINE_BYTES)
        );
    }
    for r in &status.routes {
        for warning in &r.warnings {
            let _ = writeln!(out, "{}", line(format!("warning: {warning}")));
        }
    }
    // Upstreams, for the routes where there is more to say than the UPSTREAM column: several
    // upstreams, a weight, a drain, or a health sozu reported.
    let upstream_rows: Vec<[String; 6]> = status
        .routes
        .iter()
        .filter(|r| {
            r.upstreams.len() > 1
                || r.upstreams.iter().any(|u| {
                    u.drain
                        || u.weight != 1
                        || u.backends
                            .iter()
                            .any(|b| b.health != BackendHealth::Unknown)
                })
        })
        .flat_map(|r| {
            r.upstreams.iter().map(|u| {
                [
                    r.host.clone(),
                    r.place(),
                    u.upstream.clone(),
                    u.weight.to_string(),
                    u.state.clone(),
                    u.backends
                        .iter()
                        .map(|b| format!("{} {}", b.address, b.health))
                        .collect::<Vec<_>>()
                        .join(", ")
                        .if_empty("-"),
                ]
            })
        })
        .collect();
    if !upstream_rows.is_empty() {
        out.push('\n');
        write_table(
            &mut out,
            &["HOST", "PATH", "UPSTREAM", "WEIGHT", "STATE", "BACKENDS"],
            &upstream_rows,
        );
    }
    // Route policies, one line per route that has any.
    let policy_rows: Vec<[String; 3]> = status
        .routes
        .iter()
        .filter(|r| !r.policy.is_empty())
        .map(|r| [r.host.clone(), r.place(), r.policy.clone()])
        .collect();
    if !policy_rows.is_empty() {
        out.push('\n');
        write_table(&mut out, &["HOST", "PATH", "POLICIES"], &policy_rows);
    }
    // Where the routes not written in the workspace come from (a Traefik file's router).
    let origin_rows: Vec<[String; 3]> = status
        .routes
        .iter()
        .filter_map(|r| Some([r.host.clone(), r.place(), r.origin.clone()?]))
        .collect();
    if !origin_rows.is_empty() {
        out.push('\n');
        write_table(&mut out, &["HOST", "PATH", "FROM"], &origin_rows);
    }
    if let Some(traefik) = &status.workspace.traefik {
        traefik_table(&mut out, traefik);
    }
    for refused in &status.sozu.policy_files_refused {
        let line = format!("policy file refused (its last good version stays): {refused}");
        let _ = writeln!(
            out,
            "{}",
            crate::text::clean_line(&line, crate::text::MAX_LINE_BYTES)
        );
    }
    if let Some(auth) = &status.sozu.client_auth {
        out.push('\n');
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        client_auth_table(&mut out, auth, now);
    }
    // HTTP/2 offered is the default and says nothing; the others change what clients get.
    if let Some(l) = status
        .sozu
        .https_listener
        .as_ref()
        .filter(|l| l.http2 != "offered")
    {
        let what = if l.http2 == "only" {
            "HTTP/2 only (HTTP/1.1 clients and WebSockets refused)"
        } else {
            "HTTP/1.1 only (HTTP/2 not offered)"
        };
        let _ = writeln!(out, "\nhttps listener: {what}");
    }
    if !status.sozu.listeners_need_restart.is_empty() {
        let _ = writeln!(
            out,
            "\nrestart sozu to apply: {}",
            status.sozu.listeners_need_restart.join(", ")
        );
    }
    if let Some(traffic) = &status.traffic {
        out.push('\n');
        traffic_table(&mut out, status, traffic);
    }
    if !status.dns.is_empty() {
        let dns_rows: Vec<[String; 4]> = status
            .dns
            .iter()
            .map(|n| {
                [
                    n.name.clone(),
                    n.addresses.join(",").if_empty("-"),
                    match (&n.last_error, n.resolved) {
                        (None, true) => "ok".into(),
                        (None, false) => "resolving".into(),
                        (Some(_), true) => {
                            format!("failing ({}), last addresses kept", n.consecutive_failures)
                        }
                        (Some(_), false) => "never resolved".into(),
                    },
                    n.last_error.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        out.push('\n');
        write_table(
            &mut out,
            &["DNS NAME", "ADDRESSES", "STATE", "LAST ERROR"],
            &dns_rows,
        );
    }
    if let Some(issuer) = &status.issuer {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let _ = write!(out, "\n{}", issuer_table(issuer, now));
    }
    out
}

/// The https listener's client certificates: the mode, whether sozu refused what the files
/// hold, then one row for the CA file and one per CRL file, with what is in force and why the
/// latest read of a file was refused.
fn client_auth_table(out: &mut String, auth: &crate::document::ClientAuthStatus, now: i64) {
    let _ = writeln!(out, "client certificates: {}", auth.mode);
    if let Some(reason) = &auth.sozu_refused {
        let line = format!(
            "sozu refused the CA and CRLs the files hold and keeps enforcing the ones it held \
             before: {reason}"
        );
        let _ = writeln!(
            out,
            "{}",
            crate::text::clean_line(&line, crate::text::MAX_LINE_BYTES)
        );
    }
    // While sozu refuses the files' set, a version the agent did not send is not known.
    let none = if auth.sozu_refused.is_some() {
        "not known"
    } else {
        "none valid yet"
    };
    let when = |t: Option<i64>| {
        t.map(|t| format!("{} ({})", datetime(t), in_words(t - now)))
            .unwrap_or_else(|| "-".into())
    };
    let mut rows: Vec<[String; 5]> = Vec::new();
    if let Some(ca) = &auth.ca {
        rows.push([
            "CA".into(),
            ca.file.clone(),
            ca.subject.clone().unwrap_or_else(|| none.into()),
            format!("expires {}", when(ca.not_after)),
            ca.problem.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    for crl in &auth.crls {
        rows.push([
            "CRL".into(),
            crl.file.clone(),
            crl.revoked
                .map(|n| format!("{n} revoked"))
                .unwrap_or_else(|| none.into()),
            format!("next update {}", when(crl.next_update)),
            crl.problem.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    write_table(
        out,
        &["KIND", "FILE", "IN FORCE", "UNTIL", "LATEST READ REFUSED"],
        &rows,
    );
}

/// The Traefik sources, each with its state, and the routers not served.
fn traefik_table(out: &mut String, traefik: &crate::document::TraefikStatus) {
    let rows: Vec<[String; 4]> = traefik
        .sources
        .iter()
        .map(|s| {
            [
                s.source.clone(),
                s.kind.clone(),
                match (s.state.as_str(), s.last_good) {
                    ("error", Some(_)) => "error, last good kept".to_owned(),
                    (state, _) => state.to_owned(),
                },
                s.error.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    out.push('\n');
    let _ = writeln!(out, "traefik: {} routes served", traefik.routes);
    if !rows.is_empty() {
        write_table(out, &["TRAEFIK SOURCE", "KIND", "STATE", "ERROR"], &rows);
    }
    for refused in &traefik.refused {
        let line = format!("traefik: {refused}");
        let _ = writeln!(
            out,
            "{}",
            crate::text::clean_line(&line, crate::text::MAX_LINE_BYTES)
        );
    }
}

/// Each route's requests over the window the agent keeps, from sozu's records: a line about the
/// stream (and why nothing arrives, when nothing does), then one row per route.
fn traffic_table(out: &mut String, status: &Document, traffic: &TrafficStatus) {
    let mut losses = Vec::new();
    for (n, what) in [
        (traffic.lost, "lost"),
        (traffic.malformed, "malformed"),
        (traffic.rejected, "rejected"),
    ] {
        if n > 0 {
            losses.push(format!("{n} {what}"));
        }
    }
    let _ = writeln!(
        out,
        "traffic over the last {} s   records since the agent started: {}{}   access log: {}{}",
        traffic.window_seconds,
        traffic.records,
        if losses.is_empty() {
            String::new()
        } else {
            format!(" ({})", losses.join(", "))
        },
        traffic.access_log,
        if traffic.access_log_dropped > 0 {
            format!(" ({} lines dropped)", traffic.access_log_dropped)
        } else {
            String::new()
        }
    );
    if let Some(problem) = &traffic.problem {
        let line = format!("traffic: {problem}");
        let _ = writeln!(
            out,
            "{}",
            crate::text::clean_line(&line, crate::text::MAX_LINE_BYTES)
        );
    }
    let row = |host: &str, path: &str, t: Option<&crate::document::RouteTraffic>| match t {
        Some(t) => [
            host.to_owned(),
            path.to_owned(),
            format!("{:.2}", t.requests_per_second),
            format!("{:.1}%", t.error_ratio * 100.0),
            t.p99_seconds
                .map_or("-".into(), |s| format!("{:.0} ms", s * 1000.0)),
        ],
        None => [
            host.to_owned(),
            path.to_owned(),
            "0".into(),
            "-".into(),
            "-".into(),
        ],
    };
    let mut rows: Vec<[String; 5]> = status
        .routes
        .iter()
        .map(|r| row(&r.host, &r.place(), traffic.routes.get(&r.id)))
        .collect();
    if let Some(t) = traffic.routes.get(crate::traffic::stats::UNMATCHED) {
        rows.push(row("(no route)", "-", Some(t)));
    }
    write_table(out, &["HOST", "PATH", "REQ/S", "5XX", "P99"], &rows);
}

/// The issuer's section of `private-ingress status`: one row per host.
pub fn issuer_table(status: &IssuerStatus, now: i64) -> String {
    let mut out = String::new();
    let line = |text: &str| crate::text::clean_line(text, crate::text::MAX_LINE_BYTES);
    let _ = writeln!(
        out,
        "acme: {}   account: {}   renewal info (ARI): {}",
        line(&status.directory),
        if status.account_ready {
            "ready"
        } else {
            "not yet"
        },
        match status.ari_supported {
            Some(true) => "offered",
            Some(false) => "not offered (renewal at a fraction of the lifetime)",
            None => "not asked yet",
        }
    );
    if let Some(note) = &status.profile_note {
        let _ = writeln!(out, "profile: {}", line(note));
    }
    if let Some(e) = &status.last_error {
        let _ = writeln!(out, "acme error: {}", line(e));
    }
    let headers = [
        "HOST",
        "STATE",
        "VALID UNTIL",
        "RENEWAL DUE",
        "ORDERS",
        "FAILED",
        "BACK-OFF",
        "LAST ERROR",
    ];
    let rows: Vec<[String; 8]> = status
        .hosts
        .iter()
        .map(|(host, h)| {
            let failed: u64 = h.orders_failed.values().sum();
            let failed = if failed == 0 {
                "0".to_owned()
            } else {
                let reasons: Vec<String> = h
                    .orders_failed
                    .iter()
                    .map(|(r, n)| format!("{r}={n}"))
                    .collect();
                format!("{failed} ({})", reasons.join(","))
            };
            [
                host.clone(),
                h.state.clone(),
                h.valid_until.map_or("-".into(), datetime),
                match (h.renewal_due, h.renewal_basis) {
                    (Some(t), Some(basis)) => format!("{} ({basis})", datetime(t)),
                    (Some(t), None) => datetime(t),
                    _ => "-".into(),
                },
                h.orders_placed.to_string(),
                failed,
                match &h.backoff {
                    Some(b) => format!(
                        "{} until {} ({})",
                        b.reason,
                        datetime(b.until),
                        in_words(b.until - now)
                    ),
                    None => "-".into(),
                },
                h.last_error.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    write_table(&mut out, &headers, &rows);
    out
}

fn datetime(unix: i64) -> String {
    crate::text::date_time(unix)
}

fn in_words(seconds: i64) -> String {
    match seconds {
        s if s <= 0 => "now".into(),
        s if s < 120 => format!("in {s} s"),
        s if s < 2 * 3600 => format!("in {} min", s / 60),
        s => format!("in {} h", s / 3600),
    }
}

/// Columns aligned on the widest cell, two spaces apart; the last column is not padded. Every
/// cell is shown with its control characters escaped: a status carries text a workspace or a
/// file name chose, and a terminal must not act on it.
pub(crate) fn write_table<const N: usize>(
    out: &mut String,
    headers: &[&str; N],
    rows: &[[String; N]],
) {
    let rows: Vec<[String; N]> = rows
        .iter()
        .map(|row| {
            row.clone()
                .map(|cell| crate::text::clean_line(&cell, crate::text::MAX_LINE_BYTES))
        })
        .collect();
    let rows = &rows[..];
    let mut widths = headers.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let _ = write!(l, "{cell:<w$}  ");
            }
        }
        l.trim_end().to_owned()
    };
    let _ = writeln!(out, "{}", line(&headers.map(String::from)));
    for row in rows {
        let _ = writeln!(out, "{}", line(row));
    }
}

trait IfEmpty {
    fn if_empty(self, default: &str) -> String;
}

impl IfEmpty for String {
    fn if_empty(self, default: &str) -> String {
        if self.is_empty() {
            default.to_owned()
        } else {
            self
        }
    }
}

/// A route's state as `status` and `top` write it: "ok", "pending (certificate, dns)", "error".
pub fn state_of(route: &RouteStatus) -> String {
    match route.waiting_for.as_slice() {
        [] => route.state.to_string(),
        waiting => format!(
            "{} ({})",
            route.state,
            waiting
                .iter()
                .map(|w| match w {
                    Waiting::Certificate => "certificate",
                    Waiting::Dns => "dns",
                })
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::{
        Backoff, CertificateStatus, DnsNameStatus, HostStatus, RenewalBasis, RouteState,
        RouteStatus, Waiting,
    };
    use std::collections::BTreeMap;

    /// While sozu refuses the set the files make, a line says so with sozu's reason, and each
    /// file's row gives what sozu enforces: the version it kept, or "not known" where the agent
    /// did not send it, never the version on disk.
    #[test]
    fn the_client_certificates_say_when_sozu_refused_the_files_set() {
        use crate::document::{ClientAuthStatus, ClientCaStatus, ClientCrlStatus};
        let now = 1_800_000_000;
        let crl = |file: &str, revoked: Option<usize>, problem: Option<&str>| ClientCrlStatus {
            file: file.into(),
            next_update: revoked.map(|_| now + 86_400),
            revoked,
            problem: problem.map(str::to_owned),
        };
        let mut auth = ClientAuthStatus {
            mode: "required".into(),
            ca: Some(ClientCaStatus {
                file: "/etc/devices/ca.crt".into(),
                subject: Some("CN=devices".into()),
                not_after: Some(now + 365 * 86_400),
                problem: None,
            }),
            crls: vec![
                crl("/etc/devices/laptops.crl", Some(0), None),
                crl(
                    "/etc/devices/phones.crl",
                    None,
                    Some("/etc/devices/phones.crl: the CRL's nextUpdate has passed"),
                ),
            ],
            sozu_refused: Some(
                "CRL #2 (counted across client_ca_crls) expired 3 seconds ago".into(),
            ),
        };
        let mut out = String::new();
        client_auth_table(&mut out, &auth, now);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "client certificates: required");
        assert_eq!(
            lines[1],
            "sozu refused the CA and CRLs the files hold and keeps enforcing the ones it held \
             before: CRL #2 (counted across client_ca_crls) expired 3 seconds ago"
        );
        let row = |file: &str| {
            lines
                .iter()
                .find(|l| l.contains(file))
                .copied()
                .unwrap_or("")
        };
        assert!(row("laptops.crl").contains("0 revoked"), "{out}");
        assert!(row("phones.crl").contains("not known"), "{out}");
        // sozu holding what the files hold: no such line, and a file never read good says so.
        auth.sozu_refused = None;
        let mut out = String::new();
        client_auth_table(&mut out, &auth, now);
        assert!(!out.contains("sozu refused"), "{out}");
        assert!(out.contains("none valid yet"), "{out}");
    }

    #[test]
    fn drained_and_down_upstreams_get_a_table_of_their_own() {
        use crate::document::{BackendStatus, UpstreamStatus};
        let upstream = |name: &str, weight, drain, state: &str, health| UpstreamStatus {
            upstream: name.into(),
            weight,
            drain,
            state: state.into(),
            backends: vec![BackendStatus {
                id: format!("pi-a-{name}"),
                address: name.into(),
                health,
                transitions: 1,
            }],
        };
        let status = Document {
            routes: vec![RouteStatus {
                id: "pi-a".into(),
                host: "a.in.example.org".into(),
                path_prefix: "/".into(),
                upstreams: vec![
                    upstream(
                        "10.0.0.1:80",
                        9,
                        true,
                        "draining (2 sessions)",
                        BackendHealth::Up,
                    ),
                    upstream("10.0.0.2:80", 1, false, "in rotation", BackendHealth::Down),
                ],
                ..RouteStatus::default()
            }],
            ..Document::default()
        };
        let text = table(&status);
        assert!(
            text.contains("10.0.0.1:80  9       draining (2 sessions)  10.0.0.1:80 up"),
            "{text}"
        );
        assert!(
            text.contains("in rotation            10.0.0.2:80 down"),
            "{text}"
        );
    }

    /// What a workspace or a file name chose reaches the terminal as text: no escape sequence
    /// is acted on. A pair that names another host says it is served for its own.
    #[test]
    fn control_characters_are_escaped_and_foreign_names_noted() {
        let status = Document {
            workspace: crate::document::WorkspaceStatus {
                loaded: true,
                zone: Some("in.example.org".into()),
                last_error: Some("bad \u{1b}]0;owned\u{7} title".into()),
                listeners: None,
                traefik: None,
            },
            routes: vec![RouteStatus {
                host: "a.in.example.org".into(),
                path_prefix: "/".into(),
                certificate: CertificateStatus {
                    other_names: vec!["b.in.example.org".into()],
                    ..CertificateStatus::default()
                },
                last_error: Some("resolving x: \u{1b}[2J".into()),
                ..RouteStatus::default()
            }],
            ..Document::default()
        };
        let text = table(&status);
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text:?}"
        );
        assert!(text.contains("\\u{1b}]0;owned"), "{text}");
        assert!(
            text.contains(
                "note: the pair of a.in.example.org also names b.in.example.org; it is served for a.in.example.org only"
            ),
            "{text}"
        );
    }

    /// A host served a pair of `certificates` is noted with the pair's file, once, and not as a
    /// pair served for its own host alone (it serves every host it covers); a file name cannot
    /// write to the terminal.
    #[test]
    fn a_pair_of_certificates_is_noted_with_its_file() {
        let route = |host: &str, path: &str| RouteStatus {
            host: host.into(),
            path_prefix: path.into(),
            certificate: CertificateStatus {
                other_names: vec!["*.in.example.org".into()],
                file: Some("/etc/letsencrypt/live/\u{1b}[2Jx/fullchain.pem".into()),
                ..CertificateStatus::default()
            },
            ..RouteStatus::default()
        };
        let status = Document {
            routes: vec![
                route("a.in.example.org", "/"),
                route("a.in.example.org", "/api"),
            ],
            ..Document::default()
        };
        let text = table(&status);
        let note = "note: the certificate of a.in.example.org is the pair of `certificates` /etc/letsencrypt/live/\\u{1b}[2Jx/fullchain.pem";
        assert_eq!(text.matches(note).count(), 1, "{text}");
        assert!(!text.contains("served for a.in.example.org only"), "{text}");
        assert!(!text.contains('\u{1b}'), "{text:?}");
    }

    #[test]
    fn the_header_says_why_the_agent_is_not_ready_and_which_routes_it_does_not_wait_for() {
        let header = |ready: bool, routes_not_served: usize, reason: Option<&str>| {
            let status = Document {
                ready,
                readiness: crate::document::Readiness {
                    ready,
                    routes_not_served,
                    reason: reason.map(str::to_owned),
                    ..Default::default()
                },
                ..Document::default()
            };
            table(&status).lines().next().unwrap_or_default().to_owned()
        };
        assert!(header(true, 0, None).starts_with("ready: yes   "));
        assert!(header(true, 2, None).starts_with("ready: yes (2 routes not served)   "));
        assert!(header(
            false,
            1,
            Some("none of the 1 routes can be served (1 not served)")
        )
        .starts_with("ready: no (none of the 1 routes can be served (1 not served))   "));
        // An older agent's document: `ready` alone.
        assert!(header(false, 0, None).starts_with("ready: no   "));
    }

    #[test]
    fn one_row_per_route_with_both_fingerprints() {
        let status = Document {
            ready: false,
            routes: vec![RouteStatus {
                id: "pi-a".into(),
                host: "a.in.example.org".into(),
                path_prefix: "/".into(),
                upstream: "svc:80".into(),
                backends_desired: vec!["10.0.0.1:80".into()],
                backends_actual: vec!["10.0.0.1:80".into()],
                certificate: CertificateStatus {
                    disk_fingerprint: Some("aa".repeat(32).into()),
                    disk_not_after: Some(1_900_000_000),
                    expiring_soon: true,
                    served_fingerprints: vec!["bb".repeat(32).into()],
                    ..CertificateStatus::default()
                },
                state: RouteState::Error,
                waiting_for: vec![],
                last_error: Some("boom".into()),
                ..RouteStatus::default()
            }],
            ..Document::default()
        };
        let text = table(&status);
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[2].contains("bbbbbbbbbbbb") && lines[2].contains("aaaaaaaaaaaa"),
            "{text}"
        );
        assert!(
            lines[2].contains("2030-03-17 (expiring)") && lines[2].ends_with("boom"),
            "{text}"
        );
    }

    #[test]
    fn a_route_waiting_for_dns_says_so_and_each_name_has_a_row() {
        let status = Document {
            routes: vec![RouteStatus {
                host: "b.in.example.org".into(),
                path_prefix: "/".into(),
                upstream: "never.svc:80".into(),
                state: RouteState::Pending,
                waiting_for: vec![Waiting::Dns],
                last_error: Some("resolving never.svc: no answer within 5000 ms".into()),
                ..RouteStatus::default()
            }],
            dns: vec![
                DnsNameStatus {
                    name: "never.svc".into(),
                    last_error: Some("no answer within 5000 ms".into()),
                    consecutive_failures: 3,
                    failures: 3,
                    ..DnsNameStatus::default()
                },
                DnsNameStatus {
                    name: "ok.svc".into(),
                    addresses: vec!["10.0.0.1".into(), "fd00::1".into()],
                    resolved: true,
                    ..DnsNameStatus::default()
                },
            ],
            ..Document::default()
        };
        let text = table(&status);
        let lines: Vec<_> = text.lines().collect();
        assert!(lines[2].contains("pending (dns)"), "{text}");
        assert!(lines[4].starts_with("DNS NAME"), "{text}");
        assert!(
            lines[5].starts_with("never.svc") && lines[5].contains("never resolved"),
            "{text}"
        );
        assert!(
            lines[6].contains("10.0.0.1,fd00::1") && lines[6].contains("ok"),
            "{text}"
        );
    }
    fn issuer_sample() -> IssuerStatus {
        let mut hosts = BTreeMap::new();
        hosts.insert(
            "a.in.example.org".to_owned(),
            HostStatus {
                state: "valid".into(),
                valid_until: Some(1_900_000_000),
                renewal_due: Some(1_890_000_000),
                renewal_basis: Some(RenewalBasis::Lifetime),
                orders_placed: 1,
                certificates_issued: 1,
                ..HostStatus::default()
            },
        );
        hosts.insert(
            "b.in.example.org".to_owned(),
            HostStatus {
                state: "backing_off".into(),
                orders_placed: 2,
                orders_failed: BTreeMap::from([("dns_update".to_owned(), 2)]),
                backoff: Some(Backoff {
                    reason: "dns_update".into(),
                    until: 1_800_000_600,
                    failures: 2,
                }),
                last_error: Some("NOTAUTH".into()),
                ..HostStatus::default()
            },
        );
        IssuerStatus {
            directory: "https://ca/dir".into(),
            account_ready: true,
            ari_supported: Some(false),
            hosts,
            ..IssuerStatus::default()
        }
    }

    #[test]
    fn the_table_shows_renewal_time_and_reason_and_the_back_off() {
        let text = issuer_table(&issuer_sample(), 1_800_000_000);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("not offered"), "{text}");
        let a = lines.iter().find(|l| l.starts_with("a.in")).unwrap();
        assert!(
            a.contains("2029-11-22 ") && a.contains("(lifetime)"),
            "{text}"
        );
        let b = lines.iter().find(|l| l.starts_with("b.in")).unwrap();
        assert!(
            b.contains("2 (dns_update=2)")
                && b.contains("dns_update until")
                && b.contains("in 10 min"),
            "{text}"
        );
        assert!(b.ends_with("NOTAUTH"), "{text}");
    }
}
