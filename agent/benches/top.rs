//! `top`'s frame time as routes grow: a frame drawn at 120×40 (through ratatui's terminal and
//! its diff, as on a real terminal) while scrolling the routes, with a filter typed key by key,
//! a sort changed, on the certificates and events panes, and a route's page; and taking a new
//! document (the rows built again). At 10 routes (the baseline) and 10,000, in the same run,
//! with the ratio of each to the baseline. The target is a frame within 16 ms at 10,000 routes.
//! Prints figures; asserts nothing.
//!
//!     cargo bench -p private-ingress --bench top

use std::hint::black_box;
use std::time::{Duration, Instant};

use private_ingress::cli::top::draw;
use private_ingress::cli::top::model::{Action, App, Pane, Theme, Update};
use private_ingress::document::*;
use ratatui::backend::TestBackend;
use ratatui::Terminal;

const SIZES: [usize; 2] = [10, 10_000];
const WIDTH: u16 = 120;
const HEIGHT: u16 = 40;

fn document(routes: usize) -> Document {
    let now = 1_796_126_400;
    let mut traffic = TrafficStatus {
        window_seconds: 60,
        ..TrafficStatus::default()
    };
    let routes: Vec<RouteStatus> = (0..routes)
        .map(|i| {
            let host = format!("svc{i:05}.team{}.in.example.org", i % 37);
            let id = format!("pi-{host}");
            traffic.routes.insert(
                id.clone(),
                RouteTraffic {
                    requests: (i % 300) as u64,
                    requests_per_second: (i % 300) as f64 / 60.0,
                    error_ratio: (i % 17) as f64 / 100.0,
                    p99_seconds: Some((i % 900) as f64 / 1000.0),
                },
            );
            RouteStatus {
                id,
                host,
                path_prefix: if i % 5 == 0 {
                    "/api".into()
                } else {
                    "/".into()
                },
                upstream: "10.0.0.1:8080".into(),
                state: if i % 97 == 0 {
                    RouteState::Error
                } else {
                    RouteState::Ok
                },
                last_error: (i % 97 == 0).then(|| "every backend is reported down".into()),
                certificate: CertificateStatus {
                    served_fingerprints: vec!["ab".repeat(32).into()],
                    disk_fingerprint: Some("ab".repeat(32).into()),
                    served_not_before: Some(now - 30 * 86_400),
                    served_not_after: Some(now + (i % 90) as i64 * 86_400),
                    ..CertificateStatus::default()
                },
                upstreams: vec![UpstreamStatus {
                    upstream: "10.0.0.1:8080".into(),
                    weight: 1,
                    state: "in rotation".into(),
                    backends: vec![BackendStatus {
                        id: "b".into(),
                        address: "10.0.0.1:8080".into(),
                        health: BackendHealth::Up,
                        transitions: 0,
                    }],
                    ..UpstreamStatus::default()
                }],
                ..RouteStatus::default()
            }
        })
        .collect();
    Document {
        ready: true,
        routes,
        traffic: Some(traffic),
        workspace: WorkspaceStatus {
            loaded: true,
            zone: Some("in.example.org".into()),
            ..WorkspaceStatus::default()
        },
        ..Document::default()
    }
}

