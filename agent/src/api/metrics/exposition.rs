//! The text exposition format's pieces: a family's header, a sample with its labels, a label
//! value escaped.

use std::fmt::Write as _;

/// A gauge of one sample, with its header.
pub(super) fn gauge(out: &mut String, name: &str, help: &str, value: i64) {
    header(out, name, "gauge", help);
    sample(out, name, &[], value);
}

/// A family's `# HELP` and `# TYPE` lines.
pub(super) fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One sample; labels in the order given (sorted by name, as exposition readers expect, but
/// for a histogram's `le`, last by custom).
pub(super) fn sample(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    value: impl std::fmt::Display,
) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (label, value)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(label);
            out.push_str("=\"");
            escape(out, value);
            out.push('"');
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// A label value as the text format quotes it: backslash, double quote and line feed escaped.
pub(super) fn escape(out: &mut String, value: &str) {
    // Most values (hosts, routes, fingerprints, addresses) need nothing escaped: copied whole,
    // not a character at a time (a scrape at 10,000 routes writes hundreds of thousands).
    if !value.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.push_str(value);
        return;
    }
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}
