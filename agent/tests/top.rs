//! `top`'s screen from fixed states, at 80×24 and 120×40: every pane, a route's page and the
//! help, as golden text files (`tests/fixtures/top/`, `UPDATE_GOLDEN=1` rewrites them), and the
//! colours that carry meaning (a failing route and a certificate under the alert's threshold in
//! red; none at all without colour).

use std::path::Path;

use private_ingress::cli::top::model::{Action, App, Pane, Theme, Update};
use private_ingress::cli::top::{draw, render};
use private_ingress::document::*;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Color;

use crate::common::assert_golden;

/// 2026-12-01T12:00:00Z.
const NOW: i64 = 1_796_126_400;
const DAY: i64 = 86_400;

fn route(host: &str, state: RouteState, days_left: i64) -> RouteStatus {
    RouteStatus {
        id: format!("pi-{host}"),
        host: host.into(),
        path_prefix: "/".into(),
        upstream: "10.0.0.1:8080".into(),
        backends_desired: vec!["10.0.0.1:8080".into()],
        backends_actual: vec!["10.0.0.1:8080".into()],
        certificate: CertificateStatus {
            disk_fingerprint: Some(("a877dc973904".repeat(5) + "abcd").into()),
            disk_not_before: Some(NOW - 30 * DAY),
            disk_not_after: Some(NOW + days_left * DAY),
            served_fingerprints: vec![("a877dc973904".repeat(5) + "abcd").into()],
            served_not_before: Some(NOW - 30 * DAY),
            served_not_after: Some(NOW + days_left * DAY),
            disk_issuer: Some("CN=internal-ca".into()),
            rotations: 2,
            last_rotation: Some((NOW - 3_600) as u64),
            ..CertificateStatus::default()
        },
        state,
        upstreams: vec![UpstreamStatus {
            upstream: "10.0.0.1:8080".into(),
            weight: 1,
            drain: false,
            state: "in rotation".into(),
            backends: vec![BackendStatus {
                id: format!("pi-{host}-10.0.0.1:8080"),
                address: "10.0.0.1:8080".into(),
                health: BackendHealth::Up,
                transitions: 0,
            }],
        }],
        ..RouteStatus::default()
    }
}

fn document(routes: Vec<RouteStatus>) -> Document {
    Document {
        ready: true,
        readiness: Readiness {
            ready: true,
            ..Readiness::default()
        },
        workspace: WorkspaceStatus {
            loaded: true,
            zone: Some("in.example.org".into()),
            last_error: None,
            listeners: Some(ListenersStatus {
                https: "0.0.0.0:443".into(),
                http: "0.0.0.0:80".into(),
                min_tls_version: "1.2".into(),
                expect_proxy: false,
                interface: None,
                timeouts: [("back", 30), ("connect", 3), ("front", 60), ("request", 10)]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect(),
            }),
            traefik: None,
        },
        sozu: SozuStatus {
            connected: true,
            generation: Some("sozu 1 (workers 2)".into()),
            ..SozuStatus::default()
        },
        routes,
        traffic: Some(TrafficStatus {
            listen: Some("127.0.0.1:9181".into()),
            window_seconds: 60,
            access_log: "stdout".into(),
            ..TrafficStatus::default()
        }),
        ..Document::default()
    }
}

fn traffic(doc: &mut Document, id: &str, rate: f64, errors: f64, p99: f64) {
    let traffic = doc.traffic.get_or_insert_with(TrafficStatus::default);
    traffic.routes.insert(
        id.to_owned(),
        RouteTraffic {
            requests: (rate * 60.0) as u64,
            requests_per_second: rate,
            error_ratio: errors,
            p99_seconds: Some(p99),
        },
    );
}

fn event(id: u64, kind: EventKind, host: Option<&str>, problem: bool, message: &str) -> Event {
    Event {
        id,
        time: format!("2026-12-01T11:{:02}:00.000Z", 40 + id),
        kind,
        host: host.map(str::to_owned),
        problem,
        message: message.into(),
    }
}

/// An app that has read `docs` one after the other (the sparklines' history) and `events`.
fn app(docs: Vec<Document>, events: Vec<Event>, theme: Theme) -> App {
    let mut app = App::new("127.0.0.1:9180", theme, Pane::Routes);
    app.now = NOW;
    app.update(Update::EventsLink(true));
    for doc in docs {
        app.update(Update::state(doc, NOW));
    }
    for e in events {
        app.update(Update::Event(Box::new(e)));
    }
    app
}

const PLAIN: Theme = Theme {
    color: false,
    ascii: false,
};

fn empty() -> App {
    app(vec![document(Vec::new())], Vec::new(), PLAIN)
}

