//! The Traefik source: the workspace's `traefik` record served live. It watches the directory
//! (or the one file's directory: files are replaced by rename, and a ConfigMap mount swaps its
//! `..data` link), polls the endpoint every `poll_interval`, and hands the workspace source
//! ([`super::workspace`]) the routes translated from what it read ([`crate::translate::traefik`]),
//! which merges them with the workspace's own ([`crate::translate::traefik::join::merge`]).
//!
//! Each file and the endpoint keep their **last good document** ([`Reads`], pure): a file or
//! an answer that does not parse (a half-written file, an endpoint answering garbage, one that
//! does not answer) keeps what it said before, and its error is shown with its file and line;
//! a file removed takes its routes with it. A router that does not translate is refused alone
//! (fail closed: never served without the part that cannot be carried), the other routers go
//! on. The documents are translated together, as Traefik merges its files: a router may use
//! another file's service.
//!
//! The endpoint is asked off the runtime (a blocking client on tokio's blocking pool) with a
//! deadline, by a task of its own: a stalled endpoint delays nothing but its own next answer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::watcher;
use crate::document::{TraefikSourceStatus, TraefikStatus};
use crate::translate::traefik::{
    self, Carried, CertificatePair, Document, Format, Options, Refused,
};
use crate::workspace::TraefikSettings;

/// What the source reads by: the record and the workspace's zone and Traefik's entry points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub traefik: TraefikSettings,
    pub zone: String,
}

/// What the source tells the workspace source.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Update {
    pub routes: Vec<Carried>,
    /// The pairs `tls.certificates` names, served as the workspace's `certificates` are.
    pub certificates: Vec<CertificatePair>,
    pub refused: Vec<Refused>,
    pub status: TraefikStatus,
}

/// How long an endpoint has to answer in full (Traefik's own `providers.http.pollTimeout`
/// default).
pub const ENDPOINT_DEADLINE: Duration = Duration::from_secs(5);

/// One source's reads: its last good document, and why its latest read was not taken.
#[derive(Debug, Clone)]
struct Source {
    kind: &'static str,
    /// The text last read, good or not: a read of the same text changes nothing.
    text: Option<String>,
    good: Option<(Document, i64)>,
    error: Option<String>,
}

/// Every file's and the endpoint's last good document. Pure.
#[derive(Debug, Clone, Default)]
pub struct Reads {
    sources: BTreeMap<String, Source>,
}

impl Reads {
    /// `name` was read (a file's path, the endpoint's URL): `text`, or why it could not be.
    /// A text that parses is taken unless it makes a router of its own refused that its last
    /// good version did not (a file edited into a router that does not check keeps its last
    /// good version, and says which router and why). Returns whether anything changed.
    pub fn read(
        &mut self,
        name: &str,
        kind: &'static str,
        text: Result<String, String>,
        now: i64,
        options: &Options,
    ) -> bool {
        self.expect(name, kind);
        let Some(source) = self.sources.get_mut(name) else {
            return false;
        };
        let text = match text {
            Ok(text) => text,
            Err(error) => {
                let changed = source.error.as_deref() != Some(error.as_str());
                source.error = Some(error);
                source.text = None;
                return changed;
            }
        };
        if source.text.as_deref() == Some(text.as_str()) {
            return false;
        }
        source.text = Some(text.clone());
        if text.trim().is_empty() && source.good.is_some() {
            // What a writer that truncates, then writes, leaves for a moment: removing a file
            // is how its routes are removed.
            source.error = Some(format!(
                "{name}: empty (being written?): its last good version stays; remove the file to remove its routes"
            ));
            return true;
        }
        let doc = match parse(name, kind, &text) {
            Ok(doc) => doc,
            Err(error) => {
                source.error = Some(error);
                return true;
            }
        };
        let had_good = source.good.is_some();
        let refused_now = |reads: &Reads| -> Vec<Refused> {
            reads
                .translate(options)
                .refused
                .into_iter()
                .filter(|r| r.origin.file == name)
                .collect()
        };
        let before: Vec<String> = if had_good {
            refused_now(self)
                .into_iter()
                .map(|r| r.origin.router)
                .collect()
        } else {
            Vec::new()
        };
        let Some(source) = self.sources.get_mut(name) else {
            return false;
        };
        let previous = source.good.replace((doc, now));
        source.error = None;
        if had_good {
            let newly = refused_now(self)
                .into_iter()
                .find(|r| !before.contains(&r.origin.router));
            if let Some(refused) = newly {
                if let Some(source) = self.sources.get_mut(name) {
                    source.good = previous;
                    source.error = Some(format!("{refused} (the last good version stays)"));
                }
                return true;
            }
        }
        true
    }

