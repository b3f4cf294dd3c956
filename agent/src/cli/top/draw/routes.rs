//! The routes pane: one row per route (host, path, requests a second, 5xx share, p99, days
//! left of its certificate, state; and its last error where the screen is wide enough), in the
//! chosen order, filtered. Only the rows in view are built.

use std::borrow::Cow;

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;

use super::list::{empty, window};
use super::{days, look, rate, row, seconds, share, Cell};
use crate::cli::top::model::{App, Column, Pane};

/// Widths of the fixed columns; HOST takes what is left, up to [`HOST_MAX`], and beyond that
/// a LAST ERROR column appears.
const PATH: u16 = 8;
const RATE: u16 = 7;
const ERRORS: u16 = 6;
const P99: u16 = 7;
const CERT: u16 = 5;
const STATE: u16 = 14;
const HOST_MIN: u16 = 16;
const HOST_MAX: u16 = 40;

pub fn table(app: &App, area: Rect, buf: &mut Buffer) {
    let look = look(app);
    let fixed = PATH + RATE + ERRORS + P99 + CERT + STATE + 7;
    let host = area
        .width
        .saturating_sub(fixed + 1)
        .clamp(HOST_MIN, HOST_MAX);
    let error = area.width.saturating_sub(fixed + host + 2);
    let widths = [host, PATH, RATE, ERRORS, P99, CERT, STATE];
    let title = |c: Column| {
        if c == app.sort {
            Cow::Owned(format!("{}{}", c.title(), look.arrow(app.descending)))
        } else {
            Cow::Borrowed(c.title())
        }
    };
    let mut header: Vec<Cell<'_>> = Column::ALL
        .iter()
        .zip(widths)
        .map(|(c, width)| Cell {
            text: title(*c),
            width,
            style: Style::default(),
            right: matches!(
                c,
                Column::Rate | Column::Errors | Column::P99 | Column::Cert
            ),
        })
        .collect();
    if error > 8 {
        header.push(Cell {
            text: "LAST ERROR".into(),
            width: error,
            style: Style::default(),
            right: false,
        });
    }
    row(buf, area, area.y, &header, look.heading(), &look);
    if app.visible.is_empty() {
        let what = match (&app.doc, app.filter.is_empty()) {
            (None, _) => "no answer from the agent yet".to_owned(),
            (Some(_), true) => "no route: the workspace declares none".to_owned(),
            (Some(_), false) => format!("no route matches /{}", app.filter),
        };
        empty(buf, area, &what, &look);
        return;
    }
    let doc = app.doc.as_ref();
    for (y, i, base) in window(app, Pane::Routes, &app.visible, area, &look) {
        let r = &app.rows[i];
        let bad = r.state.starts_with("error");
        let state_style = if bad {
            look.bad()
        } else if r.state.starts_with("pending") {
            look.warn()
        } else {
            look.good()
        };
        let errors_style = if r.error_ratio.unwrap_or(0.0) > 0.05 {
            look.bad()
        } else {
            Style::default()
        };
        let cert = days(r.days_left);
        let mut cells = vec![
            Cell {
                text: Cow::Borrowed(&r.host),
                width: host,
                style: Style::default(),
                right: false,
            },
            Cell {
                text: Cow::Borrowed(&r.path),
                width: PATH,
                style: Style::default(),
                right: false,
            },
            Cell {
                text: rate(r.rate).into(),
                width: RATE,
                style: Style::default(),
                right: true,
            },
            Cell {
                text: share(r.error_ratio).into(),
                width: ERRORS,
                style: errors_style,
                right: true,
            },
            Cell {
                text: seconds(r.p99).into(),
                width: P99,
                style: Style::default(),
                right: true,
            },
            Cell {
                // Without colour, the alert still shows.
                text: if r.cert_alert && !look.0.color {
                    format!("{cert}!").into()
                } else {
                    cert.into()
                },
                width: CERT,
                style: if r.cert_alert {
                    look.bad()
                } else {
                    Style::default()
                },
                right: true,
            },
            Cell {
                text: Cow::Borrowed(&r.state),
                width: STATE,
                style: state_style,
                right: false,
            },
        ];
        if error > 8 {
            let last = doc
                .and_then(|d| d.routes.get(r.index))
                .and_then(|route| route.last_error.as_deref())
                .unwrap_or("");
            cells.push(Cell {
                text: last.into(),
                width: error,
                style: look.dim(),
                right: false,
            });
        }
        row(buf, area, y, &cells, base, &look);
    }
}
