//! What `top` reads from the agent, on threads of their own so that the screen never waits for
//! the network: `/v1/state` every refresh, sent back with its entity tag (`If-None-Match`), so
//! that while nothing changed the agent answers `304` and renders and sends nothing; and
//! `/v1/events` as one long stream, resumed after the last event seen (`Last-Event-ID`) when it
//! breaks. Both only report ([`Update`]); when the agent goes away they keep trying, every
//! refresh for the state and every two seconds for the stream, and say so.

use std::io::BufRead;
use std::sync::mpsc::Sender;
use std::time::Duration;

use super::model::Update;
use super::sse::{Message, Parser};
use crate::cli::status::{base_url, StatusError};
use crate::document::{Document, Event};

/// How long the event stream may stay silent before it is taken for broken: the agent writes a
/// comment every 15 s.
const STREAM_SILENCE: Duration = Duration::from_secs(45);
/// Between two attempts to open the stream again.
const STREAM_RETRY: Duration = Duration::from_secs(2);

/// Reads `/v1/state`, remembering the entity tag of the last document.
pub struct StateReader {
    address: String,
    url: String,
    agent: ureq::Agent,
    timeout: Duration,
    etag: Option<String>,
}

impl StateReader {
    pub fn new(address: &str, timeout: Duration) -> Result<StateReader, StatusError> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(StateReader {
            address: address.to_owned(),
            url: format!("{}/v1/state", base_url(address)?),
            agent,
            timeout,
            etag: None,
        })
    }

    /// The document, or `None` when it has not changed since the last read.
    pub fn read(&mut self) -> Result<Option<Document>, StatusError> {
        let mut request = self.agent.get(&self.url);
        if let Some(etag) = &self.etag {
            request = request.header("If-None-Match", etag);
        }
        let malformed = |reason: String| StatusError::Malformed {
            address: self.address.clone(),
            reason,
        };
        let mut response = request.call().map_err(|e| match e {
            ureq::Error::Timeout(_) => StatusError::NoAnswer {
                address: self.address.clone(),
                timeout: self.timeout,
            },
            e => StatusError::Unreachable {
                address: self.address.clone(),
                reason: e.to_string(),
            },
        })?;
        match response.status().as_u16() {
            304 => return Ok(None),
            200 => {}
            code => return Err(malformed(format!("HTTP status {code}"))),
        }
        let etag = response
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_vec()
            .map_err(|e| match e {
                ureq::Error::Timeout(_) => StatusError::NoAnswer {
                    address: self.address.clone(),
                    timeout: self.timeout,
                },
                e => malformed(e.to_string()),
            })?;
        let doc = serde_json::from_slice(&body).map_err(|e| malformed(e.to_string()))?;
        self.etag = etag;
        Ok(Some(doc))
    }
}

fn unix_now() -> i64 {
    crate::clock::unix_seconds(std::time::SystemTime::now())
}

/// Reads `/v1/state` every `refresh` (the first time `refresh` from now) until `updates` is
/// dropped.
pub fn poll(
    mut reader: StateReader,
    refresh: Duration,
    updates: Sender<Update>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("top-state".into())
        .spawn(move || loop {
            std::thread::sleep(refresh);
            let update = match reader.read() {
                Ok(Some(doc)) => Update::state(doc, unix_now()),
                Ok(None) => Update::Unchanged(unix_now()),
                Err(e) => {
                    // A new agent's first body must not be taken as unchanged.
                    reader.etag = None;
                    Update::Down(e.to_string())
                }
            };
            if updates.send(update).is_err() {
                return;
            }
        })
        .map(drop)
}

/// Follows `/v1/events` until `updates` is dropped.
pub fn follow(address: &str, updates: Sender<Update>) -> Result<(), StatusError> {
    let url = format!("{}/v1/events", base_url(address)?);
    std::thread::Builder::new()
        .name("top-events".into())
        .spawn(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .timeout_connect(Some(Duration::from_secs(5)))
                .timeout_recv_response(Some(Duration::from_secs(10)))
                .timeout_per_read(Some(STREAM_SILENCE))
                .build()
                .into();
            let mut last: Option<String> = None;
            loop {
                let gone = stream(&agent, &url, &mut last, &mut |update| {
                    updates.send(update).is_ok()
                });
                if gone || updates.send(Update::EventsLink(false)).is_err() {
                    return;
                }
                std::thread::sleep(STREAM_RETRY);
            }
        })
        .map(drop)
        .map_err(|e| StatusError::Unreachable {
            address: address.to_owned(),
            reason: e.to_string(),
        })
}

/// One stream, until it breaks. `send` returns `false` when nobody listens any more: then so
/// does this, returning `true`.
fn stream(
    agent: &ureq::Agent,
    url: &str,
    last: &mut Option<String>,
    send: &mut dyn FnMut(Update) -> bool,
) -> bool {
    let mut request = agent.get(url);
    if let Some(id) = last.as_deref() {
        request = request.header("Last-Event-ID", id);
    }
    let Ok(response) = request.call() else {
        return false;
    };
    if !send(Update::EventsLink(true)) {
        return true;
    }
    let mut reader = std::io::BufReader::new(response.into_body().into_reader());
    let mut parser = Parser::default();
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
        let Some(message) = parser.line(line.trim_end_matches('\n')) else {
            continue;
        };
        let update = match message {
            Message::Comment(_) => continue,
            Message::Event { id, event, data } => {
                if id.is_some() {
                    *last = id;
                }
                match event.as_str() {
                    "stopping" => Update::Stopping,
                    "dropped" => Update::Skipped(
                        serde_json::from_str::<serde_json::Value>(&data)
                            .ok()
                            .and_then(|v| v["dropped"].as_u64())
                            .unwrap_or(0),
                    ),
                    _ => match serde_json::from_str::<Event>(&data) {
                        Ok(event) => Update::Event(Box::new(event)),
                        // An event of a newer agent that this `top` cannot read: skipped.
                        Err(_) => continue,
                    },
                }
            }
        };
        if !send(update) {
            return true;
        }
    }
}

/// The agent's backlog of events (what a client joining now gets first), oldest first: for
/// `--once`, which reads the stream up to the agent's `: live` and no further.
pub fn backlog(address: &str, timeout: Duration) -> Result<Vec<Event>, StatusError> {
    let url = format!("{}/v1/events", base_url(address)?);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .build()
        .into();
    let response = agent
        .get(&url)
        .call()
        .map_err(|e| StatusError::Unreachable {
            address: address.to_owned(),
            reason: e.to_string(),
        })?;
    let mut reader = std::io::BufReader::new(response.into_body().into_reader());
    let mut parser = Parser::default();
    let mut events = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => return Ok(events),
            Err(e) => {
                return Err(StatusError::Malformed {
                    address: address.to_owned(),
                    reason: e.to_string(),
                })
            }
            Ok(_) => {}
        }
        match parser.line(line.trim_end_matches('\n')) {
            Some(Message::Comment(c)) if c == "live" => return Ok(events),
            Some(Message::Event { data, .. }) => {
                if let Ok(event) = serde_json::from_str::<Event>(&data) {
                    events.push(event);
                }
            }
            _ => {}
        }
    }
}
