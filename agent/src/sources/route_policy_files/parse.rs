//! The files route policies name, checked before sozu sees them: a basic-auth users file
//! (`user:hex(sha256(password))` lines) and an error page (a whole HTTP response with sozu's
//! template variables). A file refused here keeps its last good version in sozu, and its reason
//! names the file and the line. Pure: the caller reads the bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The largest error page taken. sozu has no bound of its own below its command buffer (2 MB),
/// but a page is sent with its cluster and kept by every worker for every route that names it.
pub const MAX_PAGE_BYTES: usize = 64 * 1024;

/// The largest users file taken.
pub const MAX_USERS_BYTES: usize = 1024 * 1024;

/// The hashes of a users file, in file order. Blank lines and lines starting with `#` are
/// skipped. The reason for a refusal names the line and quotes nothing of it: a users file is
/// a credential, and a workspace may name any file the agent can read as one
/// (docs/security.md).
pub fn parse_users(bytes: &[u8], path: &Path) -> Result<Vec<String>, String> {
    let at = |line: usize| format!("{}:{line}", path.display());
    if bytes.len() > MAX_USERS_BYTES {
        return Err(format!(
            "{}: larger than {MAX_USERS_BYTES} bytes",
            path.display()
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let line = bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        format!("{}: not UTF-8 text", at(line + 1))
    })?;
    let mut users = BTreeMap::new();
    let mut hashes = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((user, hash)) = line.split_once(':') else {
            return Err(format!(
                "{}: expected `user:sha256`, the user and the lowercase hex SHA-256 of the \
                 password (`just basic-auth-user NAME FILE` writes one)",
                at(n + 1)
            ));
        };
        if user.is_empty() || user.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "{}: the user name is empty or holds whitespace",
                at(n + 1)
            ));
        }
        let hex = hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !hex {
            return Err(format!(
                "{}: the hash is not a SHA-256 (64 lowercase hex digits)",
                at(n + 1)
            ));
        }
        if let Some(first) = users.insert(user.to_owned(), n + 1) {
            return Err(format!(
                "{}: the user of line {first} is listed again",
                at(n + 1)
            ));
        }
        hashes.push(format!("{user}:{hash}"));
    }
    if hashes.is_empty() {
        // Also what a file being written looks like, truncated before its lines arrive.
        return Err(format!(
            "{}: no user: basic auth needs at least one `user:sha256` line",
            path.display()
        ));
    }
    Ok(hashes)
}

/// sozu's template variables and the statuses whose page may use each (sozu 2.3.3,
/// `kawa_h1/answers.rs`); `header` tells whether it may be a header's value, `body` whether it
/// may stand in the body.
struct Variable {
    name: &'static str,
    statuses: &'static [u16],
    header: bool,
    body: bool,
    once: bool,
}

const ALL: &[u16] = &[400, 401, 404, 408, 413, 421, 429, 502, 503, 504, 507];

const VARIABLES: &[Variable] = &[
    Variable {
        name: "REQUEST_ID",
        statuses: ALL,
        header: true,
        body: true,
        once: false,
    },
    Variable {
        name: "ROUTE",
        statuses: ALL,
        header: true,
        body: true,
        once: false,
    },
    Variable {
        name: "CLUSTER_ID",
        statuses: &[429, 502, 503, 504, 507],
        header: true,
        body: true,
        once: false,
    },
    Variable {
        name: "BACKEND_ID",
        statuses: &[502, 503, 504, 507],
        header: true,
        body: true,
        once: false,
    },
    Variable {
        name: "DURATION",
        statuses: &[408, 504],
        header: true,
        body: true,
        once: false,
    },
    Variable {
        name: "CAPACITY",
        statuses: &[413, 507],
        header: true,
        body: true,
        once: false,
    },
    Variable {
        name: "PHASE",
        statuses: &[400, 413, 502, 507],
        header: true,
        body: true,
        once: false,
    },
    Variable {
        name: "MESSAGE",
        statuses: &[400, 401, 404, 408, 413, 421, 429, 502, 503, 504, 507],
        header: false,
        body: true,
        once: true,
    },
    Variable {
        name: "SUCCESSFULLY_PARSED",
        statuses: &[400, 502],
        header: false,
        body: true,
        once: true,
    },
    Variable {
        name: "PARTIALLY_PARSED",
        statuses: &[400, 502],
        header: false,
        body: true,
        once: true,
    },
    Variable {
        name: "INVALID",
        statuses: &[400, 502],
        header: false,
        body: true,
        once: true,
    },
    Variable {
        name: "WWW_AUTHENTICATE",
        statuses: &[401],
        header: true,
        body: false,
        once: true,
    },
    Variable {
        name: "RETRY_AFTER",
        statuses: &[429],
        header: true,
        body: false,
        once: true,
    },
];

