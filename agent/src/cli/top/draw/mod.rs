//! Drawing `top`'s screen into a ratatui [`Buffer`]: the overview at the top, the panes' tabs,
//! the pane (or the open route, or the help), the keys at the bottom. The live terminal,
//! `--once` and the snapshot tests draw with the same code; only where the buffer goes differs.
//!
//! Everything shown that came from the agent (hosts, messages, paths) goes through
//! [`crate::text::clean_line`] first: a terminal must not act on what a workspace or a file
//! name chose. Rows are written cell by cell with [`put`]; only the rows in view are built, so
//! a frame costs the same at 10,000 routes as at ten.

mod certificates;
mod events;
mod list;
mod listeners;
mod route;
mod routes;

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::widgets::{Block, Borders, Clear, Widget};

use super::keys::HELP;
use super::model::{counts, App, Pane, Theme};

/// The whole screen.
pub fn frame(app: &App, area: Rect, buf: &mut Buffer) {
    let alert = alert_line(app);
    let [header, tabs, body, footer] = Layout::vertical([
        Constraint::Length(if alert.is_some() { 4 } else { 3 }),
        Constraint::Length(1),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(area);
    overview(app, header, alert, buf);
    tab_line(app, tabs, buf);
    // Rows a page holds: what PgUp and PgDn move by.
    app.page.set(usize::from(body.height.saturating_sub(1)));
    if app.help {
        help(app, body, buf);
    } else if app.detail.is_some() {
        route::page(app, body, buf);
    } else {
        match app.pane {
            Pane::Routes => routes::table(app, body, buf),
            Pane::Certificates => certificates::table(app, body, buf),
            Pane::Listeners => listeners::page(app, body, buf),
            Pane::Events => events::table(app, body, buf),
        }
    }
    keys_line(app, footer, buf);
}

/// The screen as text, one line per row, trailing blanks cut: `--once` and the snapshot tests.
pub fn text(buf: &Buffer) -> String {
    let area = buf.area;
    let mut out = String::new();
    for y in area.top()..area.bottom() {
        let mut line = String::new();
        for x in area.left()..area.right() {
            line.push_str(buf[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Styles and symbols of a theme.
pub(super) struct Look(Theme);

impl Look {
    fn colour(&self, color: Color) -> Style {
        if self.0.color {
            Style::default().fg(color)
        } else {
            Style::default()
        }
    }

    /// Something wrong: red, or bold without colour.
    pub fn bad(&self) -> Style {
        if self.0.color {
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)
        } else {
            Style::default().add_modifier(Modifier::BOLD)
        }
    }

    pub fn good(&self) -> Style {
        self.colour(Color::Green)
    }

    pub fn warn(&self) -> Style {
        self.colour(Color::Yellow)
    }

    pub fn dim(&self) -> Style {
        if self.0.color {
            Style::default().fg(Color::DarkGray)
        } else {
            Style::default()
        }
    }

    pub fn heading(&self) -> Style {
        Style::default().add_modifier(Modifier::BOLD)
    }

    pub fn selected(&self) -> Style {
        Style::default().add_modifier(Modifier::REVERSED)
    }

    pub fn accent(&self) -> Style {
        self.colour(Color::Cyan)
    }

    pub fn ellipsis(&self) -> &'static str {
        if self.0.ascii {
            "~"
        } else {
            "…"
        }
    }

    pub fn bar(&self) -> &'static str {
        if self.0.ascii {
            "|"
        } else {
            "│"
        }
    }

    pub fn arrow(&self, descending: bool) -> &'static str {
        match (self.0.ascii, descending) {
            (true, true) => "v",
            (true, false) => "^",
            (false, true) => "▼",
            (false, false) => "▲",
        }
    }

    /// `values` as a sparkline of at most `width` cells, the newest at the right, scaled to
    /// the largest shown (or to `max`, if given).
    pub fn spark(
        &self,
        values: impl DoubleEndedIterator<Item = f64> + ExactSizeIterator,
        width: usize,
        max: Option<f64>,
    ) -> String {
        const BLOCKS: [&str; 8] = ["▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"];
        const ASCII: [&str; 8] = ["_", ".", ":", "-", "=", "+", "*", "#"];
        let skip = values.len().saturating_sub(width);
        let shown: Vec<f64> = values.skip(skip).collect();
        let top = max
            .unwrap_or_else(|| shown.iter().copied().fold(0.0, f64::max))
            .max(f64::MIN_POSITIVE);
        let set = if self.0.ascii { &ASCII } else { &BLOCKS };
        shown
            .iter()
            .map(|v| {
                let level = ((v / top) * 7.0).round().clamp(0.0, 7.0) as usize;
                set[level]
            })
            .collect()
    }
}

pub(super) fn look(app: &App) -> Look {
    Look(app.theme)
}

/// Writes `text` at (x, y) in at most `width` cells, cut with an ellipsis when longer; the
/// text is cleaned first. Returns the cells written.
pub(super) fn put(
    buf: &mut Buffer,
    x: u16,
    y: u16,
    width: u16,
    text: &str,
    style: Style,
    look: &Look,
) -> u16 {
    if width == 0 {
        return 0;
    }
    let mut clean = crate::text::clean_line(text, crate::text::MAX_LINE_BYTES);
    if look.0.ascii && !clean.is_ascii() {
        clean = clean
            .chars()
            .map(|c| match c {
                '…' => '~',
                '→' => '>',
                c if c.is_ascii() => c,
                _ => '?',
            })
            .collect();
    }
    let chars = clean.chars().count();
    let width_usize = usize::from(width);
    let shown = if chars > width_usize {
        let kept: String = clean.chars().take(width_usize.saturating_sub(1)).collect();
        format!("{kept}{}", look.ellipsis())
    } else {
        clean
    };
    let (end, _) = buf.set_stringn(x, y, &shown, width_usize, style);
    end - x
}

/// Cells of a table row, left to right, one space apart: (text, width, style, right-aligned).
pub(super) struct Cell<'a> {
    pub text: std::borrow::Cow<'a, str>,
    pub width: u16,
    pub style: Style,
    pub right: bool,
}

pub(super) fn row(
    buf: &mut Buffer,
    area: Rect,
    y: u16,
    cells: &[Cell<'_>],
    base: Style,
    look: &Look,
) {
    buf.set_style(Rect::new(area.x, y, area.width, 1), base);
    let mut x = area.x + 1;
    for cell in cells {
        if x >= area.right() {
            break;
        }
        let width = cell.width.min(area.right() - x);
        let len = cell.text.chars().count() as u16;
        let at = if cell.right && len < width {
            x + width - len
        } else {
            x
        };
        put(
            buf,
            at,
            y,
            width - (at - x),
            &cell.text,
            base.patch(cell.style),
            look,
        );
        x += width + 1;
    }
}

/// A moment as `HH:MM:SS` (UTC).
pub(super) fn clock(unix: i64) -> String {
    let s = unix.rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// Seconds as the shortest readable duration.
pub(super) fn ago(seconds: i64) -> String {
    match seconds {
        s if s < 120 => format!("{s} s"),
        s if s < 7_200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{} h", s / 3_600),
        s => format!("{} d", s / 86_400),
    }
}

pub(super) fn rate(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.2}"),
    }
}

pub(super) fn share(value: Option<f64>) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{:.1}%", v * 100.0))
}

pub(super) fn seconds(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(v) if v < 1.0 => format!("{:.0} ms", v * 1e3),
        Some(v) => format!("{v:.2} s"),
    }
}

