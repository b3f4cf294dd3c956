//! The JSON access log: one object per request, one line each, on the agent's standard output or
//! in a file. The shape is public interface (docs/agent.md, "Access log"): fields are added,
//! never renamed, and every field is present in every line (`null` where the record has no
//! value), so that Loki, Vector or Elastic read it without a parser of their own.
//!
//! Writing never holds up the receiver: the lines of each batch of records the receiver reads go
//! in one piece to a thread of their own (one hand-over per batch, not per line), through a queue
//! bounded in bytes; a batch that finds it full is dropped and its lines counted. A slow disk or
//! a reader of stdout that stops costs lines of the log, never a record's count.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::record::Record;
use crate::workspace::AccessLog;

/// Bytes of lines waiting to be written; beyond, batches are dropped.
pub const QUEUE_BYTES: usize = 8 << 20;

/// One line, field for field.
#[derive(Serialize)]
struct Line<'a> {
    time: String,
    route: Option<&'a str>,
    host: Option<&'a str>,
    method: Option<&'a str>,
    path: Option<&'a str>,
    status: Option<u16>,
    duration_ms: f64,
    backend_ms: Option<f64>,
    bytes_in: u64,
    bytes_out: u64,
    client: Option<String>,
    backend: Option<String>,
    upstream_id: Option<&'a str>,
    request_id: String,
    x_request_id: Option<&'a str>,
    protocol: &'a str,
    /// `http/1.1`, `h2`, `websocket` for the line sozu writes when a WebSocket ends, or `tcp`
    /// for the one it writes when a TCP or TLS-passthrough route's connection ends: the
    /// metrics' `protocol` label for requests.
    http_protocol: &'static str,
    tls_version: Option<&'a str>,
    tls_cipher: Option<&'a str>,
    sni: Option<&'a str>,
    alpn: Option<&'a str>,
    authority: Option<&'a str>,
    user_agent: Option<&'a str>,
    forwarded_for: Option<&'a str>,
    /// Why sozu ended the request early, when it says.
    error: Option<&'a str>,
    worker: &'a str,
}

/// The line for `record`, routed to `route` (`None`: unmatched), with a trailing newline. The
/// query string is cut off the path unless `query_string`.
pub fn line(record: &Record, route: Option<(&str, &str)>, query_string: bool) -> String {
    let mut out = Vec::with_capacity(512);
    append(&mut out, record, route, query_string);
    String::from_utf8(out).unwrap_or_default()
}

/// [`line`], appended to `out`.
pub fn append(out: &mut Vec<u8>, record: &Record, route: Option<(&str, &str)>, query_string: bool) {
    let r = &record.0;
    let path = record.path().map(|p| {
        if query_string {
            p
        } else {
            p.split_once('?').map_or(p, |(path, _)| path)
        }
    });
    let ms = |us: u64| us as f64 / 1_000.0;
    let line = Line {
        time: timestamp(record.time_ns()),
        route: route.map(|r| r.0),
        host: route.map(|r| r.1),
        method: record.method(),
        path,
        status: record.status(),
        duration_ms: ms(record.duration_us()),
        backend_ms: record.backend_us().map(ms),
        bytes_in: record.bytes_in(),
        bytes_out: record.bytes_out(),
        client: record.client().map(|a| a.to_string()),
        backend: record.backend().map(|a| a.to_string()),
        upstream_id: record.backend_id(),
        request_id: rusty_ulid::Ulid::from(r.request_id).to_string(),
        x_request_id: r.x_request_id.as_deref(),
        protocol: &r.protocol,
        http_protocol: record.app_protocol().label(),
        tls_version: r.tls_version.as_deref(),
        tls_cipher: r.tls_cipher.as_deref(),
        sni: r.tls_sni.as_deref(),
        alpn: r.tls_alpn.as_deref(),
        authority: record.authority(),
        user_agent: r.user_agent.as_deref(),
        forwarded_for: r.xff_chain.as_deref(),
        error: r.message.as_deref(),
        worker: &r.tag,
    };
    let start = out.len();
    if serde_json::to_writer(&mut *out, &line).is_ok() {
        out.push(b'\n');
    } else {
        out.truncate(start);
    }
}

/// RFC 3339 in UTC with microseconds, from POSIX nanoseconds.
fn timestamp(ns: u128) -> String {
    let ns = i128::try_from(ns).unwrap_or(0);
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ns)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

/// Where lines go, and how many were dropped.
pub struct Sink {
    queue: Sender<Vec<u8>>,
    /// Bytes queued and not written yet.
    queued: Arc<AtomicUsize>,
    pub settings: AccessLog,
    dropped: Arc<AtomicU64>,
    /// Set by the writer when it gives up.
    closed: Arc<std::sync::atomic::AtomicBool>,
}