    /// A file is gone: its routes go with it.
    pub fn remove(&mut self, name: &str) -> bool {
        self.sources.remove(name).is_some()
    }

    /// The files read (not the endpoint).
    pub fn files(&self) -> impl Iterator<Item = &str> {
        self.sources
            .iter()
            .filter(|(_, s)| s.kind == "file")
            .map(|(name, _)| name.as_str())
    }

    /// A source that is expected but not read yet.
    pub fn expect(&mut self, name: &str, kind: &'static str) {
        self.sources
            .entry(name.to_owned())
            .or_insert_with(|| Source {
                kind,
                text: None,
                good: None,
                error: None,
            });
    }

    /// The last good documents translated together, and each source's state.
    pub fn translate(&self, options: &Options) -> Update {
        let docs: Vec<Document> = self
            .sources
            .values()
            .filter_map(|s| s.good.as_ref().map(|(doc, _)| doc.clone()))
            .collect();
        let t = traefik::translate(&docs, options);
        let sources = self
            .sources
            .iter()
            .map(|(name, s)| TraefikSourceStatus {
                source: name.clone(),
                kind: s.kind.to_owned(),
                state: match (&s.error, &s.good) {
                    (Some(_), _) => "error",
                    (None, Some(_)) => "ok",
                    (None, None) => "pending",
                }
                .to_owned(),
                last_good: s.good.as_ref().map(|(_, at)| *at),
                error: s.error.clone(),
            })
            .collect();
        Update {
            routes: t.routes,
            certificates: t.certificates,
            refused: t.refused,
            status: TraefikStatus {
                sources,
                routes: 0,
                refused: Vec::new(),
            },
        }
    }
}

/// A document read whole, or why not: its syntax, or what is no configuration at all (a
/// section Traefik does not have, a `tls.certificates` entry without its paths), with its line.
fn parse(name: &str, kind: &str, text: &str) -> Result<Document, String> {
    let format = Format::of(name).filter(|_| kind == "file").unwrap_or(
        if text.trim_start().starts_with('{') {
            Format::Json
        } else {
            Format::Yaml
        },
    );
    let doc = Document::parse(name, format, text).map_err(|e| e.to_string())?;
    // What only the whole translation tells (an unknown section, a certificate entry without
    // paths) is asked of this document alone.
    let alone = traefik::translate(
        std::slice::from_ref(&doc),
        &Options {
            zone: "invalid".into(),
            entry_points: traefik::default_entry_points(),
            host: None,
        },
    );
    if let Some(broken) = alone.broken.first() {
        return Err(broken.to_string());
    }
    Ok(doc)
}

/// Whether a directory's entry is read: `.yml`, `.yaml`, `.toml` and `.json` files, not hidden
/// ones (an atomic writer's temporary file, a ConfigMap's `..data`).
pub fn is_read(name: &str) -> bool {
    !name.starts_with('.') && Format::of(name).is_some()
}

