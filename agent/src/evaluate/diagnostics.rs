//! Nickel's diagnostics, reworded where they would mislead the author of a workspace.
//!
//! nickel-lang-core speaks to whoever writes the contract; a workspace's author only writes
//! data. Three of its messages send that author the wrong way:
//!
//! - a misspelt field is an `extra field` whose notes advise appending `, ..` to the record
//!   contract, which is the bundled contract, not theirs: here it is `unknown field `hots`; did
//!   you mean `host`?`, pointing at the field in their file (with the fields the record takes
//!   when none is close, and another provider's field said to be one);
//! - two routes without a comma between them read as the first applied to the second, `not a
//!   function`; two fields without one, as an `unexpected token` at the second's `=`: here both
//!   say that a comma is probably missing, and where;
//! - labels that point into the line that applies the contract to the workspace (`imported
//!   here`, `applied to this expression`) show plumbing, not the mistake: dropped.
//!
//! Everything else passes through as Nickel wrote it. Pure: the sources come from the caller's
//! file database.

use std::ops::Range;

use codespan_reporting::diagnostic::{Diagnostic, Label, LabelStyle};
use nickel_lang_core::files::{FileId, Files};
use nickel_lang_core::parser::lexer::{Lexer, MultiStringToken, NormalToken, StringToken, Token};
use serde::Deserialize;

use crate::workspace as model;

/// Where the generated entry point (the contract applied to the workspace's import) lies: the
/// file, and the offset from which its text is plumbing rather than the contract.
#[derive(Debug, Clone, Copy)]
pub struct Plumbing {
    pub file: FileId,
    pub from: usize,
}

/// The note of nickel-lang-core's `extra field` error that advises opening the record contract.
const OPEN_THE_CONTRACT: &str = "The record contract might also be too strict";
const MISSPELLED: &str = "Have you misspelled a field?";

/// `diagnostics`, reworded where they mislead (see the module).
pub fn reword(
    diagnostics: Vec<Diagnostic<FileId>>,
    files: &Files,
    plumbing: Plumbing,
) -> Vec<Diagnostic<FileId>> {
    let reworder = Reworder { files, plumbing };
    diagnostics
        .into_iter()
        .flat_map(|diagnostic| reworder.reword(diagnostic))
        .collect()
}

struct Reworder<'a> {
    files: &'a Files,
    plumbing: Plumbing,
}