/// The page as sozu is sent it (line ends as CRLF), or why it is refused.
pub fn parse_page(bytes: &[u8], path: &Path, status: u16) -> Result<String, String> {
    let file = path.display();
    if bytes.len() > MAX_PAGE_BYTES {
        return Err(format!(
            "{file}: {} bytes, larger than the {MAX_PAGE_BYTES} an error page may hold",
            bytes.len()
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| format!("{file}: not UTF-8 text"))?;
    let text = text.replace("\r\n", "\n");
    let Some((head, body)) = text.split_once("\n\n") else {
        return Err(format!(
            "{file}: not an HTTP response: no blank line after the status line and headers"
        ));
    };
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (version, code) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    if !matches!(version, "HTTP/1.1" | "HTTP/1.0") {
        return Err(format!(
            "{file}:1: expected a status line such as `HTTP/1.1 {status} …`"
        ));
    }
    if code != status.to_string() {
        return Err(format!(
            "{file}:1: the page of {status} answers `{code}`: sozu sends a page for its own \
             status only"
        ));
    }
    let mut used = BTreeSet::new();
    let mut content_length = 0;
    let mut kept = vec![status_line];
    for (n, line) in lines.enumerate() {
        let line_no = n + 2;
        let Some((name, value)) = line.split_once(':') else {
            return Err(format!("{file}:{line_no}: expected a header `Name: value`"));
        };
        let name = name.trim();
        let value = value.trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(format!("{file}:{line_no}: `{name}` is not a header name"));
        }
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(format!(
                "{file}:{line_no}: sozu sends a page whole: `Transfer-Encoding` is refused"
            ));
        }
        if name.eq_ignore_ascii_case("content-length") {
            content_length += 1;
            if content_length > 1 {
                return Err(format!("{file}:{line_no}: a second `Content-Length`"));
            }
            continue;
        }
        kept.push(line);
        if let Some(var) = value.strip_prefix('%') {
            if let Some(v) = VARIABLES.iter().find(|v| v.name == var) {
                check_variable(v, status, true, &mut used)
                    .map_err(|e| format!("{file}:{line_no}: {e}"))?;
            }
        } else if let Some(var) = variables_in(value).next() {
            if VARIABLES.iter().any(|v| v.name == var) {
                return Err(format!(
                    "{file}:{line_no}: `%{var}` in a header must be its whole value"
                ));
            }
        }
    }
    let body_line = head.lines().count() + 2;
    for var in variables_in(body) {
        if let Some(v) = VARIABLES.iter().find(|v| v.name == var) {
            check_variable(v, status, false, &mut used)
                .map_err(|e| format!("{file}:{body_line}: {e}"))?;
        }
    }
    Ok(framed(&kept, body))
}

/// The page as sozu is sent it: line ends as CRLF (sozu makes them so, body included) and a
/// `Content-Length` of the body, in place of any the page gave. sozu sends a page without one
/// as it is, and a client kept alive then waits for the end of a body that never comes; given
/// one, sozu sets its value again after it fills the variables (`Template::new` in sozu
/// 2.3.3's `lib/src/protocol/kawa_h1/answers.rs`), but reads the page's body up to the value it
/// finds, so the value must be the body's length as written.
fn framed(head: &[&str], body: &str) -> String {
    let body = body.replace('\n', "\r\n");
    let mut page = String::with_capacity(body.len() + 256);
    for line in head {
        page.push_str(line);
        page.push_str("\r\n");
    }
    page.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    page.push_str(&body);
    page
}

fn check_variable(
    v: &Variable,
    status: u16,
    header: bool,
    used: &mut BTreeSet<&'static str>,
) -> Result<(), String> {
    if !v.statuses.contains(&status) {
        return Err(format!("sozu fills `%{}` on no {status} page", v.name));
    }
    if header && !v.header {
        return Err(format!("`%{}` may stand in the body only", v.name));
    }
    if !header && !v.body {
        return Err(format!("`%{}` may be a header's value only", v.name));
    }
    if !used.insert(v.name) && v.once {
        return Err(format!("`%{}` may be used once", v.name));
    }
    Ok(())
}