/// The files the settings name, now: the directory's, or the one file.
fn list(settings: &TraefikSettings) -> Result<Vec<PathBuf>, String> {
    if let Some(file) = &settings.file {
        return Ok(vec![file.clone()]);
    }
    let Some(dir) = &settings.directory else {
        return Ok(Vec::new());
    };
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        // A link is followed: a ConfigMap's files are links into `..data`.
        if is_read(&name) && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Reads every file the settings name into `reads`; returns whether anything changed.
fn read_files(settings: &Settings, reads: &mut Reads, now: i64) -> bool {
    let options = settings.options();
    let settings = &settings.traefik;
    let mut changed = false;
    let dir_name = settings.directory.as_ref().map(|d| d.display().to_string());
    match list(settings) {
        Ok(files) => {
            if let Some(dir) = &dir_name {
                changed |= reads.remove(dir);
            }
            let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            let gone: Vec<String> = reads
                .files()
                .filter(|f| !names.iter().any(|n| n == f) && Some(*f) != dir_name.as_deref())
                .map(str::to_owned)
                .collect();
            for name in gone {
                changed |= reads.remove(&name);
            }
            for (file, name) in files.iter().zip(&names) {
                let text = read_text(file);
                changed |= reads.read(name, "file", text, now, &options);
            }
        }
        Err(error) => {
            // The directory itself cannot be read: shown as a source of its own, and the files
            // read before keep their last good documents.
            if let Some(dir) = &dir_name {
                changed |= reads.read(dir, "file", Err(error), now, &options);
            }
        }
    }
    changed
}

fn read_text(path: &Path) -> Result<String, String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.len() > traefik::document::MAX_DOCUMENT_BYTES as u64 {
        return Err(format!(
            "{}: larger than {} bytes",
            path.display(),
            traefik::document::MAX_DOCUMENT_BYTES
        ));
    }
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// How an endpoint is named in status, metrics, events and logs: without the credentials a URL
/// may carry (its user information, its query string, where a token often is).
pub fn shown_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("…@{host}"),
        None => authority.to_owned(),
    };
    let path = match path.find(['?', '#']) {
        Some(at) => format!("{}?…", &path[..at]),
        None => path.to_owned(),
    };
    format!("{scheme}://{authority}{path}")
}

/// Asks the endpoint once, within [`ENDPOINT_DEADLINE`]: its body, or why there is none.
async fn ask(url: &str) -> Result<String, String> {
    let shown = shown_url(url);
    if url.starts_with("https://") {
        return ask_https(url).await;
    }
    let owned = url.to_owned();
    let asked = tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(ENDPOINT_DEADLINE))
            .http_status_as_error(false)
            .build()
            .into();
        let mut response = agent.get(&owned).call().map_err(|e| match e {
            ureq::Error::Timeout(_) => format!(
                "no complete answer within {} s",
                ENDPOINT_DEADLINE.as_secs()
            ),
            other => other.to_string(),
        })?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("answered {status}"));
        }
        response
            .body_mut()
            .with_config()
            .limit(traefik::document::MAX_DOCUMENT_BYTES as u64)
            .read_to_string()
            .map_err(|e| match e {
                ureq::Error::Timeout(_) => format!(
                    "no complete answer within {} s",
                    ENDPOINT_DEADLINE.as_secs()
                ),
                other => other.to_string(),
            })
    });
    asked
        .await
        .map_err(|e| format!("the request could not be waited for: {e}"))?
        .map_err(|e| format!("{shown}: {}", e.replace(url, &shown)))
}

/// An `https://` endpoint, through the client the issuer uses (the platform's roots).
async fn ask_https(url: &str) -> Result<String, String> {
    use crate::acme::http;
    let shown = shown_url(url);
    let client = http::client(http::Roots::Platform).map_err(|e| e.to_string())?;
    let request = ::http::Request::get(url)
        .body(instant_acme::BodyWrapper::from(Vec::<u8>::new()))
        .map_err(|e| format!("{shown}: {e}"))?;
    let response = http::exchange(&client, request, ENDPOINT_DEADLINE)
        .await
        .map_err(|e| format!("{shown}: {}", e.to_string().replace(url, &shown)))?;
    if !response.status().is_success() {
        return Err(format!("{shown}: answered {}", response.status()));
    }
    String::from_utf8(response.into_body().to_vec()).map_err(|_| format!("{shown}: not UTF-8"))
}

/// The record's files read once (the endpoint is read live only: it shows as pending), as
/// `check` and `render` read them.
pub fn read_once(settings: &Settings) -> Update {
    let mut reads = Reads::default();
    read_files(
        settings,
        &mut reads,
        crate::clock::unix_seconds(std::time::SystemTime::now()),
    );
    if let Some(url) = &settings.traefik.endpoint {
        reads.expect(&shown_url(url), "endpoint");
    }
    reads.translate(&settings.options())
}

