//! Traefik's router rules (the v3 syntax): `Host(`a`) && (PathPrefix(`/x`) || Method(`GET`))`,
//! parsed into a tree and expanded into the alternatives sozu can hold, one frontend each.
//!
//! Pure: a rule's text in, [`Alternative`]s or a [`RuleError`] out. The grammar is Traefik's own
//! (`pkg/muxer/http` and `pkg/muxer/tcp`, read through `vulcand/predicate`, which scans with Go's
//! `text/scanner`): a matcher is a name and a parenthesised list of string literals, quoted with
//! backticks (raw) or double quotes (Go escapes); `&&` binds tighter than `||`; `!` negates.
//! sozu 2.3.3 matches a conjunction (a host, one path rule, a method, header predicates), so a
//! disjunction becomes several frontends and a negation cannot be carried: it is refused, never
//! dropped, since dropping it would serve what the rule excludes.

use std::fmt;

/// One matcher as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    pub name: String,
    pub args: Vec<String>,
}

/// A rule's tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    Matcher(Matcher),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
}

/// Why a rule is not carried. The message quotes the rule's own words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RuleError(pub String);

fn err<T>(message: impl Into<String>) -> Result<T, RuleError> {
    Err(RuleError(message.into()))
}

/// More frontends than this from one rule is a rule written to be matched by a regular
/// expression, not one sozu should hold as a product of alternatives.
pub const MAX_ALTERNATIVES: usize = 64;

/// The longest rule read: Traefik sets none, but a rule is one line of a file.
pub const MAX_RULE_LEN: usize = 16 * 1024;

/// How deeply parentheses and operators may nest before a rule is refused (a recursive parser
/// on input from a file or an endpoint must not exhaust the stack).
const MAX_DEPTH: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Str(String),
    LParen,
    RParen,
    Comma,
    And,
    Or,
    Not,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Ident(name) => write!(f, "`{name}`"),
            Token::Str(_) => f.write_str("a string"),
            Token::LParen => f.write_str("`(`"),
            Token::RParen => f.write_str("`)`"),
            Token::Comma => f.write_str("`,`"),
            Token::And => f.write_str("`&&`"),
            Token::Or => f.write_str("`||`"),
            Token::Not => f.write_str("`!`"),
        }
    }
}