fn one_route() -> App {
    let mut docs = Vec::new();
    for i in 0..12 {
        let mut doc = document(vec![route("grafana.in.example.org", RouteState::Ok, 60)]);
        traffic(
            &mut doc,
            "pi-grafana.in.example.org",
            2.0 + i as f64,
            0.0,
            0.012 + 0.001 * i as f64,
        );
        docs.push(doc);
    }
    app(
        docs,
        vec![event(
            1,
            EventKind::WorkspaceAccepted,
            None,
            false,
            "workspace applied: 1 route in zone in.example.org (1 added, 0 removed)",
        )],
        PLAIN,
    )
}

/// A route in error (its backend down, its pair refused, its certificate three days from
/// expiry), a pending one, a long host name, an SSH route of its own port, a rejected edit,
/// client certificates, events.
fn failing(theme: Theme) -> App {
    let long =
        "a-very-long-service-name-for-the-reporting-backend.team-observability.in.example.org";
    let mut docs = Vec::new();
    for i in 0..10 {
        let mut failing = route("billing.in.example.org", RouteState::Error, 3);
        failing.last_error = Some(
            "every backend is reported down: sozu still tries them (fail-open) and answers 503 when none connects".into(),
        );
        failing.no_available_backend = true;
        failing.upstreams[0].backends[0].health = BackendHealth::Down;
        failing.upstreams[0].backends[0].transitions = 1;
        failing.certificate.error =
            Some("/tls/billing.in.example.org/tls.crt: expired (valid until 2026-11-30)".into());
        failing.certificate.error_reason = Some("expired".into());
        failing.policy = "basic auth (realm billing), 100 connections".into();
        let mut pending = route("new.in.example.org", RouteState::Pending, 0);
        pending.waiting_for = vec![Waiting::Dns];
        pending.certificate = CertificateStatus::default();
        pending.backends_actual.clear();
        pending.upstreams[0].backends.clear();
        let mut api = route("grafana.in.example.org", RouteState::Ok, 80);
        api.path_prefix = "/api".into();
        api.id = "pi-grafana.in.example.org-1a2b3c4d".into();
        // A route of its own port: its protocol and port where a path goes, and no pair.
        let mut ssh = route("git.in.example.org", RouteState::Ok, 0);
        ssh.id = "pi-git.in.example.org-tcp-2222".into();
        ssh.protocol = "tcp".into();
        ssh.listen_port = Some(2222);
        ssh.certificate = CertificateStatus::default();
        let mut doc = document(vec![
            failing,
            route("grafana.in.example.org", RouteState::Ok, 80),
            api,
            route(long, RouteState::Ok, 45),
            pending,
            ssh,
        ]);
        doc.ready = true;
        doc.readiness.routes_not_served = 1;
        doc.workspace.last_error = Some(
            "error: contract broken by the value of `port`\n       port 0 is not a TCP port".into(),
        );
        doc.sozu.client_auth = Some(ClientAuthStatus {
            mode: "required".into(),
            ca: Some(ClientCaStatus {
                file: "/etc/devices/ca.pem".into(),
                subject: Some("CN=Devices CA".into()),
                not_after: Some(NOW + 400 * DAY),
                problem: None,
            }),
            crls: vec![ClientCrlStatus {
                file: "/etc/devices/crl.pem".into(),
                next_update: Some(NOW + DAY),
                revoked: Some(3),
                problem: None,
            }],
            sozu_refused: None,
        });
        traffic(
            &mut doc,
            "pi-billing.in.example.org",
            4.0,
            0.25 + 0.02 * i as f64,
            0.9,
        );
        traffic(&mut doc, "pi-grafana.in.example.org", 12.5, 0.0, 0.045);
        traffic(&mut doc, &format!("pi-{long}"), 0.5, 0.0, 0.003);
        docs.push(doc);
    }
    let events = vec![
        event(1, EventKind::WorkspaceAccepted, None, false, "workspace applied: 5 routes in zone in.example.org (5 added, 0 removed)"),
        event(2, EventKind::CertificateRotated, Some("grafana.in.example.org"), false, "now serving a877dc973904 (was 0f1e2d3c4b5a)"),
        event(3, EventKind::BackendDown, Some("billing.in.example.org"), true, "backend 10.0.0.1:8080 of 10.0.0.1:8080 is down"),
        event(4, EventKind::RouteState, Some("billing.in.example.org"), true, "route in error: every backend is reported down"),
        event(5, EventKind::PairRefused, Some("billing.in.example.org"), true, "pair refused (expired), the last good one keeps serving: /tls/billing.in.example.org/tls.crt: expired"),
        event(6, EventKind::WorkspaceRejected, None, true, "workspace edit rejected, the last good one stays live: error: contract broken by the value of `port`"),
    ];
    app(docs, events, theme)
}

/// Every pane, the first route's page and the help, one after the other.
fn screens(mut app: App, width: u16, height: u16) -> String {
    let mut out = String::new();
    let mut shot = |app: &App, what: &str| {
        out.push_str(&format!("=== {what} ({width}x{height})\n"));
        out.push_str(&render(app, width, height));
    };
    for pane in Pane::ALL {
        app.act(Action::Pane(pane));
        shot(&app, pane.title());
    }
    app.act(Action::Pane(Pane::Routes));
    app.act(Action::Open);
    shot(&app, "route page");
    app.act(Action::Back);
    app.act(Action::Help);
    shot(&app, "help");
    out
}