impl Sink {
    /// Starts the writer thread for `settings` (enabled).
    pub fn start(settings: AccessLog, dropped: Arc<AtomicU64>) -> std::io::Result<Sink> {
        let output = Output::open(settings.path.clone())?;
        let (queue, batches) = mpsc::channel();
        let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let queued = Arc::new(AtomicUsize::new(0));
        let (flag, written) = (closed.clone(), queued.clone());
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || {
                write(batches, output, &written);
                flag.store(true, Ordering::Relaxed);
            })?;
        Ok(Sink {
            queue,
            queued,
            settings,
            dropped,
            closed,
        })
    }

    /// Queues a batch of `lines` lines; drops it, counted, when the queue is full or the writer
    /// is gone.
    pub fn send(&self, batch: Vec<u8>, lines: u64) {
        if batch.is_empty() {
            return;
        }
        let len = batch.len();
        if self.queued.fetch_add(len, Ordering::Relaxed) + len > QUEUE_BYTES
            || self.queue.send(batch).is_err()
        {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            self.dropped.fetch_add(lines, Ordering::Relaxed);
        }
    }

    /// The writer is gone (it could not write and gave up).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
}

/// Standard output, or a file opened for appending and opened again once it is moved away.
enum Output {
    Stdout(BufWriter<std::io::Stdout>),
    File {
        path: PathBuf,
        file: BufWriter<File>,
        checked: Instant,
    },
}

/// How often a file's path is checked for a rotation.
const REOPEN_CHECK: Duration = Duration::from_secs(1);

impl Output {
    fn open(path: Option<PathBuf>) -> std::io::Result<Output> {
        Ok(match path {
            None => Output::Stdout(BufWriter::with_capacity(64 * 1024, std::io::stdout())),
            Some(path) => Output::File {
                file: BufWriter::with_capacity(64 * 1024, open_append(&path)?),
                path,
                checked: Instant::now(),
            },
        })
    }

    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Output::Stdout(w) => w,
            Output::File { file, .. } => file,
        }
    }

    /// Opens the file again when its path no longer names the file written (logrotate moved
    /// it away): the old one is flushed and closed.
    fn follow_rotation(&mut self) {
        use std::os::unix::fs::MetadataExt;
        let Output::File {
            path,
            file,
            checked,
        } = self
        else {
            return;
        };
        if checked.elapsed() < REOPEN_CHECK {
            return;
        }
        *checked = Instant::now();
        let same = match (std::fs::metadata(&*path), file.get_ref().metadata()) {
            (Ok(on_disk), Ok(open)) => on_disk.ino() == open.ino() && on_disk.dev() == open.dev(),
            _ => false,
        };
        if !same {
            let _ = file.flush();
            match open_append(path) {
                Ok(new) => *file = BufWriter::with_capacity(64 * 1024, new),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot open the access log again")
                }
            }
        }
    }
}

fn open_append(path: &std::path::Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// The writer thread: writes what is queued, flushes whenever the queue runs dry, and stops when
/// the sink is dropped or the output fails.
fn write(batches: Receiver<Vec<u8>>, mut output: Output, queued: &AtomicUsize) {
    while let Ok(first) = batches.recv() {
        output.follow_rotation();
        let mut next = Some(first);
        while let Some(batch) = next {
            let written = output.writer().write_all(&batch);
            queued.fetch_sub(batch.len(), Ordering::Relaxed);
            if let Err(e) = written {
                tracing::error!(error = %e, "cannot write the access log; access-log lines are dropped");
                return;
            }
            next = batches.try_recv().ok();
        }
        if let Err(e) = output.writer().flush() {
            tracing::error!(error = %e, "cannot write the access log; access-log lines are dropped");
            return;
        }
    }
    let _ = output.writer().flush();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::record::{decode, tests::record};

    #[test]
    fn a_line_is_one_json_object_without_the_query_string() {
        let r = decode(&record(Some("pi-a"), "GET", 200, 1_500)).unwrap();
        let text = line(&r, Some(("pi-a", "a.in.example.org")), false);
        assert!(text.ends_with('\n') && !text.trim_end().contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["path"], "/x");
        assert_eq!(v["route"], "pi-a");
        assert_eq!(v["status"], 200);
        assert_eq!(v["duration_ms"], 1.5);
        assert_eq!(v["time"], "2027-01-15T08:00:00.000000Z");
        assert!(v["backend"].is_null());
        assert!(!text.contains("secret"));
        let with = line(&r, None, true);
        assert!(with.contains("/x?token=secret"), "{with}");
        assert_eq!(v["http_protocol"], "http/1.1");
    }

    #[test]
    fn a_line_names_the_http_protocol() {
        let mut r = decode(&record(Some("pi-a"), "POST", 200, 1)).unwrap();
        r.0.tls_alpn = Some("h2".into());
        let v: serde_json::Value = serde_json::from_str(&line(&r, None, false)).unwrap();
        assert_eq!(v["http_protocol"], "h2");
        r.0.protocol = "WSS-TLS1.3".into();
        r.0.tls_alpn = Some("http/1.1".into());
        let v: serde_json::Value = serde_json::from_str(&line(&r, None, false)).unwrap();
        assert_eq!(v["http_protocol"], "websocket");
        assert_eq!(v["protocol"], "WSS-TLS1.3");
    }
}
