//! What the agent did and why, as it happens: the events `/v1/events` streams
//! ([`crate::document::Event`]), kept in a bounded backlog that a client joining late gets first.
//!
//! Emitting is cheap and never waits for a reader: [`Events::emit`] takes a lock held for a
//! push, and hands the event to a [`tokio::sync::broadcast`] channel, a ring of
//! [`CLIENT_QUEUE`] events shared by every client. A client that reads slower than events come
//! (a stalled `curl -N`, a port-forward that stopped) falls behind in that ring rather than
//! grow it: it skips what was overwritten, is told how many it missed (`event: dropped`), and
//! the count goes to `private_ingress_events_dropped_total`. So the loop that emits (a rotation,
//! a pass) is never held up by a client, and a client's cost to the agent is bounded whatever
//! it does: the ring, its place in it, and the few frames queued for its connection
//! ([`FRAMES_QUEUED`]).
//!
//! Event ids count from 1 at each start of the agent; the SSE `id:` line is
//! `<instance>-<id>`, the instance being the agent's start time in milliseconds, so that a
//! client resuming with `Last-Event-ID` from a previous agent gets the new agent's whole backlog
//! instead of a resumption at a number that means something else now.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{broadcast, mpsc, watch};

use crate::document::{Event, EventKind};

/// Events kept for a client that joins late: a screenful and more of `top`'s events pane, and a
/// few hundred kilobytes at most.
pub const BACKLOG: usize = 512;
/// How far a client may fall behind before it skips events (the broadcast ring's size).
pub const CLIENT_QUEUE: usize = 1024;
/// Frames written for one client and not yet taken by its connection.
pub const FRAMES_QUEUED: usize = 16;
/// Event streams open at once; more are refused with 503, as `/metrics` beyond its limit.
pub const MAX_STREAMS: usize = 32;
/// A comment line every so often: a port-forward or a proxy that closes idle connections
/// keeps the stream, and a client gone is noticed at the next write.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The agent's events: emit from anywhere, stream to every client. Cheap to clone.
#[derive(Clone)]
pub struct Events(Arc<Hub>);

struct Hub {
    state: Mutex<Backlog>,
    sender: broadcast::Sender<Arc<Event>>,
    /// Events a client skipped because it read too slowly, summed over clients.
    dropped: AtomicU64,
    /// Turns true when the agent stops: every stream ends, after saying so.
    closed: watch::Sender<bool>,
    streams: Arc<tokio::sync::Semaphore>,
}

struct Backlog {
    next: u64,
    kept: VecDeque<Arc<Event>>,
}

impl Default for Events {
    fn default() -> Self {
        let (sender, _) = broadcast::channel(CLIENT_QUEUE);
        Events(Arc::new(Hub {
            state: Mutex::new(Backlog {
                next: 1,
                kept: VecDeque::with_capacity(BACKLOG),
            }),
            sender,
            dropped: AtomicU64::new(0),
            closed: watch::channel(false).0,
            streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
        }))
    }
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("dropped", &self.dropped())
            .finish_non_exhaustive()
    }
}

/// This agent's instance: its start, in Unix milliseconds (see the module's header).
pub fn instance() -> u64 {
    static STARTED: OnceLock<u64> = OnceLock::new();
    *STARTED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    })
}

impl Events {
    /// Records an event and hands it to every client; never waits for one.
    pub fn emit(&self, kind: EventKind, host: Option<&str>, problem: bool, message: String) {
        let mut state = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        let event = Arc::new(Event {
            id: state.next,
            time: now_rfc3339(),
            kind,
            host: host.map(str::to_owned),
            problem,
            message: crate::text::clean_line(&message, crate::text::MAX_LINE_BYTES),
        });
        state.next += 1;
        if state.kept.len() == BACKLOG {
            state.kept.pop_front();
        }
        state.kept.push_back(event.clone());
        // No receiver is no error: nobody watches.
        let _ = self.0.sender.send(event);
    }

    /// The backlog after `last` (all of it when `last` is `None`, from another instance, or
    /// older than what is kept), and a receiver of what comes next: taken together, so that
    /// nothing falls between them.
    pub fn subscribe(
        &self,
        last: Option<u64>,
    ) -> (Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>) {
        let state = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        let newest = state.next - 1;
        let backlog = state
            .kept
            .iter()
            .filter(|e| match last {
                Some(last) if last <= newest => e.id > last,
                _ => true,
            })
            .cloned()
            .collect();
        (backlog, self.0.sender.subscribe())
    }

