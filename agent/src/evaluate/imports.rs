//! The files a workspace reads: its own and every file it imports, found with Nickel's own lexer
//! (an import is always a static string, so lexing sees every one, and lexing cannot loop), and
//! kept inside the workspace's directory tree.
//!
//! A workspace is evaluated by the agent, which can read secrets the workspace's author may not
//! (the ACME account key, a TSIG secret, the private keys under the tls dir). An import is
//! therefore confined to the *root*: the workspace file's own directory, or an ancestor given as
//! `--workspace-root`. The check runs on the paths as the file system resolves them, symlinks
//! included, so an absolute path, a `..` that climbs out, and a link that points out are all
//! refused, each at its import with file, line and column. `'Text` imports stay allowed: what they
//! read is inside the tree the operator handed over, and a CA bundle or a host list kept beside the
//! workspace is a real use.
//!
//! Reads only what it is asked to; [`walk`] is the one function that opens files.

use std::collections::{BTreeMap, VecDeque};

use std::ops::Range;
use std::path::{Component, Path, PathBuf};

use nickel_lang_core::cache::InputFormat;
use nickel_lang_core::parser::lexer::{Lexer, NormalToken, StringToken, Token};

/// One `import "…"` in a Nickel source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    /// As written.
    pub path: String,
    /// The format an `as 'Format` names.
    pub format: Option<InputFormat>,
    /// Byte range of the path's string literal, quotes included.
    pub span: Range<usize>,
}

/// Why a file's imports cannot be followed, at `span` of `file`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", file.display())]
pub struct ImportError {
    /// The importing file.
    pub file: PathBuf,
    /// Its text, for a diagnostic.
    pub text: String,
    pub span: Range<usize>,
    pub message: String,
    pub notes: Vec<String>,
}

/// The static imports of a Nickel source. `Err((span, message))` for what is not a plain import
/// of a path (a package import, an interpolated path).
pub fn imports(source: &str) -> Result<Vec<Import>, (Range<usize>, String)> {
    // Up to the first lexical error: Nickel's parser, on the same lexer, refuses the file there
    // and reads none of its imports, and says what is wrong better than this scan could.
    let mut tokens = Lexer::new(source)
        .map_while(Result::ok)
        .map(|(start, token, end)| Ok::<_, (Range<usize>, String)>((start..end, token)));
    let mut found = Vec::new();
    let mut pending = None;
    loop {
        let (span, token) = match pending.take() {
            Some(next) => next,
            None => match tokens.next() {
                Some(next) => next?,
                None => return Ok(found),
            },
        };
        if token != Token::Normal(NormalToken::Import) {
            continue;
        }
        let start = match tokens.next().transpose()? {
            Some((quote, Token::Normal(NormalToken::DoubleQuote))) => quote.start,
            Some((at, Token::Normal(NormalToken::Identifier(name)))) => {
                return Err((
                    span.start..at.end,
                    format!("`import {name}` imports a package; a workspace imports files by path"),
                ))
            }
            _ => return Err((span, "an `import` is not followed by a path".into())),
        };
        let mut path = String::new();
        let end = loop {
            match tokens.next().transpose()? {
                Some((_, Token::Str(StringToken::Literal(text)))) => path.push_str(&text),
                Some((_, Token::Str(StringToken::EscapedChar(c)))) => path.push(c),
                Some((quote, Token::Normal(NormalToken::DoubleQuote))) => break quote.end,
                _ => {
                    return Err((
                        start..start + 1,
                        "an import path must be a plain string".into(),
                    ))
                }
            }
        };
        let mut format = None;
        match tokens.next().transpose()? {
            Some((at, Token::Normal(NormalToken::As))) => match tokens.next().transpose()? {
                Some((tag_at, Token::Normal(NormalToken::RawEnumTag(tag)))) => {
                    format = Some(
                        tag.parse::<InputFormat>()
                            .map_err(|()| (tag_at, format!("unknown import format '{tag}")))?,
                    );
                }
                _ => return Err((at, "`as` names no format".into())),
            },
            Some(other) => pending = Some(other),
            None => {}
        }
        found.push(Import {
            path,
            format,
            span: start..end,
        });
    }
}

/// How Nickel reads a file it imports without `as 'Format`: by extension, Nickel by default.
pub fn format_of(path: &Path) -> InputFormat {
    InputFormat::from_path(path).unwrap_or_default()
}

/// `path` without `.` and `..` components, as Nickel resolves an import.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The directory tree a workspace may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    /// As given (absolute, normalized): paths inside it keep their names.
    pub given: PathBuf,
    /// As the file system resolves it.
    real: PathBuf,
}

impl Root {
    /// `root`, or the workspace's own directory.
    pub fn of(workspace: &Path, root: Option<&Path>) -> std::io::Result<Root> {
        let given = match root {
            Some(root) => normalize(&std::path::absolute(root)?),
            None => normalize(&std::path::absolute(workspace)?)
                .parent()
                .map(Path::to_owned)
                .unwrap_or_else(|| PathBuf::from("/")),
        };
        let real = std::fs::canonicalize(&given)?;
        Ok(Root { given, real })
    }

