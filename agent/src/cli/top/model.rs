//! What `top` shows and where the person is in it: the last document read, the events, the
//! history it keeps for the sparklines, the pane, the sort, the filter and the selection. Pure:
//! the fetchers feed it [`Update`]s, the keys [`Action`]s, and [`super::draw`] reads it. Every
//! derived list (the routes' rows, the certificates') is built once per document, and filtered
//! and sorted once per change of filter or sort, never per frame: a frame at 10,000 routes
//! draws the forty rows it shows.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::cli::status::state_of;
use crate::document::{Document, Event, RouteState, RouteStatus};
use crate::render::alerts::{EXPIRY_FLOOR, EXPIRY_FRACTION};

/// Samples kept for the overview's sparklines: at the default refresh (2 s), eight minutes.
pub const HISTORY: usize = 240;
/// Samples kept per route for its latency sparkline.
pub const ROUTE_HISTORY: usize = 120;
/// Events kept by `top` (the agent keeps 512 for a client joining late).
pub const EVENTS_KEPT: usize = 2_000;

/// A pane of `top`, as `--pane` names it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Pane {
    Routes,
    Certificates,
    Listeners,
    Events,
}

impl Pane {
    pub const ALL: [Pane; 4] = [
        Pane::Routes,
        Pane::Certificates,
        Pane::Listeners,
        Pane::Events,
    ];

    pub fn index(self) -> usize {
        match self {
            Pane::Routes => 0,
            Pane::Certificates => 1,
            Pane::Listeners => 2,
            Pane::Events => 3,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Pane::Routes => "Routes",
            Pane::Certificates => "Certificates",
            Pane::Listeners => "Listeners",
            Pane::Events => "Events",
        }
    }
}

/// The routes table's columns, each a sort key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    Host,
    Path,
    Rate,
    Errors,
    P99,
    Cert,
    State,
}

impl Column {
    pub const ALL: [Column; 7] = [
        Column::Host,
        Column::Path,
        Column::Rate,
        Column::Errors,
        Column::P99,
        Column::Cert,
        Column::State,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Column::Host => "HOST",
            Column::Path => "PATH",
            Column::Rate => "REQ/S",
            Column::Errors => "5XX",
            Column::P99 => "P99",
            Column::Cert => "CERT",
            Column::State => "STATE",
        }
    }

    /// Which way a column sorts first: the busiest, the most failing, the slowest and the
    /// soonest to expire at the top; names in alphabetical order.
    fn descending_first(self) -> bool {
        matches!(
            self,
            Column::Rate | Column::Errors | Column::P99 | Column::State
        )
    }
}

/// One route as the routes table shows it, built once per document.
#[derive(Debug, Clone)]
pub struct RouteRow {
    /// Its place in the document's routes.
    pub index: usize,
    pub id: String,
    pub host: String,
    pub path: String,
    pub rate: Option<f64>,
    pub error_ratio: Option<f64>,
    pub p99: Option<f64>,
    /// Days left to the served certificate's notAfter (the pair on disk's when the served one is
    /// not known).
    pub days_left: Option<f64>,
    /// Under the expiry alert's threshold: shown in red.
    pub cert_alert: bool,
    pub state: String,
    /// Errors first, then pending, then ok.
    state_rank: u8,
    /// Lowercase host, path and state: what `/` searches.
    search: String,
}

/// One host's pair, as the certificates pane shows it.
#[derive(Debug, Clone)]
pub struct CertRow {
    pub host: String,
    pub days_left: Option<f64>,
    pub alert: bool,
    pub not_after: Option<i64>,
    pub served: String,
    pub disk: String,
    pub rotations: u64,
    pub last_rotation: Option<u64>,
    pub problem: Option<String>,
    search: String,
}

/// A document with the rows its panes list, built where it was read: at 10,000 routes that is
/// tens of milliseconds, which the screen's thread does not spend.
#[derive(Debug)]
pub struct Prepared {
    pub doc: Document,
    rows: Vec<RouteRow>,
    certs: Vec<CertRow>,
}

impl Prepared {
    /// `doc`'s rows, days left counted from `now` (Unix seconds).
    pub fn new(doc: Document, now: i64) -> Prepared {
        Prepared {
            rows: doc
                .routes
                .iter()
                .enumerate()
                .map(|(i, r)| route_row(i, r, &doc, now))
                .collect(),
            certs: cert_rows(&doc, now),
            doc,
        }
    }
}