impl Reworder<'_> {
    fn reword(&self, mut diagnostic: Diagnostic<FileId>) -> Vec<Diagnostic<FileId>> {
        diagnostic
            .labels
            .retain(|label| !self.is_plumbing(label.file_id, &label.range));
        if let Some(unknown) = self.unknown_fields(&diagnostic) {
            return unknown;
        }
        if let Some(comma) = self
            .comma_between_items(&diagnostic)
            .or_else(|| self.comma_between_fields(&diagnostic))
        {
            return vec![comma];
        }
        diagnostic
            .notes
            .retain(|note| !note.starts_with(OPEN_THE_CONTRACT) && note != MISSPELLED);
        vec![diagnostic]
    }

    fn is_plumbing(&self, file: FileId, range: &Range<usize>) -> bool {
        file == self.plumbing.file && range.start >= self.plumbing.from
    }

    /// Whether `file` is one the workspace's author wrote (not the contract, not Nickel's
    /// standard library).
    fn is_users(&self, file: FileId) -> bool {
        file != self.plumbing.file && !self.files.is_stdlib(file)
    }

    fn text(&self, file: FileId) -> &str {
        self.files.source(file)
    }

    /// `extra field(s) `a`, `b`` on a record the author wrote: one diagnostic per field, at the
    /// field, with the closest field the record takes.
    fn unknown_fields(&self, diagnostic: &Diagnostic<FileId>) -> Option<Vec<Diagnostic<FileId>>> {
        let mut lines = diagnostic.message.lines().map(str::trim);
        let title = lines.next()?;
        let extra = lines.find(|l| l.starts_with("extra field"))?;
        let names = backticked(extra);
        if names.is_empty() {
            return None;
        }
        // `contract broken by the value of `health``: the field that holds the record.
        let holder = title
            .strip_prefix("contract broken by the value of ")
            .and_then(|rest| backticked(rest).into_iter().next());
        // The record as evaluated, or else as written where the contract was applied to it.
        let record = ["evaluated to this expression", "applied to this expression"]
            .iter()
            .find_map(|message| {
                diagnostic
                    .labels
                    .iter()
                    .find(|l| l.message == *message && self.is_users(l.file_id))
            })?;
        let written = record_fields(&self.text(record.file_id)[record.range.clone()]);
        let others: Vec<&str> = written
            .iter()
            .map(|(name, _)| name.as_str())
            .filter(|name| !names.iter().any(|n| n == name))
            .collect();
        let kind = record_kind(holder.as_deref(), &others);
        let mut out = Vec::new();
        for name in &names {
            let at = written
                .iter()
                .find(|(written, _)| written == name)
                .map(|(_, span)| record.range.start + span.start..record.range.start + span.end);
            // A field the record takes in another of its forms (another provider's).
            let other_form = kind.filter(|kind| kind.fields.contains(&name.as_str()));
            let suggestion = kind
                .filter(|_| other_form.is_none())
                .and_then(|kind| closest(name, kind.fields));
            let message = match (suggestion, other_form) {
                (Some(known), _) => format!("unknown field `{name}`; did you mean `{known}`?"),
                (None, Some(kind)) => {
                    format!("`{name}` is not a field of {} {}", kind.what, kind.form)
                }
                (None, None) => format!("unknown field `{name}`"),
            };
            let label = match &at {
                Some(span) => {
                    Label::primary(record.file_id, span.clone()).with_message(match kind {
                        Some(kind) if other_form.is_some() => {
                            format!("not a field of {} {}", kind.what, kind.form)
                        }
                        Some(kind) => format!("not a field of {}", kind.what),
                        None => "not a field this record takes".into(),
                    })
                }
                None => Label::primary(record.file_id, record.range.clone())
                    .with_message(format!("this record has the field `{name}`")),
            };
            let mut notes = Vec::new();
            if let Some(kind) = kind {
                if suggestion.is_none() && other_form.is_none() {
                    notes.push(format!(
                        "The fields of {}: {}.",
                        kind.what,
                        kind.fields
                            .iter()
                            .map(|f| format!("`{f}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
            match other_form {
                Some(kind) if !kind.form_note.is_empty() => notes.push(kind.form_note.into()),
                _ => notes.push(
                    "Every record of a workspace is closed: a field the contract does not know \
                     is refused rather than ignored (`private-ingress schema` prints the \
                     contract)."
                        .into(),
                ),
            }
            out.push(
                Diagnostic::error()
                    .with_message(message)
                    .with_labels(vec![label])
                    .with_notes(notes),
            );
        }
        Some(out)
    }

    /// `not a function` where the term applied is a literal (a record, an array, a string, a
    /// number) that the author wrote next to another: a comma is missing between them.
    fn comma_between_items(&self, diagnostic: &Diagnostic<FileId>) -> Option<Diagnostic<FileId>> {
        if diagnostic.message != "not a function" {
            return None;
        }
        let applied = diagnostic
            .labels
            .iter()
            .find(|l| l.style == LabelStyle::Primary && self.is_users(l.file_id))?;
        let application = diagnostic.labels.iter().find(|l| {
            l.style == LabelStyle::Secondary
                && l.file_id == applied.file_id
                && l.range.start == applied.range.start
                && l.range.end > applied.range.end
        })?;
        let text = self.text(applied.file_id);
        let first = text.get(applied.range.clone())?;
        let literal = first.starts_with(['{', '[', '"'])
            || first.starts_with("m%")
            || first.starts_with(|c: char| c.is_ascii_digit());
        if !literal {
            return None;
        }
        let after = text.get(applied.range.end..application.range.end)?;
        let second =
            applied.range.end + (after.len() - after.trim_start().len())..application.range.end;
        Some(
            Diagnostic::error()
                .with_message("a comma is probably missing between two items")
                .with_labels(vec![
                    Label::primary(applied.file_id, applied.range.end..applied.range.end)
                        .with_message("a comma here?"),
                    Label::secondary(applied.file_id, applied.range.clone())
                        .with_message("this item"),
                    Label::secondary(applied.file_id, second).with_message("and the next"),
                ])
                .with_notes(vec![
                    "Items of an array are separated by commas; without one, the first is \
                     applied to the next as if it were a function (`not a function`)."
                        .into(),
                ]),
        )
    }

    /// `unexpected token` at the `=` (or `|`, `:`) of a field that follows a complete value
    /// with no comma between them.
    fn comma_between_fields(&self, diagnostic: &Diagnostic<FileId>) -> Option<Diagnostic<FileId>> {
        if diagnostic.message != "unexpected token" {
            return None;
        }
        let at = diagnostic
            .labels
            .iter()
            .find(|l| l.style == LabelStyle::Primary && self.is_users(l.file_id))?;
        let text = self.text(at.file_id);
        if !matches!(text.get(at.range.clone())?, "=" | "|" | ":") {
            return None;
        }
        let before = tokens_before(text, at.range.start)?;
        let [.., value_end, field] = before.as_slice() else {
            return None;
        };
        if !matches!(field.1, Kind::Name) || !matches!(value_end.1, Kind::ValueEnd) {
            return None;
        }
        let gap = value_end.0.end..value_end.0.end;
        Some(
            Diagnostic::error()
                .with_message("a comma is probably missing between two fields")
                .with_labels(vec![
                    Label::primary(at.file_id, gap).with_message("a comma here?"),
                    Label::secondary(at.file_id, field.0.clone()).with_message("before this field"),
                ])
                .with_notes(vec!["Fields of a record are separated by commas.".into()]),
        )
    }
}

/// The names between backticks in `text`.
fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The fields a record literal defines at its top level, with their names' spans in `text`
/// (which starts with the record). Empty when `text` is not a record literal.
fn record_fields(text: &str) -> Vec<(String, Range<usize>)> {
    let mut fields = Vec::new();
    let mut depth = 0usize;
    let mut expecting_name = false;
    let mut quoted: Option<(usize, String)> = None;
    for token in Lexer::new(text) {
        let Ok((start, token, end)) = token else {
            break;
        };
        if let Some((open, name)) = &mut quoted {
            match token {
                Token::Str(StringToken::Literal(part)) => name.push_str(&part),
                Token::Str(StringToken::EscapedChar(c)) => name.push(c),
                Token::Normal(NormalToken::DoubleQuote) => {
                    fields.push((std::mem::take(name), *open..end));
                    quoted = None;
                }
                // An interpolated name is not a name known before evaluation.
                _ => quoted = None,
            }
            continue;
        }
        if depth == 0 && fields.is_empty() && !matches!(token, Token::Normal(NormalToken::LBrace)) {
            return Vec::new();
        }
        if depth == 1 && expecting_name {
            expecting_name = false;
            match token {
                Token::Normal(NormalToken::Identifier(name)) => {
                    fields.push((name.to_owned(), start..end));
                    continue;
                }
                Token::Normal(NormalToken::DoubleQuote) => {
                    quoted = Some((start, String::new()));
                    continue;
                }
                _ => {}
            }
        }
        match token {
            Token::Normal(NormalToken::LBrace) => {
                depth += 1;
                if depth == 1 {
                    expecting_name = true;
                }
            }
            Token::Normal(NormalToken::LBracket | NormalToken::LParen)
            | Token::Str(StringToken::Interpolation)
            | Token::MultiStr(MultiStringToken::Interpolation) => depth += 1,
            Token::Normal(NormalToken::RBrace | NormalToken::RBracket | NormalToken::RParen) => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    break;
                }
            }
            Token::Normal(NormalToken::Comma) if depth == 1 => expecting_name = true,
            _ => {}
        }
    }
    fields
}

/// What a token before an unexpected one was, as far as a missing comma goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The end of a complete value: a closing bracket or quote, a number, a name, a tag.
    ValueEnd,
    /// An identifier (which may also end a value).
    Name,
    Other,
}

/// The last tokens of `text` before `offset`, each with its span and [`Kind`]; `None` where the
/// text does not lex up to there.
fn tokens_before(text: &str, offset: usize) -> Option<Vec<(Range<usize>, Kind)>> {
    let mut out: Vec<(Range<usize>, Kind)> = Vec::new();
    let mut in_string = false;
    for token in Lexer::new(text) {
        let (start, token, end) = token.ok()?;
        if start >= offset {
            break;
        }
        let kind = match token {
            Token::Normal(NormalToken::Identifier(_)) => Kind::Name,
            Token::Normal(
                NormalToken::RBrace
                | NormalToken::RBracket
                | NormalToken::RParen
                | NormalToken::DecNumLiteral(_)
                | NormalToken::HexNumLiteral(_)
                | NormalToken::OctNumLiteral(_)
                | NormalToken::BinNumLiteral(_)
                | NormalToken::RawEnumTag(_)
                | NormalToken::True
                | NormalToken::False
                | NormalToken::Null,
            ) => Kind::ValueEnd,
            Token::MultiStr(MultiStringToken::End) => Kind::ValueEnd,
            // The lexer gives a string's closing quote as a normal token, like its opening one.
            Token::Normal(NormalToken::DoubleQuote) => {
                in_string = !in_string;
                if in_string {
                    Kind::Other
                } else {
                    Kind::ValueEnd
                }
            }
            Token::Normal(NormalToken::StrEnumTagBegin) => {
                in_string = true;
                Kind::Other
            }
            _ => Kind::Other,
        };
        out.push((start..end, kind));
    }
    // A name is also the end of a value, when it stands before another name.
    if let [.., (_, before @ Kind::Name), _] = out.as_mut_slice() {
        *before = Kind::ValueEnd;
    }
    Some(out)
}

/// A record of the workspace: the field that holds it, how to call it, and the fields it takes
/// (in any of its forms).
#[derive(Debug, Clone, Copy)]
struct RecordKind {
    holders: &'static [&'static str],
    what: &'static str,
    fields: &'static [&'static str],
    /// Which form takes which of the fields, for a record whose forms take different fields:
    /// `with this provider`, and where to read which.
    form: &'static str,
    form_note: &'static str,
}