pub(super) fn days(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(d) if d < 0.0 => "expired".into(),
        Some(d) if d < 2.0 => format!("{:.0}h", d * 24.0),
        Some(d) if d >= 1_000.0 => format!("{:.0}y", d / 365.25),
        Some(d) => format!("{:.0}d", d.floor()),
    }
}

/// What is wrong with the agent as a whole, in one line: unreachable, a rejected edit, not
/// ready; `None` when all is well.
fn alert_line(app: &App) -> Option<String> {
    if let Some((why, since)) = &app.down {
        return Some(format!(
            "agent unreachable for {}: {why}; retrying (showing what it last said)",
            ago(app.now - since)
        ));
    }
    if app.stopping {
        return Some("the agent said it is stopping; waiting for it to come back".into());
    }
    let doc = app.doc.as_ref()?;
    if let Some(e) = &doc.workspace.last_error {
        let first = e.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        return Some(format!(
            "workspace edit rejected, the last good one stays live: {first}"
        ));
    }
    if !doc.ready {
        return Some(format!(
            "not ready: {}",
            doc.readiness.reason.as_deref().unwrap_or("no reason given")
        ));
    }
    None
}

fn overview(app: &App, area: Rect, alert: Option<String>, buf: &mut Buffer) {
    let look = look(app);
    let (x, w) = (area.x, area.width);
    let mut y = area.y;
    // Title line: what, where, when.
    buf.set_style(Rect::new(x, y, w, 1), look.selected());
    let mut title = format!(" private-ingress top {} {}", look.bar(), app.address);
    if app.paused {
        title.push_str("  [PAUSED]");
    }
    put(buf, x, y, w, &title, look.selected(), &look);
    let when = format!(
        "{} ",
        match app.read_at {
            Some(at) => format!("read {} UTC", clock(at)),
            None => "not read yet".into(),
        }
    );
    let at = x + w.saturating_sub(when.len() as u16);
    if at > x + title.chars().count() as u16 {
        put(buf, at, y, w, &when, look.selected(), &look);
    }
    y += 1;
    let Some(doc) = &app.doc else {
        put(
            buf,
            x + 1,
            y,
            w - 1,
            "waiting for the agent's first answer…",
            look.dim(),
            &look,
        );
        return;
    };
    // Status line: ready, sozu, workspace, routes.
    let mut cx = x + 1;
    let mut span = |text: &str, style: Style, buf: &mut Buffer| {
        cx += put(buf, cx, y, (x + w).saturating_sub(cx), text, style, &look);
    };
    span("ready ", look.heading(), buf);
    let ready = if doc.ready {
        match doc.readiness.routes_not_served {
            0 => "yes".to_owned(),
            n => format!("yes ({n} not served)"),
        }
    } else {
        "no".into()
    };
    span(
        &ready,
        if doc.ready { look.good() } else { look.bad() },
        buf,
    );
    span("   sozu ", look.heading(), buf);
    let (sozu, sozu_style) = match (&doc.sozu.generation, &doc.sozu.last_error) {
        (_, Some(_)) => ("unreachable", look.bad()),
        (Some(_), None) => ("in sync", look.good()),
        (None, None) => ("not connected yet", look.warn()),
    };
    span(sozu, sozu_style, buf);
    let (ok, pending, error) = counts(doc);
    span(
        &format!("   routes {}", doc.routes.len()),
        look.heading(),
        buf,
    );
    span(&format!(" ({ok} ok"), Style::default(), buf);
    if pending > 0 {
        span(&format!(", {pending} pending"), look.warn(), buf);
    }
    if error > 0 {
        span(&format!(", {error} error"), look.bad(), buf);
    }
    span(")", Style::default(), buf);
    span("   workspace ", look.heading(), buf);
    let (workspace, ws_style) = match (&doc.workspace.zone, &doc.workspace.last_error) {
        (Some(zone), None) => (format!("{zone} applied"), look.good()),
        (Some(zone), Some(_)) => (format!("{zone}, last edit rejected"), look.bad()),
        (None, _) => ("not loaded".to_owned(), look.warn()),
    };
    span(&workspace, ws_style, buf);
    y += 1;
    // Traffic line: requests a second and 5xx share across routes, with their history.
    let history = &app.history;
    let now_rate = history.rate.back().copied();
    let now_errors = history.errors.back().copied();
    let spark_width = usize::from(w.saturating_sub(40) / 2).clamp(8, 60);
    let mut cx = x + 1;
    let mut span = |text: &str, style: Style, buf: &mut Buffer| {
        cx += put(buf, cx, y, (x + w).saturating_sub(cx), text, style, &look);
    };
    span("req/s ", look.heading(), buf);
    span(&format!("{:<7} ", rate(now_rate)), Style::default(), buf);
    span(
        &look.spark(history.rate.iter().copied(), spark_width, None),
        look.accent(),
        buf,
    );
    span("  5xx ", look.heading(), buf);
    let errors_style = if now_errors.unwrap_or(0.0) > 0.05 {
        look.bad()
    } else {
        Style::default()
    };
    span(&format!("{:<6} ", share(now_errors)), errors_style, buf);
    span(
        &look.spark(history.errors.iter().copied(), spark_width, Some(1.0)),
        look.bad(),
        buf,
    );
    if doc
        .traffic
        .as_ref()
        .and_then(|t| t.problem.as_ref())
        .is_some()
    {
        span("  (sozu sends no records)", look.warn(), buf);
    }
    y += 1;
    if let Some(alert) = alert {
        put(buf, x + 1, y, w - 1, &alert, look.bad(), &look);
    }
}

