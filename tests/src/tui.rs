//! A full-screen program on a pseudo-terminal, as a person runs it: its own session with the
//! terminal as its controlling one (so that a resize sends it SIGWINCH), its output read into a
//! [`vt100`] screen, keys written to it, and after it exits the terminal's state as a person's
//! shell would find it: the alternate screen left, the cursor shown, raw mode off.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::live::eventually;

pub struct Tui {
    child: Child,
    master: std::fs::File,
    /// Kept, to read the terminal's modes after the program exits.
    slave: OwnedFd,
    parser: Arc<Mutex<vt100::Parser>>,
    /// Everything the program wrote, for a failure's message.
    written: Arc<Mutex<Vec<u8>>>,
}

fn nonzero(n: u16) -> std::num::NonZeroU16 {
    std::num::NonZeroU16::new(n).unwrap_or(std::num::NonZeroU16::MIN)
}

fn winsize(rows: u16, cols: u16) -> nix::pty::Winsize {
    nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

impl Tui {
    /// Runs `command` on a new `rows` × `cols` terminal.
    pub fn start(command: &mut Command, rows: u16, cols: u16) -> Tui {
        let pty = nix::pty::openpty(Some(&winsize(rows, cols)), None).expect("a pseudo-terminal");
        let slave = pty.slave;
        let fd = |f: &OwnedFd| Stdio::from(f.try_clone().expect("dup the terminal"));
        command
            .stdin(fd(&slave))
            .stdout(fd(&slave))
            .stderr(fd(&slave))
            .env("TERM", "xterm-256color");
        // SAFETY: between fork and exec, only async-signal-safe calls: setsid(2) and ioctl(2).
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        let master = std::fs::File::from(pty.master);
        let parser = Arc::new(Mutex::new(vt100::Parser::new(
            nonzero(rows),
            nonzero(cols),
            0,
        )));
        let written = Arc::new(Mutex::new(Vec::new()));
        let mut reader = master.try_clone().expect("dup the terminal's master");
        let (screen, all) = (parser.clone(), written.clone());
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            // Linux ends the read with EIO once no process holds the terminal; this process
            // holds it too (to read its modes), so the thread ends with the test's process.
            while let Ok(n) = reader.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                screen
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .process(&chunk[..n]);
                all.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(&chunk[..n]);
            }
        });
        Tui {
            child,
            master,
            slave,
            parser,
            written,
        }
    }

    /// The program's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the screen shows now, row by row.
    pub fn screen(&self) -> String {
        self.parser
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .screen()
            .contents()
    }

    /// Waits until the screen shows every one of `needles`; returns the screen.
    pub fn wait_for(&self, needles: &[&str], timeout: Duration) -> String {
        let mut last = String::new();
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            eventually(timeout, &format!("{needles:?} on the screen"), || {
                last = self.screen();
                needles
                    .iter()
                    .all(|n| last.contains(n))
                    .then(|| last.clone())
            })
        }));
        found.unwrap_or_else(|_| {
            panic!(
                "{needles:?} not on the screen within {timeout:?}; the screen:\n{}",
                self.screen()
            )
        })
    }

    /// Waits until `f` holds of the screen.
    pub fn wait_until(&self, what: &str, timeout: Duration, f: impl Fn(&vt100::Screen) -> bool) {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            eventually(timeout, what, || {
                let parser = self.parser.lock().unwrap_or_else(|p| p.into_inner());
                f(parser.screen()).then_some(())
            })
        }));
        if ok.is_err() {
            panic!(
                "{what}: not within {timeout:?}; the screen:\n{}",
                self.screen()
            );
        }
    }

    /// Types `keys`.
    pub fn send(&mut self, keys: &[u8]) {
        self.master.write_all(keys).expect("write to the terminal");
        self.master.flush().expect("flush the terminal");
    }

    /// The terminal is now `rows` × `cols`: the kernel tells the program (SIGWINCH).
    pub fn resize(&self, rows: u16, cols: u16) {
        self.parser
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .screen_mut()
            .set_size(nonzero(rows), nonzero(cols));
        let size = winsize(rows, cols);
        // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which outlives the call.
        let done = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        assert_eq!(done, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).expect("signal the program");
    }

    /// Waits for the program's exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let child = &mut self.child;
        let status = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            eventually(timeout, "the program's exit", || {
                child.try_wait().ok().flatten()
            })
        }));
        status.unwrap_or_else(|_| panic!("still running after {timeout:?}:\n{}", self.screen()))
    }

    /// The terminal as the program left it: `Err` naming what is not as a shell needs it.
    pub fn restored(&self) -> Result<(), String> {
        // The program has exited: what it wrote last is read within moments.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match self.modes() {
                Ok(()) => return Ok(()),
                Err(e) if std::time::Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn modes(&self) -> Result<(), String> {
        let mut wrong = Vec::new();
        {
            let parser = self.parser.lock().unwrap_or_else(|p| p.into_inner());
            if parser.screen().alternate_screen() {
                wrong.push("still on the alternate screen");
            }
            if parser.screen().hide_cursor() {
                wrong.push("the cursor hidden");
            }
        }
        let modes = nix::sys::termios::tcgetattr(&self.slave).map_err(|e| e.to_string())?;
        use nix::sys::termios::LocalFlags;
        if !modes
            .local_flags
            .contains(LocalFlags::ICANON | LocalFlags::ECHO)
        {
            wrong.push("raw mode on (no line editing or no echo)");
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{}; it wrote last: {:?}",
                wrong.join(", "),
                self.written_tail(200)
            ))
        }
    }

    /// The last `n` bytes the program wrote, escapes and all.
    pub fn written_tail(&self, n: usize) -> String {
        let all = self.written.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&all[all.len().saturating_sub(n)..]).into_owned()
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
