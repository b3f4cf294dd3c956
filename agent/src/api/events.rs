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
//! A client that reads nothing at all is another matter: it holds a stream slot. Streams are
//! counted per client ([`super::clients`]: an address): at most [`MAX_STREAMS_PER_CLIENT`] each,
//! [`MAX_STREAMS`] in all, and a client's new stream beyond its share ends its oldest one (with
//! a last comment saying why), so that no client can take every slot and a newcomer is never
//! refused for slots that silent clients hold. And a stream whose connection has taken nothing
//! for [`STALL`] while a frame waits for it is ended and its connection closed: its client does
//! not read. A client that reads slowly but steadily takes something within that time and keeps
//! its stream (skipping what it fell behind on, as above). What TCP cannot tell is a silent
//! client from an attentive one while there is little to send: the client's kernel acknowledges
//! whatever fits in its receive buffer (some 170 KB with Linux's defaults, measured; megabytes
//! if the client enlarges it) whether or not anything reads it, so a silent client on a quiet
//! agent is only found out when events fill its buffers, or when its slot is wanted.
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

use super::clients::{Client, Closer, Closing, Slots};
use crate::document::{Event, EventKind};

/// Events kept for a client that joins late: a screenful and more of `top`'s events pane, and a
/// few hundred kilobytes at most.
pub const BACKLOG: usize = 512;
/// How far a client may fall behind before it skips events (the broadcast ring's size).
pub const CLIENT_QUEUE: usize = 1024;
/// Frames written for one client and not yet taken by its connection.
pub const FRAMES_QUEUED: usize = 16;
/// Event streams open at once. A stream beyond makes room as [`super::clients`] says, or is
/// refused with 503 when nothing may give way.
pub const MAX_STREAMS: usize = 32;
/// Event streams of one client (an address; every `kubectl port-forward` user of a pod is one
/// client, 127.0.0.1): a few people watching `top` through the same forward. Its next stream
/// ends its oldest.
pub const MAX_STREAMS_PER_CLIENT: usize = 8;
/// How long a stream's connection may take nothing while a frame waits for it: then its client
/// is taken not to read, the stream ends and the connection is closed. A reader that takes a
/// frame within this time keeps its stream; twice the keep-alive interval, so that a client is
/// never judged on a single quiet period.
pub const STALL: Duration = Duration::from_secs(30);
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
    streams: Slots,
    /// Streams ended because their client took nothing for [`STALL`].
    stalled: AtomicU64,
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
            streams: Slots::new(MAX_STREAMS_PER_CLIENT, MAX_STREAMS),
            stalled: AtomicU64::new(0),
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

    /// Streams open now.
    pub fn streams(&self) -> usize {
        self.0.streams.held()
    }

    /// Streams ended to make room for another (a client beyond its share, or all slots taken),
    /// and streams ended because their client read nothing for [`STALL`], since the start.
    pub fn streams_closed(&self) -> (u64, u64) {
        (
            self.0.streams.evicted(),
            self.0.stalled.load(Ordering::Relaxed),
        )
    }

    /// The stream for one client, as SSE frames: `None` when no slot may be had (see the
    /// module's header), or the agent is stopping. `last_event_id` is the client's
    /// `Last-Event-ID`, if any; `client`, who it is; `connection`, what closes the connection
    /// the stream goes on, when its client does not read or its slot goes to another.
    pub fn stream(
        &self,
        last_event_id: Option<&str>,
        client: Client,
        connection: Option<Closer>,
    ) -> Option<mpsc::Receiver<Bytes>> {
        if *self.0.closed.borrow() {
            return None;
        }
        let slot = self.0.streams.take(client, true, Closing::Graceful)?;
        let last = last_event_id.and_then(resume_after);
        let (backlog, live) = self.subscribe(last);
        let (frames, taken) = mpsc::channel(FRAMES_QUEUED);
        let hub = self.0.clone();
        let closed = self.0.closed.subscribe();
        tokio::spawn(async move {
            let sink = Sink {
                frames: &frames,
                slot: &slot,
            };
            match follow(&hub, sink, backlog, live, closed).await {
                End::Gone => {}
                End::Stopping => {
                    let _ = frames.send(Bytes::from_static(STOPPING)).await;
                }
                End::Replaced => {
                    // Said if there is room for it; the connection ends after the response.
                    let _ = frames.try_send(Bytes::from_static(REPLACED));
                    drop(frames);
                    if let Some(connection) = connection {
                        connection.close(Closing::Graceful);
                    }
                }
                End::Stalled => {
                    hub.stalled.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%client, "event stream ended: its client read nothing for {} s", STALL.as_secs());
                    drop(frames);
                    if let Some(connection) = connection {
                        connection.close(Closing::Abort);
                    }
                }
            }
            drop(slot);
        });
        Some(taken)
    }
}