impl Settings {
    /// The translation's options: TCP `HostSNI(`*`)` and UDP routers, which name no host, take
    /// the zone as theirs (what `import traefik --host` gives; the record has no such field).
    fn options(&self) -> Options {
        Options {
            zone: self.zone.clone(),
            entry_points: self.traefik.entry_points.clone(),
            host: Some(self.zone.clone()),
        }
    }
}

/// Starts the source: follows `settings` (none: nothing to read), and sends an [`Update`]
/// whenever what it read translates to something new. Ends when `updates` closes.
pub fn spawn(
    mut settings: watch::Receiver<Option<Arc<Settings>>>,
    updates: mpsc::UnboundedSender<Update>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let current = settings.borrow_and_update().clone();
            let run = async {
                match current {
                    Some(current) => serve(&current, &updates).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = settings.changed() => if changed.is_err() { return },
                () = run => return,
            }
        }
    })
}

/// Reads and polls by `settings` until `updates` closes.
async fn serve(settings: &Settings, updates: &mpsc::UnboundedSender<Update>) {
    let options = settings.options();
    let now = || crate::clock::unix_seconds(std::time::SystemTime::now());
    let mut reads = Reads::default();
    if let Some(url) = &settings.traefik.endpoint {
        reads.expect(&shown_url(url), "endpoint");
    }
    // The directory watched: the configured one, or the one file's.
    let dir = settings
        .traefik
        .directory
        .clone()
        .or_else(|| settings.traefik.file.as_deref().map(watcher::parent_dir));
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let mut watching = None;
    let watch = |watching: &mut Option<notify::RecommendedWatcher>| {
        let Some(dir) = &dir else { return None };
        if watching.is_some() {
            return None;
        }
        let tx = events_tx.clone();
        match watcher::watch(&[dir], move |event| {
            let _ = tx.send(event);
        }) {
            Ok(w) => {
                *watching = Some(w);
                None
            }
            Err(e) => Some(e.to_string()),
        }
    };
    let mut watch_error = watch(&mut watching);
    // The endpoint is asked by a task of its own, which sends each answer here.
    let (answers_tx, mut answers) = mpsc::unbounded_channel();
    let poller = settings.traefik.endpoint.clone().map(|url| {
        let every = Duration::from_secs(settings.traefik.poll_interval_secs);
        tokio::spawn(async move {
            loop {
                let answer = ask(&url).await;
                if answers_tx.send((shown_url(&url), answer)).is_err() {
                    return;
                }
                tokio::time::sleep(every).await;
            }
        })
    });
    let polling = poller.is_some();
    let _stop_poller = Abort(poller);
    // A directory that cannot be watched (not there yet) is tried again this often.
    let mut retry = tokio::time::interval(Duration::from_secs(2));
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<Update> = None;
    let mut changed = true;
    read_files(settings, &mut reads, now());
    // The first answer is waited for (within its deadline): the first routes handed over are
    // then the endpoint's too, not an empty pending source.
    if polling {
        let first =
            tokio::time::timeout(ENDPOINT_DEADLINE + Duration::from_secs(1), answers.recv());
        if let Ok(Some((url, answer))) = first.await {
            reads.read(&url, "endpoint", answer, now(), &options);
        }
    }
    loop {
        if let (Some(dir), Some(error)) = (&dir, &watch_error) {
            changed |= reads.read(
                &dir.display().to_string(),
                "file",
                Err(error.clone()),
                now(),
                &options,
            );
        }
        if changed {
            let update = reads.translate(&options);
            if last.as_ref() != Some(&update) {
                if updates.send(update.clone()).is_err() {
                    return;
                }
                last = Some(update);
            }
        }
        changed = false;
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { return };
                let mut relevant = matters(&event);
                let mut lost = dir.as_deref().is_some_and(|d| watch_lost(&event, d));
                // A burst (a rename is several events) is read once.
                while let Ok(event) = events.try_recv() {
                    relevant |= matters(&event);
                    lost |= dir.as_deref().is_some_and(|d| watch_lost(&event, d));
                }
                if relevant {
                    changed |= read_files(settings, &mut reads, now());
                }
                // A directory removed or moved away takes its watch with it, even when one of
                // the same name is back already: watched again (and read) once it is there,
                // as a directory made after the start is; its files' last good routes stay.
                if let Some(d) = dir.as_deref().filter(|d| lost || !d.is_dir()) {
                    watching = None;
                    watch_error = Some(format!(
                        "cannot watch {}: it was removed; watched again once it exists",
                        d.display()
                    ));
                }
            }
            answer = answers.recv(), if polling => {
                let Some((url, answer)) = answer else { return };
                changed |= reads.read(&url, "endpoint", answer, now(), &options);
            }
            _ = retry.tick(), if watching.is_none() && dir.is_some() => {
                watch_error = watch(&mut watching);
                if watch_error.is_none() {
                    if let Some(dir) = &dir {
                        reads.remove(&dir.display().to_string());
                    }
                    read_files(settings, &mut reads, now());
                    changed = true;
                }
            }
        }
    }
}

