//! sozu's event stream: one long-lived `SubscribeEvents` connection, read on a thread of its
//! own, publishing what sozu says of backends (up, down, no backend left, a removed backend's
//! last connection ended) and of changes to its configuration (audit events) as facts.
//!
//! The stream is the only way to learn a backend's health as sozu sees it, and the fastest way
//! to learn that someone else changed sozu. When it breaks, sozu may have restarted: that is
//! published too, and the stream is opened again, with a growing wait while sozu is away.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use sozu_command_lib::channel::Channel;
use sozu_command_lib::proto::command::{
    request::RequestType, response_content::ContentType, EventKind, Request, Response,
    SubscribeEvents,
};
use tokio::sync::mpsc::UnboundedSender;

use super::Fact;

/// One event, as the loop needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SozuEvent {
    /// A backend passed its health check, or a connection to it succeeded again.
    BackendUp { backend_id: String },
    /// A backend failed its health check, or connections to it failed.
    BackendDown { backend_id: String },
    /// Every backend of a cluster is down. sozu still tries those that accept connections
    /// (fail-open), and answers 503 when none does.
    NoAvailableBackends { cluster_id: String },
    /// A cluster has a backend up again.
    ClusterRecovered { cluster_id: String },
    /// A backend taken out of its cluster has no connection left.
    BackendDrained { backend_id: String },
    /// sozu's configuration changed (an audit event), by whoever.
    Changed(Change),
    /// The stream broke: sozu may have restarted. Sent once per break.
    StreamBroken,
}

/// An audit event about the configuration.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Change {
    pub kind: ChangeKind,
    pub cluster_id: Option<String>,
    pub address: Option<SocketAddr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChangeKind {
    ClusterAdded,
    ClusterRemoved,
    FrontendAdded,
    FrontendRemoved,
    CertificateAdded,
    CertificateRemoved,
    CertificateReplaced,
    /// A state file or a configuration file was loaded.
    Loaded,
}

impl std::fmt::Display for ChangeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ChangeKind::ClusterAdded => "cluster added",
            ChangeKind::ClusterRemoved => "cluster removed",
            ChangeKind::FrontendAdded => "frontend added",
            ChangeKind::FrontendRemoved => "frontend removed",
            ChangeKind::CertificateAdded => "certificate added",
            ChangeKind::CertificateRemoved => "certificate removed",
            ChangeKind::CertificateReplaced => "certificate replaced",
            ChangeKind::Loaded => "state loaded",
        })
    }
}

/// Pure: the event sozu sent, as the loop takes it; `None` for what the agent does not follow.
pub fn from_proto(event: &sozu_command_lib::proto::command::Event) -> Option<SozuEvent> {
    let kind = EventKind::try_from(event.kind).ok()?;
    let backend = || event.backend_id.clone();
    let cluster = || event.cluster_id.clone();
    let change = |kind: ChangeKind| {
        Some(SozuEvent::Changed(Change {
            kind,
            cluster_id: event.cluster_id.clone(),
            address: event.address.map(SocketAddr::from),
        }))
    };
    match kind {
        EventKind::BackendUp | EventKind::HealthCheckHealthy => Some(SozuEvent::BackendUp {
            backend_id: backend()?,
        }),
        EventKind::BackendDown | EventKind::HealthCheckUnhealthy => Some(SozuEvent::BackendDown {
            backend_id: backend()?,
        }),
        EventKind::NoAvailableBackends => Some(SozuEvent::NoAvailableBackends {
            cluster_id: cluster()?,
        }),
        EventKind::ClusterRecovered => Some(SozuEvent::ClusterRecovered {
            cluster_id: cluster()?,
        }),
        EventKind::RemovedBackendHasNoConnections => Some(SozuEvent::BackendDrained {
            backend_id: backend()?,
        }),
        EventKind::ClusterAdded => change(ChangeKind::ClusterAdded),
        EventKind::ClusterRemoved => change(ChangeKind::ClusterRemoved),
        EventKind::FrontendAdded => change(ChangeKind::FrontendAdded),
        EventKind::FrontendRemoved => change(ChangeKind::FrontendRemoved),
        EventKind::CertificateAdded => change(ChangeKind::CertificateAdded),
        EventKind::CertificateRemoved => change(ChangeKind::CertificateRemoved),
        EventKind::CertificateReplaced => change(ChangeKind::CertificateReplaced),
        EventKind::StateLoaded | EventKind::ConfigurationReloaded => change(ChangeKind::Loaded),
        _ => None,
    }
}

/// How long to wait before opening the stream again after it broke or could not open.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Starts reading sozu's events on a thread of its own, which holds `guard` for its life (a
/// supervisor learns of its end). The thread ends when `facts` closes.
pub fn spawn(
    socket: &Path,
    peer: crate::sozu::SozuPeer,
    facts: UnboundedSender<Fact>,
    guard: impl Send + 'static,
) -> std::io::Result<()> {
    let socket = socket.to_owned();
    std::thread::Builder::new()
        .name("sozu-events".into())
        .spawn(move || {
            let _guard = guard;
            run(&socket, peer, &facts)
        })
        .map(|_| ())
}

