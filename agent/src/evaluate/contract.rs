//! Evaluates a workspace file with the bundled contract into a [`Workspace`].
//!
//! The contract (`schema/private_ingress.ncl`, compiled into the binary) is applied to whatever the
//! workspace evaluates to, so a workspace can be plain data — Nickel, or JSON, YAML or TOML, chosen
//! by the file's extension. Imports resolve relative to the importing file, and stay inside the
//! workspace's directory tree ([`crate::evaluate::imports`]). A workspace already read ([`Input::Text`]:
//! standard input, a pipe) is evaluated from memory, as a source Nickel holds, and imports from
//! the current directory. Nickel's diagnostics go through [`crate::evaluate::diagnostics`] before anyone
//! reads them.
//!
//! Three rules are checked here, after evaluation, rather than in Nickel: the uniqueness of a
//! route's match (host, path rule, method, header matches) across routes, because a hash map
//! makes it linear where a Nickel fold is quadratic (and aborts on a deep stack at ten thousand
//! routes); the regular expressions, which Nickel's regex engine is not sozu's; and the pairing of
//! `tls_rotation = 'sozu_managed` with an `acme` record. All point at the offending source
//! with file, line and column.
//!
//! nickel-lang-core's values are not `Send`, has no step limit, and aborts the process on a stack
//! overflow: callers that evaluate untrusted input go through [`crate::evaluate::sandbox`], which runs this
//! module in a child process with a deadline and a memory cap.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use codespan_reporting::diagnostic::{Diagnostic, Label};
use nickel_lang_core::cache::{
    CacheHub, ImportResolver, InputFormat, SourcePath, IN_MEMORY_SOURCE_PATH_PREFIX,
};
use nickel_lang_core::error::{IntoDiagnostics, NullReporter};
use nickel_lang_core::eval::cache::CacheImpl;
use nickel_lang_core::eval::value::{Container, NickelValue};
use nickel_lang_core::eval::{VirtualMachine, VmContext};
use nickel_lang_core::files::{FileId, Files};
use nickel_lang_core::identifier::LocIdent;
use nickel_lang_core::position::PosTable;
use nickel_lang_core::program::FieldPath;
use serde::Deserialize;

use crate::evaluate::diagnostics;
use crate::evaluate::imports::{self, Root, WalkError};
use crate::evaluate::input::Input;
use crate::workspace::{RawWorkspace, TlsRotation, Workspace};

/// The contract, as shipped in `schema/private_ingress.ncl`.
pub const SCHEMA: &str = include_str!("../../../schema/private_ingress.ncl");

/// The name the bundled contract carries in diagnostics.
const SCHEMA_NAME: &str = "bundled:private_ingress.ncl";

/// At most this many duplicate pairs are reported at once; the rest follow after a fix.
const MAX_DUPLICATES_REPORTED: usize = 10;

#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    /// The workspace file cannot be read at all (missing, a directory, no permission).
    #[error("cannot read workspace {}: {reason}", path.display())]
    Unreadable { path: PathBuf, reason: String },
    /// The workspace does not parse, fails to evaluate or breaks the contract. `diagnostic` is the
    /// rendered report: file, line, column, the offending value and what was expected.
    #[error("{diagnostic}")]
    Invalid { diagnostic: String },
}

impl ContractError {
    fn invalid(diagnostic: impl Into<String>) -> ContractError {
        ContractError::Invalid {
            diagnostic: diagnostic.into(),
        }
    }
}

/// Evaluates `path` in this process, its imports confined to its own directory. Only for trusted
/// input (tests, benchmarks): a workspace that recurses without end overflows the stack and
/// aborts the process. Everything else goes through [`crate::evaluate::sandbox::evaluate`].
pub fn evaluate(path: &Path) -> Result<Workspace, ContractError> {
    evaluate_in(path, None)
}

/// [`evaluate`], with the imports confined to `root` (an ancestor of the workspace's directory)
/// instead: every import is checked before Nickel reads anything ([`crate::evaluate::imports`]).
pub fn evaluate_in(path: &Path, root: Option<&Path>) -> Result<Workspace, ContractError> {
    evaluate_input(&Input::File(path.to_owned()), root)
}

/// [`evaluate_in`] for a workspace that is a file or text already read ([`Input`]). Text is
/// evaluated from memory, never read again; its imports resolve from the current directory.
pub fn evaluate_input(input: &Input, root: Option<&Path>) -> Result<Workspace, ContractError> {
    evaluate_input_for(
        input,
        root,
        Target::Agent,
        DEFAULT_ADMIN_PORT,
        Afterwards::Free,
    )
}