/// Every record a workspace writes, each with the fields of the model's type for it. Those types
/// refuse any field they do not list (`deny_unknown_fields`) and read what the contract returns,
/// so their fields are the contract's.
fn record_kinds() -> Vec<RecordKind> {
    vec![
        kind::<model::RawWorkspace>(&[], "the workspace"),
        kind::<model::RawRoute>(&["routes"], "a route"),
        kind::<model::RawUpstream>(&["upstreams"], "an upstream"),
        kind::<model::RawHealth>(&["health"], "a health check"),
        kind::<model::RawHstsPolicy>(&["hsts"], "an HSTS policy"),
        kind::<model::RawListeners>(&["listeners"], "`listeners`"),
        kind::<model::RawDeploy>(&["deploy"], "`deploy`"),
        kind::<model::PodResources>(&["resources"], "`deploy.resources`"),
        kind::<model::ContainerResources>(&["sozu", "agent"], "a container's resources"),
        kind::<model::Quantities>(&["requests", "limits"], "requests or limits"),
        kind::<model::Monitoring>(&["monitoring", "cluster_dns"], "a namespace selector"),
        kind::<model::RawAcme>(&["acme"], "`acme`"),
        kind::<model::Eab>(&["eab"], "`acme.eab`"),
        RecordKind {
            form: "with this provider",
            form_note: "Each provider takes fields of its own: docs/acme.md lists them.",
            ..kind::<model::RawDns01>(&["dns01"], "`acme.dns01`")
        },
        kind::<model::RawPropagation>(&["propagation"], "`acme.propagation`"),
        kind::<model::RawTraffic>(&["traffic"], "`traffic`"),
        kind::<model::RawAccessLog>(&["access_log"], "`traffic.access_log`"),
        kind::<model::RawTraefik>(&["traefik"], "`traefik`"),
    ]
}

