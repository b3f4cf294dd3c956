//! A Traefik [`Translation`] written as workspace text (`import traefik`): the routes under a
//! comment naming the file, line and router each comes from, and a comment for each router not
//! carried over and why. Pure.

use std::fmt::Write;

use serde_json::Value;

use super::Translation;
use crate::translate::nickel::string;

/// The contract fields whose values are enum tags (the contract also takes them as strings; a
/// tag is how a workspace is written by hand).
const TAGS: [&str; 4] = ["protocol", "upstream_protocol", "scheme", "balancing"];

/// The workspace text.
pub fn workspace(t: &Translation, files: &[String], zone: &str, cluster_issuer: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Written by `private-ingress import traefik` from {}.",
        comment(&files.join(", "))
    );
    let _ = writeln!(
        out,
        "# Every HTTP router is served over HTTPS with its host's certificate (a pair of `certificates` that covers it, else the tls_dir's); the http listener redirects to it."
    );
    for (origin, why) in &t.covered {
        let _ = writeln!(out, "# {}: {}", comment(&origin.to_string()), comment(why));
    }
    let left = t.refused.len() + t.broken.len();
    if left > 0 {
        let _ = writeln!(out, "#\n# Not carried over ({left}):");
        for broken in &t.broken {
            let _ = writeln!(out, "# - {}", comment(&broken.to_string()));
        }
        for refused in &t.refused {
            let _ = writeln!(out, "# - {}", comment(&refused.to_string()));
        }
    }
    out.push_str("{\n");
    let _ = writeln!(out, "  zone = {},", string(zone));
    let _ = writeln!(out, "  cluster_issuer = {},", string(cluster_issuer));
    if !t.certificates.is_empty() {
        // tls.certificates, watched and served for every route host each covers. A relative
        // path is then the workspace directory's, where Traefik read it from its own.
        out.push_str("  certificates = [\n");
        for pair in &t.certificates {
            let _ = writeln!(
                out,
                "    # {}{}: tls.certificates",
                comment(&pair.file),
                pair.line.map(|l| format!(":{l}")).unwrap_or_default()
            );
            let _ = writeln!(
                out,
                "    {{ cert_file = {}, key_file = {} }},",
                string(&pair.cert_file),
                string(&pair.key_file)
            );
        }
        out.push_str("  ],\n");
    }
    out.push_str("  routes = [\n");
    for route in &t.routes {
        let _ = writeln!(out, "    # {}", comment(&route.origin.to_string()));
        let _ = writeln!(out, "    {},", record(&route.route, ""));
    }
    out.push_str("  ],\n}\n");
    out
}

/// A comment's text on one line (a value quoted from the input cannot end the comment early).
fn comment(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// A field name as Nickel takes it: bare when it is an identifier, quoted otherwise.
fn key(name: &str) -> String {
    let ident = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '\'');
    if ident
        && ![
            "let",
            "in",
            "if",
            "then",
            "else",
            "fun",
            "match",
            "rec",
            "import",
            "null",
            "true",
            "false",
            "default",
            "optional",
            "forall",
            "doc",
            "not_exported",
            "priority",
            "force",
        ]
        .contains(&name)
    {
        name.to_owned()
    } else {
        string(name)
    }
}

/// The order fields are written in, as a workspace is written by hand (others after these).
const ORDER: [&str; 28] = [
    "host",
    "protocol",
    "listen_port",
    "path_prefix",
    "path_segment_prefix",
    "path_exact",
    "path_regex",
    "method",
    "match_headers",
    "name",
    "exact",
    "regex",
    "upstream",
    "port",
    "upstreams",
    "weight",
    "drain",
    "upstream_protocol",
    "proxy_protocol",
    "status",
    "scheme",
    "path",
    "interval",
    "timeout",
    "health",
    "hsts",
    "redirect",
    "rewrite",
];

fn rank(key: &str) -> usize {
    ORDER.iter().position(|k| *k == key).unwrap_or(ORDER.len())
}

fn record(map: &serde_json::Map<String, Value>, _indent: &str) -> String {
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    entries.sort_by_key(|(k, _)| rank(k));
    let fields: Vec<String> = entries
        .into_iter()
        .map(|(k, v)| {
            let value = match v {
                Value::String(s)
                    if TAGS.contains(&k.as_str())
                        && s.chars()
                            .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit()) =>
                {
                    format!("'{s}")
                }
                other => value(other),
            };
            format!("{} = {value}", key(k))
        })
        .collect();
    format!("{{ {} }}", fields.join(", "))
}

fn value(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => string(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(value).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => record(map, ""),
    }
}