/// A filesystem event that may change what is read (the agent's own reads do not).
fn matters(event: &notify::Result<notify::Event>) -> bool {
    match event {
        Ok(event) => !watcher::is_read(event),
        Err(_) => true,
    }
}

/// Whether `event` says the watched directory `dir` itself is gone (removed, or renamed away),
/// which ends an inotify watch for good.
fn watch_lost(event: &notify::Result<notify::Event>, dir: &Path) -> bool {
    use notify::event::{EventKind, ModifyKind};
    match event {
        Ok(event) => {
            matches!(
                event.kind,
                EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
            ) && event.paths.iter().any(|p| p == dir)
        }
        Err(_) => false,
    }
}

/// Ends the poller with the source.
struct Abort(Option<tokio::task::JoinHandle<()>>);

impl Drop for Abort {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORCA: &str = "http:\n  routers:\n    orca-web:\n      rule: Host(`web.in.example.org`) && PathPrefix(`/web`)\n      service: orca-web\n      tls: {}\n  services:\n    orca-web:\n      loadBalancer:\n        servers:\n          - url: \"unix:///run/orca/a.sock\"\n";

    fn options() -> Options {
        Options {
            zone: "in.example.org".into(),
            entry_points: traefik::default_entry_points(),
            host: None,
        }
    }

    fn routers(update: &Update) -> Vec<String> {
        let mut names: Vec<String> = update
            .routes
            .iter()
            .map(|r| r.origin.router.clone())
            .collect();
        names.dedup();
        names
    }

    #[test]
    fn a_file_that_stops_parsing_keeps_its_last_good_routes_and_says_where() {
        let mut reads = Reads::default();
        assert!(reads.read("d/orca-web.yaml", "file", Ok(ORCA.into()), 10, &options()));
        assert_eq!(routers(&reads.translate(&options())), ["orca-web"]);
        // Half written: the list is cut.
        let half = &ORCA[..ORCA.len() - 30];
        assert!(reads.read("d/orca-web.yaml", "file", Ok(half.into()), 20, &options()));
        let update = reads.translate(&options());
        assert_eq!(routers(&update), ["orca-web"], "the last good routes stay");
        let source = &update.status.sources[0];
        assert_eq!(source.state, "error");
        assert_eq!(source.last_good, Some(10));
        let error = source.error.as_deref().unwrap();
        assert!(error.starts_with("d/orca-web.yaml:"), "{error}");
        // The same text again changes nothing; fixed, the error goes.
        assert!(!reads.read("d/orca-web.yaml", "file", Ok(half.into()), 30, &options()));
        assert!(reads.read("d/orca-web.yaml", "file", Ok(ORCA.into()), 40, &options()));
        let update = reads.translate(&options());
        assert_eq!(update.status.sources[0].state, "ok");
        assert_eq!(update.status.sources[0].error, None);
        assert_eq!(update.status.sources[0].last_good, Some(40));
    }