const STOPPING: &[u8] = b"event: stopping\ndata: {\"message\":\"the agent is stopping\"}\n\n";
const REPLACED: &[u8] = b": closed to make room for a newer stream (at most 8 per client address, 32 in all); reconnect to resume\n\n";

/// Why a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The client went.
    Gone,
    /// The agent stops: said, then the stream ends.
    Stopping,
    /// Its slot went to a newer stream.
    Replaced,
    /// Its connection took nothing for [`STALL`] while a frame waited.
    Stalled,
}

/// Where one stream's frames go, and the slot it holds.
#[derive(Clone, Copy)]
struct Sink<'a> {
    frames: &'a mpsc::Sender<Bytes>,
    slot: &'a super::clients::Slot,
}

impl Sink<'_> {
    /// Hands one frame to the connection; why the stream ends instead, if it does.
    async fn send(self, frame: Bytes) -> Result<(), End> {
        tokio::select! {
            sent = tokio::time::timeout(STALL, self.frames.send(frame)) => match sent {
                Ok(Ok(())) => Ok(()),
                Ok(Err(_)) => Err(End::Gone),
                Err(_) => Err(End::Stalled),
            },
            _ = self.slot.closing() => Err(End::Replaced),
        }
    }
}

/// One stream: the retry hint, the backlog, `: live`, then each event as it comes, until the
/// client goes, the agent stops, the slot goes to another or the client stalls.
async fn follow(
    hub: &Hub,
    sink: Sink<'_>,
    backlog: Vec<Arc<Event>>,
    live: broadcast::Receiver<Arc<Event>>,
    closed: watch::Receiver<bool>,
) -> End {
    match stream_frames(hub, sink, backlog, live, closed).await {
        Ok(never) => match never {},
        Err(end) => end,
    }
}