fn app(routes: usize) -> App {
    let mut app = App::new(
        "127.0.0.1:9180",
        Theme {
            color: true,
            ascii: false,
        },
        Pane::Routes,
    );
    app.now = 1_796_126_400;
    for _ in 0..3 {
        app.update(Update::state(document(routes), app.now));
    }
    for i in 0..500 {
        app.update(Update::Event(Box::new(Event {
            id: i,
            time: "2026-12-01T11:00:00.000Z".into(),
            kind: EventKind::CertificateRotated,
            host: Some(format!("svc{i:05}.in.example.org")),
            problem: i % 7 == 0,
            message: "now serving abababababab (was cdcdcdcdcdcd)".into(),
        })));
    }
    app
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The median and the worst of `runs` frames, each after `step` changed the app.
fn frames(
    app: &mut App,
    runs: usize,
    mut step: impl FnMut(&mut App, usize),
) -> (Duration, Duration) {
    let mut terminal = Terminal::new(TestBackend::new(WIDTH, HEIGHT)).expect("a terminal");
    let mut took = Vec::with_capacity(runs);
    for i in 0..runs {
        let t = Instant::now();
        step(app, i);
        terminal
            .draw(|f| {
                let area = f.area();
                draw::frame(app, area, f.buffer_mut());
            })
            .expect("a frame");
        took.push(t.elapsed());
    }
    let worst = took.iter().copied().max().unwrap_or_default();
    (median(took), worst)
}

/// What changes before a frame: the app, at the frame's number.
type Step = fn(&mut App, usize);

fn main() {
    println!("top: one frame at {WIDTH}x{HEIGHT} (step, then draw and diff), median / worst");
    let cases: [(&str, Step); 7] = [
        ("scroll routes", |app, _| {
            app.act(Action::Down);
        }),
        ("page down", |app, _| {
            app.act(Action::PageDown);
        }),
        ("filter, a key", |app, i| {
            // Typing "svc0", clearing, again: each key filters all routes again.
            if i % 5 == 4 {
                app.act(Action::FilterCancel);
            } else {
                app.act(Action::FilterChar(['s', 'v', 'c', '0'][i % 5]));
            }
        }),
        ("sort, a column", |app, _| {
            app.act(Action::SortNext);
        }),
        ("certificates", |app, _| {
            app.act(Action::Pane(Pane::Certificates));
            app.act(Action::Down);
        }),
        ("events", |app, _| {
            app.act(Action::Pane(Pane::Events));
            app.act(Action::Down);
        }),
        ("a route's page", |app, _| {
            app.act(Action::Pane(Pane::Routes));
            app.act(Action::Down);
            app.act(Action::Open);
        }),
    ];
    println!(
        "  {:<16} {:>22} {:>22} {:>9}",
        "case", "10 routes", "10,000 routes", "ratio"
    );
    for (name, step) in cases {
        let mut row = Vec::new();
        for routes in SIZES {
            let mut app = app(routes);
            // Warm: the first frame allocates the buffers.
            let _ = frames(&mut app, 3, step);
            row.push(frames(&mut app, 200, step));
        }
        println!(
            "  {:<16} {:>10.3?} / {:>9.3?} {:>10.3?} / {:>9.3?} {:>8.2}×",
            name,
            row[0].0,
            row[0].1,
            row[1].0,
            row[1].1,
            row[1].0.as_secs_f64() / row[0].0.as_secs_f64()
        );
    }
    // A new document: its rows built where it was read (the reading thread), then taken by
    // the screen's thread (filtered, sorted, the history sampled).
    let (mut built, mut taken) = (Vec::new(), Vec::new());
    for routes in SIZES {
        let doc = document(routes);
        let mut app = app(routes);
        let (mut b, mut t) = (Vec::new(), Vec::new());
        for _ in 0..21 {
            let doc = doc.clone();
            let started = Instant::now();
            let update = Update::state(doc, app.now);
            b.push(started.elapsed());
            let started = Instant::now();
            app.update(update);
            black_box(&app);
            t.push(started.elapsed());
        }
        built.push(median(b));
        taken.push(median(t));
    }
    for (name, row) in [("rows built", built), ("a new document", taken)] {
        println!(
            "  {:<16} {:>22.3?} {:>22.3?} {:>8.2}×",
            name,
            row[0],
            row[1],
            row[1].as_secs_f64() / row[0].as_secs_f64()
        );
    }
    // And the parse of it, on top's reading thread: what a read that changed costs top.
    let mut row = Vec::new();
    for routes in SIZES {
        let json = serde_json::to_vec(&document(routes)).expect("JSON");
        let took = median(
            (0..11)
                .map(|_| {
                    let t = Instant::now();
                    black_box(serde_json::from_slice::<Document>(&json).expect("a document"));
                    t.elapsed()
                })
                .collect(),
        );
        row.push((took, json.len()));
    }
    println!(
        "  {:<16} {:>13.3?} ({:>4} KB) {:>11.3?} ({:>5} KB) {:>6.2}×",
        "parse /v1/state",
        row[0].0,
        row[0].1 / 1000,
        row[1].0,
        row[1].1 / 1000,
        row[1].0.as_secs_f64() / row[0].0.as_secs_f64()
    );
}
