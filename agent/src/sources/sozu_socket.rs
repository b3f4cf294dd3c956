//! sozu's socket, watched: a restarted sozu deletes and creates its socket again, which is the
//! first sign of a restart (the next request would find out too, later). The directory is
//! watched, and only the socket's own events count: the agent writes its bulk state files beside
//! it, and their coming and going is no restart.

use std::path::{Path, PathBuf};

use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use super::{watcher, Fact, WatchError};

/// Pure: whether `event` concerns the socket at `socket`.
pub fn concerns_socket(event: &notify::Result<notify::Event>, socket: &Path) -> bool {
    match event {
        // Lost events or a broken watch may have hidden a restart.
        Err(_) => true,
        Ok(event) if event.need_rescan() => true,
        Ok(event) if watcher::is_read(event) => false,
        Ok(event) => event.paths.iter().any(|p| p == socket),
    }
}

/// Starts watching `socket`'s directory; publishes [`Fact::SozuSocket`] on each change of the
/// socket. Ends when `facts` closes.
pub fn spawn(
    socket: &Path,
    facts: UnboundedSender<Fact>,
) -> Result<tokio::task::JoinHandle<()>, WatchError> {
    let dir = watcher::parent_dir(socket);
    let socket: PathBuf = dir.join(socket.file_name().unwrap_or_default());
    let (events_tx, mut events) = unbounded_channel();
    let watcher = watcher::watch(&[&dir], move |event| {
        let _ = events_tx.send(event);
    })?;
    Ok(tokio::spawn(async move {
        let _watcher = watcher;
        while let Some(event) = events.recv().await {
            let mut changed = concerns_socket(&event, &socket);
            while let Ok(event) = events.try_recv() {
                changed |= concerns_socket(&event, &socket);
            }
            if changed && facts.send(Fact::SozuSocket).is_err() {
                return;
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, EventKind, RemoveKind};

    #[test]
    fn only_the_socket_itself_counts() {
        let socket = Path::new("/run/sozu/sozu.sock");
        let on = |kind: EventKind, path: &str| {
            concerns_socket(
                &Ok(notify::Event::new(kind).add_path(PathBuf::from(path))),
                socket,
            )
        };
        assert!(on(
            EventKind::Create(CreateKind::Any),
            "/run/sozu/sozu.sock"
        ));
        assert!(on(
            EventKind::Remove(RemoveKind::Any),
            "/run/sozu/sozu.sock"
        ));
        assert!(!on(
            EventKind::Create(CreateKind::File),
            "/run/sozu/.private-ingress-x.state"
        ));
        assert!(concerns_socket(
            &Err(notify::Error::generic("overflow")),
            socket
        ));
    }
}
