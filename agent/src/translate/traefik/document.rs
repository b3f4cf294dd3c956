//! A Traefik dynamic configuration file read as one tree, whatever it was written in (YAML,
//! TOML, JSON, as Traefik's file provider takes them by extension and its HTTP provider takes
//! YAML or JSON), and the line a name is declared on.
//!
//! Pure: text in. The parsers give a line for a syntax error; for a router or a service the
//! parsers give none (serde's trees carry no positions), so [`Document::line_of`] finds the line
//! its key is written on by reading the text the way each format declares a key.

use serde_json::Value;

/// How a file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Toml,
    Json,
}

impl Format {
    /// Whether Traefik's file provider reads a file of a directory: `.yml`, `.yaml` and
    /// `.toml` only (Traefik 3.7 logs "Skipping file, unsupported extension" for a `.json`).
    pub fn read_from_directory(name: &str) -> bool {
        matches!(Format::of(name), Some(Format::Yaml | Format::Toml))
    }

    /// A file's format by its extension: YAML, TOML, or JSON (what an HTTP provider answers,
    /// saved to a file).
    pub fn of(name: &str) -> Option<Format> {
        let lower = name.to_ascii_lowercase();
        if lower.ends_with(".yaml") || lower.ends_with(".yml") {
            Some(Format::Yaml)
        } else if lower.ends_with(".toml") {
            Some(Format::Toml)
        } else if lower.ends_with(".json") {
            Some(Format::Json)
        } else {
            None
        }
    }
}

/// A file that does not parse: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ParseError {
    pub file: String,
    pub line: Option<usize>,
    pub message: String,
}

/// One file's tree, with its text for [`Document::line_of`].
#[derive(Debug, Clone)]
pub struct Document {
    pub file: String,
    pub format: Format,
    pub text: String,
    /// `text` in ASCII lowercase (same byte offsets), where keys are looked for.
    lower: String,
    /// The byte offset of each `\n`, for [`Document::line_at`].
    newlines: Vec<usize>,
    pub value: Value,
}

/// The largest document read: a configuration of ten thousand routers is a few megabytes.
pub const MAX_DOCUMENT_BYTES: usize = 64 * 1024 * 1024;

impl Document {
    /// Parses `text`; an empty file (Traefik's own reading of one) is an empty configuration.
    pub fn parse(file: &str, format: Format, text: &str) -> Result<Document, ParseError> {
        let fail = |line: Option<usize>, message: String| ParseError {
            file: file.to_owned(),
            line,
            message,
        };
        if text.len() > MAX_DOCUMENT_BYTES {
            return Err(fail(
                None,
                format!("larger than {MAX_DOCUMENT_BYTES} bytes"),
            ));
        }
        let value = if text.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            match format {
                Format::Yaml => serde_norway::from_str::<Value>(text).map_err(|e| {
                    fail(
                        e.location().map(|l| l.line()),
                        strip_location(&e.to_string()),
                    )
                })?,
                Format::Json => serde_json::from_str::<Value>(text)
                    .map_err(|e| fail(Some(e.line()), strip_location(&e.to_string())))?,
                Format::Toml => toml::from_str::<Value>(text).map_err(|e| {
                    let line = e.span().map(|span| {
                        // Bytes, not a `str` slice: a span need not fall on a character boundary.
                        let before = &text.as_bytes()[..span.start.min(text.len())];
                        before.iter().filter(|b| **b == b'\n').count() + 1
                    });
                    fail(line, e.message().to_owned())
                })?,
            }
        };
        let value = match value {
            Value::Null => Value::Object(Default::default()),
            Value::Object(map) => Value::Object(map),
            other => {
                return Err(fail(
                    Some(1),
                    format!(
                        "expected a configuration (a mapping with `http`, `tcp`, `udp` or `tls`), got {}",
                        kind(&other)
                    ),
                ))
            }
        };
        Ok(Document {
            file: file.to_owned(),
            format,
            text: text.to_owned(),
            lower: text.to_ascii_lowercase(),
            newlines: text.match_indices('\n').map(|(at, _)| at).collect(),
            value,
        })
    }

    /// The line (from 1) of the byte at `offset`.
    fn line_at(&self, offset: usize) -> usize {
        self.newlines.partition_point(|&n| n < offset) + 1
    }

    /// The line where the key at `path` (`["http", "routers", "orca-web"]`) is written, when it
    /// can be told: each key is looked for after the one before it.
    pub fn line_of(&self, path: &[&str]) -> Option<usize> {
        match self.format {
            Format::Toml => self.toml_line(path),
            Format::Yaml | Format::Json => {
                let mut from = 0;
                let mut line = None;
                for key in path {
                    let (at, found) = self.find_key(from, key)?;
                    from = at;
                    line = Some(found);
                }
                line
            }
        }
    }

    /// YAML and JSON: the key (bare or quoted) followed by `:`, where a key may start (the
    /// line's start, after `{`, `,`, `- ` or blanks), from the byte `from` on; the byte after it
    /// and its line.
    fn find_key(&self, from: usize, key: &str) -> Option<(usize, usize)> {
        // Traefik folds the case of keys; ASCII lowercase keeps every byte where it was.
        let text = self.lower.as_str();
        let key = key.to_ascii_lowercase();
        let forms = [format!("\"{key}\""), format!("'{key}'"), key.clone()];
        let mut best: Option<usize> = None;
        for form in &forms {
            let mut at = from;
            // Only before the best found so far: one router's lookup reads the text once, not
            // once per form (a thousand routers in one answer are a few hundred kilobytes).
            let until = |best: Option<usize>| best.map_or(text.len(), |b| b.min(text.len()));
            while let Some(found) = text
                .get(at..until(best))
                .and_then(|rest| rest.find(form.as_str()))
            {
                let start = at + found;
                let end = start + form.len();
                let before = text[..start].chars().next_back();
                let starts_key = matches!(before, None | Some('{' | ',' | ' ' | '\t' | '\n' | '-'));
                let after = text[end..].trim_start_matches([' ', '\t']);
                if starts_key && after.starts_with(':') {
                    best = Some(best.map_or(start, |b| b.min(start)));
                    break;
                }
                at = end;
            }
        }
        let start = best?;
        Some((start + key.len(), self.line_at(start)))
    }

    /// TOML: a table header naming the path (`[http.routers.orca-web]`, quoted or not), or the
    /// last key written as `name = …` inside the table of the keys before it.
    fn toml_line(&self, path: &[&str]) -> Option<usize> {
        let dotted = |keys: &[&str]| -> Vec<String> {
            let mut forms = vec![keys.join(".")];
            forms.push(
                keys.iter()
                    .map(|k| format!("\"{k}\""))
                    .collect::<Vec<_>>()
                    .join("."),
            );
            if let Some((last, head)) = keys.split_last() {
                let mut quoted_last = head.join(".");
                if !quoted_last.is_empty() {
                    quoted_last.push('.');
                }
                quoted_last.push_str(&format!("\"{last}\""));
                forms.push(quoted_last);
            }
            forms
        };
        let lines: Vec<&str> = self.text.lines().collect();
        for form in dotted(path) {
            for (index, line) in lines.iter().enumerate() {
                let t = line.trim();
                if t.strip_prefix('[')
                    .and_then(|r| r.trim_start_matches('[').strip_suffix(']'))
                    .map(|r| r.trim_end_matches(']').trim())
                    == Some(form.as_str())
                {
                    return Some(index + 1);
                }
            }
        }
        let (last, head) = path.split_last()?;
        let mut in_table = head.is_empty();
        let heads = dotted(head);
        for (index, line) in lines.iter().enumerate() {
            let t = line.trim();
            if t.starts_with('[') {
                let name = t.trim_matches(|c| c == '[' || c == ']').trim();
                in_table = heads.iter().any(|h| h == name);
                continue;
            }
            if in_table {
                for key in [last.to_string(), format!("\"{last}\"")] {
                    if let Some(rest) = t.strip_prefix(key.as_str()) {
                        if rest.trim_start().starts_with('=') {
                            return Some(index + 1);
                        }
                    }
                }
            }
        }
        None
    }
}