fn run(socket: &Path, peer: crate::sozu::SozuPeer, facts: &UnboundedSender<Fact>) {
    let mut wait = RETRY_MIN;
    let mut was_open = false;
    loop {
        match subscribe(socket, peer) {
            Ok(mut channel) => {
                wait = RETRY_MIN;
                was_open = true;
                tracing::debug!("subscribed to sozu's events");
                loop {
                    match next_message(&mut channel) {
                        Ok(response) => {
                            let event = event_of(&response);
                            if let Some(event) = &event {
                                tracing::debug!(
                                    kind = EventKind::try_from(event.kind)
                                        .map_or("unknown", |kind| kind.as_str_name()),
                                    cluster = event.cluster_id.as_deref(),
                                    backend = event.backend_id.as_deref(),
                                    "sozu reported an event"
                                );
                            }
                            if let Some(event) = event.and_then(|e| from_proto(&e)) {
                                if facts.send(Fact::Sozu(event)).is_err() {
                                    return;
                                }
                            }
                        }
                        // A quiet hour is not a break.
                        Err(sozu_command_lib::channel::ChannelError::TimeoutReached(_)) => {
                            if facts.is_closed() {
                                return;
                            }
                        }
                        Err(e) => {
                            tracing::info!(error = %crate::sozu::channel_reason(&e),
                                "sozu's event stream broke");
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot subscribe to sozu's events"),
        }
        if was_open {
            was_open = false;
            if facts.send(Fact::Sozu(SozuEvent::StreamBroken)).is_err() {
                return;
            }
        }
        if facts.is_closed() {
            return;
        }
        std::thread::sleep(wait);
        wait = (wait * 2).min(RETRY_MAX);
    }
}

/// How long the stream may stay quiet before the thread checks that the loop still listens.
const QUIET: Duration = Duration::from_secs(3600);

/// The next message on the stream. sozu-command-lib's blocking read wakes every 100 ms to look
/// for data (ten wake-ups a second on an idle agent), so the thread first sleeps in `poll(2)`
/// until the socket has something, unless a message is already buffered.
fn next_message(
    channel: &mut Channel<Request, Response>,
) -> Result<Response, sozu_command_lib::channel::ChannelError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    if channel.front_buf.available_data() == 0 {
        let timeout = PollTimeout::try_from(QUIET).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(channel.sock.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(0) => {
                return Err(sozu_command_lib::channel::ChannelError::TimeoutReached(
                    QUIET,
                ))
            }
            // Readable, hung up or failed: the read says which.
            Ok(_) => {}
            // A signal: look again.
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                return Err(sozu_command_lib::channel::ChannelError::Read(
                    std::io::Error::from(e),
                ))
            }
        }
    }
    channel.read_message_blocking_timeout(Some(QUIET))
}

fn subscribe(
    socket: &Path,
    peer: crate::sozu::SozuPeer,
) -> Result<Channel<Request, Response>, String> {
    let path = socket.to_str().ok_or("the socket path is not UTF-8")?;
    let mut channel: Channel<Request, Response> =
        Channel::from_path(path, 16_384, 1_000_000).map_err(|e| crate::sozu::channel_reason(&e))?;
    peer.check(std::os::fd::AsFd::as_fd(&channel.sock))?;
    channel
        .blocking()
        .map_err(|e| crate::sozu::channel_reason(&e))?;
    channel
        .write_message(&Request::from(RequestType::SubscribeEvents(
            SubscribeEvents {},
        )))
        .map_err(|e| crate::sozu::channel_reason(&e))?;
    Ok(channel)
}

fn event_of(response: &Response) -> Option<sozu_command_lib::proto::command::Event> {
    match response.content.as_ref()?.content_type.as_ref()? {
        ContentType::Event(event) => Some(event.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sozu_command_lib::proto::command::Event;

    #[test]
    fn health_and_audit_events_are_told_apart() {
        let event = |kind: EventKind, cluster: Option<&str>, backend: Option<&str>| Event {
            kind: kind as i32,
            cluster_id: cluster.map(str::to_owned),
            backend_id: backend.map(str::to_owned),
            address: None,
            metric_detail: None,
        };
        assert_eq!(
            from_proto(&event(
                EventKind::HealthCheckUnhealthy,
                Some("pi-a"),
                Some("b")
            )),
            Some(SozuEvent::BackendDown {
                backend_id: "b".into()
            })
        );
        assert_eq!(
            from_proto(&event(EventKind::FrontendRemoved, Some("pi-a"), None)),
            Some(SozuEvent::Changed(Change {
                kind: ChangeKind::FrontendRemoved,
                cluster_id: Some("pi-a".into()),
                address: None,
            }))
        );
        assert_eq!(
            from_proto(&event(
                EventKind::RemovedBackendHasNoConnections,
                None,
                Some("b")
            )),
            Some(SozuEvent::BackendDrained {
                backend_id: "b".into()
            })
        );
        assert_eq!(
            from_proto(&event(EventKind::WorkerKilled, None, None)),
            None
        );
        // An event missing what it is about is dropped, not guessed.
        assert_eq!(from_proto(&event(EventKind::BackendUp, None, None)), None);
    }
}
