//! The `private-ingress` binary as users run it, and what it renders, checked against the tools
//! that read it: one test binary (each module one concern).

/// The harness: the binary under test, running it, golden files.
mod common;

/// Exit codes, messages, limits and output files of every subcommand.
mod cli;

/// `import ingress` and `import gateway`: what `check` accepts, what is left out, bad inputs.
mod import;

/// `import traefik`: Orca's directory and Atlas's answer, what is left out, bad inputs.
mod import_traefik;

/// Colour on a terminal, and NO_COLOR.
mod terminal;

/// Shell completions, the manual page, and the exit codes the README lists.
mod manual;

/// `render --format k8s` and `--format dns` against kubernetes-validate, dnspython and just.
mod deploy;

/// The alert rules against promtool, and the dashboard.
mod alerts;

/// The justfile's `image` and `push-images` recipes.
mod images;

/// `top`'s screens from fixed states: every pane at 80×24 and 120×40, colours, ASCII.
mod top;

/// The module maps (`lib.rs`, docs/agent.md) name every module of the crate.
mod map;