fn tab_line(app: &App, area: Rect, buf: &mut Buffer) {
    let look = look(app);
    let mut x = area.x + 1;
    for pane in Pane::ALL {
        let label = format!(" {} {} ", pane.index() + 1, pane.title());
        let style = if pane == app.pane && app.detail.is_none() {
            look.selected().add_modifier(Modifier::BOLD)
        } else {
            look.dim()
        };
        x += put(
            buf,
            x,
            area.y,
            area.right().saturating_sub(x),
            &label,
            style,
            &look,
        ) + 1;
    }
    // The sort and the filter, at the right.
    let mut right = String::new();
    if app.pane == Pane::Routes && app.detail.is_none() {
        right.push_str(&format!(
            "sort {} {} ",
            app.sort.title().to_lowercase(),
            look.arrow(app.descending)
        ));
    }
    if app.editing_filter || !app.filter.is_empty() {
        right.push_str(&format!(
            " /{}{} ",
            app.filter,
            if app.editing_filter { "_" } else { "" }
        ));
    }
    let len = right.chars().count() as u16;
    if len > 0 && area.right() > x + len {
        let style = if app.editing_filter {
            look.selected()
        } else {
            look.accent()
        };
        put(buf, area.right() - len, area.y, len, &right, style, &look);
    }
}

