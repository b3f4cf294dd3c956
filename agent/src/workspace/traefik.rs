//! The workspace's `traefik` record: where Traefik's dynamic configuration is read from, and
//! what its routes added to a workspace once joined
//! ([`crate::translate::traefik::join`]). Pure.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{RawEntryPoint, RawTraefik};
use crate::document::TraefikStatus;

/// What an entry point is to the workspace: the HTTPS listener, the HTTP listener (which
/// redirects every `'https` route's requests to HTTPS), or a port of the ingress for TCP and
/// UDP routers.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum EntryPoint {
    Https,
    Http,
    Port(u16),
}

/// The workspace's `traefik.entry_points` default: Traefik's usual names.
pub fn default_entry_points() -> BTreeMap<String, EntryPoint> {
    BTreeMap::from([
        ("websecure".to_owned(), EntryPoint::Https),
        ("web".to_owned(), EntryPoint::Http),
    ])
}

/// The `traefik` record, checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraefikSettings {
    /// Every `.yml`, `.yaml`, `.toml` and `.json` file in it, watched (absolute once the
    /// workspace's directory anchors it).
    pub directory: Option<PathBuf>,
    /// One file, watched through its directory.
    pub file: Option<PathBuf>,
    /// An `http://` or `https://` URL answering the configuration, polled.
    pub endpoint: Option<String>,
    pub poll_interval_secs: u64,
    pub entry_points: BTreeMap<String, EntryPoint>,
}

impl TraefikSettings {
    pub fn from_raw(raw: RawTraefik) -> Result<TraefikSettings, String> {
        if raw.directory.is_none() && raw.file.is_none() && raw.endpoint.is_none() {
            return Err("give `directory`, `file` or `endpoint`".into());
        }
        if raw.directory.is_some() && raw.file.is_some() {
            return Err("`directory` and `file` are both given".into());
        }
        if let Some(url) = &raw.endpoint {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "endpoint `{url}` is not an http:// or https:// URL"
                ));
            }
        }
        let poll = raw.poll_interval;
        if poll.fract() != 0.0 || !(1.0..=3600.0).contains(&poll) {
            return Err(format!(
                "poll_interval {poll} is not a whole number of seconds from 1 to 3600"
            ));
        }
        let entry_points = raw
            .entry_points
            .into_iter()
            .map(|(name, kind)| {
                let kind = match kind {
                    RawEntryPoint::Listener(s) if s == "https" => EntryPoint::Https,
                    RawEntryPoint::Listener(s) if s == "http" => EntryPoint::Http,
                    RawEntryPoint::Port(p) if p.fract() == 0.0 && (1.0..=65535.0).contains(&p) => {
                        EntryPoint::Port(p as u16)
                    }
                    other => {
                        return Err(format!(
                            "entry_points.{name}: {other:?} is not 'https, 'http or a port"
                        ))
                    }
                };
                Ok((name, kind))
            })
            .collect::<Result<_, _>>()?;
        Ok(TraefikSettings {
            directory: raw.directory.map(PathBuf::from),
            file: raw.file.map(PathBuf::from),
            endpoint: raw.endpoint,
            poll_interval_secs: poll as u64,
            entry_points,
        })
    }
}

/// What the Traefik source added to a workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraefikLive {
    /// Each added route's origin, by route id: `traefik: dynamic/orca-web.yaml:3: http router
    /// `orca-web``.
    pub origins: BTreeMap<String, String>,
    /// Each source's state and the routers refused, as `/v1/state` shows them.
    pub status: TraefikStatus,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_read_with_its_defaults_and_refused_without_a_source() {
        let raw = RawTraefik {
            directory: Some("dynamic".into()),
            file: None,
            endpoint: None,
            poll_interval: 2.0,
            entry_points: BTreeMap::from([
                ("websecure".into(), RawEntryPoint::Listener("https".into())),
                ("ssh".into(), RawEntryPoint::Port(2222.0)),
            ]),
        };
        let settings = TraefikSettings::from_raw(raw.clone()).unwrap();
        assert_eq!(settings.poll_interval_secs, 2);
        assert_eq!(settings.entry_points["ssh"], EntryPoint::Port(2222));
        let none = RawTraefik {
            directory: None,
            ..raw.clone()
        };
        assert!(TraefikSettings::from_raw(none).is_err());
        let half = RawTraefik {
            poll_interval: 0.5,
            ..raw
        };
        assert!(TraefikSettings::from_raw(half).is_err());
    }
}