fn golden(name: &str, make: fn() -> App) {
    for (width, height) in [(80, 24), (120, 40)] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/top/{name}.{width}x{height}.txt"));
        assert_golden(
            &path,
            &screens(make(), width, height),
            &format!("top, {name}"),
        );
    }
}

#[test]
fn an_agent_without_routes() {
    golden("empty", empty);
}

#[test]
fn one_route_with_traffic() {
    golden("one-route", one_route);
}

#[test]
fn a_failing_route_a_pending_one_and_a_long_host_name() {
    golden("failing", || failing(PLAIN));
}

/// What the colours say, cell by cell: the failing route's state and its certificate's days in
/// red; without colour, none anywhere, and the alert still marked (`3d!`).
#[test]
fn red_marks_what_is_wrong_and_no_color_has_none() {
    let area = Rect::new(0, 0, 120, 40);
    let mut buf = Buffer::empty(area);
    let mut coloured = failing(Theme {
        color: true,
        ascii: false,
    });
    // Worst first: the failing route on the first row.
    coloured.act(Action::SortNext);
    coloured.act(Action::SortNext);
    coloured.act(Action::SortNext);
    coloured.act(Action::SortNext);
    coloured.act(Action::SortNext);
    coloured.act(Action::SortNext);
    draw::frame(&coloured, area, &mut buf);
    let text = draw::text(&buf);
    let row = text
        .lines()
        .position(|l| l.contains("billing.in.example.org"))
        .expect("the failing route's row") as u16;
    let line: Vec<&str> = text.lines().collect();
    let cell_of = |needle: &str| {
        let x = line[usize::from(row)].find(needle).expect(needle) as u16;
        buf[(x, row)].fg
    };
    assert_eq!(cell_of("error"), Color::Red, "{text}");
    assert_eq!(cell_of("3d"), Color::Red, "{text}");
    // A healthy route's certificate is not.
    let ok_row = line
        .iter()
        .position(|l| l.contains("grafana.in.example.org  "))
        .expect("grafana's row") as u16;
    let x = line[usize::from(ok_row)]
        .find("80d")
        .expect("grafana's days") as u16;
    assert_ne!(buf[(x, ok_row)].fg, Color::Red);

    let mut plain = Buffer::empty(area);
    draw::frame(&failing(PLAIN), area, &mut plain);
    assert!(
        plain
            .content()
            .iter()
            .all(|c| c.fg == Color::Reset && c.bg == Color::Reset),
        "a colour without colour"
    );
    assert!(draw::text(&plain).contains("3d!"), "{}", draw::text(&plain));
}

/// `--ascii`: nothing beyond ASCII on any screen.
#[test]
fn ascii_mode_draws_ascii_alone() {
    let ascii = Theme {
        color: false,
        ascii: true,
    };
    let shown = screens(failing(ascii), 120, 40);
    // The hosts and messages are ASCII here: anything else would be the screen's own.
    let foreign: Vec<char> = shown.chars().filter(|c| !c.is_ascii()).collect();
    assert!(foreign.is_empty(), "{foreign:?} in\n{shown}");
    assert!(shown.contains("_"), "{shown}");
}

/// 10,000 routes: sorting and filtering stay on the routes' rows, and the frame shows the
/// selected one wherever it is.
#[test]
fn ten_thousand_routes_sort_filter_and_scroll() {
    let routes: Vec<RouteStatus> = (0..10_000)
        .map(|i| {
            route(
                &format!("s{i:05}.in.example.org"),
                RouteState::Ok,
                10 + i % 80,
            )
        })
        .collect();
    let mut app = app(vec![document(routes)], Vec::new(), PLAIN);
    for c in "s0999".chars() {
        app.act(Action::FilterChar(c));
    }
    assert_eq!(app.visible.len(), 10, "s09990 to s09999");
    app.act(Action::FilterCancel);
    assert_eq!(app.visible.len(), 10_000);
    app.act(Action::Bottom);
    let shown = render(&app, 120, 40);
    assert!(shown.contains("s09999.in.example.org"), "{shown}");
    // By certificate, soonest first: days left 10, from s00000, s00080, …
    app.act(Action::Top);
    for _ in 0..5 {
        app.act(Action::SortNext);
    }
    let first = &app.rows[app.visible[0]];
    assert_eq!(first.days_left.map(f64::round), Some(10.0));
}

/// Not on a terminal, `top` says to use `--once`, and exits 2 before anything else.
#[test]
fn top_without_a_terminal_points_at_once() {
    let (code, out, err) = crate::common::run(
        crate::common::bin()
            .args(["top", "--admin-address", "127.0.0.1:1"])
            .stdin(std::process::Stdio::null()),
    );
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("`top --once` prints one frame"), "{err}");
    assert!(out.is_empty(), "{out:?}");
}