fn lex(rule: &str) -> Result<Vec<Token>, RuleError> {
    let mut tokens = Vec::new();
    let mut chars = rule.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '(' => tokens.push(Token::LParen),
            ')' => tokens.push(Token::RParen),
            ',' => tokens.push(Token::Comma),
            '!' => tokens.push(Token::Not),
            '&' | '|' => match chars.next() {
                Some((_, d)) if d == c => {
                    tokens.push(if c == '&' { Token::And } else { Token::Or })
                }
                _ => return err(format!("a lone `{c}` at character {}: write `{c}{c}`", at + 1)),
            },
            '`' => {
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some((_, '`')) => break,
                        Some((_, c)) => s.push(c),
                        None => return err("a string opened with ` is not closed"),
                    }
                }
                tokens.push(Token::Str(s));
            }
            '"' => {
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some((_, '"')) => break,
                        Some((_, '\\')) => match chars.next() {
                            Some((_, 'n')) => s.push('\n'),
                            Some((_, 't')) => s.push('\t'),
                            Some((_, 'r')) => s.push('\r'),
                            Some((_, c @ ('\\' | '"' | '\''))) => s.push(c),
                            Some((_, c)) => {
                                return err(format!(
                                    "the escape `\\{c}` in a double-quoted string is not carried; quote the value with backticks"
                                ))
                            }
                            None => return err("a string opened with \" is not closed"),
                        },
                        Some((_, c)) => s.push(c),
                        None => return err("a string opened with \" is not closed"),
                    }
                }
                tokens.push(Token::Str(s));
            }
            '\'' => {
                return err(
                    "a value quoted with ' (Traefik reads it as a Go character, not a string): quote it with backticks",
                )
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut name = String::from(c);
                while let Some((_, d)) = chars.peek() {
                    if d.is_ascii_alphanumeric() || *d == '_' {
                        name.push(*d);
                        chars.next();
                    } else {
                        break;
                    }
                }
                tokens.push(Token::Ident(name));
            }
            c => {
                return err(format!(
                    "unexpected `{}` at character {}",
                    c.escape_default(),
                    at + 1
                ))
            }
        }
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn or(&mut self, depth: usize) -> Result<Expr, RuleError> {
        let mut left = self.and(depth)?;
        while self.peek() == Some(&Token::Or) {
            self.at += 1;
            let right = self.and(depth)?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self, depth: usize) -> Result<Expr, RuleError> {
        let mut left = self.unary(depth)?;
        while self.peek() == Some(&Token::And) {
            self.at += 1;
            let right = self.unary(depth)?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self, depth: usize) -> Result<Expr, RuleError> {
        if depth > MAX_DEPTH {
            return err(format!("the rule nests deeper than {MAX_DEPTH} levels"));
        }
        match self.next() {
            Some(Token::Not) => Ok(Expr::Not(Box::new(self.unary(depth + 1)?))),
            Some(Token::LParen) => {
                let inner = self.or(depth + 1)?;
                match self.next() {
                    Some(Token::RParen) => Ok(inner),
                    Some(other) => err(format!("expected `)`, found {other}")),
                    None => err("a `(` is not closed"),
                }
            }
            Some(Token::Ident(name)) => {
                match self.next() {
                    Some(Token::LParen) => {}
                    _ => return err(format!("`{name}` is not followed by `(`")),
                }
                let mut args = Vec::new();
                if self.peek() == Some(&Token::RParen) {
                    self.at += 1;
                } else {
                    loop {
                        match self.next() {
                            Some(Token::Str(s)) => args.push(s),
                            Some(other) => {
                                return err(format!("`{name}` takes quoted values, found {other}"))
                            }
                            None => return err(format!("`{name}(` is not closed")),
                        }
                        match self.next() {
                            Some(Token::Comma) => {}
                            Some(Token::RParen) => break,
                            Some(other) => {
                                return err(format!(
                                    "expected `,` or `)` in `{name}`, found {other}"
                                ))
                            }
                            None => return err(format!("`{name}(` is not closed")),
                        }
                    }
                }
                Ok(Expr::Matcher(Matcher { name, args }))
            }
            Some(other) => err(format!("expected a matcher, found {other}")),
            None => err("the rule ends where a matcher was expected"),
        }
    }
}

/// The rule's tree.
pub fn parse(rule: &str) -> Result<Expr, RuleError> {
    if rule.len() > MAX_RULE_LEN {
        return err(format!("the rule is longer than {MAX_RULE_LEN} bytes"));
    }
    if rule.trim().is_empty() {
        return err("the rule is empty");
    }
    let mut parser = Parser {
        tokens: lex(rule)?,
        at: 0,
    };
    let expr = parser.or(0)?;
    match parser.next() {
        None => Ok(expr),
        Some(other) => err(format!("unexpected {other} after a complete rule")),
    }
}

/// The rule as alternatives (a disjunction of conjunctions of matchers): each alternative is one
/// frontend. A negation anywhere is refused.
pub fn alternatives(expr: &Expr) -> Result<Vec<Vec<Matcher>>, RuleError> {
    match expr {
        Expr::Matcher(m) => Ok(vec![vec![m.clone()]]),
        Expr::Not(_) => err(
            "`!` is not carried: sozu 2.3.3 matches what a request has, never what it lacks (a frontend's host, path rule, method and header predicates must all hold)",
        ),
        Expr::Or(a, b) => {
            let mut left = alternatives(a)?;
            left.extend(alternatives(b)?);
            if left.len() > MAX_ALTERNATIVES {
                return err(format!(
                    "the rule stands for more than {MAX_ALTERNATIVES} frontends"
                ));
            }
            Ok(left)
        }
        Expr::And(a, b) => {
            let left = alternatives(a)?;
            let right = alternatives(b)?;
            if left.len().saturating_mul(right.len()) > MAX_ALTERNATIVES {
                return err(format!(
                    "the rule stands for more than {MAX_ALTERNATIVES} frontends"
                ));
            }
            let mut out = Vec::with_capacity(left.len() * right.len());
            for l in &left {
                for r in &right {
                    let mut both = l.clone();
                    both.extend(r.iter().cloned());
                    out.push(both);
                }
            }
            Ok(out)
        }
    }
}

/// A path rule of an HTTP alternative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathRule {
    /// `PathPrefix`: a raw string prefix, as sozu's PREFIX is.
    Prefix(String),
    /// `Path`.
    Exact(String),
    /// `PathRegexp`, as Traefik reads it: unanchored (Go's `MatchString`).
    Regex(String),
}