/// What the fetchers report.
#[derive(Debug)]
pub enum Update {
    /// A new `/v1/state`, read at `at` (Unix seconds).
    State(Box<Prepared>, i64),
    /// `/v1/state` did not change (304) at `at`.
    Unchanged(i64),
    /// The agent could not be read: why.
    Down(String),
    Event(Box<Event>),
    /// The agent skipped events for this client (it read too slowly).
    Skipped(u64),
    /// The events stream is open (`true`), or broke and is being opened again.
    EventsLink(bool),
    /// The agent said it is stopping.
    Stopping,
}

/// What a key asks for ([`super::keys`] maps keys to actions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Quit,
    Help,
    Pane(Pane),
    NextPane,
    PreviousPane,
    Up,
    Down,
    PageUp,
    PageDown,
    Top,
    Bottom,
    Open,
    Back,
    Pause,
    SortNext,
    SortPrevious,
    SortReverse,
    FilterStart,
    FilterChar(char),
    FilterBackspace,
    FilterDone,
    FilterCancel,
}

/// How the screen is drawn: colours (none with `NO_COLOR`), and ASCII alone (`--ascii`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Theme {
    pub color: bool,
    pub ascii: bool,
}

/// The overview's history: the requests a second and the 5xx share across routes, sampled
/// at each read, and each route's p99.
#[derive(Debug, Default)]
pub struct History {
    pub rate: VecDeque<f64>,
    pub errors: VecDeque<f64>,
    pub p99: HashMap<String, VecDeque<f64>>,
}

impl History {
    fn sample(&mut self, doc: &Document) {
        let (mut rate, mut requests, mut failed) = (0.0, 0.0, 0.0);
        if let Some(traffic) = &doc.traffic {
            for (id, t) in &traffic.routes {
                rate += t.requests_per_second;
                requests += t.requests as f64;
                failed += t.requests as f64 * t.error_ratio;
                if let Some(p99) = t.p99_seconds {
                    push(self.p99.entry(id.clone()).or_default(), p99, ROUTE_HISTORY);
                }
            }
            // A route with no request in the window has none to show: its history ends.
            self.p99.retain(|id, _| traffic.routes.contains_key(id));
        }
        push(&mut self.rate, rate, HISTORY);
        push(
            &mut self.errors,
            if requests > 0.0 {
                failed / requests
            } else {
                0.0
            },
            HISTORY,
        );
    }
}

fn push(series: &mut VecDeque<f64>, value: f64, cap: usize) {
    if series.len() == cap {
        series.pop_front();
    }
    series.push_back(value);
}

/// Everything `top` shows.
#[derive(Debug)]
pub struct App {
    pub address: String,
    pub theme: Theme,
    pub doc: Option<Document>,
    pub rows: Vec<RouteRow>,
    /// `rows` after the filter, in the sort's order: indices into `rows`.
    pub visible: Vec<usize>,
    pub certs: Vec<CertRow>,
    pub visible_certs: Vec<usize>,
    /// Newest first.
    pub events: VecDeque<Event>,
    pub visible_events: Vec<usize>,
    pub history: History,
    pub pane: Pane,
    pub sort: Column,
    pub descending: bool,
    pub filter: String,
    pub editing_filter: bool,
    /// The selection in each pane, an index into its visible list.
    pub selected: [usize; 4],
    /// The first row shown in each pane: kept by drawing, so that the selection stays in view.
    pub offset: [Cell<usize>; 4],
    /// The route open (Enter), by id, and how far its page is scrolled.
    pub detail: Option<String>,
    pub detail_scroll: u16,
    pub help: bool,
    pub paused: bool,
    /// Why the agent could not be read, and since when (Unix seconds); `None` while it answers.
    pub down: Option<(String, i64)>,
    pub events_live: bool,
    /// Events the agent skipped for this client.
    pub skipped: u64,
    pub stopping: bool,
    /// When the document was last read (or found unchanged), Unix seconds.
    pub read_at: Option<i64>,
    /// Now, Unix seconds: what days left are counted from.
    pub now: i64,
    /// Rows a page holds, from the last frame.
    pub page: Cell<usize>,
    held: Vec<Update>,
}

impl Update {
    /// A document read at `at`, its rows built here.
    pub fn state(doc: Document, at: i64) -> Update {
        Update::State(Box::new(Prepared::new(doc, at)), at)
    }
}

