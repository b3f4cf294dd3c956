//! `private-ingress top`: a live, full-screen view of a running agent over its admin API, read
//! only: the overview (ready, sozu, the workspace, the traffic with its sparklines), the routes
//! (sortable, filtered, each opened on its upstreams, certificate, policies and last errors),
//! the certificates, the listeners, and the events as they happen.
//!
//! It reads what `status` reads, at the same address (so through a `kubectl port-forward`
//! too): `/v1/state` every `--refresh` seconds, with its entity tag so that an unchanged
//! state costs the agent a `304` ([`fetch`]), and `/v1/events` as a stream. When the agent goes
//! away, the screen says so, keeps what it last said, and picks up when it is back. It starts
//! only if the agent answers, with `status`'s exit codes otherwise (2 unreachable, 3 no answer).
//!
//! | module | owns |
//! |---|---|
//! | [`model`] | what is shown and where the person is in it (pure) |
//! | [`keys`] | keys to actions (pure) |
//! | [`draw`] | the screen, drawn into a buffer |
//! | [`fetch`], [`sse`] | reading the agent, on threads; the event-stream parser (pure) |
//! | [`terminal`] | taking the terminal and always giving it back |

pub mod draw;
pub mod fetch;
pub mod keys;
pub mod model;
pub mod sse;
pub mod terminal;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crossterm::event::{self, Event as TermEvent};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;

use crate::cli::status::StatusError;
use model::{App, Pane, Theme, Update};

/// What `top` was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    pub admin_address: String,
    pub refresh: Duration,
    pub timeout: Duration,
    pub pane: Pane,
    pub theme: Theme,
}

#[derive(Debug, thiserror::Error)]
pub enum TopError {
    /// The agent could not be read at the start: `status`'s exit codes apply.
    #[error(transparent)]
    Agent(#[from] StatusError),
    #[error("the terminal: {0}")]
    Terminal(#[from] std::io::Error),
    #[error("top draws on a terminal, and standard input or output is not one: `top --once` prints one frame as text")]
    NotATerminal,
}

/// `top`: live on the terminal, or one frame as text with `--once` (of `size`, else the
/// terminal's, else `COLUMNS` × `LINES`), exit 2 when the agent is not ready.
pub fn command(
    options: &Options,
    once: bool,
    size: Option<(u16, u16)>,
) -> Result<std::process::ExitCode, TopError> {
    if !once {
        run(options)?;
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let (width, height) = size.unwrap_or_else(frame_size);
    let (text, ready) = self::once(options, width, height)?;
    crate::cli::output::print(text)?;
    Ok(if ready {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(crate::cli::exit::NOT_READY)
    })
}

/// `top --once`'s frame: the terminal's size when standard output is one, else `COLUMNS` and
/// `LINES` when set, else 120 × 40.
fn frame_size() -> (u16, u16) {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        if let Ok(size) = crossterm::terminal::size() {
            return size;
        }
    }
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u16>().ok());
    (
        var("COLUMNS").unwrap_or(120).clamp(20, 1000),
        var("LINES").unwrap_or(40).clamp(10, 1000),
    )
}

fn unix_now() -> i64 {
    crate::clock::unix_seconds(std::time::SystemTime::now())
}

/// How often the screen is drawn while nothing comes: the clock, the time since the agent went
/// away, and a resize caught even without an event.
const TICK: Duration = Duration::from_millis(250);

/// Runs until the person quits (or a signal). Returns whether the agent was last seen ready.
pub fn run(options: &Options) -> Result<bool, TopError> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(TopError::NotATerminal);
    }
    // The first read decides whether `top` starts at all, before the screen is taken.
    let mut reader = fetch::StateReader::new(&options.admin_address, options.timeout)?;
    let first = reader.read()?.ok_or_else(|| StatusError::Malformed {
        address: options.admin_address.clone(),
        reason: "answered 304 to a first request".into(),
    })?;
    let mut app = App::new(&options.admin_address, options.theme, options.pane);
    app.now = unix_now();
    app.update(Update::state(first, app.now));
    let (updates, incoming) = mpsc::channel();
    fetch::follow(&options.admin_address, updates.clone())?;
    fetch::poll(reader, options.refresh, updates)?;

    let screen = terminal::Screen::take()?;
    let mut terminal =
        ratatui::Terminal::new(ratatui::backend::CrosstermBackend::new(std::io::stdout()))?;
    let mut dirty = true;
    let mut last_draw = Instant::now();
    #[cfg(feature = "test-hooks")]
    let mut frames = 0u32;
    loop {
        if screen.stopped() {
            break;
        }
        if event::poll(TICK)? {
            match event::read()? {
                TermEvent::Key(key) => {
                    if let Some(action) = keys::action(key, app.editing_filter) {
                        if !app.act(action) {
                            break;
                        }
                        dirty = true;
                    }
                }
                TermEvent::Resize(..) => {
                    terminal.autoresize()?;
                    dirty = true;
                }
                _ => {}
            }
        }
        while let Ok(update) = incoming.try_recv() {
            app.update(update);
            dirty = true;
        }
        let now = unix_now();
        if now != app.now {
            app.now = now;
            dirty = true;
        }
        if dirty || last_draw.elapsed() >= Duration::from_secs(1) {
            terminal.draw(|f| {
                let area = f.area();
                draw::frame(&app, area, f.buffer_mut());
            })?;
            dirty = false;
            last_draw = Instant::now();
            // A test build panics on demand, for the test that a panic restores the terminal.
            #[cfg(feature = "test-hooks")]
            {
                frames += 1;
                if frames == 3 && std::env::var_os("PRIVATE_INGRESS_TEST_TOP_PANIC").is_some() {
                    panic!("test hook: top panics after drawing");
                }
            }
        }
    }
    drop(terminal);
    drop(screen);
    Ok(app.doc.as_ref().is_some_and(|d| d.ready))
}

/// One frame as plain text (`--once`), `width` × `height`; and whether the agent is ready.
pub fn once(options: &Options, width: u16, height: u16) -> Result<(String, bool), TopError> {
    let mut reader = fetch::StateReader::new(&options.admin_address, options.timeout)?;
    let doc = reader.read()?.ok_or_else(|| StatusError::Malformed {
        address: options.admin_address.clone(),
        reason: "answered 304 to a first request".into(),
    })?;
    let ready = doc.ready;
    let mut app = App::new(&options.admin_address, options.theme, options.pane);
    app.now = unix_now();
    app.update(Update::state(doc, app.now));
    // An agent older than `/v1/events` has none: the frame shows it without them.
    let events = fetch::backlog(&options.admin_address, options.timeout);
    app.update(Update::EventsLink(events.is_ok()));
    for event in events.unwrap_or_default() {
        app.update(Update::Event(Box::new(event)));
    }
    Ok((render(&app, width, height), ready))
}

/// `app` drawn at `width` × `height`, as text.
pub fn render(app: &App, width: u16, height: u16) -> String {
    let area = Rect::new(0, 0, width, height);
    let mut buf = Buffer::empty(area);
    draw::frame(app, area, &mut buf);
    draw::text(&buf)
}