fn kind<'de, T: Deserialize<'de>>(
    holders: &'static [&'static str],
    what: &'static str,
) -> RecordKind {
    RecordKind {
        holders,
        what,
        fields: fields_of::<T>(),
        form: "here",
        form_note: "",
    }
}

/// Which record the author meant: the one the holding field names, unless the fields they wrote
/// beside the unknown one fit another better (a record a contract reached some other way).
fn record_kind(holder: Option<&str>, others: &[&str]) -> Option<RecordKind> {
    let kinds = record_kinds();
    let fit = |kind: &RecordKind| others.iter().filter(|f| kind.fields.contains(f)).count();
    let named = kinds
        .iter()
        .find(|k| match holder {
            Some(holder) => k.holders.contains(&holder),
            None => k.holders.is_empty(),
        })
        .copied();
    let best = kinds.iter().copied().max_by_key(|k| fit(k));
    match (named, best) {
        (Some(named), Some(best)) if fit(&best) > fit(&named) => Some(best),
        (Some(named), _) => Some(named),
        (None, Some(best)) if fit(&best) > 0 => Some(best),
        _ => None,
    }
}

/// The known field closest to `name`, when it is close enough to be a misspelling: at most one
/// edit (a transposition counts as one) per three characters.
fn closest(name: &str, known: &[&'static str]) -> Option<&'static str> {
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(name, k), *k))
        .filter(|(distance, _)| *distance > 0 && *distance <= (name.chars().count() / 3).max(1))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, k)| k)
}