impl App {
    pub fn new(address: &str, theme: Theme, pane: Pane) -> App {
        App {
            address: address.to_owned(),
            theme,
            doc: None,
            rows: Vec::new(),
            visible: Vec::new(),
            certs: Vec::new(),
            visible_certs: Vec::new(),
            events: VecDeque::new(),
            visible_events: Vec::new(),
            history: History::default(),
            pane,
            sort: Column::Host,
            descending: false,
            filter: String::new(),
            editing_filter: false,
            selected: [0; 4],
            offset: Default::default(),
            detail: None,
            detail_scroll: 0,
            help: false,
            paused: false,
            down: None,
            events_live: false,
            skipped: 0,
            stopping: false,
            read_at: None,
            now: 0,
            page: Cell::new(20),
            held: Vec::new(),
        }
    }

    /// Takes what a fetcher reports; while paused, the data waits (the link's state does not).
    pub fn update(&mut self, update: Update) {
        match update {
            Update::Down(why) => {
                let since = self.down.as_ref().map_or(self.now, |(_, t)| *t);
                self.down = Some((why, since));
                return;
            }
            Update::EventsLink(live) => {
                self.events_live = live;
                return;
            }
            Update::Stopping => {
                self.stopping = true;
                return;
            }
            Update::State(..) | Update::Unchanged(_) => {
                self.down = None;
                self.stopping = false;
            }
            Update::Event(_) | Update::Skipped(_) => {}
        }
        if self.paused {
            self.held.push(update);
            return;
        }
        self.apply(update);
    }

    fn apply(&mut self, update: Update) {
        match update {
            Update::State(prepared, at) => {
                self.read_at = Some(at);
                self.history.sample(&prepared.doc);
                self.set_document(*prepared);
            }
            Update::Unchanged(at) => {
                self.read_at = Some(at);
                if let Some(doc) = self.doc.take() {
                    self.history.sample(&doc);
                    self.doc = Some(doc);
                }
            }
            Update::Event(event) => {
                if self.events.len() == EVENTS_KEPT {
                    self.events.pop_back();
                }
                self.events.push_front(*event);
                self.refilter_events();
            }
            Update::Skipped(n) => self.skipped += n,
            Update::Down(_) | Update::EventsLink(_) | Update::Stopping => {}
        }
    }

    /// A new document and its rows, the selection kept on the same route.
    pub fn set_document(&mut self, prepared: Prepared) {
        let keep = self.selected_row().map(|r| r.id.clone());
        let old = (
            std::mem::replace(&mut self.rows, prepared.rows),
            std::mem::replace(&mut self.certs, prepared.certs),
            self.doc.replace(prepared.doc),
        );
        // Freeing 10,000 routes' strings is milliseconds too: not on the screen's thread.
        if self.rows.len() > 1_000 {
            let _ = std::thread::Builder::new()
                .name("top-free".into())
                .spawn(move || drop(old));
        }
        self.refilter();
        if let Some(id) = keep {
            if let Some(at) = self.visible.iter().position(|&i| self.rows[i].id == id) {
                self.selected[Pane::Routes.index()] = at;
            }
        }
    }

    /// The filter or the sort changed: the visible lists again.
    pub fn refilter(&mut self) {
        let needle = self.filter.to_lowercase();
        self.visible = (0..self.rows.len())
            .filter(|&i| needle.is_empty() || self.rows[i].search.contains(&needle))
            .collect();
        let rows = &self.rows;
        let column = self.sort;
        self.visible.sort_by(|&a, &b| {
            let order = compare(&rows[a], &rows[b], column);
            if self.descending {
                order.reverse()
            } else {
                order
            }
        });
        self.visible_certs = (0..self.certs.len())
            .filter(|&i| needle.is_empty() || self.certs[i].search.contains(&needle))
            .collect();
        self.refilter_events();
        for pane in Pane::ALL {
            let len = self.len_of(pane);
            let selected = &mut self.selected[pane.index()];
            *selected = (*selected).min(len.saturating_sub(1));
        }
    }