/// The names after each `%` in `text`: upper-case letters and `_`.
fn variables_in(text: &str) -> impl Iterator<Item = &str> {
    text.match_indices('%').filter_map(move |(i, _)| {
        let rest = &text[i + 1..];
        let end = rest
            .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
            .unwrap_or(rest.len());
        (end > 0).then(|| &rest[..end])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path() -> &'static Path {
        Path::new("/pages/users")
    }

    #[test]
    fn a_users_file_gives_its_hashes_and_a_bad_line_is_named_without_its_hash() {
        let good = format!(
            "# admins\n\nalice:{}\nbob:{}\n",
            "a".repeat(64),
            "0".repeat(64)
        );
        assert_eq!(parse_users(good.as_bytes(), path()).unwrap().len(), 2);
        let bad = format!("alice:{}\nbob:NOTAHASHsecret\n", "a".repeat(64));
        let err = parse_users(bad.as_bytes(), path()).unwrap_err();
        assert!(err.starts_with("/pages/users:2:"), "{err}");
        assert!(
            !err.contains("bob") && !err.contains("secret"),
            "a refusal quotes nothing of the line: {err}"
        );
        let twice = format!("a:{}\na:{}\n", "a".repeat(64), "b".repeat(64));
        assert_eq!(
            parse_users(twice.as_bytes(), path()).unwrap_err(),
            "/pages/users:2: the user of line 1 is listed again"
        );
        assert!(parse_users(b"alice\n", path()).unwrap_err().contains(":1:"));
        assert!(parse_users(b"", path()).unwrap_err().contains("no user"));
    }

    #[test]
    fn a_page_must_be_a_whole_response_of_its_status_with_variables_sozu_fills() {
        let page = "HTTP/1.1 503 Service Unavailable\nContent-Type: text/html\nX-Id: %REQUEST_ID\n\n<h1>down</h1> %ROUTE %CLUSTER_ID\n";
        let sent = parse_page(page.as_bytes(), path(), 503).unwrap();
        assert!(sent.starts_with("HTTP/1.1 503 Service Unavailable\r\nContent-Type"));
        let other = parse_page(page.as_bytes(), path(), 404).unwrap_err();
        assert!(other.contains(":1:") && other.contains("`503`"), "{other}");
        let no_blank = parse_page(b"HTTP/1.1 503 X\nA: b", path(), 503).unwrap_err();
        assert!(no_blank.contains("blank line"), "{no_blank}");
        let body_only = "HTTP/1.1 503 X\nX-M: %MESSAGE\n\nbody";
        assert!(parse_page(body_only.as_bytes(), path(), 503)
            .unwrap_err()
            .contains("body only"));
        let not_here = "HTTP/1.1 404 X\n\n%CLUSTER_ID";
        assert!(parse_page(not_here.as_bytes(), path(), 404)
            .unwrap_err()
            .contains("no 404 page"));
        let big = format!("HTTP/1.1 503 X\n\n{}", "x".repeat(MAX_PAGE_BYTES));
        assert!(parse_page(big.as_bytes(), path(), 503)
            .unwrap_err()
            .contains("larger"));
        let twice = "HTTP/1.1 503 X\nContent-Length: 1\ncontent-length: 1\n\nx";
        assert!(parse_page(twice.as_bytes(), path(), 503)
            .unwrap_err()
            .contains(":3: a second"));
        let chunked = "HTTP/1.1 503 X\nTransfer-Encoding: chunked\n\n";
        assert!(parse_page(chunked.as_bytes(), path(), 503)
            .unwrap_err()
            .contains(":2:"));
    }

    /// sozu sends a page as it is given, reading its body up to the `Content-Length` it finds:
    /// the page sent carries exactly one, the length of the body as sozu holds it (CRLF line
    /// ends), whatever the file said.
    #[test]
    fn a_page_is_sent_with_the_length_of_its_body() {
        let without =
            "HTTP/1.1 503 Service Unavailable\nContent-Type: text/plain\n\ndown\n%ROUTE\n";
        assert_eq!(
            parse_page(without.as_bytes(), path(), 503).unwrap(),
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n\
             Content-Length: 14\r\n\r\ndown\r\n%ROUTE\r\n"
        );
        let wrong = "HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\nX-A: b\r\n\r\nnot here";
        assert_eq!(
            parse_page(wrong.as_bytes(), path(), 404).unwrap(),
            "HTTP/1.1 404 Not Found\r\nX-A: b\r\nContent-Length: 8\r\n\r\nnot here"
        );
        let empty = "HTTP/1.1 503 X\n\n";
        assert_eq!(
            parse_page(empty.as_bytes(), path(), 503).unwrap(),
            "HTTP/1.1 503 X\r\nContent-Length: 0\r\n\r\n"
        );
    }
}