/// A header predicate of an HTTP alternative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderRule {
    /// `Header(name, value)`: the value exactly.
    Exact(String, String),
    /// `HeaderRegexp(name, re)`: unanchored, as Traefik reads it.
    Regex(String, String),
}

/// One alternative of an HTTP rule, in the terms of a sozu frontend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpAlternative {
    pub host: Option<String>,
    pub path: Option<PathRule>,
    pub method: Option<String>,
    pub headers: Vec<HeaderRule>,
}

fn one_arg(m: &Matcher) -> Result<&str, RuleError> {
    match m.args.as_slice() {
        [one] => Ok(one),
        [] => err(format!("`{}` names no value", m.name)),
        _ => err(format!(
            "`{}` takes one value in Traefik v3 (the v2 syntax with several is not read): write `{}(`a`) || {}(`b`)`",
            m.name, m.name, m.name
        )),
    }
}

fn two_args(m: &Matcher) -> Result<(&str, &str), RuleError> {
    match m.args.as_slice() {
        [a, b] => Ok((a, b)),
        _ => err(format!("`{}` takes a header name and a value", m.name)),
    }
}

/// A regular expression sozu's `regex` crate compiles as Traefik's Go `regexp` would read it.
fn check_regex(what: &str, re: &str) -> Result<(), RuleError> {
    regex::Regex::new(re)
        .map(|_| ())
        .map_err(|e| RuleError(format!("{what} `{re}` does not compile: {e}")))
}

/// An unanchored pattern (Go's `MatchString`) as sozu matches its patterns: anchored at both
/// ends (sozu 2.3.3 `anchored_regex` in `lib/src/router/mod.rs` wraps it in `\A(?:…)\z`).
pub fn unanchored(re: &str) -> String {
    format!(".*(?:{re}).*")
}