fn keys_line(app: &App, area: Rect, buf: &mut Buffer) {
    let look = look(app);
    let keys = if app.editing_filter {
        "type to filter  Enter:keep  Esc:clear"
    } else if app.detail.is_some() {
        "Esc:back ↑↓:scroll q:quit ?:help"
    } else {
        "?:help q:quit /:filter Tab:pane ↑↓:move Enter:open s:sort p:pause"
    };
    let keys = if look.0.ascii {
        keys.replace("↑↓", "j/k")
    } else {
        keys.to_owned()
    };
    // The events' link at the right, whole; the keys take what is left.
    let link = if app.events_live {
        "events: live"
    } else {
        "events: reconnecting"
    };
    let mut status = String::from(link);
    if app.skipped > 0 {
        status.push_str(&format!(" ({} skipped)", app.skipped));
    }
    let len = status.chars().count() as u16 + 1;
    let room = area.width.saturating_sub(len + 2);
    put(buf, area.x + 1, area.y, room, &keys, look.dim(), &look);
    if area.width > len + 2 {
        let style = if app.events_live {
            look.dim()
        } else {
            look.warn()
        };
        put(buf, area.right() - len, area.y, len, &status, style, &look);
    }
}

fn help(app: &App, area: Rect, buf: &mut Buffer) {
    let look = look(app);
    let height = (HELP.len() as u16 + 4).min(area.height);
    let width = 64.min(area.width);
    let popup = Rect::new(
        area.x + (area.width - width) / 2,
        area.y + (area.height - height) / 2,
        width,
        height,
    );
    Clear.render(popup, buf);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_set(if look.0.ascii {
            ratatui::symbols::border::Set {
                top_left: "+",
                top_right: "+",
                bottom_left: "+",
                bottom_right: "+",
                vertical_left: "|",
                vertical_right: "|",
                horizontal_top: "-",
                horizontal_bottom: "-",
            }
        } else {
            ratatui::symbols::border::PLAIN
        })
        .title(" keys ");
    let inner = block.inner(popup);
    block.render(popup, buf);
    for (i, (keys, what)) in HELP.iter().enumerate() {
        let y = inner.y + 1 + i as u16;
        if y >= inner.bottom() {
            break;
        }
        let keys = if look.0.ascii {
            keys.replace("↑ ↓", "up dn")
                .replace('→', "right")
                .replace('←', "left")
        } else {
            (*keys).to_owned()
        };
        put(buf, inner.x + 1, y, 16, &keys, look.heading(), &look);
        put(
            buf,
            inner.x + 18,
            y,
            inner.width.saturating_sub(19),
            what,
            Style::default(),
            &look,
        );
    }
}