/// The port of the agent's admin server unless `--admin-address` says otherwise
/// ([`crate::cli::DEFAULT_ADMIN_ADDRESS`]), and the port of the rendered pod's.
pub const DEFAULT_ADMIN_PORT: u16 = 9180;

/// What a workspace is evaluated for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Target {
    /// The agent, or any output made from the whole model.
    #[default]
    Agent,
    /// sozu's configuration file (`render --format sozu-toml`), which cannot hold every policy
    /// the agent applies over the socket: what it cannot hold is refused at its value.
    SozuToml,
    /// The Kubernetes manifests (`render --format k8s`): the pod's admin port is
    /// [`DEFAULT_ADMIN_PORT`] whatever `--admin-address` says, and the Service takes clients on
    /// 80 and 443 for the listeners, so no route of its own port may be there either.
    K8s,
}

/// [`evaluate_input`], for `target`, beside an agent whose admin server listens on
/// `admin_port`: a route of its own port may not take it; what the evaluation built is then
/// freed or left as `afterwards` says.
pub fn evaluate_input_for(
    input: &Input,
    root: Option<&Path>,
    target: Target,
    admin_port: u16,
    afterwards: Afterwards,
) -> Result<Workspace, ContractError> {
    evaluate_with(
        input,
        root,
        target,
        admin_port,
        SCHEMA,
        std::io::sink(),
        afterwards,
    )
}

/// What becomes of an evaluation's own memory (its sources, terms and positions) once the
/// workspace is read from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Afterwards {
    Free,
    /// Never freed, in a process that exits once it has the workspace (the sandbox's child):
    /// freeing it term by term is 20–30 ms of a core that sozu shares at 10,000 routes.
    LeftToExit,
}

/// [`evaluate_input_for`] with `schema` as the contract, and what the contract writes with
/// `std.trace` sent to `trace`: the unit tests evaluate variants of the bundled contract (one
/// without its fast tiers, one that traces the tier each route takes), which nothing else can.
fn evaluate_with(
    input: &Input,
    root: Option<&Path>,
    target: Target,
    admin_port: u16,
    schema: &str,
    trace: impl std::io::Write + 'static,
    afterwards: Afterwards,
) -> Result<Workspace, ContractError> {
    let mut cache = CacheHub::new();
    // The tree the workspace may read (imports, error pages), and its directory, where its
    // relative paths start.
    let (import, tree, dir) = match input {
        Input::File(path) => {
            let path = readable_workspace(path)?;
            let tree = check_imports(&path, root, |confined| imports::walk(&path, confined))?;
            let import = format!(
                "import \"{}\"",
                escape_nickel_string(&path.to_string_lossy())
            );
            let dir = path
                .parent()
                .map_or_else(|| PathBuf::from("/"), Path::to_owned);
            (import, tree, dir)
        }
        Input::Text { name, text } => {
            let dir = std::env::current_dir().map_err(|err| ContractError::Unreadable {
                path: PathBuf::from(name),
                reason: format!("the current directory: {}", io_reason(&err)),
            })?;
            let entry = dir.join(name);
            let format = text_format(text);
            let tree = check_imports(&entry, root, |confined| {
                imports::walk_text(Path::new(name), &dir, text, format, confined)
            })?;
            cache
                .sources
                .add_string(SourcePath::Path(PathBuf::from(name), format), text.clone());
            // nickel-lang-core's way to import a source it holds in memory.
            let import = format!(
                "import \"{IN_MEMORY_SOURCE_PATH_PREFIX}{}\"{}",
                escape_nickel_string(name),
                if format == InputFormat::Json {
                    " as 'Json"
                } else {
                    ""
                }
            );
            (import, tree, dir)
        }
    };
    let main = format!("{schema}\n|> (fun schema => ({import}) | schema.Workspace)\n");
    let main_id = cache.sources.add_string(
        SourcePath::Path(PathBuf::from(SCHEMA_NAME), InputFormat::Nickel),
        main,
    );
    let plumbing = diagnostics::Plumbing {
        file: main_id,
        from: schema.len(),
    };
    let mut vm: VmContext<CacheHub, CacheImpl> = VmContext::new(cache, trace, NullReporter {});
    let value = match eval_for_export(&mut vm, main_id) {
        Ok(value) => value,
        Err(err) => {
            let mut files = vm.import_resolver.files().clone();
            let found = err.into_diagnostics(&mut files);
            let reworded = diagnostics::reword(found, &files, plumbing);
            return Err(ContractError::invalid(render(&files, &reworded)));
        }
    };
    let raw = RawWorkspace::deserialize(value.clone()).map_err(|err| {
        ContractError::invalid(format!(
            "error: the workspace passed the contract but cannot be read: {err}"
        ))
    })?;

    let located = Located {
        files: vm.import_resolver.files().clone(),
        pos_table: &vm.pos_table,
        root: &value,
    };
    located.check_rotation_mode(&raw)?;
    located.check_regexes(&raw)?;
    located.check_unique_routes(&raw)?;
    located.check_ports(&raw, target, admin_port)?;
    located.check_client_auth_reach(&raw)?;
    located.check_pages_inside(&raw, &tree, &dir)?;
    if target == Target::SozuToml {
        located.check_sozu_toml(&raw)?;
    }

    let mut workspace =
        Workspace::from_raw(raw).map_err(|err| ContractError::invalid(format!("error: {err}")))?;
    // Error pages and users files named relative to the workspace are read from its directory.
    workspace.anchor_files(&dir);
    if afterwards == Afterwards::LeftToExit {
        std::mem::forget(located);
        std::mem::forget(value);
        std::mem::forget(vm);
    }
    Ok(workspace)
}