    /// Where `import` of a file in `dir` leads, when that is inside the root; why not, else.
    pub fn resolve(&self, dir: &Path, import: &str) -> Result<PathBuf, String> {
        if Path::new(import).is_absolute() {
            return Err(format!("`{import}` is an absolute path"));
        }
        let target = normalize(&dir.join(import));
        if !target.starts_with(&self.given) {
            return Err(format!("`{import}` leads out of it"));
        }
        // A missing file is Nickel's to report; a link is followed to where it really leads.
        match std::fs::canonicalize(&target) {
            Ok(real) if !real.starts_with(&self.real) => {
                Err(format!("`{import}` is a link to {}", real.display()))
            }
            _ => Ok(target),
        }
    }

    /// Where `path`, named by a file of `dir` (absolute, or relative to `dir`), leads, when that
    /// is inside the root: the file as the file system resolves it, to be read there and not
    /// through a link that may change meanwhile; why not, else. Unlike an import, an absolute
    /// path inside the root is taken. A file that does not exist is inside when its name is.
    pub fn confine(&self, dir: &Path, path: &Path) -> Result<PathBuf, String> {
        let target = normalize(&dir.join(path));
        if !target.starts_with(&self.given) {
            return Err(if path.is_absolute() {
                format!("it is outside {}", self.given.display())
            } else {
                format!("it leads out of {}", self.given.display())
            });
        }
        match std::fs::canonicalize(&target) {
            Ok(real) if !real.starts_with(&self.real) => {
                Err(format!("it is a link to {}", real.display()))
            }
            Ok(real) => Ok(real),
            Err(_) => Ok(target),
        }
    }

    pub fn real(&self) -> &Path {
        &self.real
    }
}

/// What [`walk`] read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Walked {
    /// Each file's text by its absolute (normalized) path, the workspace's first.
    pub files: BTreeMap<PathBuf, String>,
    /// Imported files that could not be read (a missing file: Nickel's to report where it is
    /// imported), with why.
    pub unreadable: Vec<(PathBuf, String)>,
}

/// Reads `workspace` and every file it imports, transitively, each checked to be inside `root`
/// before it is read. An import that leads out of the root is an error at that import.
pub fn walk(workspace: &Path, root: &Root) -> Result<Walked, WalkError> {
    let entry = normalize(
        &std::path::absolute(workspace).map_err(|e| WalkError::Read {
            path: workspace.to_owned(),
            reason: e.to_string(),
        })?,
    );
    if let Err(reason) = root.resolve(
        entry.parent().unwrap_or(Path::new("/")),
        &entry.file_name().unwrap_or_default().to_string_lossy(),
    ) {
        return Err(WalkError::Outside {
            path: entry,
            root: root.given.clone(),
            reason,
        });
    }
    let text = std::fs::read_to_string(&entry).map_err(|e| WalkError::Read {
        path: entry.clone(),
        reason: e.to_string(),
    })?;
    let dir = entry.parent().unwrap_or(Path::new("/")).to_owned();
    let format = format_of(&entry);
    walk_from(entry, &dir, text, format, root)
}

/// [`walk`] for a workspace handed over as text (read from standard input or a pipe): `name` is
/// what errors call it, its imports resolve from `dir`, and it is read as `format`.
pub fn walk_text(
    name: &Path,
    dir: &Path,
    text: &str,
    format: InputFormat,
    root: &Root,
) -> Result<Walked, WalkError> {
    walk_from(name.to_owned(), dir, text.to_owned(), format, root)
}

/// Follows the imports of `entry` (already read: `text`), then of every file they lead to.
fn walk_from(
    entry: PathBuf,
    dir: &Path,
    text: String,
    format: InputFormat,
    root: &Root,
) -> Result<Walked, WalkError> {
    let mut walked = Walked::default();
    let mut queue = VecDeque::new();
    follow(&entry, dir, &text, format, root, &mut queue)?;
    walked.files.insert(entry, text);
    while let Some((path, format)) = queue.pop_front() {
        if walked.files.contains_key(&path) || walked.unreadable.iter().any(|(p, _)| *p == path) {
            continue;
        }
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) => {
                walked.unreadable.push((path, e.to_string()));
                continue;
            }
        };
        let dir = path.parent().unwrap_or(Path::new("/")).to_owned();
        let format = format.unwrap_or_else(|| format_of(&path));
        follow(&path, &dir, &text, format, root, &mut queue)?;
        walked.files.insert(path, text);
    }
    Ok(walked)
}

/// Queues what a Nickel file imports, each import resolved from `dir` and checked to stay in
/// `root`.
fn follow(
    file: &Path,
    dir: &Path,
    text: &str,
    format: InputFormat,
    root: &Root,
    queue: &mut VecDeque<(PathBuf, Option<InputFormat>)>,
) -> Result<(), WalkError> {
    if format != InputFormat::Nickel {
        return Ok(());
    }
    let found = imports(text).map_err(|(span, message)| {
        WalkError::Import(ImportError {
            file: file.to_owned(),
            text: text.to_owned(),
            span,
            message,
            notes: Vec::new(),
        })
    })?;
    for import in found {
        let target = root
            .resolve(dir, &import.path)
            .map_err(|reason| WalkError::Import(outside(file, text, &import, root, &reason)))?;
        queue.push_back((target, import.format));
    }
    Ok(())
}

