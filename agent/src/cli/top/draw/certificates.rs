//! The certificates pane: every host's pair, soonest expiry first: days left (red under the
//! expiry alert's threshold), notAfter, the served and on-disk fingerprints, the rotations seen
//! and when the last was, and why the pair on disk is refused, if it is.

use std::borrow::Cow;

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;

use super::list::{empty, window};
use super::{ago, days, look, row, Cell};
use crate::cli::top::model::{App, Pane};

pub fn table(app: &App, area: Rect, buf: &mut Buffer) {
    let look = look(app);
    let widths: [u16; 7] = [7, 17, 12, 12, 4, 9, 14];
    let fixed: u16 = widths.iter().sum::<u16>() + 8;
    let host = area.width.saturating_sub(fixed + 1).clamp(16, 44);
    let titles = [
        "HOST",
        "LEFT",
        "NOT AFTER",
        "SERVED",
        "ON DISK",
        "ROT",
        "LAST ROT",
        "REFUSED",
    ];
    let mut all = vec![host];
    all.extend(widths);
    let header: Vec<Cell<'_>> = titles
        .iter()
        .zip(&all)
        .enumerate()
        .map(|(i, (t, w))| Cell {
            text: Cow::Borrowed(*t),
            width: *w,
            style: Style::default(),
            right: i == 1 || i == 5,
        })
        .collect();
    row(buf, area, area.y, &header, look.heading(), &look);
    if app.visible_certs.is_empty() {
        empty(buf, area, "no certificate", &look);
        return;
    }
    for (y, i, base) in window(app, Pane::Certificates, &app.visible_certs, area, &look) {
        let c = &app.certs[i];
        let left = days(c.days_left);
        let cells = [
            Cell {
                text: Cow::Borrowed(&c.host),
                width: all[0],
                style: Style::default(),
                right: false,
            },
            Cell {
                text: if c.alert && !look.0.color {
                    format!("{left}!").into()
                } else {
                    left.into()
                },
                width: all[1],
                style: if c.alert { look.bad() } else { look.good() },
                right: true,
            },
            Cell {
                text: c
                    .not_after
                    .map_or_else(|| "-".into(), crate::text::date_time)
                    .into(),
                width: all[2],
                style: Style::default(),
                right: false,
            },
            Cell {
                text: Cow::Borrowed(if c.served.is_empty() { "-" } else { &c.served }),
                width: all[3],
                style: Style::default(),
                right: false,
            },
            Cell {
                text: Cow::Borrowed(if c.disk.is_empty() { "-" } else { &c.disk }),
                width: all[4],
                style: if !c.disk.is_empty() && !c.served.contains(&c.disk) {
                    look.warn()
                } else {
                    Style::default()
                },
                right: false,
            },
            Cell {
                text: c.rotations.to_string().into(),
                width: all[5],
                style: Style::default(),
                right: true,
            },
            Cell {
                text: c
                    .last_rotation
                    .map_or_else(
                        || "-".into(),
                        |t| format!("{} ago", ago(app.now - t as i64)),
                    )
                    .into(),
                width: all[6],
                style: Style::default(),
                right: false,
            },
            Cell {
                text: c.problem.as_deref().unwrap_or("-").into(),
                width: all[7],
                style: if c.problem.is_some() {
                    look.bad()
                } else {
                    look.dim()
                },
                right: false,
            },
        ];
        row(buf, area, y, &cells, base, &look);
    }
}