/// What `Program::eval_full_for_export` does, on a context whose sources were added by hand (a
/// `Program` takes one in-memory source, and a workspace read from a pipe is a second).
fn eval_for_export(
    vm: &mut VmContext<CacheHub, CacheImpl>,
    main_id: FileId,
) -> Result<NickelValue, nickel_lang_core::error::Error> {
    let prepared = vm.prepare_eval(main_id)?;
    let mut machine = VirtualMachine::new(vm);
    let closure = machine.extract_field_value_closure(prepared.into(), &FieldPath::new())?;
    Ok(machine.eval_full_for_export_closure(closure)?)
}

/// Walks the workspace's imports (`walk`) confined to `root`, or to the directory of `entry`
/// (absolute), turning what stops it into the error `check` reports; returns that tree.
fn check_imports(
    entry: &Path,
    root: Option<&Path>,
    walk: impl FnOnce(&Root) -> Result<imports::Walked, WalkError>,
) -> Result<Root, ContractError> {
    let confined = Root::of(entry, root).map_err(|err| ContractError::Unreadable {
        path: root.unwrap_or(entry).to_owned(),
        reason: format!("the workspace root: {}", io_reason(&err)),
    })?;
    match walk(&confined) {
        Ok(_) => Ok(confined),
        Err(WalkError::Import(error)) => Err(ContractError::invalid(error.render())),
        Err(error @ WalkError::Outside { .. }) => {
            Err(ContractError::invalid(format!("error: {error}\n")))
        }
        Err(WalkError::Read { path, reason }) => Err(ContractError::Unreadable { path, reason }),
    }
}

/// How a workspace read as text is parsed: JSON when it is JSON (which Nickel's syntax is not),
/// Nickel otherwise.
pub fn text_format(text: &str) -> InputFormat {
    if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() {
        InputFormat::Json
    } else {
        InputFormat::Nickel
    }
}

/// `diagnostics` as text, without colour (a diagnostic is also logged and served).
fn render(files: &Files, diagnostics: &[Diagnostic<FileId>]) -> String {
    let config = codespan_reporting::term::Config::default();
    let mut out = String::new();
    for diagnostic in diagnostics {
        match codespan_reporting::term::emit_into_string(&config, files, diagnostic) {
            Ok(text) => out.push_str(&text),
            Err(_) => {
                let _ = writeln!(out, "error: {}", diagnostic.message);
            }
        }
    }
    out
}

/// Fails early, with one line, on a path that cannot be a workspace; Nickel's own message for a
/// missing import is a multi-line report about the generated entry point.
fn readable_workspace(path: &Path) -> Result<PathBuf, ContractError> {
    let unreadable = |reason: String| ContractError::Unreadable {
        path: path.to_owned(),
        reason,
    };
    let absolute = std::path::absolute(path).map_err(|err| unreadable(err.to_string()))?;
    let metadata = std::fs::metadata(&absolute).map_err(|err| unreadable(io_reason(&err)))?;
    if metadata.is_dir() {
        return Err(unreadable("it is a directory".into()));
    }
    std::fs::File::open(&absolute).map_err(|err| unreadable(io_reason(&err)))?;
    Ok(absolute)
}

fn io_reason(err: &std::io::Error) -> String {
    match err.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => err.to_string(),
    }
}

fn escape_nickel_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("\\%"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The evaluated workspace together with what is needed to point back at its source.
struct Located<'a> {
    files: Files,
    pos_table: &'a PosTable,
    root: &'a NickelValue,
}