/// serde's messages end with ` at line L column C`, which [`ParseError`] says its own way.
fn strip_location(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(at) => message[..at].to_owned(),
        None => message.to_owned(),
    }
}

/// A value's kind in a message.
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORCA: &str = "http:\n  routers:\n    orca-web:\n      rule: PathPrefix(\"/web\")\n      service: orca-web\n  services:\n    orca-web:\n      loadBalancer:\n        servers:\n          - url: \"unix:///run/orca/a.sock\"\n";

    #[test]
    fn yaml_keys_are_found_on_their_lines() {
        let doc = Document::parse("orca-web.yaml", Format::Yaml, ORCA).unwrap();
        assert_eq!(doc.line_of(&["http", "routers", "orca-web"]), Some(3));
        assert_eq!(doc.line_of(&["http", "services", "orca-web"]), Some(7));
    }

    #[test]
    fn json_and_toml_keys_are_found_on_their_lines() {
        let json = "{\n  \"http\": {\n    \"routers\": {\n      \"a\": {\"rule\": \"Host(`a`)\"},\n      \"b\": {\"rule\": \"Host(`b`)\"}\n    }\n  }\n}\n";
        let doc = Document::parse("c.json", Format::Json, json).unwrap();
        assert_eq!(doc.line_of(&["http", "routers", "b"]), Some(5));
        let toml = "[http.routers.a]\nrule = \"Host(`a`)\"\n\n[http.routers.\"b-c\"]\nrule = \"Host(`b`)\"\n";
        let doc = Document::parse("c.toml", Format::Toml, toml).unwrap();
        assert_eq!(doc.line_of(&["http", "routers", "b-c"]), Some(4));
        let inline = "[http.routers]\nx = { rule = \"Host(`x`)\" }\n";
        let doc = Document::parse("d.toml", Format::Toml, inline).unwrap();
        assert_eq!(doc.line_of(&["http", "routers", "x"]), Some(2));
    }

    #[test]
    fn syntax_errors_name_their_line() {
        let e =
            Document::parse("a.yaml", Format::Yaml, "http:\n  routers:\n    a: [\n").unwrap_err();
        assert_eq!(e.file, "a.yaml");
        assert!(e.line.is_some(), "{e}");
        let e = Document::parse("a.json", Format::Json, "{\n\"http\": }\n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        let e = Document::parse("a.toml", Format::Toml, "[http]\nx = \n").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        let e = Document::parse("a.yaml", Format::Yaml, "- 1\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("a.yaml:1: expected a configuration"),
            "{e}"
        );
    }

    #[test]
    fn an_empty_file_is_an_empty_configuration() {
        let doc = Document::parse("e.yaml", Format::Yaml, "\n").unwrap();
        assert_eq!(doc.value, Value::Object(Default::default()));
    }
}
