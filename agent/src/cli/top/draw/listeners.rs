//! The listeners pane: their addresses and TLS policy as the workspace in force declares them,
//! what sozu needs a restart for, the client certificates (the device CA's expiry and each CRL's
//! next update, in red when near), and sozu's access-log stream.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;

use super::{ago, look, put};
use crate::cli::top::model::App;

/// A CRL whose next update is nearer than this is shown in red: sozu fails every handshake
/// once it passes (the critical alert fires two days ahead too).
const CRL_WARNING: i64 = 2 * 86_400;
/// A device CA nearer its expiry than this is shown in red.
const CA_WARNING: i64 = 30 * 86_400;

pub fn page(app: &App, area: Rect, buf: &mut Buffer) {
    let look = look(app);
    let Some(doc) = &app.doc else {
        return;
    };
    let plain = Style::default();
    let mut lines: Vec<Vec<(String, Style)>> = Vec::new();
    match &doc.workspace.listeners {
        Some(l) => {
            lines.push(vec![
                ("HTTPS  ".into(), look.heading()),
                (l.https.clone(), plain),
                (format!("   TLS {} and up", l.min_tls_version), plain),
            ]);
            lines.push(vec![
                ("HTTP   ".into(), look.heading()),
                (l.http.clone(), plain),
                ("   redirects to HTTPS".into(), look.dim()),
            ]);
            let timeouts: Vec<String> = l
                .timeouts
                .iter()
                .map(|(k, v)| format!("{k} {v} s"))
                .collect();
            lines.push(vec![
                ("       ".into(), plain),
                (
                    format!(
                        "PROXY protocol {}",
                        if l.expect_proxy { "expected" } else { "off" }
                    ),
                    plain,
                ),
                (
                    format!("   interface {}", l.interface.as_deref().unwrap_or("any")),
                    plain,
                ),
            ]);
            lines.push(vec![
                ("       ".into(), plain),
                (format!("timeouts: {}", timeouts.join(", ")), plain),
            ]);
        }
        None => lines.push(vec![(
            "no listener known (an older agent, or no workspace yet)".into(),
            look.dim(),
        )]),
    }
    if !doc.sozu.listeners_need_restart.is_empty() {
        lines.push(vec![
            ("restart sozu to apply: ".into(), look.warn()),
            (doc.sozu.listeners_need_restart.join(", "), look.warn()),
        ]);
    }
    lines.push(Vec::new());
    match &doc.sozu.client_auth {
        None => lines.push(vec![(
            "client certificates: not asked for".into(),
            look.dim(),
        )]),
        Some(auth) => {
            lines.push(vec![
                ("client certificates: ".into(), look.heading()),
                (auth.mode.clone(), plain),
            ]);
            if let Some(reason) = &auth.sozu_refused {
                lines.push(vec![(
                    format!("  sozu refused the files' set and keeps the one it held: {reason}"),
                    look.bad(),
                )]);
            }
            if let Some(ca) = &auth.ca {
                let left = ca.not_after.map(|t| t - app.now);
                lines.push(vec![
                    ("  CA   ".into(), look.heading()),
                    (format!("{}  ", ca.file), plain),
                    (
                        ca.subject
                            .clone()
                            .unwrap_or_else(|| "none valid yet".into()),
                        plain,
                    ),
                    (
                        left.map_or_else(String::new, |s| {
                            if s > 0 {
                                format!("  expires in {}", ago(s))
                            } else {
                                "  expired".into()
                            }
                        }),
                        if left.is_some_and(|s| s < CA_WARNING) {
                            look.bad()
                        } else {
                            look.good()
                        },
                    ),
                ]);
                if let Some(p) = &ca.problem {
                    lines.push(vec![(
                        format!("       latest read refused: {p}"),
                        look.bad(),
                    )]);
                }
            }
            for crl in &auth.crls {
                let left = crl.next_update.map(|t| t - app.now);
                lines.push(vec![
                    ("  CRL  ".into(), look.heading()),
                    (format!("{}  ", crl.file), plain),
                    (
                        crl.revoked
                            .map_or_else(|| "none valid yet".into(), |n| format!("{n} revoked")),
                        plain,
                    ),
                    (
                        left.map_or_else(String::new, |s| {
                            if s > 0 {
                                format!("  next update in {}", ago(s))
                            } else {
                                "  next update passed".into()
                            }
                        }),
                        if left.is_some_and(|s| s < CRL_WARNING) {
                            look.bad()
                        } else {
                            look.good()
                        },
                    ),
                ]);
                if let Some(p) = &crl.problem {
                    lines.push(vec![(
                        format!("       latest read refused: {p}"),
                        look.bad(),
                    )]);
                }
            }
        }
    }
    if let Some(traffic) = &doc.traffic {
        lines.push(Vec::new());
        lines.push(vec![
            ("access-log stream: ".into(), look.heading()),
            (
                traffic.listen.clone().unwrap_or_else(|| "not bound".into()),
                plain,
            ),
            (
                format!("   {} records, {} lost", traffic.records, traffic.lost),
                look.dim(),
            ),
        ]);
        if let Some(problem) = &traffic.problem {
            lines.push(vec![(format!("  {problem}"), look.warn())]);
        }
    }
    for (y, line) in (area.y + 1..area.bottom()).zip(&lines) {
        let mut x = area.x + 1;
        for (text, style) in line {
            if x >= area.right() {
                break;
            }
            x += put(buf, x, y, area.right() - x, text, *style, &look);
        }
    }
}