impl Located<'_> {
    /// `'sozu_managed` needs an `acme` record, and an `acme` record means nothing in another mode:
    /// both are mistakes an operator wants to hear about, not settings to ignore.
    fn check_rotation_mode(&self, raw: &RawWorkspace) -> Result<(), ContractError> {
        let sozu_managed = raw.tls_rotation == TlsRotation::SozuManaged;
        let (message, field, label, notes) = match (sozu_managed, &raw.acme) {
            (true, None) => (
                "tls_rotation 'sozu_managed needs an `acme` record",
                "tls_rotation",
                "set here",
                vec![
                    "The agent orders the certificates itself: give at least `acme = { dns01 = { provider = 'cloudflare, api_token_file = \"/run/secrets/cloudflare/token\" } }`.".into(),
                    "See docs/acme.md for the fields and the DNS providers.".into(),
                ],
            ),
            (false, Some(_)) => (
                "`acme` is only read with tls_rotation 'sozu_managed",
                "acme",
                "this record",
                vec![format!(
                    "tls_rotation is '{}: cert-manager obtains the certificates. Set tls_rotation = 'sozu_managed, or remove `acme`.",
                    raw.tls_rotation
                )],
            ),
            _ => return Ok(()),
        };
        let mut diagnostic = Diagnostic::error().with_message(message).with_notes(notes);
        if let Some((file, range)) = self.field_span(self.root, field) {
            diagnostic =
                diagnostic.with_labels(vec![Label::primary(file, range).with_message(label)]);
        }
        Err(ContractError::invalid(self.render(&[diagnostic])))
    }

    /// A `path_regex` or a header match's `regex` that sozu would not compile is refused at its
    /// value: compiled here with the crate and the type sozu-lib 2.3.3 routes with, alone and
    /// anchored as sozu anchors it ([`crate::workspace::regex_problem`]).
    fn check_regexes(&self, raw: &RawWorkspace) -> Result<(), ContractError> {
        use crate::workspace::regex_problem;
        for (index, route) in raw.routes.iter().enumerate() {
            let mut found = route
                .path_regex
                .as_deref()
                .and_then(|p| Some((regex_problem(p)?, "path_regex", None, p)));
            for (i, header) in route.match_headers.iter().flatten().enumerate() {
                if found.is_some() {
                    break;
                }
                found = header
                    .regex
                    .as_deref()
                    .and_then(|p| Some((regex_problem(p)?, "match_headers", Some(i), p)));
            }
            let Some((problem, field, header, pattern)) = found else {
                continue;
            };
            let span = (|| {
                let Container::Alloc(array) = self.field(self.root, "routes")?.as_array()? else {
                    return None;
                };
                let route = array.array.iter().nth(index)?;
                match header {
                    None => self.field_span(route, field),
                    Some(i) => {
                        let Container::Alloc(headers) = self.field(route, field)?.as_array()?
                        else {
                            return None;
                        };
                        self.field_span(headers.array.iter().nth(i)?, "regex")
                    }
                }
            })();
            let what = match header {
                None => "path_regex".to_owned(),
                Some(i) => format!("match_headers[{i}].regex"),
            };
            let mut diagnostic = Diagnostic::error()
                .with_message(format!(
                    "routes[{index}]: {what} `{}` does not compile: {problem}",
                    crate::text::clean_line(pattern, 64)
                ))
                .with_notes(vec![
                    "sozu compiles it with Rust's `regex` crate (https://docs.rs/regex, \"Syntax\") and refuses the route otherwise; it matches the whole value, as if written between `^` and `$`.".into(),
                ]);
            if let Some((file, range)) = span {
                diagnostic = diagnostic.with_labels(vec![
                    Label::primary(file, range).with_message("this expression")
                ]);
            }
            return Err(ContractError::invalid(self.render(&[diagnostic])));
        }
        Ok(())
    }

    /// Every HTTPS route must be told apart from its host's others by what sozu files its
    /// frontend under (its path rule, method and header matches): sozu would refuse the second
    /// frontend. (Routes of their own port are [`Located::check_ports`]'.)
    fn check_unique_routes(&self, raw: &RawWorkspace) -> Result<(), ContractError> {
        // What sozu files a route's frontend under, beside its host; `None` for a route whose
        // match the conversion refuses anyway (it says why).
        let identity = |route: &crate::workspace::RawRoute| {
            let raw = crate::workspace::Route::from_raw(route.clone()).ok()?;
            match &raw.kind {
                crate::workspace::RouteKind::Http(http) => Some((
                    http.path.rule(),
                    http.method.clone(),
                    http.match_headers.clone(),
                    http.prefix_only(),
                    http.place(),
                )),
                _ => None,
            }
        };
        type Identity = (
            crate::workspace::PathRule,
            Option<String>,
            Vec<crate::workspace::HeaderMatch>,
        );
        let mut first_seen: HashMap<(&str, Identity), usize> =
            HashMap::with_capacity(raw.routes.len());
        let mut places: HashMap<usize, (bool, String)> = HashMap::new();
        let mut duplicates = Vec::new();
        for (index, route) in raw.routes.iter().enumerate() {
            if route.listen_port.is_some() {
                continue;
            }
            // A route matched by its prefix alone, as every route was before the other fields:
            // no conversion needed to know its identity.
            let plain = route.path_segment_prefix.is_none()
                && route.path_exact.is_none()
                && route.path_regex.is_none()
                && route.method.is_none()
                && route.match_headers.as_ref().is_none_or(Vec::is_empty);
            let key: Identity = if plain {
                (
                    crate::workspace::PathRule::prefix(&route.path_prefix),
                    None,
                    Vec::new(),
                )
            } else {
                let Some((rule, method, headers, prefix_only, place)) = identity(route) else {
                    continue;
                };
                places.insert(index, (prefix_only, place));
                (rule, method, headers)
            };
            let key = (route.host.as_str(), key);
            match first_seen.get(&key) {
                Some(&first) => duplicates.push((first, index)),
                None => {
                    first_seen.insert(key, index);
                }
            }
        }
        if duplicates.is_empty() {
            return Ok(());
        }
        let routes = self.field(self.root, "routes");
        let element_span = |index: usize| {
            let array = routes?.as_array()?;
            let Container::Alloc(array) = array else {
                return None;
            };
            let element = array.array.iter().nth(index)?;
            self.span_of(element)
        };
        let diagnostics: Vec<_> = duplicates
            .iter()
            .take(MAX_DUPLICATES_REPORTED)
            .map(|&(first, second)| {
                let route = &raw.routes[second];
                let mut labels = Vec::new();
                if let Some((file, range)) = element_span(second) {
                    labels.push(
                        Label::primary(file, range).with_message(format!("routes[{second}]")),
                    );
                }
                if let Some((file, range)) = element_span(first) {
                    labels.push(
                        Label::secondary(file, range)
                            .with_message(format!("routes[{first}] has the same host and path")),
                    );
                }
                match (places.get(&first), places.get(&second)) {
                    (None, None) => Diagnostic::error()
                        .with_message(format!(
                            "duplicate route: host `{}` with path_prefix `{}` is declared by routes[{first}] and routes[{second}]",
                            route.host, route.path_prefix
                        ))
                        .with_labels(labels)
                        .with_notes(vec![
                            "Each (host, path_prefix) pair may appear once; merge the entries or give one another path_prefix.".into(),
                        ]),
                    (a, b) => {
                        let shown = |i: usize, p: Option<&(bool, String)>| match p {
                            Some((_, place)) => format!("routes[{i}] matches `{place}`"),
                            None => format!("routes[{i}] matches `{}`", raw.routes[i].path_prefix),
                        };
                        Diagnostic::error()
                            .with_message(format!(
                                "duplicate route: host `{}`: {} and {}, which sozu files as one frontend",
                                route.host,
                                shown(first, a),
                                shown(second, b)
                            ))
                            .with_labels(labels)
                            .with_notes(vec![
                                "Two routes of a host must differ in their path, `method` or `match_headers` as sozu matches them (docs/contract.md, \"Matching\"): merge the entries, or tell them apart.".into(),
                            ])
                    }
                }
            })
            .collect();
        let mut report = self.render(&diagnostics);
        if duplicates.len() > MAX_DUPLICATES_REPORTED {
            let _ = writeln!(
                report,
                "... and {} more duplicate routes",
                duplicates.len() - MAX_DUPLICATES_REPORTED
            );
        }
        Err(ContractError::invalid(report))
    }

    /// The ports of the routes of their own port: each is one listener of sozu's, on the https
    /// listener's address, so it is not one of the HTTP listeners' ports (for TCP); it takes one
    /// TCP route, or TLS passed through for distinct hosts (sozu's listener reads the SNI for
    /// every connection or for none), or one UDP route; and a port is TCP or UDP, not both (the
    /// agent keeps a listener per address). A host passed through is not also one sozu
    /// terminates: its certificate and its clients would be two places at once.
    ///
    /// Nor is it a port of the agent's own, whatever the route's protocol: the admin server's
    /// (`admin_port`, from `--admin-address`) and the access-log receiver's (`traffic.listen`).
    /// sozu shares the agent's network (a pod's), so it could not bind them, and deployed, the
    /// route's port goes on the load balancer and into the NetworkPolicy: the admin API would
    /// be open to every client the listeners admit. For `target` k8s the pod's admin port is
    /// checked too, and a TCP port may not be one the Service takes for the listeners (80, 443).
    fn check_ports(
        &self,
        raw: &RawWorkspace,
        target: Target,
        admin_port: u16,
    ) -> Result<(), ContractError> {
        use crate::workspace::RawProtocol;
        let listener_port = |address: &str| {
            address
                .rsplit_once(':')
                .and_then(|(_, port)| port.parse::<f64>().ok())
        };
        let http_ports = [
            ("https", listener_port(&raw.listeners.https)),
            ("http", listener_port(&raw.listeners.http)),
        ];
        let admin_note = "The agent serves /healthz, /readyz, /metrics, /v1/state and /v1/events there: sozu could not bind the port, and deployed, the route would put the admin API on the load balancer. Give the route another port (or the agent another `--admin-address`, PRIVATE_INGRESS_ADMIN_ADDRESS, as `check`, `render` and `run` read it).";
        let mut agent_ports = vec![(
            f64::from(admin_port),
            format!("the agent's admin port (--admin-address, {DEFAULT_ADMIN_PORT} unless given)"),
            admin_note,
        )];
        if target == Target::K8s && admin_port != DEFAULT_ADMIN_PORT {
            agent_ports.push((
                f64::from(DEFAULT_ADMIN_PORT),
                "the rendered pod's admin port".to_owned(),
                admin_note,
            ));
        }
        let traffic_listen = raw
            .traffic
            .as_ref()
            .map_or(crate::workspace::DEFAULT_TRAFFIC_LISTEN.port(), |t| {
                listener_port(&t.listen).map_or(0, |p| p as u16)
            });
        agent_ports.push((
            f64::from(traffic_listen),
            "the access-log receiver's port (traffic.listen)".to_owned(),
            "The agent receives sozu's access records there (UDP): give the route another port, or `traffic.listen` another address.",
        ));
        // The Service takes clients of the listeners at the standard ports, whichever ports the
        // listeners have in the pod (a route on a listener's own port is refused above).
        let service_ports: &[(f64, &str)] = if target == Target::K8s {
            &[(443.0, "https"), (80.0, "http")]
        } else {
            &[]
        };
        let terminated: std::collections::HashSet<&str> = raw
            .routes
            .iter()
            .filter(|r| matches!(r.protocol, None | Some(RawProtocol::Https)))
            .map(|r| r.host.as_str())
            .collect();
        // Port → the first route on it, with its protocol.
        let mut on_port: HashMap<u64, (usize, RawProtocol)> = HashMap::new();
        for (index, route) in raw.routes.iter().enumerate() {
            let (Some(protocol), Some(port)) = (route.protocol, route.listen_port) else {
                continue;
            };
            let name = |p: RawProtocol| match p {
                RawProtocol::Https => "https",
                RawProtocol::Tcp => "tcp",
                RawProtocol::TlsPassthrough => "tls_passthrough",
                RawProtocol::Udp => "udp",
            };
            let problem = if protocol != RawProtocol::Udp {
                http_ports
                    .iter()
                    .find(|(_, p)| *p == Some(port))
                    .map(|(listener, _)| {
                        (
                            format!("listen_port {port} is the {listener} listener's port"),
                            None,
                            format!("sozu listens there for every HTTP route; give the '{} route a port of its own", name(protocol)),
                        )
                    })
            } else {
                None
            };
            let problem = problem.or_else(|| {
                agent_ports
                    .iter()
                    .find(|(p, _, _)| *p == port)
                    .map(|(_, what, note)| {
                        (
                            format!("listen_port {port} is {what}"),
                            None,
                            (*note).to_owned(),
                        )
                    })
            });
            let problem = problem.or_else(|| {
                let (_, listener) = service_ports
                    .iter()
                    .filter(|_| protocol != RawProtocol::Udp)
                    .find(|(p, _)| *p == port)?;
                Some((
                    format!("listen_port {port} is the load balancer's {listener} port"),
                    None,
                    format!("The rendered Service takes the {listener} listener's clients on port {port} (to the listener's own port in the pod), and each route of its own port at its listen_port: one Service cannot have port {port}/TCP twice. Give the '{} route another port.", name(protocol)),
                ))
            });
            let problem = problem.or_else(|| {
                (protocol == RawProtocol::TlsPassthrough && terminated.contains(route.host.as_str()))
                    .then(|| {
                        (
                            format!("host `{}` is both passed through and terminated", route.host),
                            None,
                            "An 'https route of the same host has sozu terminate its TLS with the host's certificate; passing it through leaves TLS to the backend. Give the passed-through service a host of its own.".to_owned(),
                        )
                    })
            });
            let problem = problem.or_else(|| {
                let (first, first_protocol) = *on_port.get(&(port as u64))?;
                let shared = first_protocol == RawProtocol::TlsPassthrough
                    && protocol == RawProtocol::TlsPassthrough
                    && raw.routes[first].host != route.host;
                (!shared).then(|| {
                    (
                        format!("listen_port {port} is taken by routes[{first}] ('{})", name(first_protocol)),
                        Some(first),
                        "A port takes one 'tcp route, one 'udp route, or 'tls_passthrough routes of distinct hosts: sozu's listener reads the ClientHello's SNI for every connection or for none, and the agent keeps one listener per port.".to_owned(),
                    )
                })
            });
            if let Some((message, first, note)) = problem {
                let routes = self.field(self.root, "routes").and_then(|r| r.as_array());
                let element = |i: usize| {
                    let Some(Container::Alloc(array)) = routes else {
                        return None;
                    };
                    array.array.iter().nth(i)
                };
                let mut labels = Vec::new();
                if let Some((file, range)) =
                    element(index).and_then(|r| self.field_span(r, "listen_port"))
                {
                    labels.push(Label::primary(file, range).with_message("this port"));
                }
                if let Some((file, range)) = first
                    .and_then(element)
                    .and_then(|r| self.field_span(r, "listen_port"))
                {
                    labels.push(Label::secondary(file, range).with_message("taken here"));
                }
                let diagnostic = Diagnostic::error()
                    .with_message(format!("routes[{index}]: {message}"))
                    .with_labels(labels)
                    .with_notes(vec![note]);
                return Err(ContractError::invalid(self.render(&[diagnostic])));
            }
            on_port.entry(port as u64).or_insert((index, protocol));
        }
        Ok(())
    }

    /// `listeners.client_auth.mode = 'required` keeps out of the HTTPS listener every client
    /// without a device certificate, and nothing else: sozu 2.3.3 checks client certificates on
    /// its HTTPS listener alone (`lib/src/https.rs`, `HttpsListener::client_cert_verifier`),
    /// while its TCP listener makes each connection a pipe to the backend, or an SNI preread
    /// first, with no handshake of its own (`lib/src/tcp.rs`, `TcpProxy::create_session`;
    /// `TcpListenerConfig` has no client-auth field), and its UDP listener forwards datagrams.
    /// So a route of its own port would let in whoever reaches its port, without a word: such
    /// a route is refused, at its `protocol`, unless it says `client_auth_exempt = true`
    /// (`check` then warns, and so does `status`: [`Workspace::client_auth_exemption`]).
    fn check_client_auth_reach(&self, raw: &RawWorkspace) -> Result<(), ContractError> {
        use crate::workspace::{ClientAuthMode, RawProtocol};
        if raw.listeners.client_auth.mode != ClientAuthMode::Required {
            return Ok(());
        }
        let Some((index, route, protocol)) =
            raw.routes.iter().enumerate().find_map(|(index, route)| {
                let protocol = match route.protocol? {
                    RawProtocol::Https => return None,
                    RawProtocol::Tcp => "tcp",
                    RawProtocol::TlsPassthrough => "tls_passthrough",
                    RawProtocol::Udp => "udp",
                };
                (route.client_auth_exempt != Some(true)).then_some((index, route, protocol))
            })
        else {
            return Ok(());
        };
        let span = (|| {
            let Container::Alloc(array) = self.field(self.root, "routes")?.as_array()? else {
                return None;
            };
            let element = array.array.iter().nth(index)?;
            self.field_span(element, "client_auth_exempt")
                .or_else(|| self.field_span(element, "protocol"))
        })();
        let mut diagnostic = Diagnostic::error()
            .with_message(format!(
                "routes[{index}]: the '{protocol} route `{}` would be open without a client certificate: sozu checks listeners.client_auth on the https listener only",
                route.host
            ))
            .with_notes(vec![
                "listeners.client_auth.mode is 'required, yet sozu 2.3.3's TCP and UDP listeners verify no client certificate (its TCP listener has no TLS configuration; a passed-through ClientHello goes to the backend untouched): any client that reaches the route's port gets in.".into(),
                "If that is meant (the backend authenticates its clients itself, or `allowed_sources` is narrow enough), say so on the route: `client_auth_exempt = true`. Otherwise remove the route, or have the backend check the device certificates (a 'tls_passthrough backend terminates TLS itself).".into(),
            ]);
        if let Some((file, range)) = span {
            diagnostic = diagnostic
                .with_labels(vec![Label::primary(file, range).with_message("this route")]);
        }
        Err(ContractError::invalid(self.render(&[diagnostic])))
    }

    /// An error page is sent to every client of its route, so it must be a file of the
    /// workspace's own tree, as an import must: a page named outside it (an absolute path, a
    /// `..` that climbs out, a link that leads out) is refused at its value. The agent checks
    /// again at every read, for a link put in its place later (`crate::sources::route_policy_files`).
    fn check_pages_inside(
        &self,
        raw: &RawWorkspace,
        tree: &Root,
        dir: &Path,
    ) -> Result<(), ContractError> {
        let workspace = raw.error_pages.iter().flatten().map(|page| (None, page));
        let routes = raw.routes.iter().enumerate().flat_map(|(index, route)| {
            route
                .error_pages
                .iter()
                .flatten()
                .map(move |page| (Some(index), page))
        });
        let Some((route, (status, path), reason)) =
            workspace.chain(routes).find_map(|(route, page)| {
                Some((route, page, tree.confine(dir, Path::new(page.1)).err()?))
            })
        else {
            return Ok(());
        };
        let span = (|| {
            let owner = match route {
                None => self.root,
                Some(index) => {
                    let Container::Alloc(array) = self.field(self.root, "routes")?.as_array()?
                    else {
                        return None;
                    };
                    array.array.iter().nth(index)?
                }
            };
            self.field_span(self.field(owner, "error_pages")?, status)
        })();
        let mut diagnostic = Diagnostic::error()
            .with_message(format!(
                "error page `{path}` is not in the workspace's tree: {reason}"
            ))
            .with_notes(vec![
                "sozu sends an error page to every client of the route: the agent reads pages from the workspace's directory (or `--workspace-root`) only, as it reads imports.".into(),
                "Put the page beside the workspace and name it by its relative path, e.g. \"pages/503.http\".".into(),
            ]);
        if let Some((file, range)) = span {
            diagnostic =
                diagnostic.with_labels(vec![Label::primary(file, range).with_message("this page")]);
        }
        Err(ContractError::invalid(self.render(&[diagnostic])))
    }

    /// sozu's configuration file knows the 301 redirect only (its parser has no word for 302
    /// and 308): a route asking for another is refused there, at its status, rather than
    /// written as a 301.
    fn check_sozu_toml(&self, raw: &RawWorkspace) -> Result<(), ContractError> {
        let Some((index, status)) = raw.routes.iter().enumerate().find_map(|(i, r)| {
            let status = r.redirect.as_ref()?.status;
            (status != 301.0).then_some((i, status))
        }) else {
            return Ok(());
        };
        let span = (|| {
            let Container::Alloc(array) = self.field(self.root, "routes")?.as_array()? else {
                return None;
            };
            let route = array.array.iter().nth(index)?;
            let redirect = self.field(route, "redirect")?;
            self.field_span(redirect, "status")
        })();
        let mut diagnostic = Diagnostic::error()
            .with_message(format!(
                "redirect.status {status} cannot be written in sozu's configuration file"
            ))
            .with_notes(vec![
                "sozu's file knows the 301 redirect only; 302 and 308 exist on its socket, where the agent applies them.".into(),
                "Run the agent beside sozu (or render --format k8s), or use status 301 for the rendered file.".into(),
            ]);
        if let Some((file, range)) = span {
            diagnostic = diagnostic
                .with_labels(vec![Label::primary(file, range).with_message("this status")]);
        }
        Err(ContractError::invalid(self.render(&[diagnostic])))
    }

    fn field<'v>(&self, record: &'v NickelValue, name: &str) -> Option<&'v NickelValue> {
        let Container::Alloc(record) = record.as_record()? else {
            return None;
        };
        record.fields.get(&LocIdent::from(name))?.value.as_ref()
    }

    fn field_span(
        &self,
        record: &NickelValue,
        name: &str,
    ) -> Option<(FileId, std::ops::Range<usize>)> {
        self.span_of(self.field(record, name)?)
    }

    fn span_of(&self, value: &NickelValue) -> Option<(FileId, std::ops::Range<usize>)> {
        let span = value.pos(self.pos_table).into_opt()?;
        // A value the standard library built (a string turned into a tag) points nowhere useful.
        if self.files.is_stdlib(span.src_id) {
            return None;
        }
        Some((span.src_id, span.start.0 as usize..span.end.0 as usize))
    }

    fn render(&self, diagnostics: &[Diagnostic<FileId>]) -> String {
        render(&self.files, diagnostics)
    }
}

#[cfg(test)]
mod tests;