    fn refilter_events(&mut self) {
        let needle = self.filter.to_lowercase();
        self.visible_events = self
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                needle.is_empty()
                    || e.message.to_lowercase().contains(&needle)
                    || e.kind.as_str().contains(&needle)
                    || e.host
                        .as_deref()
                        .is_some_and(|h| h.to_lowercase().contains(&needle))
            })
            .map(|(i, _)| i)
            .collect();
    }

    /// The rows the pane lists.
    pub fn len_of(&self, pane: Pane) -> usize {
        match pane {
            Pane::Routes => self.visible.len(),
            Pane::Certificates => self.visible_certs.len(),
            Pane::Listeners => 0,
            Pane::Events => self.visible_events.len(),
        }
    }

    pub fn selected_row(&self) -> Option<&RouteRow> {
        let at = *self.visible.get(self.selected[Pane::Routes.index()])?;
        self.rows.get(at)
    }

    /// The open route's status.
    pub fn detail_route(&self) -> Option<&RouteStatus> {
        let id = self.detail.as_ref()?;
        self.doc.as_ref()?.routes.iter().find(|r| &r.id == id)
    }

    /// Applies a key's action; returns `false` to quit.
    pub fn act(&mut self, action: Action) -> bool {
        let pane = self.pane.index();
        let len = self.len_of(self.pane);
        let page = self.page.get().max(1);
        let at = self.selected[pane];
        let mut move_to = |to: usize| self.selected[pane] = to.min(len.saturating_sub(1));
        match action {
            Action::Quit => return false,
            Action::Help => self.help = !self.help,
            Action::Pane(p) => {
                self.pane = p;
                self.detail = None;
            }
            Action::NextPane | Action::PreviousPane => {
                let step = if action == Action::NextPane { 1 } else { 3 };
                self.pane = Pane::ALL[(pane + step) % 4];
                self.detail = None;
            }
            Action::Up if self.detail.is_some() => {
                self.detail_scroll = self.detail_scroll.saturating_sub(1)
            }
            Action::Down if self.detail.is_some() => {
                self.detail_scroll = self.detail_scroll.saturating_add(1)
            }
            Action::Up => move_to(at.saturating_sub(1)),
            Action::Down => move_to(at + 1),
            Action::PageUp => move_to(at.saturating_sub(page)),
            Action::PageDown => move_to(at + page),
            Action::Top => move_to(0),
            Action::Bottom => move_to(len.saturating_sub(1)),
            Action::Open => self.open(),
            Action::Back => {
                if self.help {
                    self.help = false;
                } else if self.detail.is_some() {
                    self.detail = None;
                } else if !self.filter.is_empty() {
                    self.filter.clear();
                    self.refilter();
                }
            }
            Action::Pause => {
                self.paused = !self.paused;
                if !self.paused {
                    for update in std::mem::take(&mut self.held) {
                        self.apply(update);
                    }
                }
            }
            Action::SortNext | Action::SortPrevious => {
                let at = Column::ALL
                    .iter()
                    .position(|c| *c == self.sort)
                    .unwrap_or(0);
                let step = if action == Action::SortNext {
                    1
                } else {
                    Column::ALL.len() - 1
                };
                self.sort = Column::ALL[(at + step) % Column::ALL.len()];
                self.descending = self.sort.descending_first();
                self.refilter();
            }
            Action::SortReverse => {
                self.descending = !self.descending;
                self.refilter();
            }
            Action::FilterStart => self.editing_filter = true,
            Action::FilterChar(c) => {
                self.filter.push(c);
                self.refilter();
            }
            Action::FilterBackspace => {
                self.filter.pop();
                self.refilter();
            }
            Action::FilterDone => self.editing_filter = false,
            Action::FilterCancel => {
                self.editing_filter = false;
                self.filter.clear();
                self.refilter();
            }
        }
        true
    }

    /// Enter: the selected route's page (from the routes or the certificates pane).
    fn open(&mut self) {
        let id = match self.pane {
            Pane::Routes => self.selected_row().map(|r| r.id.clone()),
            Pane::Certificates => self
                .visible_certs
                .get(self.selected[Pane::Certificates.index()])
                .and_then(|&i| self.certs.get(i))
                .and_then(|c| self.rows.iter().find(|r| r.host == c.host))
                .map(|r| r.id.clone()),
            Pane::Listeners | Pane::Events => None,
        };
        if id.is_some() {
            self.detail = id;
            self.detail_scroll = 0;
        }
    }
}