async fn stream_frames(
    hub: &Hub,
    sink: Sink<'_>,
    backlog: Vec<Arc<Event>>,
    mut live: broadcast::Receiver<Arc<Event>>,
    mut closed: watch::Receiver<bool>,
) -> Result<std::convert::Infallible, End> {
    {
        // How long to wait before reconnecting, for a client that follows the spec.
        sink.send(Bytes::from_static(b"retry: 2000\n\n")).await?;
        for event in backlog {
            sink.send(frame(&event)).await?;
        }
        // What a client that wants the backlog alone (`top --once`) waits for.
        sink.send(Bytes::from_static(b": live\n\n")).await?;
        let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
        keep_alive.tick().await;
        loop {
            let next = tokio::select! {
                biased;
                // (The arm holds the watch's guard: the frame is sent after the select.)
                _ = closed.wait_for(|c| *c) => None,
                _ = sink.slot.closing() => return Err(End::Replaced),
                received = live.recv() => Some(match received {
                    Ok(event) => frame(&event),
                    Err(broadcast::error::RecvError::Lagged(skipped)) => {
                        hub.dropped.fetch_add(skipped, Ordering::Relaxed);
                        Bytes::from(format!(
                            "event: dropped\ndata: {{\"dropped\":{skipped},\"message\":\"{skipped} events skipped: this client read too slowly\"}}\n\n"
                        ))
                    }
                    Err(broadcast::error::RecvError::Closed) => return Err(End::Gone),
                }),
                _ = keep_alive.tick() => Some(Bytes::from_static(b": keep-alive\n\n")),
                () = sink.frames.closed() => return Err(End::Gone),
            };
            let Some(next) = next else {
                return Err(End::Stopping);
            };
            sink.send(next).await?;
        }
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
        let mut frames = events
            .stream(None, Client::default(), None)
            .expect("a stream");
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
        let mut frames = events
            .stream(None, Client::default(), None)
            .expect("a stream");
        events.close();
        let mut last = String::new();
        while let Some(frame) = frames.recv().await {
            last = String::from_utf8_lossy(&frame).into_owned();
        }
        assert!(last.starts_with("event: stopping"), "{last}");
        assert!(events.stream(None, Client::default(), None).is_none());
    }

    async fn next_frame(frames: &mut mpsc::Receiver<Bytes>) -> String {
        String::from_utf8_lossy(&frames.recv().await.expect("a frame")).into_owned()
    }

    /// One client cannot take every slot: its ninth stream ends its first (which says why), and
    /// another client still gets a stream when 32 are open.
    #[tokio::test]
    async fn streams_are_per_client_and_the_newest_of_a_client_wins() {
        let events = Events::default();
        let silent = Client::of([127, 0, 0, 1].into());
        let mut held: Vec<_> = (0..MAX_STREAMS_PER_CLIENT)
            .map(|_| events.stream(None, silent, None).expect("a stream"))
            .collect();
        assert_eq!(events.streams(), MAX_STREAMS_PER_CLIENT);
        let _newest = events.stream(None, silent, None).expect("a stream");
        assert_eq!(events.streams(), MAX_STREAMS_PER_CLIENT);
        let mut first = held.remove(0);
        let mut seen = Vec::new();
        while let Some(frame) = first.recv().await {
            seen.push(String::from_utf8_lossy(&frame).into_owned());
        }
        assert!(
            seen.last()
                .is_some_and(|f| f.starts_with(": closed to make room")),
            "{seen:?}"
        );
        assert_eq!(events.streams_closed(), (1, 0));
        // Every slot taken, by four clients; a fifth still gets one, from one of the biggest.
        let _others: Vec<_> = (2..5u8)
            .flat_map(|i| (0..MAX_STREAMS_PER_CLIENT).map(move |_| i))
            .map(|i| events.stream(None, Client::of([127, 0, 0, i].into()), None))
            .collect();
        assert_eq!(events.streams(), MAX_STREAMS);
        let mut newcomer = events
            .stream(None, Client::of([127, 0, 0, 9].into()), None)
            .expect("a stream for a new client");
        assert_eq!(next_frame(&mut newcomer).await, "retry: 2000\n\n");
        assert_eq!(events.streams(), MAX_STREAMS);
    }

    /// A client that takes nothing while frames wait is dropped after [`STALL`]: its frames end.
    /// One that takes a frame now and then, slower than events come, keeps its stream and is
    /// told what it skipped.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_takes_nothing_is_dropped_and_a_slow_one_is_not() {
        let events = Events::default();
        let mut silent = events
            .stream(None, Client::of([127, 0, 0, 1].into()), None)
            .expect("a stream");
        let mut slow = events
            .stream(None, Client::of([127, 0, 0, 2].into()), None)
            .expect("a stream");
        assert_eq!(next_frame(&mut slow).await, "retry: 2000\n\n");
        assert_eq!(next_frame(&mut slow).await, ": live\n\n");
        let started = tokio::time::Instant::now();
        let mut slow_frames = Vec::new();
        for _ in 0..12 {
            emit(&events, CLIENT_QUEUE / 4);
            // Far slower than the events: four frames every 10 s.
            tokio::time::sleep(Duration::from_secs(10)).await;
            for _ in 0..4 {
                slow_frames.push(next_frame(&mut slow).await);
            }
        }
        assert!(started.elapsed() >= STALL * 3);
        assert_eq!(
            events.streams(),
            1,
            "the silent stream is gone, the slow one stays"
        );
        assert_eq!(events.streams_closed(), (0, 1));
        assert!(
            slow_frames.iter().any(|f| f.starts_with("event: dropped")),
            "{slow_frames:?}"
        );
        // What the silent client had queued, then the end.
        let mut queued = 0;
        while silent.recv().await.is_some() {
            queued += 1;
        }
        assert!(queued <= FRAMES_QUEUED, "{queued}");
    }
}
