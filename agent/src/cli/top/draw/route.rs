//! A route's page (Enter): its upstreams and backends with their health, weight and drain; its
//! certificate, served and on disk, with its names, notAfter and issuer, and under
//! `'sozu_managed` the order's state and next renewal; its policies; its last errors (the
//! current one and the problems the events named it in); its latency over the minutes `top`
//! has watched. Scrolled with the arrows.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;

use super::{ago, days, look, put, seconds, Look};
use crate::cli::status::state_of;
use crate::cli::top::model::{days_left, App};
use crate::document::BackendHealth;

/// How many of the route's latest problems the page lists.
const LAST_ERRORS: usize = 5;

type Line = Vec<(String, Style)>;

pub fn page(app: &App, area: Rect, buf: &mut Buffer) {
    let look = look(app);
    let Some(route) = app.detail_route() else {
        put(
            buf,
            area.x + 2,
            area.y,
            area.width.saturating_sub(2),
            "the route is gone from the workspace (Esc)",
            look.dim(),
            &look,
        );
        return;
    };
    let plain = Style::default();
    let heading = |text: &str| -> Line { vec![(text.to_owned(), look.heading())] };
    let mut lines: Vec<Line> = Vec::new();
    let state = state_of(route);
    let state_style = match route.state {
        crate::document::RouteState::Error => look.bad(),
        crate::document::RouteState::Pending => look.warn(),
        crate::document::RouteState::Ok => look.good(),
    };
    lines.push(vec![
        (format!("{} {}", route.host, route.place()), look.heading()),
        (format!("   {}   ", route.id), look.dim()),
        (state, state_style),
    ]);
    if let Some(e) = &route.last_error {
        lines.push(vec![
            ("  last error: ".into(), plain),
            (e.clone(), look.bad()),
        ]);
    }
    lines.push(Vec::new());
    lines.push(heading("Upstreams"));
    if route.upstreams.is_empty() {
        lines.push(vec![("  none (a redirect)".into(), look.dim())]);
    }
    for u in &route.upstreams {
        lines.push(vec![
            (format!("  {}", u.upstream), plain),
            (format!("   weight {}", u.weight), look.dim()),
            (
                format!("   {}", u.state),
                if u.drain { look.warn() } else { look.good() },
            ),
        ]);
        if u.backends.is_empty() {
            lines.push(vec![(
                "      no backend (no address yet)".into(),
                look.warn(),
            )]);
        }
        for b in &u.backends {
            let style = match b.health {
                BackendHealth::Up => look.good(),
                BackendHealth::Down => look.bad(),
                BackendHealth::Unknown => look.dim(),
            };
            lines.push(vec![
                (format!("      {:<24}", b.address), plain),
                (format!("{:<8}", b.health.to_string()), style),
                (format!("{} transitions", b.transitions), look.dim()),
            ]);
        }
    }
    if route.no_available_backend {
        lines.push(vec![("  no backend can take a request".into(), look.bad())]);
    }
    lines.push(Vec::new());
    lines.push(heading("Certificate"));
    let c = &route.certificate;
    let short = |f: &str| f.get(..16).unwrap_or(f).to_owned();
    let served = if c.served_fingerprints.is_empty() {
        "none".to_owned()
    } else {
        c.served_fingerprints
            .iter()
            .map(|f| short(f))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let disk = c
        .disk_fingerprint
        .as_deref()
        .map(short)
        .unwrap_or_else(|| "none".into());
    let differs = c
        .disk_fingerprint
        .as_ref()
        .is_some_and(|d| !c.served_fingerprints.contains(d));
    lines.push(vec![
        ("  served   ".into(), look.dim()),
        (served, plain),
        ("   on disk ".into(), look.dim()),
        (disk, if differs { look.warn() } else { plain }),
    ]);
    let mut names = vec![route.host.clone()];
    names.extend(c.other_names.iter().cloned());
    lines.push(vec![
        ("  names    ".into(), look.dim()),
        (names.join(", "), plain),
    ]);
    let (left, alert) = days_left(route, app.now);
    let not_after = c.served_not_after.or(c.disk_not_after);
    lines.push(vec![
        ("  expires  ".into(), look.dim()),
        (
            not_after.map_or_else(|| "-".to_owned(), crate::text::date_time),
            plain,
        ),
        (
            format!("  ({} left)", days(left)),
            if alert { look.bad() } else { plain },
        ),
    ]);
    if let Some(issuer) = &c.disk_issuer {
        lines.push(vec![
            ("  issuer   ".into(), look.dim()),
            (issuer.to_string(), plain),
        ]);
    }
    // A pair of `certificates`: where it is read from (the tls dir's needs no saying).
    if let Some(file) = &c.file {
        lines.push(vec![
            ("  file     ".into(), look.dim()),
            (file.clone(), plain),
        ]);
    }
    lines.push(vec![
        ("  rotated  ".into(), look.dim()),
        (
            match c.last_rotation {
                Some(at) => format!(
                    "{} time{} since the agent started, last {} ago",
                    c.rotations,
                    if c.rotations == 1 { "" } else { "s" },
                    ago(app.now - at as i64)
                ),
                None => "not since the agent started".into(),
            },
            plain,
        ),
    ]);
    if let Some(e) = &c.error {
        lines.push(vec![
            ("  refused  ".into(), look.dim()),
            (e.clone(), look.bad()),
        ]);
    }
    if let Some(host) = app
        .doc
        .as_ref()
        .and_then(|d| d.issuer.as_ref())
        .and_then(|i| i.hosts.get(&route.host))
    {
        let mut order = vec![
            ("  ACME     ".into(), look.dim()),
            (
                host.state.clone(),
                if host.state == "backing_off" {
                    look.bad()
                } else {
                    plain
                },
            ),
        ];
        if let Some(due) = host.renewal_due {
            order.push((
                format!(
                    "; next renewal {}{}",
                    crate::text::date_time(due),
                    host.renewal_basis
                        .map(|b| format!(" ({b})"))
                        .unwrap_or_default()
                ),
                plain,
            ));
        }
        if let Some(b) = &host.backoff {
            order.push((
                format!(
                    "; backing off until {}: {}",
                    crate::text::date_time(b.until),
                    b.reason
                ),
                look.bad(),
            ));
        }
        lines.push(order);
    }
    lines.push(Vec::new());
    lines.push(heading("Policies"));
    lines.push(vec![(
        format!(
            "  {}",
            if route.policy.is_empty() {
                "none"
            } else {
                &route.policy
            }
        ),
        plain,
    )]);
    lines.push(Vec::new());
    lines.push(heading(
        "Latency (p99 over the last minute, as top read it)",
    ));
    let history = app.history.p99.get(&route.id);
    let now = history.and_then(|h| h.back().copied());
    let width = usize::from(area.width.saturating_sub(16)).min(120);
    lines.push(vec![
        (format!("  {:<9}", seconds(now)), plain),
        (
            history.map_or_else(String::new, |h| look.spark(h.iter().copied(), width, None)),
            look.accent(),
        ),
    ]);
    lines.push(Vec::new());
    lines.push(heading("Last errors"));
    let problems: Vec<_> = app
        .events
        .iter()
        .filter(|e| e.problem && e.host.as_deref() == Some(route.host.as_str()))
        .take(LAST_ERRORS)
        .collect();
    if problems.is_empty() {
        lines.push(vec![("  none seen since top started".into(), look.dim())]);
    }
    for e in problems {
        lines.push(vec![
            (
                format!("  {} ", e.time.get(11..19).unwrap_or(&e.time)),
                look.dim(),
            ),
            (format!("{:<14} ", e.kind.as_str()), look.bad()),
            (e.message.clone(), plain),
        ]);
    }
    draw_lines(&lines, app.detail_scroll, area, buf, &look);
}

fn draw_lines(lines: &[Line], scroll: u16, area: Rect, buf: &mut Buffer, look: &Look) {
    let skip = usize::from(scroll).min(lines.len().saturating_sub(1));
    for (y, line) in (area.y..area.bottom()).zip(lines.iter().skip(skip)) {
        let mut x = area.x + 1;
        for (text, style) in line {
            if x >= area.right() {
                break;
            }
            x += put(buf, x, y, area.right() - x, text, *style, look);
        }
    }
}