/// An HTTP rule's alternatives in sozu's terms.
pub fn http(rule: &str) -> Result<Vec<HttpAlternative>, RuleError> {
    let tree = parse(rule)?;
    let mut out = Vec::new();
    for conjunction in alternatives(&tree)? {
        let mut alt = HttpAlternative::default();
        for m in &conjunction {
            match m.name.as_str() {
                "Host" => {
                    let host = one_arg(m)?.to_ascii_lowercase();
                    match &alt.host {
                        Some(h) if *h != host => {
                            return err(format!(
                                "`Host(`{h}`) && Host(`{host}`)` matches no request"
                            ))
                        }
                        _ => alt.host = Some(host),
                    }
                }
                "Path" | "PathPrefix" | "PathRegexp" => {
                    let value = one_arg(m)?.to_owned();
                    let path = match m.name.as_str() {
                        "Path" => PathRule::Exact(value),
                        "PathPrefix" => PathRule::Prefix(value),
                        _ => {
                            check_regex("PathRegexp", &value)?;
                            PathRule::Regex(value)
                        }
                    };
                    if alt.path.is_some() {
                        return err(
                            "two path matchers joined by `&&`: a sozu frontend has one path rule",
                        );
                    }
                    alt.path = Some(path);
                }
                "Method" => {
                    let method = one_arg(m)?.to_owned();
                    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
                        return err(format!("`Method(`{method}`)` is not an HTTP method"));
                    }
                    // Traefik compares methods as Go's net/http sees them (upper case on the
                    // wire); sozu compares case-sensitively, so the name is written upper case.
                    let method = method.to_ascii_uppercase();
                    match &alt.method {
                        Some(existing) if *existing != method => {
                            return err(format!(
                                "`Method(`{existing}`) && Method(`{method}`)` matches no request"
                            ))
                        }
                        _ => alt.method = Some(method),
                    }
                }
                "Header" => {
                    let (name, value) = two_args(m)?;
                    alt.headers
                        .push(HeaderRule::Exact(name.to_owned(), value.to_owned()));
                }
                "HeaderRegexp" => {
                    let (name, value) = two_args(m)?;
                    check_regex("HeaderRegexp", value)?;
                    alt.headers
                        .push(HeaderRule::Regex(name.to_owned(), value.to_owned()));
                }
                "HostRegexp" => {
                    return err(
                        "`HostRegexp` is not carried: a workspace route names one host (give each name its router)",
                    )
                }
                "Query" | "QueryRegexp" => {
                    return err(format!(
                        "`{}` is not carried: sozu 2.3.3 routes by host, path, method and headers, never by the query string",
                        m.name
                    ))
                }
                "ClientIP" => {
                    return err(
                        "`ClientIP` is not carried: the workspace admits sources for every route at once (`allowed_sources`), not per route",
                    )
                }
                "HostSNI" | "HostSNIRegexp" | "ALPN" => {
                    return err(format!("`{}` is a TCP matcher, not an HTTP one", m.name))
                }
                other => return err(format!("`{other}` is not a Traefik v3 matcher")),
            }
        }
        out.push(alt);
    }
    Ok(out)
}

/// What a TCP rule matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sni {
    /// `HostSNI(`*`)`: every connection.
    Any,
    /// `HostSNI(`name`)`.
    Name(String),
}