    /// A writer that truncates and then writes leaves an empty file for a moment: it does not
    /// take the file's routes down.
    #[test]
    fn an_emptied_file_keeps_its_last_good_routes_until_it_is_removed() {
        let mut reads = Reads::default();
        reads.read("d/a.yaml", "file", Ok(ORCA.into()), 1, &options());
        assert!(reads.read("d/a.yaml", "file", Ok(String::new()), 2, &options()));
        let update = reads.translate(&options());
        assert_eq!(routers(&update), ["orca-web"]);
        assert!(update.status.sources[0]
            .error
            .as_deref()
            .unwrap()
            .contains("empty (being written?)"));
        // A file that starts empty is an empty configuration, as Traefik reads it.
        reads.read("d/b.yaml", "file", Ok("\n".into()), 3, &options());
        assert_eq!(reads.translate(&options()).status.sources[1].state, "ok");
    }

    #[test]
    fn an_unknown_section_is_a_broken_file_not_an_empty_one() {
        let mut reads = Reads::default();
        reads.read("a.yaml", "file", Ok(ORCA.into()), 1, &options());
        reads.read(
            "a.yaml",
            "file",
            Ok(ORCA.replace("http:", "htp:")),
            2,
            &options(),
        );
        let update = reads.translate(&options());
        assert_eq!(routers(&update), ["orca-web"]);
        assert!(update.status.sources[0]
            .error
            .as_deref()
            .unwrap()
            .contains("`htp` is not a section"));
    }

    #[test]
    fn a_removed_file_takes_its_routes_and_a_router_may_use_another_files_service() {
        let mut reads = Reads::default();
        let (router, service) = ORCA.split_at(ORCA.find("  services:").unwrap());
        reads.read("d/routers.yaml", "file", Ok(router.into()), 1, &options());
        let update = reads.translate(&options());
        assert!(update.routes.is_empty());
        assert_eq!(update.refused.len(), 1, "its service is not declared yet");
        reads.read(
            "d/services.yaml",
            "file",
            Ok(format!("http:\n{service}")),
            2,
            &options(),
        );
        let update = reads.translate(&options());
        assert_eq!(routers(&update), ["orca-web"]);
        assert!(update.refused.is_empty());
        assert!(reads.remove("d/routers.yaml"));
        assert!(reads.translate(&options()).routes.is_empty());
    }

    #[test]
    fn an_endpoint_that_fails_or_answers_garbage_keeps_its_last_good_answer() {
        let mut reads = Reads::default();
        reads.expect("http://atlas/config", "endpoint");
        assert_eq!(
            reads.translate(&options()).status.sources[0].state,
            "pending"
        );
        let json =
            serde_json::to_string(&serde_norway::from_str::<serde_json::Value>(ORCA).unwrap())
                .unwrap();
        reads.read("http://atlas/config", "endpoint", Ok(json), 5, &options());
        assert_eq!(routers(&reads.translate(&options())), ["orca-web"]);
        reads.read(
            "http://atlas/config",
            "endpoint",
            Err("no complete answer within 5 s".into()),
            6,
            &options(),
        );
        let update = reads.translate(&options());
        assert_eq!(routers(&update), ["orca-web"]);
        assert_eq!(update.status.sources[0].state, "error");
        reads.read(
            "http://atlas/config",
            "endpoint",
            Ok("{\"http\": [1, ".into()),
            7,
            &options(),
        );
        let update = reads.translate(&options());
        assert_eq!(routers(&update), ["orca-web"]);
        assert!(update.status.sources[0]
            .error
            .as_deref()
            .unwrap()
            .starts_with("http://atlas/config:1:"));
    }

