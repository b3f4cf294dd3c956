//! Alert rules on the agent's `/metrics`, as data: `render --format prometheus-rules` writes
//! them as a Prometheus rules file, and `--format k8s` wraps the same groups in a
//! prometheus-operator PrometheusRule (`deploy.prometheus_rule`).
//!
//! The failures the agent exists to prevent are silent ones: a pair on disk refused while the
//! old certificate keeps serving until it expires, a workspace edit rejected while the last
//! good one serves, a route waiting for DNS. Each rule turns one of them into an alert that
//! names the host (or upstream name) and the reason. docs/operations.md has a runbook section
//! per alert; a test keeps the two lists equal.

use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

/// The rule group's name, in the rules file and the PrometheusRule.
pub const GROUP: &str = "private-ingress";

/// An expiry alert fires once the served certificate has less than this fraction of its
/// lifetime left: 18 days of a 90-day certificate, 29 hours of a 6-day one. cert-manager and
/// the agent's own ACME issuer renew at a third of the lifetime left, so by then the renewal is
/// well overdue.
pub const EXPIRY_FRACTION: f64 = 0.2;

/// …or less than this, whatever its lifetime: a last call that leaves time to act.
pub const EXPIRY_FLOOR: Duration = Duration::from_secs(6 * 3600);

/// A route alerts on errors once more than this share of its requests over 5 minutes got a 5xx
/// status (from its backends, or sozu's own 502, 503 and 504 when a backend cannot be reached,
/// fails or times out): one request in twenty, for 10 minutes. A healthy internal service
/// answers almost none with 5xx, so that is a failing backend, not noise; 1 % would page on the
/// few errors a backend's restart or a client's bad request leaves behind.
pub const ROUTE_ERROR_RATIO: f64 = 0.05;

/// A route alerts on latency once its 99th percentile over 5 minutes, from the request's first
/// byte to the response's last, is above this many seconds. An interactive service (Grafana,
/// Prometheus' UI, an internal API) answers in tens of milliseconds; a second is where its users
/// notice. It is also a bucket bound of `private_ingress_http_request_duration_seconds`, so
/// `histogram_quantile` does not interpolate at the threshold: the p99 is above 1 s exactly when
/// more than 1 % of the requests took longer than 1 s.
pub const ROUTE_LATENCY_P99_SECONDS: f64 = 1.0;

/// Neither route alert fires for a route with fewer requests a second than this over 5 minutes:
/// 0.1 is 30 requests in the window. Above 5 % is then at least two failures in every window for
/// the 10 minutes of `for:`, so one failed request among three (someone trying a route) does
/// not page. At that rate the p99 is the slowest request of the window: a route that sees one
/// slow request in every 5 minutes for 10 minutes alerts, which is what its few users see.
pub const ROUTE_MIN_RATE: f64 = 0.1;

/// sozu alerts on saturation once its workers hold more than this share of the connections
/// they accept (`max_connections`) or of their buffers (`max_buffers`, two per TCP connection),
/// for 5 minutes. Past either maximum sozu accepts no connection on any listener: HTTPS
/// handshakes time out. A fifth left is room to act (find the client holding them, lower its
/// route's `limits`) before that.
pub const SOZU_SATURATION_RATIO: f64 = 0.8;

/// How the rules are rendered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AlertSettings {
    /// Every rule's `for:` is multiplied by this (rounded to whole seconds, at least 1 s). 1 in
    /// production; a test or a staging Prometheus uses a small factor to see alerts fire in
    /// seconds rather than minutes.
    pub for_scale: f64,
}