/// A TCP rule's alternatives: `HostSNI` each, joined by `||`.
pub fn tcp(rule: &str) -> Result<Vec<Sni>, RuleError> {
    let tree = parse(rule)?;
    let mut out = Vec::new();
    for conjunction in alternatives(&tree)? {
        let mut sni = None;
        for m in &conjunction {
            match m.name.as_str() {
                "HostSNI" => {
                    let value = one_arg(m)?.to_ascii_lowercase();
                    let this = if value == "*" {
                        Sni::Any
                    } else {
                        Sni::Name(value)
                    };
                    match &sni {
                        Some(existing) if *existing != this => {
                            return err("two different `HostSNI` joined by `&&` match no connection")
                        }
                        _ => sni = Some(this),
                    }
                }
                "HostSNIRegexp" => {
                    return err(
                        "`HostSNIRegexp` is not carried: a workspace route names one host",
                    )
                }
                "ClientIP" => {
                    return err(
                        "`ClientIP` is not carried: the workspace admits sources for every route at once (`allowed_sources`), not per route",
                    )
                }
                "ALPN" => {
                    return err("`ALPN` is not carried: sozu 2.3.3 routes TLS by SNI only")
                }
                other => return err(format!("`{other}` is not a Traefik v3 TCP matcher")),
            }
        }
        match sni {
            Some(sni) => out.push(sni),
            None => return err("a TCP rule needs `HostSNI`"),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atlas_rule_is_one_frontend_with_host_and_prefix() {
        let alts = http("Host(`app.example.org`) && PathPrefix(`/api`)").unwrap();
        assert_eq!(
            alts,
            vec![HttpAlternative {
                host: Some("app.example.org".into()),
                path: Some(PathRule::Prefix("/api".into())),
                method: None,
                headers: vec![],
            }]
        );
    }

    #[test]
    fn and_binds_tighter_than_or_and_parentheses_distribute() {
        let alts = http("Host(`a`) && PathPrefix(`/x`) || Host(`b`)").unwrap();
        assert_eq!(alts.len(), 2);
        assert_eq!(alts[1].host.as_deref(), Some("b"));
        assert_eq!(alts[1].path, None);
        let alts = http(
            "Host(\"a\") && (Path(`/x`) || PathRegexp(`^/v[0-9]+`)) && (Method(`get`) || Method(`POST`))",
        )
        .unwrap();
        assert_eq!(alts.len(), 4);
        assert_eq!(alts[0].method.as_deref(), Some("GET"));
        assert_eq!(alts[3].path, Some(PathRule::Regex("^/v[0-9]+".into())));
        assert!(alts.iter().all(|a| a.host.as_deref() == Some("a")));
    }

    #[test]
    fn headers_accumulate() {
        let alts = http("Host(`a`) && Header(`X-Canary`, `1`) && HeaderRegexp(`X-Env`, `stag.*`)")
            .unwrap();
        assert_eq!(
            alts[0].headers,
            vec![
                HeaderRule::Exact("X-Canary".into(), "1".into()),
                HeaderRule::Regex("X-Env".into(), "stag.*".into())
            ]
        );
    }

    #[test]
    fn what_cannot_be_carried_is_refused_with_its_reason() {
        for (rule, says) in [
            ("!Host(`a`)", "`!`"),
            ("Host(`a`) && !PathPrefix(`/admin`)", "`!`"),
            ("Host(`a`, `b`)", "one value"),
            ("HostRegexp(`.+`)", "HostRegexp"),
            ("Host(`a`) && Query(`x`, `1`)", "query"),
            ("ClientIP(`10.0.0.0/8`)", "allowed_sources"),
            ("Host(`a`) && Host(`b`)", "matches no request"),
            ("Path(`/a`) && PathPrefix(`/b`)", "one path rule"),
            ("PathRegexp(`(`)", "does not compile"),
            ("Host(`a`", "not closed"),
            ("Host(`a`) &", "lone"),
            ("Host('a')", "backticks"),
            ("Hots(`a`)", "not a Traefik v3 matcher"),
            ("", "empty"),
            ("Host(`a`) Host(`b`)", "after a complete rule"),
        ] {
            let e = http(rule).unwrap_err().to_string();
            assert!(e.contains(says), "{rule}: {e}");
        }
    }

    #[test]
    fn a_rule_that_multiplies_out_is_refused_not_expanded() {
        let factor = "(Path(`/a`) || Path(`/b`) || Path(`/c`) || Path(`/d`))";
        let method = "(Method(`GET`) || Method(`PUT`) || Method(`POST`) || Method(`HEAD`))";
        let rule = format!("{factor} && {method} && (Header(`a`,`1`) || Header(`b`,`1`) || Header(`c`,`1`) || Header(`d`,`1`) || Header(`e`,`1`))");
        assert!(http(&rule).unwrap_err().to_string().contains("frontends"));
        let deep = format!("{}Host(`a`){}", "(".repeat(200), ")".repeat(200));
        assert!(http(&deep).unwrap_err().to_string().contains("deeper"));
    }

    #[test]
    fn tcp_rules() {
        assert_eq!(tcp("HostSNI(`*`)").unwrap(), vec![Sni::Any]);
        assert_eq!(
            tcp("HostSNI(`DB.example.org`) || HostSNI(`b`)").unwrap(),
            vec![Sni::Name("db.example.org".into()), Sni::Name("b".into())]
        );
        assert!(tcp("ALPN(`h2`)").is_err());
        assert!(tcp("Host(`a`)").is_err());
    }

    #[test]
    fn unanchored_patterns_match_as_go_does_once_sozu_anchors_them() {
        let sozu = |re: &str| regex::Regex::new(&format!("\\A(?:{})\\z", unanchored(re))).unwrap();
        assert!(sozu("v[0-9]+").is_match("/api/v2/x"));
        assert!(sozu("^/api").is_match("/api/x"));
        assert!(!sozu("^/api").is_match("/x/api"));
        assert!(sozu("a|^/b").is_match("/xa"));
    }
}
