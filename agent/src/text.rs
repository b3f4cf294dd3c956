//! Text that came from outside (a workspace's diagnostic, a file's name, a CA's error) made safe
//! to log, publish and print: control characters that a terminal would act on are shown as
//! `\u{…}` escapes, and the length is bounded. Pure.

/// The longest diagnostic kept: a report of a few dozen errors fits; a workspace cannot make the
/// agent log or serve megabytes.
pub const MAX_DIAGNOSTIC_BYTES: usize = 16 * 1024;
/// The longest one-line message kept (an error in a status table, a log field).
pub const MAX_LINE_BYTES: usize = 512;

/// `text` with every control character but line feeds and tabs escaped, cut at `max` bytes (on
/// a character boundary) with a note of how much was left out.
pub fn clean(text: &str, max: usize) -> String {
    clean_keeping(text, max, |c| c == '\n' || c == '\t')
}

/// [`clean`] for one line: line feeds escaped too.
pub fn clean_line(text: &str, max: usize) -> String {
    clean_keeping(text, max, |c| c == '\t')
}

/// A JSON document (`serde_json`'s output) with the control characters it leaves raw in its
/// strings, DEL and the C1 range (U+0080 to U+009F, U+009B being a terminal's CSI), written as
/// `\u` escapes: the same JSON to a parser, nothing for a terminal to act on. serde_json
/// escapes only U+0000 to U+001F, which are whitespace when raw (outside any string) and stay.
pub fn json_for_terminal(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_control() && u32::from(c) >= 0x7f {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// `error` and its causes on one line, each said once: `error: cause: cause's cause`. A cause
/// whose text its error already shows (many crates' errors print their source and return it too)
/// is not repeated.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let text = next.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = next.source();
    }
    out
}

fn clean_keeping(text: &str, max: usize, keep: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 16);
    for (at, c) in text.char_indices() {
        if out.len() >= max {
            out.push_str(&format!("… ({} more bytes)", text.len() - at));
            return out;
        }
        if c.is_control() && !keep(c) {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// Unix seconds as `YYYY-MM-DD HH:MMZ` (UTC), or the number when out of range: how `status`,
/// `top` and the events write a moment.
pub fn date_time(unix: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(unix) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute()
        ),
        Err(_) => unix.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_escapes_are_shown_not_acted_on() {
        let planted = "zone \u{1b}]0;owned\u{7}\u{1b}[2J ok\nnext\tline\r";
        let shown = clean(planted, 100);
        assert!(!shown
            .chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t'));
        assert!(shown.contains("\\u{1b}]0;owned"), "{shown}");
        assert!(shown.contains("ok\nnext\tline\\u{d}"), "{shown}");
        assert_eq!(clean_line("a\nb", 10), "a\\u{a}b");
    }

    /// An error that prints its cause and returns it as its source too.
    #[derive(Debug)]
    struct Both(std::io::Error);

    impl std::fmt::Display for Both {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot write out.json: {}", self.0)
        }
    }

    impl std::error::Error for Both {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let missing = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory");
        assert_eq!(
            error_chain(&Both(missing())),
            "cannot write out.json: no such directory"
        );
        let chained = anyhow::Error::new(missing()).context("cannot read the workspace");
        assert_eq!(
            error_chain(chained.as_ref()),
            "cannot read the workspace: no such directory"
        );
    }

    #[test]
    fn json_keeps_its_meaning_and_loses_its_c1_controls() {
        let value = serde_json::json!({ "subject": "CN=a\u{9b}2Jb\u{7f}\u{1b}[0m", "n": [1, 2] });
        let raw = serde_json::to_string_pretty(&value).unwrap();
        assert!(raw.contains('\u{9b}'), "serde_json leaves it raw: {raw}");
        let shown = json_for_terminal(&raw);
        assert!(
            !shown
                .chars()
                .any(|c| c.is_control() && !c.is_ascii_whitespace()),
            "{shown}"
        );
        assert!(shown.contains("\\u009b2Jb\\u007f\\u001b[0m"), "{shown}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&shown).unwrap(),
            value
        );
    }

    #[test]
    fn long_text_is_cut_on_a_character_boundary() {
        let long = "é".repeat(100);
        let cut = clean(&long, 11);
        assert!(cut.starts_with(&"é".repeat(6)), "{cut}");
        assert!(cut.ends_with("(188 more bytes)"), "{cut}");
        assert_eq!(clean("short", 100), "short");
    }
}