fn outside(file: &Path, source: &str, import: &Import, root: &Root, reason: &str) -> ImportError {
    ImportError {
        file: file.to_owned(),
        text: source.to_owned(),
        span: import.span.clone(),
        message: format!(
            "import outside the workspace's directory {}: {reason}",
            root.given.display()
        ),
        notes: vec![
            "A workspace imports only files under its directory (after symlinks): the agent \
             that evaluates it can read secrets its author may not."
                .into(),
            "Move the file beside the workspace, or give a wider root with --workspace-root."
                .into(),
        ],
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalkError {
    #[error("cannot read {}: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    #[error("{} is outside the workspace root {}: {reason}", path.display(), root.display())]
    Outside {
        path: PathBuf,
        root: PathBuf,
        reason: String,
    },
    #[error(transparent)]
    Import(ImportError),
}

impl ImportError {
    /// The error as `check` prints it: codespan's report, pointing at the import.
    pub fn render(&self) -> String {
        use codespan_reporting::diagnostic::{Diagnostic, Label};
        use codespan_reporting::files::SimpleFile;
        let file = SimpleFile::new(self.file.display().to_string(), self.text.as_str());
        let diagnostic = Diagnostic::error()
            .with_message(&self.message)
            .with_labels(vec![Label::primary((), self.span.clone())])
            .with_notes(self.notes.clone());
        let config = codespan_reporting::term::Config::default();
        codespan_reporting::term::emit_into_string(&config, &file, &diagnostic)
            .unwrap_or_else(|_| format!("error: {self}\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_are_found_with_their_format_and_position() {
        let source = "let a = import \"a.ncl\" in\n{ b = import \"d/b.txt\" as 'Text, c = a }";
        let found = imports(source).unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].path, "a.ncl");
        assert_eq!(&source[found[0].span.clone()], "\"a.ncl\"");
        assert_eq!(found[1].format, Some(InputFormat::Text));
        assert_eq!(&source[found[1].span.clone()], "\"d/b.txt\"");
        assert!(imports("import foo").is_err());
    }

    #[test]
    fn imports_are_found_past_comments_strings_and_escapes() {
        let found = imports(
            r#"let a = import "a.ncl" in
# import "commented.ncl"
let s = "import \"in-a-string.ncl\"" in
{ b = import "dir/b.yaml" as 'Nickel, c = import "c\"q.json", d = "%{import "d.txt"}" }"#,
        )
        .unwrap();
        let found: Vec<(String, Option<InputFormat>)> =
            found.into_iter().map(|i| (i.path, i.format)).collect();
        assert_eq!(
            found,
            [
                ("a.ncl".to_owned(), None),
                ("dir/b.yaml".to_owned(), Some(InputFormat::Nickel)),
                ("c\"q.json".to_owned(), None),
                ("d.txt".to_owned(), None),
            ]
        );
        let (_, err) = imports("import foo").unwrap_err();
        assert!(err.contains("imports a package"), "{err}");
    }

    #[test]
    fn imports_stay_inside_the_root_after_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::write(dir.path().join("secret"), "s3cret").unwrap();
        std::fs::write(ws.join("sub/routes.ncl"), "[]").unwrap();
        std::os::unix::fs::symlink("../../secret", ws.join("sub/link")).unwrap();
        std::os::unix::fs::symlink("routes.ncl", ws.join("sub/inner")).unwrap();
        let root = Root::of(&ws.join("w.ncl"), None).unwrap();
        assert!(root.resolve(&ws, "sub/routes.ncl").is_ok());
        assert!(root.resolve(&ws, "sub/inner").is_ok(), "a link inside");
        assert!(root.resolve(&ws, "sub/../sub/routes.ncl").is_ok());
        for escape in ["../secret", "/etc/passwd", "sub/link", "sub/../../secret"] {
            assert!(root.resolve(&ws, escape).is_err(), "{escape}");
        }
        // The walk refuses at the import, naming file and position.
        std::fs::write(
            ws.join("w.ncl"),
            "{ zone = import \"sub/link\" as 'Text, routes = import \"sub/routes.ncl\" }",
        )
        .unwrap();
        let error = match walk(&ws.join("w.ncl"), &root) {
            Err(WalkError::Import(error)) => error,
            other => panic!("{other:?}"),
        };
        let report = error.render();
        assert!(report.contains("w.ncl:1:"), "{report}");
        assert!(report.contains("import outside the workspace"), "{report}");
        assert!(!report.contains("s3cret"), "{report}");
        // A wider root lets it in.
        let wide = Root::of(&ws.join("w.ncl"), Some(dir.path())).unwrap();
        let walked = walk(&ws.join("w.ncl"), &wide).unwrap();
        assert_eq!(walked.files.len(), 3);
    }
}