    /// Fail closed: a new file's router that cannot be carried is not served (its others are);
    /// an edit that makes a served router uncarriable keeps the file's last good version, and
    /// says which router and why.
    #[test]
    fn a_router_that_cannot_be_carried_is_refused_and_an_edit_that_breaks_one_keeps_the_last_good_file(
    ) {
        let auth = ORCA.replace(
            "  services:",
            "    guarded:\n      rule: Host(`guarded.in.example.org`)\n      service: orca-web\n      middlewares: [auth]\n      tls: {}\n  middlewares:\n    auth:\n      forwardAuth:\n        address: http://auth\n  services:",
        );
        let mut reads = Reads::default();
        reads.read("d/a.yaml", "file", Ok(auth.clone()), 1, &options());
        let update = reads.translate(&options());
        assert_eq!(routers(&update), ["orca-web"]);
        assert_eq!(update.refused.len(), 1);
        assert!(
            update.refused[0]
                .to_string()
                .contains("router `guarded`: not served: middleware"),
            "{}",
            update.refused[0]
        );
        assert!(update.refused[0].reason.contains("forwardAuth"));
        assert_eq!(update.status.sources[0].state, "ok");

        let mut reads = Reads::default();
        reads.read("d/a.yaml", "file", Ok(ORCA.into()), 1, &options());
        let broken = ORCA.replace(
            "      tls: {}",
            "      middlewares: [auth]\n      tls: {}",
        ).replace("  services:", "  middlewares:\n    auth:\n      forwardAuth:\n        address: http://auth\n  services:");
        assert!(reads.read("d/a.yaml", "file", Ok(broken), 2, &options()));
        let update = reads.translate(&options());
        assert_eq!(
            routers(&update),
            ["orca-web"],
            "the last good version serves"
        );
        let error = update.status.sources[0].error.as_deref().unwrap();
        assert!(
            error.starts_with("d/a.yaml:3: http router `orca-web`: not served:"),
            "{error}"
        );
        assert!(error.ends_with("(the last good version stays)"), "{error}");
    }

    /// A TCP router on an entry point the record maps to a port is a route of that port, whose
    /// host is the zone (a `HostSNI(`*`)` router names none).
    #[test]
    fn a_tcp_router_takes_its_port_from_the_entry_points_and_the_zone_as_host() {
        let mut traefik = TraefikSettings {
            directory: None,
            file: None,
            endpoint: None,
            poll_interval_secs: 5,
            entry_points: traefik::default_entry_points(),
        };
        traefik
            .entry_points
            .insert("ssh".into(), traefik::EntryPoint::Port(2222));
        let settings = Settings {
            traefik,
            zone: "in.example.org".into(),
        };
        let mut reads = Reads::default();
        let yaml = "tcp:\n  routers:\n    ssh:\n      entryPoints: [ssh]\n      rule: HostSNI(`*`)\n      service: git\n  services:\n    git:\n      loadBalancer:\n        servers:\n          - address: \"10.0.0.9:22\"\n";
        reads.read(
            "d/ssh.yaml",
            "file",
            Ok(yaml.into()),
            1,
            &settings.options(),
        );
        let update = reads.translate(&settings.options());
        assert_eq!(update.refused, []);
        assert_eq!(update.routes.len(), 1);
        let route = &update.routes[0].route;
        assert_eq!(route["host"], "in.example.org");
        assert_eq!(route["listen_port"], 2222);
        assert_eq!(route["protocol"], "tcp");
    }

    #[test]
    fn an_endpoint_is_shown_without_its_credentials() {
        for (url, shown) in [
            ("http://atlas:8080/v1/config", "http://atlas:8080/v1/config"),
            (
                "https://user:s3cret@atlas/v1/config",
                "https://…@atlas/v1/config",
            ),
            (
                "http://atlas/v1/config?token=s3cret",
                "http://atlas/v1/config?…",
            ),
            ("http://atlas?token=s3cret", "http://atlas?…"),
        ] {
            assert_eq!(shown_url(url), shown, "{url}");
        }
    }

    #[test]
    fn hidden_and_other_files_of_the_directory_are_not_read() {
        for (name, read) in [
            ("orca-web.yaml", true),
            ("a.yml", true),
            ("a.toml", true),
            ("atlas.json", true),
            (".orca-web.yaml.tmp", false),
            (".orca-web.yaml", false),
            ("..data", false),
            ("notes.txt", false),
        ] {
            assert_eq!(is_read(name), read, "{name}");
        }
    }
}