fn compare(a: &RouteRow, b: &RouteRow, column: Column) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    // Missing figures sort as the least.
    let num = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
        (Some(_), None) => Ordering::Greater,
        (None, Some(_)) => Ordering::Less,
        (None, None) => Ordering::Equal,
    };
    let by = match column {
        Column::Host => a.host.cmp(&b.host),
        Column::Path => a.path.cmp(&b.path),
        Column::Rate => num(a.rate, b.rate),
        Column::Errors => num(a.error_ratio, b.error_ratio),
        Column::P99 => num(a.p99, b.p99),
        // Soonest first; none last.
        Column::Cert => match (a.days_left, b.days_left) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Greater,
            (Some(_), None) => Ordering::Less,
            (Some(x), Some(y)) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
        },
        Column::State => a.state_rank.cmp(&b.state_rank),
    };
    by.then_with(|| a.host.cmp(&b.host))
        .then_with(|| a.path.cmp(&b.path))
}

/// Days left of the served certificate (or the pair on disk's), and whether that is under the
/// expiry alert's threshold: a fifth of its lifetime, or six hours (`render::alerts`).
pub fn days_left(route: &RouteStatus, now: i64) -> (Option<f64>, bool) {
    let c = &route.certificate;
    let (from, to) = match (c.served_not_before, c.served_not_after) {
        (Some(from), Some(to)) => (from, to),
        _ => match (c.disk_not_before, c.disk_not_after) {
            (Some(from), Some(to)) => (from, to),
            _ => return (None, false),
        },
    };
    let left = (to - now) as f64;
    let threshold = ((to - from) as f64 * EXPIRY_FRACTION).max(EXPIRY_FLOOR.as_secs_f64());
    (Some(left / 86_400.0), left < threshold || c.expiring_soon)
}

fn route_row(index: usize, route: &RouteStatus, doc: &Document, now: i64) -> RouteRow {
    let traffic = doc.traffic.as_ref().and_then(|t| t.routes.get(&route.id));
    let (days_left, cert_alert) = days_left(route, now);
    let state = state_of(route);
    // A route of its own port shows its protocol and port where an HTTPS route shows its path.
    let place = route.place();
    RouteRow {
        index,
        id: route.id.clone(),
        search: format!("{} {} {}", route.host, place, state).to_lowercase(),
        host: route.host.clone(),
        path: place,
        rate: traffic.map(|t| t.requests_per_second),
        error_ratio: traffic.filter(|t| t.requests > 0).map(|t| t.error_ratio),
        p99: traffic.and_then(|t| t.p99_seconds),
        days_left,
        cert_alert,
        state_rank: match route.state {
            RouteState::Error => 2,
            RouteState::Pending => 1,
            RouteState::Ok => 0,
        },
        state,
    }
}

/// One row per host the agent terminates TLS for, soonest expiry first.
fn cert_rows(doc: &Document, now: i64) -> Vec<CertRow> {
    let mut seen = BTreeSet::new();
    let mut rows: Vec<CertRow> = doc
        .routes
        .iter()
        // A TCP, passthrough or UDP route holds no pair of the agent's.
        .filter(|r| r.listen_port.is_none() && seen.insert(r.host.as_str()))
        .map(|r| {
            let c = &r.certificate;
            let (days_left, alert) = days_left(r, now);
            let short = |f: &str| f.get(..12).unwrap_or(f).to_owned();
            CertRow {
                search: r.host.to_lowercase(),
                host: r.host.clone(),
                days_left,
                alert,
                not_after: c.served_not_after.or(c.disk_not_after),
                served: c
                    .served_fingerprints
                    .iter()
                    .map(|f| short(f))
                    .collect::<Vec<_>>()
                    .join(","),
                disk: c.disk_fingerprint.as_deref().map(short).unwrap_or_default(),
                rotations: c.rotations,
                last_rotation: c.last_rotation,
                problem: c.error_reason.clone(),
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        let key = |r: &CertRow| r.days_left.unwrap_or(f64::INFINITY);
        key(a)
            .partial_cmp(&key(b))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.host.cmp(&b.host))
    });
    rows
}

/// The routes' states, counted: (ok, pending, error).
pub fn counts(doc: &Document) -> (usize, usize, usize) {
    let mut by: BTreeMap<u8, usize> = BTreeMap::new();
    for r in &doc.routes {
        *by.entry(match r.state {
            RouteState::Ok => 0,
            RouteState::Pending => 1,
            RouteState::Error => 2,
        })
        .or_default() += 1;
    }
    let n = |k| by.get(&k).copied().unwrap_or(0);
    (n(0), n(1), n(2))
}
