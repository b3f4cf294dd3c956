//! The terminal while `top` runs: raw mode, the alternate screen, the cursor hidden, and always
//! put back as it was: when `top` quits, on Ctrl-C (a key in raw mode), on SIGTERM, SIGHUP or
//! SIGINT (a flag the loop reads, so the exit goes through the same restore), and on a panic
//! (a hook that restores first, then lets the panic be reported on the normal screen).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossterm::{cursor, execute, terminal};

/// The terminal taken over; dropped, it is given back.
pub struct Screen {
    /// Raised by SIGTERM, SIGHUP or SIGINT.
    pub stop: Arc<AtomicBool>,
}

impl Screen {
    pub fn take() -> std::io::Result<Screen> {
        let stop = Arc::new(AtomicBool::new(false));
        for signal in [
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGHUP,
            signal_hook::consts::SIGINT,
        ] {
            signal_hook::flag::register(signal, stop.clone())?;
        }
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
        terminal::enable_raw_mode()?;
        let mut out = std::io::stdout();
        if let Err(e) = execute!(out, terminal::EnterAlternateScreen, cursor::Hide) {
            restore();
            return Err(e);
        }
        Ok(Screen { stop })
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore();
    }
}

/// Leaves the alternate screen, shows the cursor, ends raw mode. Safe to call twice.
pub fn restore() {
    let mut out = std::io::stdout();
    let _ = execute!(out, terminal::LeaveAlternateScreen, cursor::Show);
    let _ = terminal::disable_raw_mode();
    let _ = out.flush();
}
