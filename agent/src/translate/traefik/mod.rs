//! Traefik's dynamic configuration (3.x: the file provider's YAML, TOML or JSON files, the HTTP
//! provider's answer) as workspace routes.
//!
//! Pure: documents in, a [`Translation`] out: each router becomes routes in the contract's own
//! field names (so that the same records can be written as workspace text by `import traefik`,
//! and checked by the contract as the workspace's own are), each with its [`Origin`] (file, line,
//! router). Fail closed: a router whose rule, service or middleware cannot be carried as Traefik
//! means it is not served at all; it is [`Refused`] with the reason, never carried without the
//! part that could not be (an `ipAllowList` dropped would serve everyone).
//!
//! Traefik merges every file of its directory into one configuration: a router of one file may
//! use a service or a middleware of another. A name declared in two files is refused in both,
//! as Traefik itself drops it.

pub mod document;
mod fields;
pub mod join;
mod middleware;
mod precedence;
mod router;
pub mod rule;
mod service;
pub mod workspace_text;

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde_json::{json, Map, Value};

pub use crate::workspace::traefik::{default_entry_points, EntryPoint};
pub use document::{Document, Format, ParseError};

use super::is_dns_name;
use fields::Fields;
use middleware::PathEdit;
use precedence::precedence;
use router::{Context, Outcome};
use rule::{HeaderRule, PathRule, Sni};

/// What the translation needs besides the documents.
#[derive(Debug, Clone)]
pub struct Options {
    pub zone: String,
    pub entry_points: BTreeMap<String, EntryPoint>,
    /// The host of TCP `HostSNI(`*`)` and UDP routers, which name none.
    pub host: Option<String>,
}

/// Which part of the configuration a router is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Section {
    Http,
    Tcp,
    Udp,
}

impl Section {
    pub fn key(self) -> &'static str {
        match self {
            Section::Http => "http",
            Section::Tcp => "tcp",
            Section::Udp => "udp",
        }
    }
}

/// Where a route or a refusal comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Origin {
    pub file: String,
    /// Where the router's name is written, when it could be told.
    pub line: Option<usize>,
    pub section: Section,
    pub router: String,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        write!(f, ": {} router `{}`", self.section.key(), self.router)
    }
}

/// A route in the contract's field names, and where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Carried {
    pub origin: Origin,
    pub route: Map<String, Value>,
}

impl Carried {
    /// What two routes may not share: the host and every matching field of an HTTP route, the
    /// port of a TCP or UDP one, the port and host of a passthrough one.
    pub fn key(&self) -> String {
        let get = |k: &str| self.route.get(k).map(Value::to_string).unwrap_or_default();
        match self.route.get("protocol").and_then(Value::as_str) {
            Some("tcp") => format!("tcp port {}", get("listen_port")),
            Some("udp") => format!("udp port {}", get("listen_port")),
            Some(_) => format!("tcp port {} {}", get("listen_port"), get("host")),
            None => format!(
                "https {} {} {} {} {} {} {}",
                get("host"),
                get("path_prefix"),
                get("path_exact"),
                get("path_regex"),
                get("path_segment_prefix"),
                get("method"),
                get("match_headers")
            ),
        }
    }

    pub fn host(&self) -> &str {
        self.route.get("host").and_then(Value::as_str).unwrap_or("")
    }
}

/// A router not served, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub origin: Origin,
    pub reason: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: not served: {}", self.origin, self.reason)
    }
}

/// A certificate and key pair named by `tls.certificates`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificatePair {
    pub file: String,
    pub line: Option<usize>,
    pub cert_file: String,
    pub key_file: String,
}

/// What the configuration says, in workspace terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Translation {
    pub routes: Vec<Carried>,
    pub refused: Vec<Refused>,
    /// A document that does not parse: none of its routers is read.
    pub broken: Vec<ParseError>,
    pub certificates: Vec<CertificatePair>,
    /// Routers carried by something the workspace does anyway (an HTTP router that redirects
    /// to HTTPS: the HTTP listener does that for every `'https` route).
    pub covered: Vec<(Origin, String)>,
}

/// A declaration (router, service, middleware) and the document it is in.
struct Declared<'a> {
    doc: &'a Document,
    value: &'a Value,
}

