//! The events pane: what the agent did and why, newest first, as `/v1/events` streams it;
//! problems in red. `/` filters on the kind, the host and the message.

use std::borrow::Cow;

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;

use super::list::{empty, window};
use super::{look, row, Cell};
use crate::cli::top::model::{App, Pane};

pub fn table(app: &App, area: Rect, buf: &mut Buffer) {
    let look = look(app);
    let host = (area.width / 4).clamp(12, 36);
    let widths = [8, 19, host];
    let message = area.width.saturating_sub(widths.iter().sum::<u16>() + 5);
    let header = [
        Cell {
            text: "TIME".into(),
            width: 8,
            style: Style::default(),
            right: false,
        },
        Cell {
            text: "KIND".into(),
            width: 19,
            style: Style::default(),
            right: false,
        },
        Cell {
            text: "HOST".into(),
            width: host,
            style: Style::default(),
            right: false,
        },
        Cell {
            text: "WHAT".into(),
            width: message,
            style: Style::default(),
            right: false,
        },
    ];
    row(buf, area, area.y, &header, look.heading(), &look);
    if app.visible_events.is_empty() {
        let what = if app.events.is_empty() {
            if app.events_live {
                "nothing yet: the agent has done nothing worth telling since it started"
            } else {
                "not connected to the agent's events yet"
            }
        } else {
            "no event matches the filter"
        };
        empty(buf, area, what, &look);
        return;
    }
    for (y, i, base) in window(app, Pane::Events, &app.visible_events, area, &look) {
        let e = &app.events[i];
        let style = if e.problem {
            look.bad()
        } else {
            Style::default()
        };
        let cells = [
            Cell {
                text: Cow::Borrowed(e.time.get(11..19).unwrap_or(&e.time)),
                width: 8,
                style: look.dim(),
                right: false,
            },
            Cell {
                text: Cow::Borrowed(e.kind.as_str()),
                width: 19,
                style,
                right: false,
            },
            Cell {
                text: Cow::Borrowed(e.host.as_deref().unwrap_or("-")),
                width: host,
                style: Style::default(),
                right: false,
            },
            Cell {
                text: Cow::Borrowed(&e.message),
                width: message,
                style,
                right: false,
            },
        ];
        row(buf, area, y, &cells, base, &look);
    }
}