    /// Events clients skipped because they read too slowly, since the agent started.
    pub fn dropped(&self) -> u64 {
        self.0.dropped.load(Ordering::Relaxed)
    }

    /// Ends every stream (after a last `event: stopping`) and refuses new ones: the agent is
    /// stopping, and its admin server waits for open responses to end.
    pub fn close(&self) {
        self.0.closed.send_replace(true);
    }

    /// The stream for one client, as SSE frames: `None` when [`MAX_STREAMS`] are open, or the
    /// agent is stopping. `last_event_id` is the client's `Last-Event-ID`, if any.
    pub fn stream(&self, last_event_id: Option<&str>) -> Option<mpsc::Receiver<Bytes>> {
        if *self.0.closed.borrow() {
            return None;
        }
        let permit = self.0.streams.clone().try_acquire_owned().ok()?;
        let last = last_event_id.and_then(resume_after);
        let (backlog, mut live) = self.subscribe(last);
        let (frames, taken) = mpsc::channel(FRAMES_QUEUED);
        let hub = self.0.clone();
        let mut closed = self.0.closed.subscribe();
        tokio::spawn(async move {
            let _permit = permit;
            // How long to wait before reconnecting, for a client that follows the spec.
            if frames
                .send(Bytes::from_static(b"retry: 2000\n\n"))
                .await
                .is_err()
            {
                return;
            }
            for event in backlog {
                if frames.send(frame(&event)).await.is_err() {
                    return;
                }
            }
            // What a client that wants the backlog alone (`top --once`) waits for.
            if frames
                .send(Bytes::from_static(b": live\n\n"))
                .await
                .is_err()
            {
                return;
            }
            let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
            keep_alive.tick().await;
            loop {
                let next = tokio::select! {
                    biased;
                    // (The arm holds the watch's guard: the frame is sent after the select.)
                    _ = closed.wait_for(|c| *c) => None,
                    received = live.recv() => Some(match received {
                        Ok(event) => frame(&event),
                        Err(broadcast::error::RecvError::Lagged(skipped)) => {
                            hub.dropped.fetch_add(skipped, Ordering::Relaxed);
                            Bytes::from(format!(
                                "event: dropped\ndata: {{\"dropped\":{skipped},\"message\":\"{skipped} events skipped: this client read too slowly\"}}\n\n"
                            ))
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    }),
                    _ = keep_alive.tick() => Some(Bytes::from_static(b": keep-alive\n\n")),
                    () = frames.closed() => return,
                };
                let Some(next) = next else {
                    let _ = frames
                        .send(Bytes::from_static(
                            b"event: stopping\ndata: {\"message\":\"the agent is stopping\"}\n\n",
                        ))
                        .await;
                    return;
                };
                if frames.send(next).await.is_err() {
                    return;
                }
            }
        });
        Some(taken)
    }
}

/// The id a `Last-Event-ID` of this instance resumes after; `None` for another instance's.
fn resume_after(last_event_id: &str) -> Option<u64> {
    let (instance_part, id) = last_event_id.trim().split_once('-')?;
    (instance_part.parse::<u64>().ok()? == instance()).then_some(())?;
    id.parse().ok()
}

/// One event as an SSE frame: `id:`, `event:`, then its record as one `data:` line of JSON
/// (which escapes every newline, so the line cannot be split).
pub fn frame(event: &Event) -> Bytes {
    let data = serde_json::to_string(event).unwrap_or_else(|_| "{}".to_owned());
    Bytes::from(format!(
        "id: {}-{}\nevent: {}\ndata: {data}\n\n",
        instance(),
        event.id,
        event.kind
    ))
}

/// RFC 3339 in UTC to the millisecond.
fn now_rfc3339() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// The frames of one client's stream, as an HTTP body: it ends when the stream does.
pub struct StreamBody(pub mpsc::Receiver<Bytes>);

impl http_body::Body for StreamBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|frame| frame.map(|bytes| Ok(http_body::Frame::data(bytes))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emit(events: &Events, n: usize) {
        for i in 0..n {
            events.emit(
                EventKind::CertificateRotated,
                Some("a.in.example.org"),
                false,
                format!("rotation {i}"),
            );
        }
    }

    #[test]
    fn a_late_client_gets_the_backlog_and_a_resuming_one_only_what_it_missed() {
        let events = Events::default();
        emit(&events, 5);
        let (backlog, _) = events.subscribe(None);
        assert_eq!(
            backlog.iter().map(|e| e.id).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        let (after, _) = events.subscribe(Some(3));
        assert_eq!(after.iter().map(|e| e.id).collect::<Vec<_>>(), [4, 5]);
        // An id beyond the newest is another agent's: the whole backlog.
        let (other, _) = events.subscribe(Some(90));
        assert_eq!(other.len(), 5);
        // Last-Event-ID as the stream writes it, and as another instance wrote it.
        assert_eq!(resume_after(&format!("{}-3", instance())), Some(3));
        assert_eq!(resume_after(&format!("{}-3", instance() + 1)), None);
        assert_eq!(resume_after("garbage"), None);
    }

    #[test]
    fn the_backlog_is_bounded_and_keeps_the_newest() {
        let events = Events::default();
        emit(&events, BACKLOG + 100);
        let (backlog, _) = events.subscribe(None);
        assert_eq!(backlog.len(), BACKLOG);
        assert_eq!(backlog.first().map(|e| e.id), Some(101));
        assert_eq!(backlog.last().map(|e| e.id), Some((BACKLOG + 100) as u64));
    }

    #[test]
    fn a_frame_is_one_event_with_its_id_type_and_one_data_line() {
        let events = Events::default();
        events.emit(
            EventKind::PairRefused,
            Some("a.in.example.org"),
            true,
            "line one\nline two".into(),
        );
        let (backlog, _) = events.subscribe(None);
        let text = String::from_utf8(frame(&backlog[0]).to_vec()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], format!("id: {}-1", instance()));
        assert_eq!(lines[1], "event: pair_refused");
        assert!(
            lines[2].starts_with("data: {\"id\":1,\"time\":\""),
            "{text}"
        );
        assert!(lines[2].contains("\"host\":\"a.in.example.org\""), "{text}");
        assert!(lines[2].contains("\"problem\":true"), "{text}");
        // Then the blank line that ends the event, and nothing else: one data line.
        assert_eq!(lines[3..], [""], "{text}");
        assert!(text.ends_with("\n\n"));
    }

    /// A client that never reads: the stream task stops at its few queued frames, the client
    /// falls behind in the shared ring and is told how many it skipped, and the count is kept.
    #[tokio::test]
    async fn a_client_that_does_not_read_skips_events_and_they_are_counted() {
        let events = Events::default();
        let mut frames = events.stream(None).expect("a stream");
        // The retry hint and the (empty) backlog's end.
        assert_eq!(
            frames.recv().await.unwrap(),
            Bytes::from_static(b"retry: 2000\n\n")
        );
        assert_eq!(
            frames.recv().await.unwrap(),
            Bytes::from_static(b": live\n\n")
        );
        emit(&events, CLIENT_QUEUE * 3);
        tokio::task::yield_now().await;
        let mut seen = Vec::new();
        while let Ok(Some(frame)) =
            tokio::time::timeout(Duration::from_millis(200), frames.recv()).await
        {
            seen.push(String::from_utf8_lossy(&frame).into_owned());
        }
        let dropped: Vec<&String> = seen
            .iter()
            .filter(|f| f.starts_with("event: dropped"))
            .collect();
        assert_eq!(dropped.len(), 1, "{seen:?}");
        assert!(events.dropped() > 0);
        // What it got is the newest events, in order, after the gap.
        assert!(seen
            .last()
            .unwrap()
            .contains(&format!("\"id\":{}", CLIENT_QUEUE * 3)));
    }

    #[tokio::test]
    async fn streams_end_when_the_agent_stops_and_none_start_after() {
        let events = Events::default();
        let mut frames = events.stream(None).expect("a stream");
        events.close();
        let mut last = String::new();
        while let Some(frame) = frames.recv().await {
            last = String::from_utf8_lossy(&frame).into_owned();
        }
        assert!(last.starts_with("event: stopping"), "{last}");
        assert!(events.stream(None).is_none());
    }
}
