//! A [`Translation`] written as workspace text: a Nickel record `check` reads, each route under a
//! comment naming where it comes from, and a comment for each thing left out and why.

use std::fmt::Write;

use super::{HeaderEdits, HeaderTest, Kind, PathMatch, Route, Scheme, Translation};

/// A Nickel string literal: `"` and `\` escaped, `%` too (`%{` would open an interpolation),
/// control characters as escapes.
pub fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '%' => out.push_str("\\%"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A comment's text on one line (a value quoted from the input cannot end the comment early).
fn comment(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// The workspace text.
pub fn workspace(t: &Translation) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Written by `private-ingress {}` from {}.",
        t.command,
        comment(&t.files.join(", "))
    );
    for note in &t.notes {
        let _ = writeln!(out, "# {}", comment(note));
    }
    if !t.left_out.is_empty() {
        let _ = writeln!(out, "#\n# Left out ({}):", t.left_out.len());
        for left in &t.left_out {
            let _ = writeln!(out, "# - {}", comment(&left.to_string()));
        }
    }
    out.push_str("{\n");
    let _ = writeln!(out, "  zone = {},", string(&t.zone));
    let _ = writeln!(out, "  cluster_issuer = {},", string(&t.cluster_issuer));
    if let Some(sources) = &t.allowed_sources {
        let list: Vec<String> = sources.iter().map(|s| string(s)).collect();
        let _ = writeln!(out, "  allowed_sources = [{}],", list.join(", "));
    }
    out.push_str("  routes = [\n");
    for route in &t.routes {
        let _ = writeln!(out, "    # {}", comment(&route.origin.to_string()));
        if let Some(note) = &route.note {
            let _ = writeln!(out, "    # ({})", comment(note));
        }
        let _ = writeln!(out, "    {},", route_record(route));
    }
    out.push_str("  ],\n}\n");
    out
}

fn route_record(route: &Route) -> String {
    let mut fields: Vec<String> = vec![format!("host = {}", string(&route.host))];
    match &route.kind {
        Kind::Https(http) => {
            match &http.path {
                PathMatch::Prefix(p) if p == "/" => {}
                PathMatch::Prefix(p) => fields.push(format!("path_prefix = {}", string(p))),
                PathMatch::SegmentPrefix(p) => {
                    fields.push(format!("path_segment_prefix = {}", string(p)))
                }
                PathMatch::Exact(p) => fields.push(format!("path_exact = {}", string(p))),
                PathMatch::Regex(p) => fields.push(format!("path_regex = {}", string(p))),
            }
            if let Some(method) = &http.method {
                fields.push(format!("method = {}", string(method)));
            }
            if !http.match_headers.is_empty() {
                let predicates: Vec<String> = http
                    .match_headers
                    .iter()
                    .map(|m| {
                        let test = match &m.test {
                            HeaderTest::Exact(v) => format!("exact = {}", string(v)),
                            HeaderTest::Regex(v) => format!("regex = {}", string(v)),
                            HeaderTest::Present => "present = true".into(),
                        };
                        format!("{{ name = {}, {test} }}", string(&m.name))
                    })
                    .collect();
                fields.push(format!("match_headers = [{}]", predicates.join(", ")));
            }
            if let Some(r) = &http.redirect {
                let mut parts = Vec::new();
                if r.status != 301 {
                    parts.push(format!("status = {}", r.status));
                }
                match r.scheme {
                    Scheme::Https => {}
                    Scheme::Http => parts.push("scheme = 'http".into()),
                    Scheme::Same => parts.push("scheme = 'same".into()),
                }
                if let Some(host) = &r.host {
                    parts.push(format!("host = {}", string(host)));
                }
                if let Some(path) = &r.path {
                    parts.push(format!("path = {}", string(path)));
                }
                if let Some(port) = r.port {
                    parts.push(format!("port = {port}"));
                }
                fields.push(format!("redirect = {{ {} }}", parts.join(", ")));
            }
            if let Some(path) = &http.rewrite_path {
                fields.push(format!("rewrite = {{ path = {} }}", string(path)));
            }
            let mut headers = Vec::new();
            for (direction, edits) in [
                ("request", &http.request_headers),
                ("response", &http.response_headers),
            ] {
                if !edits.is_empty() {
                    headers.push(format!("{direction} = {}", edits_record(edits)));
                }
            }
            if !headers.is_empty() {
                fields.push(format!("headers = {{ {} }}", headers.join(", ")));
            }
            if let Some(auth) = &http.basic_auth {
                let realm = auth
                    .realm
                    .as_ref()
                    .map(|r| format!(", realm = {}", string(r)))
                    .unwrap_or_default();
                fields.push(format!(
                    "basic_auth = {{ users_file = {}{realm} }}",
                    string(&auth.users_file)
                ));
            }
            if http.h2c {
                fields.push("upstream_protocol = 'h2c".into());
            }
        }
        Kind::Tcp { listen_port } => {
            fields.push(format!("protocol = 'tcp, listen_port = {listen_port}"))
        }
        Kind::TlsPassthrough { listen_port } => fields.push(format!(
            "protocol = 'tls_passthrough, listen_port = {listen_port}"
        )),
        Kind::Udp { listen_port } => {
            fields.push(format!("protocol = 'udp, listen_port = {listen_port}"))
        }
    }
    match route.upstreams.as_slice() {
        [] => {}
        [one] if one.weight == 1 => {
            fields.push(format!("upstream = {}", string(&one.host)));
            fields.push(format!("port = {}", one.port));
        }
        several => {
            let list: Vec<String> = several
                .iter()
                .map(|u| {
                    let weight = if u.weight == 1 {
                        String::new()
                    } else {
                        format!(", weight = {}", u.weight)
                    };
                    format!(
                        "{{ upstream = {}, port = {}{weight} }}",
                        string(&u.host),
                        u.port
                    )
                })
                .collect();
            fields.push(format!("upstreams = [{}]", list.join(", ")));
        }
    }
    format!("{{ {} }}", fields.join(", "))
}

fn edits_record(edits: &HeaderEdits) -> String {
    let mut parts = Vec::new();
    if !edits.set.is_empty() {
        let set: Vec<String> = edits
            .set
            .iter()
            .map(|(k, v)| format!("{} = {}", string(k), string(v)))
            .collect();
        parts.push(format!("set = {{ {} }}", set.join(", ")));
    }
    if !edits.remove.is_empty() {
        let remove: Vec<String> = edits.remove.iter().map(|n| string(n)).collect();
        parts.push(format!("remove = [{}]", remove.join(", ")));
    }
    format!("{{ {} }}", parts.join(", "))
}
