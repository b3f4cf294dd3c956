//! `import ingress` and `import gateway`: read the files, translate ([`crate::translate`]),
//! write the workspace (atomically, as `render --output` does) and the users files it names,
//! and say on stderr what was left out.
//!
//! Exit 0 when everything was carried, 1 when something was left out (the workspace is still
//! written), 2 when an input cannot be read or the output cannot be written: then nothing is.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::exit::IO;
use super::output::say_to;
use super::{ImportArgs, ImportCommand, TraefikImportArgs};
use crate::translate::{self, nickel, Options, SideFile, TranslateError, Translation};

/// A language's translator.
type Translator = fn(&[(String, String)], &Options) -> Result<Translation, TranslateError>;

/// Something was left out.
pub const LEFT_OUT: u8 = 1;

/// Runs the command; what it prints goes to `out` and `err`. Returns the exit code.
pub fn run(command: &ImportCommand, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let (args, translate): (&ImportArgs, Translator) = match command {
        ImportCommand::Ingress(args) => (args, translate::ingress::translate),
        ImportCommand::Gateway(args) => (args, translate::gateway::translate),
        ImportCommand::Traefik(args) => return traefik(args, out, err),
    };
    let sources = match read(&args.files) {
        Ok(sources) => sources,
        Err(message) => {
            say_to(err, "error", &message);
            return IO;
        }
    };
    let options = Options {
        zone: args.zone.clone(),
        host: args.host.clone(),
        cluster_issuer: args.cluster_issuer.clone(),
    };
    let translation: Translation = match translate(&sources, &options) {
        Ok(t) => t,
        Err(e) => {
            say_to(err, "error", format!("{e} (nothing was written)"));
            return IO;
        }
    };
    let text = nickel::workspace(&translation);
    let dir = match &args.output {
        Some(path) if path.as_os_str() != "-" => match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        },
        _ => PathBuf::from("."),
    };
    for file in &translation.side_files {
        let path = dir.join(&file.name);
        if let Err(e) = write_secret(&path, file) {
            say_to(
                err,
                "error",
                format!("cannot write {}: {e}", path.display()),
            );
            return IO;
        }
        let _ = writeln!(
            err,
            "wrote {} (basic-auth users, mode 0600), which the workspace names",
            path.display()
        );
    }
    if !write_workspace(args.output.as_deref(), &text, out, err) {
        return IO;
    }
    for left in &translation.left_out {
        say_to(err, "left out", left);
    }
    let _ = writeln!(
        err,
        "{} route{} carried, {} left out",
        translation.routes.len(),
        if translation.routes.len() == 1 {
            ""
        } else {
            "s"
        },
        translation.left_out.len()
    );
    if translation.left_out.is_empty() {
        0
    } else {
        LEFT_OUT
    }
}

/// Each file's name and text; `-` is standard input (read once).
fn read(files: &[PathBuf]) -> Result<Vec<(String, String)>, String> {
    let mut sources = Vec::new();
    for file in files {
        if file.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| format!("cannot read standard input: {e}"))?;
            sources.push(("standard input".to_owned(), text));
        } else {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            sources.push((file.display().to_string(), text));
        }
    }
    Ok(sources)
}

/// A users file, atomically and readable by its owner only from the start (a temporary file is
/// created 0600, then renamed over the path).
fn write_secret(path: &Path, file: &SideFile) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".private-ingress-")
        .tempfile_in(dir)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(file.mode))?;
    tmp.write_all(file.contents.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// `import traefik`: the files (directories read as Traefik's file provider reads them), the
/// workspace written, each router not carried over said on stderr. A file that does not parse
/// is an input that cannot be read: nothing is written (exit 2).
fn traefik(args: &TraefikImportArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    use translate::traefik;
    let sources = match read_traefik(&args.files) {
        Ok(sources) => sources,
        Err(message) => {
            say_to(err, "error", &message);
            return IO;
        }
    };
    let mut entry_points = if args.entry_points.is_empty() {
        traefik::default_entry_points()
    } else {
        Default::default()
    };
    entry_points.extend(args.entry_points.iter().cloned());
    let options = traefik::Options {
        zone: args.zone.clone(),
        entry_points,
        host: args.host.clone(),
    };
    let t = traefik::translate_texts(&sources, &options);
    if !t.broken.is_empty() {
        for broken in &t.broken {
            say_to(err, "error", broken);
        }
        let _ = writeln!(err, "nothing was written");
        return IO;
    }
    let files: Vec<String> = sources.iter().map(|(name, _)| name.clone()).collect();
    let issuer = args.cluster_issuer.as_deref().unwrap_or("internal-ca");
    let text = traefik::workspace_text::workspace(&t, &files, &args.zone, issuer);
    if !write_workspace(args.output.as_deref(), &text, out, err) {
        return IO;
    }
    for refused in &t.refused {
        say_to(err, "left out", refused);
    }
    let routers: std::collections::BTreeSet<_> = t.routes.iter().map(|r| &r.origin).collect();
    let _ = writeln!(
        err,
        "{} router{} carried ({} route{}), {} left out",
        routers.len(),
        if routers.len() == 1 { "" } else { "s" },
        t.routes.len(),
        if t.routes.len() == 1 { "" } else { "s" },
        t.refused.len()
    );
    if t.refused.is_empty() {
        0
    } else {
        LEFT_OUT
    }
}

/// Each file's name and text; a directory's `.yml`, `.yaml` and `.toml` files (those Traefik's
/// file provider reads), in name order, at any depth (it reads subdirectories too).
fn read_traefik(paths: &[PathBuf]) -> Result<Vec<(String, String)>, String> {
    let mut sources = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut files = Vec::new();
            collect(path, &mut files, 0)?;
            files.sort();
            for file in files {
                let text = std::fs::read_to_string(&file)
                    .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
                sources.push((file.display().to_string(), text));
            }
        } else {
            sources.extend(read(std::slice::from_ref(path))?);
        }
    }
    Ok(sources)
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>, depth: usize) -> Result<(), String> {
    if depth > 16 {
        return Err(format!("{}: directories nest too deeply", dir.display()));
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let path = entry.path();
        // Hidden files too: Traefik 3.7 reads a `.name.yaml` (an atomic writer's temporary file
        // is skipped for its extension, `.yaml.tmp`, as Traefik skips it).
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            collect(&path, files, depth + 1)?;
        } else if translate::traefik::Format::read_from_directory(&name) {
            files.push(path);
        }
    }
    Ok(())
}

/// The workspace text to `output` (written atomically) or, without one or with `-`, to `out`
/// (a reader that stopped reading is no error); false when it could not be written, said on
/// `err`.
fn write_workspace(
    output: Option<&Path>,
    text: &str,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> bool {
    match output {
        Some(path) if path.as_os_str() != "-" => {
            if let Err(e) = crate::render::write_atomic(path, text.as_bytes()) {
                say_to(err, "error", crate::text::error_chain(&e));
                return false;
            }
        }
        _ => {
            if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    say_to(err, "error", format!("cannot write to stdout: {e}"));
                    return false;
                }
            }
        }
    }
    true
}