/// The field names serde reads for `T` (a struct that derives `Deserialize`), asked of the derive
/// itself: it hands them to the deserializer before reading anything.
fn fields_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};

    struct Fields<'a>(&'a mut &'static [&'static str]);

    impl<'de> de::Deserializer<'de> for Fields<'_> {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("only the field names are asked for"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("only the field names are asked for"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Fields(&mut fields));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_gives_each_record_its_fields() {
        let kinds = record_kinds();
        let route = kinds.iter().find(|k| k.what == "a route").unwrap();
        for field in [
            "host",
            "upstream",
            "port",
            "upstreams",
            "path_prefix",
            "health",
        ] {
            assert!(route.fields.contains(&field), "{:?}", route.fields);
        }
        for kind in &kinds {
            assert!(!kind.fields.is_empty(), "{} has no fields", kind.what);
        }
    }

    #[test]
    fn a_misspelling_finds_its_field_and_nothing_else_does() {
        let route = fields_of::<model::RawRoute>();
        assert_eq!(closest("hots", route), Some("host"));
        assert_eq!(closest("pth_prefix", route), Some("path_prefix"));
        assert_eq!(closest("Host", route), Some("host"));
        assert_eq!(closest("weight", route), None);
        assert_eq!(closest("xyz", route), None);
        let workspace = fields_of::<model::RawWorkspace>();
        assert_eq!(closest("clusterissuer", workspace), Some("cluster_issuer"));
        assert_eq!(closest("rutes", workspace), Some("routes"));
    }

    #[test]
    fn the_fields_of_a_record_literal_are_found_with_their_positions() {
        let text = r#"{ a = 1, "b c" = { d = 2 }, e | Number = [f, { g = 3 }], h = "%{i}", }"#;
        let fields = record_fields(text);
        let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b c", "e", "h"]);
        assert_eq!(&text[fields[1].1.clone()], "\"b c\"");
        assert_eq!(&text[fields[2].1.clone()], "e");
        assert!(record_fields("[1, 2]").is_empty());
    }

    #[test]
    fn the_record_is_the_one_its_fields_say() {
        // Named by the field that holds it.
        assert_eq!(
            record_kind(Some("health"), &[]).unwrap().what,
            "a health check"
        );
        assert_eq!(record_kind(None, &["zone"]).unwrap().what, "the workspace");
        // The fields written beside the unknown one tell better than a holder they do not fit.
        assert_eq!(
            record_kind(Some("routes"), &["upstream", "weight"])
                .unwrap()
                .what,
            "an upstream"
        );
        assert!(record_kind(Some("nothing-known"), &[]).is_none());
    }
}