/// Every declaration of one kind across the documents, by name; a name declared twice is kept
/// with the files that declare it, for the refusal.
struct Table<'a> {
    items: BTreeMap<String, Declared<'a>>,
    twice: HashMap<String, Vec<String>>,
}

impl<'a> Table<'a> {
    fn collect(docs: &'a [Document], section: &str, kind: &str) -> Table<'a> {
        let mut items: BTreeMap<String, Declared<'a>> = BTreeMap::new();
        let mut twice: HashMap<String, Vec<String>> = HashMap::new();
        for doc in docs {
            let Some(map) = get_ci(&doc.value, section)
                .and_then(|s| get_ci(s, kind))
                .and_then(Value::as_object)
            else {
                continue;
            };
            for (name, value) in map {
                if let Some(before) = items.get(name) {
                    // Traefik keeps a name declared alike in two files, and drops one declared
                    // differently: so does this.
                    if before.value != value {
                        twice
                            .entry(name.clone())
                            .or_insert_with(|| vec![before.doc.file.clone()])
                            .push(doc.file.clone());
                    }
                    continue;
                }
                items.insert(name.clone(), Declared { doc, value });
            }
        }
        Table { items, twice }
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        if self.twice.contains_key(name) {
            return None;
        }
        self.items.get(name).map(|d| d.value)
    }
}

fn get_ci<'v>(value: &'v Value, key: &str) -> Option<&'v Value> {
    value
        .as_object()?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
}

/// Parses each `(name, text)` as its extension says (`.yaml`/`.yml`, `.toml`, `.json`; any
/// other: YAML then JSON, as Traefik's HTTP provider reads an answer) and translates them.
pub fn translate_texts(sources: &[(String, String)], options: &Options) -> Translation {
    let mut docs = Vec::new();
    let mut broken = Vec::new();
    for (name, text) in sources {
        let format = Format::of(name).unwrap_or(if text.trim_start().starts_with('{') {
            Format::Json
        } else {
            Format::Yaml
        });
        match Document::parse(name, format, text) {
            Ok(doc) => docs.push(doc),
            Err(e) => broken.push(e),
        }
    }
    let mut t = translate(&docs, options);
    t.broken.extend(broken);
    t
}

/// The routes of the documents taken together.
pub fn translate(docs: &[Document], options: &Options) -> Translation {
    let mut t = Translation::default();
    for doc in docs {
        certificates(doc, &mut t);
        top_level(doc, &mut t);
    }
    for section in [Section::Http, Section::Tcp, Section::Udp] {
        let routers = Table::collect(docs, section.key(), "routers");
        let services = Table::collect(docs, section.key(), "services");
        let middlewares = Table::collect(docs, section.key(), "middlewares");
        for (name, declared) in &routers.items {
            let origin = Origin {
                file: declared.doc.file.clone(),
                line: declared
                    .doc
                    .line_of(&[section.key(), "routers", name.as_str()]),
                section,
                router: name.clone(),
            };
            if let Some(files) = routers.twice.get(name) {
                t.refused.push(Refused {
                    origin,
                    reason: format!(
                        "router `{name}` is declared differently in {}: Traefik serves neither",
                        files.join(" and ")
                    ),
                });
                continue;
            }
            let services_get = |n: &str| services.get(n);
            let middlewares_get = |n: &str| middlewares.get(n);
            let twice_note = |n: &str, what: &str, table: &Table| -> Option<String> {
                let local = service::local_name(n, what).ok()?;
                table.twice.get(local).map(|files| {
                    format!(
                        "{what} `{local}` is declared differently in {}: Traefik serves neither",
                        files.join(" and ")
                    )
                })
            };
            let ctx = Context {
                options,
                services: service::Services {
                    section: section.key(),
                    get: &services_get,
                },
                middlewares: &middlewares_get,
            };
            let result = match section {
                Section::Http => ctx.http(name, declared.value),
                Section::Tcp => ctx.tcp(name, declared.value),
                Section::Udp => ctx.udp(name, declared.value),
            };
            match result {
                Ok(Outcome::Routes(routes)) => {
                    for route in routes {
                        t.routes.push(Carried {
                            origin: origin.clone(),
                            route,
                        });
                    }
                }
                Ok(Outcome::Covered(why)) => t.covered.push((origin, why)),
                Err(reason) => {
                    // A reference to a name declared twice says so rather than "not declared".
                    let referenced = declared
                        .value
                        .get("service")
                        .and_then(Value::as_str)
                        .and_then(|s| twice_note(s, "service", &services))
                        .or_else(|| {
                            declared
                                .value
                                .get("middlewares")
                                .and_then(Value::as_array)
                                .into_iter()
                                .flatten()
                                .filter_map(Value::as_str)
                                .find_map(|m| twice_note(m, "middleware", &middlewares))
                        });
                    t.refused.push(Refused {
                        origin,
                        reason: referenced.unwrap_or(reason),
                    });
                }
            }
        }
    }
    dedupe(&mut t);
    t
}