impl Default for AlertSettings {
    fn default() -> Self {
        AlertSettings { for_scale: 1.0 }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AlertsError {
    #[error("cannot write the alert rules as YAML: {0}")]
    Serialise(String),
}

/// One alerting rule, in the order Prometheus documents its fields.
#[derive(Debug, Clone, Serialize)]
pub struct Rule {
    pub alert: &'static str,
    pub expr: String,
    #[serde(rename = "for", serialize_with = "prometheus_duration")]
    pub hold: Duration,
    pub labels: Labels,
    pub annotations: Annotations,
}

#[derive(Debug, Clone, Serialize)]
pub struct Labels {
    pub severity: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct Annotations {
    /// One line naming the host (or name) and the reason, for the notification's title.
    pub summary: &'static str,
    /// What it means and what keeps working meanwhile.
    pub description: &'static str,
    /// The runbook section: what to do.
    pub runbook: String,
}

#[derive(Serialize)]
struct Group<'a> {
    name: &'static str,
    rules: &'a [Rule],
}

#[derive(Serialize)]
struct RulesFile<'a> {
    groups: [Group<'a>; 1],
}

/// Minutes.
const fn min(m: u64) -> Duration {
    Duration::from_secs(m * 60)
}

/// Every alert, with its `for:` scaled by `settings`.
pub fn rules(settings: &AlertSettings) -> Vec<Rule> {
    let floor = EXPIRY_FLOOR.as_secs();
    let fraction = EXPIRY_FRACTION;
    let ratio = ROUTE_ERROR_RATIO;
    let latency = ROUTE_LATENCY_P99_SECONDS;
    let min_rate = ROUTE_MIN_RATE;
    let saturation = SOZU_SATURATION_RATIO;
    let rule = |alert: &'static str,
                expr: String,
                hold: Duration,
                severity: &'static str,
                summary: &'static str,
                description: &'static str| Rule {
        alert,
        expr,
        hold: scale(hold, settings.for_scale),
        labels: Labels { severity },
        annotations: Annotations {
            summary,
            description,
            runbook: format!("docs/operations.md#{}", alert.to_lowercase()),
        },
    };
    vec![
        rule(
            "PrivateIngressCertificateExpiring",
            format!(
                "(\n  private_ingress_certificate_served_not_after_seconds - time()\n    \
                 < {fraction} * (private_ingress_certificate_served_not_after_seconds - private_ingress_certificate_served_not_before_seconds)\n)\n\
                 or\n(private_ingress_certificate_served_not_after_seconds - time() < {floor})\n"
            ),
            min(15),
            "warning",
            "The certificate served for {{ $labels.host }} expires in {{ $value | humanizeDuration }}: its renewal is overdue",
            "sozu serves a certificate for {{ $labels.host }} with less than a fifth of its lifetime, or less than 6 hours, left. No renewed pair has reached it.",
        ),
        rule(
            "PrivateIngressCertificateRefused",
            "private_ingress_certificate_refused == 1\n".to_owned(),
            min(10),
            "warning",
            "The certificate pair on disk for {{ $labels.host }} is refused ({{ $labels.reason }})",
            "The agent refuses the pair in the host's tls directory ({{ $labels.reason }}); the last good certificate keeps serving until it expires.",
        ),
        rule(
            "PrivateIngressCertificateNotServed",
            "private_ingress_certificate_disk_info\nunless\nprivate_ingress_certificate_served_info\n".to_owned(),
            min(10),
            "warning",
            "sozu does not serve the certificate on disk for {{ $labels.host }}",
            "The valid pair on disk for {{ $labels.host }} (fingerprint {{ $labels.fingerprint }}) is not the certificate sozu serves: sozu refused it or the agent cannot reach sozu.",
        ),
        rule(
            "PrivateIngressRouteNotOk",
            "private_ingress_route_ok == 0\n".to_owned(),
            min(15),
            "warning",
            "Route {{ $labels.route }} of {{ $labels.host }} is not fully served",
            "The route waits for a certificate or for its upstream's first addresses, or sozu refused one of its requests; `private-ingress status` shows which.",
        ),
        rule(
            "PrivateIngressNotReady",
            "private_ingress_ready == 0\n".to_owned(),
            min(15),
            "warning",
            "private-ingress {{ $labels.instance }} is not ready",
            "sozu cannot be reached or refuses a request that is not one route's, the latest workspace is not applied, no route can be served, or (with --readiness strict) some route is not served; /readyz and `private-ingress status` say which.",
        ),
        rule(
            "PrivateIngressWorkspaceInvalid",
            "private_ingress_workspace_valid == 0\n".to_owned(),
            min(5),
            "warning",
            "private-ingress {{ $labels.instance }} rejected the latest workspace edit",
            "The workspace no longer evaluates (syntax, contract or an evaluation limit); the last good workspace keeps serving and new edits wait.",
        ),
        rule(
            "PrivateIngressUpstreamDnsFailing",
            "private_ingress_dns_lookup_ok == 0\n".to_owned(),
            min(10),
            "warning",
            "The upstream name {{ $labels.name }} does not resolve",
            "Lookups of {{ $labels.name }} fail; its last good addresses stay in use, and a route whose name never resolved has no backend.",
        ),
        rule(
            "PrivateIngressReconcileErrors",
            "rate(private_ingress_reconcile_errors_total[5m]) > 0\n".to_owned(),
            min(15),
            "warning",
            "private-ingress {{ $labels.instance }} keeps failing reconcile passes",
            "Passes fail or sozu refuses requests ({{ $value | humanize }} a second); what sozu refused waits and is retried with back-off.",
        ),
        // A failed read stops no rotation, so nothing else shows it: drift goes unrepaired
        // while it lasts. A read that succeeds in the window clears it, whatever failed before.
        rule(
            "PrivateIngressSozuStateUnreadable",
            "increase(private_ingress_sozu_read_failures_total[10m]) > 0\n\
             unless\n\
             increase(private_ingress_resyncs_total[10m]) > 0\n"
                .to_owned(),
            min(15),
            "warning",
            "private-ingress {{ $labels.instance }} cannot read sozu's state",
            "Each resync's read of sozu's state fails, so drift (a change to sozu the agent did not make) is not repaired; rotations and edits go on from what the agent knows. /readyz's body and /v1/state (sozu.last_read_error) say why.",
        ),
        // Per route across every agent instance: clients see the route, whichever replica
        // answers. `code="0"` (no response sent, mostly a client that went away) is not an
        // error.
        rule(
            "PrivateIngressRouteErrorRatioHigh",
            format!(
                "(\n  sum by (route, host) (rate(private_ingress_http_requests_total{{route!=\"unmatched\", code=~\"5..\"}}[5m]))\n    \
                 /\n  sum by (route, host) (rate(private_ingress_http_requests_total{{route!=\"unmatched\"}}[5m]))\n) > {ratio}\n\
                 and\n\
                 sum by (route, host) (rate(private_ingress_http_requests_total{{route!=\"unmatched\"}}[5m])) >= {min_rate}\n"
            ),
            min(10),
            "warning",
            "Route {{ $labels.route }} of {{ $labels.host }} answers {{ $value | humanizePercentage }} of its requests with a 5xx status",
            "Over 5 minutes, {{ $value | humanizePercentage }} of the requests to {{ $labels.host }} got a 5xx status, from its backends or from sozu (502, 503 or 504 when a backend cannot be reached, fails or times out); the other requests are served.",
        ),
        // The minimum rate is the histogram's own count: the requests the quantile is over.
        rule(
            "PrivateIngressRouteLatencyHigh",
            format!(
                "histogram_quantile(0.99,\n  sum by (route, host, le) (rate(private_ingress_http_request_duration_seconds_bucket{{route!=\"unmatched\"}}[5m]))\n) > {latency}\n\
                 and\n\
                 sum by (route, host) (rate(private_ingress_http_request_duration_seconds_count{{route!=\"unmatched\"}}[5m])) >= {min_rate}\n"
            ),
            min(10),
            "warning",
            "Route {{ $labels.route }} of {{ $labels.host }} is slow: 99th percentile {{ $value | humanizeDuration }}",
            "Over 5 minutes, more than 1 % of the requests to {{ $labels.host }} took longer than 1 s from their first byte to the response's last: slow backends, or responses that are large or streamed by nature.",
        ),
        // Idle connections to a route of its own port hold a connection and two buffers each
        // until `front` closes them; whichever runs out first stops sozu accepting.
        rule(
            "PrivateIngressSozuSaturated",
            format!(
                "(\n  private_ingress_sozu_connections / private_ingress_sozu_connections_max > {saturation}\n)\n\
                 or\n\
                 (\n  private_ingress_sozu_buffers_in_use / private_ingress_sozu_buffers_max > {saturation}\n)\n"
            ),
            min(5),
            "warning",
            "private-ingress {{ $labels.instance }}: sozu holds {{ $value | humanizePercentage }} of the connections or buffers it can",
            "sozu's workers hold more than 80 % of their max_connections or max_buffers; once either runs out, sozu accepts no new connection on any listener and HTTPS handshakes time out. Idle connections to a 'tcp or 'tls_passthrough route hold them until listeners.timeouts.front.",
        ),
        // A CRL sozu holds lapses at its nextUpdate: every handshake fails from then on. Two
        // days leave room to issue a new one.
        rule(
            "PrivateIngressClientCrlLapsing",
            "private_ingress_client_crl_next_update_seconds - time() < 172800\n".to_owned(),
            min(10),
            "critical",
            "The device CRL {{ $labels.file }} lapses in {{ $value | humanizeDuration }}",
            "sozu holds a CRL from {{ $labels.file }} whose nextUpdate is less than two days away; once it passes, sozu fails every client's handshake. Put a new CRL, signed by the device CA, in the file.",
        ),
        rule(
            "PrivateIngressClientAuthFileRefused",
            "private_ingress_client_auth_file_refused == 1\n".to_owned(),
            min(10),
            "warning",
            "The client-auth file {{ $labels.file }} is refused",
            "The latest version of {{ $labels.file }} (the device CA or a CRL) does not validate; its last good version stays applied, so a revocation it adds is not in force. /v1/state says why.",
        ),
        // The agent validated the files and sozu refused them anyway: no file is refused, and
        // only this says the revocations on disk are not the ones enforced.
        rule(
            "PrivateIngressClientAuthRefusedBySozu",
            "private_ingress_client_auth_refused_by_sozu == 1\n".to_owned(),
            min(10),
            "warning",
            "private-ingress {{ $labels.instance }}: sozu refuses the device CA and CRLs on disk",
            "sozu refused the device CA and CRLs the agent validated from the files and keeps enforcing the ones it held before, so a revocation the files add is not in force. /v1/state (sozu.client_auth.sozu_refused) gives sozu's reason.",
        ),
    ]
}

/// The rule groups as JSON, the `spec` of a PrometheusRule.
pub fn groups(settings: &AlertSettings) -> Value {
    let rules = rules(settings);
    json!({ "groups": [Group { name: GROUP, rules: &rules }] })
}

/// A Prometheus rules file (what `promtool check rules` reads).
pub fn rules_file(settings: &AlertSettings) -> Result<String, AlertsError> {
    let rules = rules(settings);
    let file = RulesFile {
        groups: [Group {
            name: GROUP,
            rules: &rules,
        }],
    };
    let yaml =
        serde_norway::to_string(&file).map_err(|err| AlertsError::Serialise(err.to_string()))?;
    Ok(format!(
        "# Generated by private-ingress: alerts on its /metrics; runbook in docs/operations.md.\n{yaml}"
    ))
}

fn scale(hold: Duration, factor: f64) -> Duration {
    let secs = (hold.as_secs_f64() * factor).round().max(1.0);
    Duration::from_secs(secs as u64)
}

/// `15m`, `1h`, `6s`: the largest unit that divides the duration.
fn prometheus_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    let secs = d.as_secs();
    let text = if secs > 0 && secs.is_multiple_of(3600) {
        format!("{}h", secs / 3600)
    } else if secs > 0 && secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    };
    s.serialize_str(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn for_values_scale_to_whole_seconds() {
        let fast = rules(&AlertSettings { for_scale: 0.01 });
        let refused = fast
            .iter()
            .find(|r| r.alert == "PrivateIngressCertificateRefused")
            .map(|r| r.hold);
        assert_eq!(refused, Some(Duration::from_secs(6)));
        let yaml = rules_file(&AlertSettings::default()).unwrap_or_default();
        assert!(yaml.contains("for: 10m\n"), "{yaml}");
        assert!(yaml.contains("for: 15m\n"), "{yaml}");
    }

    #[test]
    fn every_traffic_selector_leaves_out_the_unmatched_requests() {
        let traffic: Vec<Rule> = rules(&AlertSettings::default())
            .into_iter()
            .filter(|r| r.expr.contains("private_ingress_http_"))
            .collect();
        assert_eq!(traffic.len(), 2);
        for rule in traffic {
            let selectors = rule.expr.matches("private_ingress_http_").count();
            let unmatched = rule.expr.matches("{route!=\"unmatched\"").count();
            assert_eq!(selectors, unmatched, "{}", rule.expr);
        }
    }

    #[test]
    fn each_alert_has_a_severity_a_summary_and_a_runbook_anchor() {
        for rule in rules(&AlertSettings::default()) {
            assert!(!rule.labels.severity.is_empty());
            assert!(rule.annotations.summary.contains("{{ $labels."));
            assert!(rule
                .annotations
                .runbook
                .ends_with(&rule.alert.to_lowercase()));
        }
    }
}
