//! The files a workspace is made of, as the ConfigMap ships them: the workspace and what it
//! imports, inside its tree ([`crate::evaluate::imports`]), laid out at their relative paths.

use super::*;
use crate::evaluate::input::Input;
use nickel_lang_core::cache::InputFormat;

/// The workspace file and every file it imports, transitively, as they will sit in the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceFiles {
    /// The workspace's path relative to the files' common directory, `/`-separated.
    pub entry: String,
    /// Contents by relative path, `/`-separated.
    pub files: BTreeMap<String, String>,
    /// The directory of the workspace file here, where its relative paths (error pages) start.
    pub dir: Option<PathBuf>,
}

impl WorkspaceFiles {
    /// [`WorkspaceFiles::read`] for a workspace that is a file or text already read. Text has no
    /// file name: it ships as `workspace.ncl` (`workspace.json` when it is JSON) in the current
    /// directory, from where its imports resolve.
    pub fn of(input: &Input, root: Option<&Path>) -> Result<WorkspaceFiles, DeployError> {
        let (name, text) = match input {
            Input::File(path) => return WorkspaceFiles::read(path, root),
            Input::Text { name, text } => (name, text),
        };
        let read_error = |reason: String| DeployError::Read {
            path: PathBuf::from(name),
            reason,
        };
        let dir = std::env::current_dir().map_err(|err| read_error(err.to_string()))?;
        let format = crate::evaluate::contract::text_format(text);
        let shipped = dir.join(match format {
            InputFormat::Json => "workspace.json",
            _ => "workspace.ncl",
        });
        // Walked under its own name, which no file has, then renamed: an import of a file by the
        // name the text ships as is refused rather than shadowed.
        let read = dir.join(name);
        let tree = Root::of(&read, root).map_err(|err| read_error(err.to_string()))?;
        let mut walked =
            imports::walk_text(&read, &dir, text, format, &tree).map_err(walk_error)?;
        if walked.files.contains_key(&shipped) {
            return Err(DeployError::ConfigMapFile {
                path: shipped,
                reason: format!(
                    "the workspace read from {name} ships under this name, and imports the file \
                     of that name; render it from its file instead"
                ),
            });
        }
        if let Some(text) = walked.files.remove(&read) {
            walked.files.insert(shipped.clone(), text);
        }
        let mut files = Self::laid_out(&shipped, walked)?;
        files.dir = Some(dir);
        Ok(files)
    }

    /// Reads `workspace` and follows its `import "…"`s ([`crate::evaluate::imports::walk`]: confined to
    /// `root`, the workspace's directory unless wider, as the evaluation is). Imports are found
    /// with Nickel's own lexer rather than by evaluating: this runs in the parent process, after
    /// the sandboxed evaluation has already accepted the workspace, and lexing cannot loop or
    /// recurse. Paths keep their layout relative to the files' deepest common directory, so
    /// relative imports still resolve in the pod.
    pub fn read(workspace: &Path, root: Option<&Path>) -> Result<WorkspaceFiles, DeployError> {
        let read_error = |path: &Path, reason: String| DeployError::Read {
            path: path.to_owned(),
            reason,
        };
        let entry = std::path::absolute(workspace)
            .map(|path| normalize(&path))
            .map_err(|err| read_error(workspace, err.to_string()))?;
        let tree = Root::of(&entry, root)
            .map_err(|err| read_error(root.unwrap_or(&entry), err.to_string()))?;
        let walked = imports::walk(&entry, &tree).map_err(walk_error)?;
        let mut files = Self::laid_out(&entry, walked)?;
        files.dir = entry.parent().map(Path::to_owned);
        Ok(files)
    }

    /// The files `walked` read, at their paths relative to their deepest common directory.
    fn laid_out(entry: &Path, walked: imports::Walked) -> Result<WorkspaceFiles, DeployError> {
        if let Some((path, reason)) = walked.unreadable.into_iter().next() {
            return Err(DeployError::Read { path, reason });
        }
        let contents = walked.files;
        let root = common_dir(contents.keys());
        let relative = |path: &Path| {
            let parts: Vec<_> = path
                .strip_prefix(&root)
                .unwrap_or(path)
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            parts.join("/")
        };
        Ok(WorkspaceFiles {
            entry: relative(entry),
            files: contents
                .into_iter()
                .map(|(path, text)| (relative(&path), text))
                .collect(),
            dir: None,
        })
    }
}

fn walk_error(err: WalkError) -> DeployError {
    match err {
        WalkError::Read { path, reason } => DeployError::Read { path, reason },
        WalkError::Outside { ref path, .. } => DeployError::Scan {
            path: path.clone(),
            reason: err.to_string(),
        },
        WalkError::Import(error) => DeployError::Scan {
            path: error.file.clone(),
            reason: error.message,
        },
    }
}

/// The deepest directory holding every path.
pub(super) fn common_dir<'a>(mut paths: impl Iterator<Item = &'a PathBuf>) -> PathBuf {
    let Some(first) = paths.next() else {
        return PathBuf::from("/");
    };
    let mut root = first.parent().map(Path::to_owned).unwrap_or_default();
    for path in paths {
        while !path.starts_with(&root) {
            if !root.pop() {
                break;
            }
        }
    }
    root
}