/// Top-level keys other than the four sections are refused by name (a misspelt `http` would
/// otherwise leave its routers silently unread).
fn top_level(doc: &Document, t: &mut Translation) {
    let Some(map) = doc.value.as_object() else {
        return;
    };
    for key in map.keys() {
        if !["http", "tcp", "udp", "tls"]
            .iter()
            .any(|k| k.eq_ignore_ascii_case(key))
        {
            t.broken.push(ParseError {
                file: doc.file.clone(),
                line: doc.line_of(&[key.as_str()]),
                message: format!("`{key}` is not a section of Traefik's dynamic configuration (http, tcp, udp, tls)"),
            });
        }
    }
}

fn certificates(doc: &Document, t: &mut Translation) {
    let Some(list) = get_ci(&doc.value, "tls")
        .and_then(|tls| get_ci(tls, "certificates"))
        .and_then(Value::as_array)
    else {
        return;
    };
    let line = doc.line_of(&["tls", "certificates"]);
    for item in list {
        let cert = get_ci(item, "certFile").and_then(Value::as_str);
        let key = get_ci(item, "keyFile").and_then(Value::as_str);
        match (cert, key) {
            (Some(cert), Some(key)) if !cert.contains("-----BEGIN") && !key.contains("-----BEGIN") => {
                t.certificates.push(CertificatePair {
                    file: doc.file.clone(),
                    line,
                    cert_file: cert.to_owned(),
                    key_file: key.to_owned(),
                })
            }
            _ => t.broken.push(ParseError {
                file: doc.file.clone(),
                line,
                // The key itself is never quoted: it may be written inline.
                message: "a `tls.certificates` entry needs `certFile` and `keyFile` paths (inline PEM is not carried)".into(),
            }),
        }
    }
}

/// Two routers that would be one sozu frontend: the one Traefik prefers (the higher priority,
/// then the longer rule, as Traefik's own default priority is the rule's length) is kept.
fn dedupe(t: &mut Translation) {
    let mut routes = std::mem::take(&mut t.routes);
    routes.sort_by(|a, b| {
        let p = |c: &Carried| {
            c.route
                .get("__priority")
                .and_then(Value::as_i64)
                .unwrap_or(0)
        };
        p(b).cmp(&p(a)).then_with(|| a.origin.cmp(&b.origin))
    });
    let mut seen: HashMap<String, Origin> = HashMap::new();
    let mut refused_routers = std::collections::HashSet::new();
    for route in routes {
        match seen.get(&route.key()) {
            Some(first) if *first != route.origin => {
                if refused_routers.insert(route.origin.clone()) {
                    t.refused.push(Refused {
                        origin: route.origin.clone(),
                        reason: format!(
                            "it matches what {first} matches, which Traefik prefers (its priority is higher)"
                        ),
                    });
                }
            }
            Some(_) => {}
            None => {
                seen.insert(route.key(), route.origin.clone());
                t.routes.push(route);
            }
        }
    }
    precedence(t, &mut refused_routers);
    // A router is served whole or not at all: a router that lost one of its frontends is taken
    // out entirely.
    t.routes.retain(|r| !refused_routers.contains(&r.origin));
    t.routes.sort_by(|a, b| {
        a.host()
            .cmp(b.host())
            .then_with(|| a.origin.cmp(&b.origin))
            .then_with(|| a.key().cmp(&b.key()))
    });
    t.refused.sort_by(|a, b| a.origin.cmp(&b.origin));
}

#[cfg(test)]
mod tests;
