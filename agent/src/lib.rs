//! private-ingress: keeps a sozu reverse proxy equal to a Nickel routes workspace.
//!
//! The map, from the outside in: each layer is a folder (each module's own header says more).
//!
//! | module | owns | I/O |
//! |---|---|---|
//! | [`cli`] | the command line, each command in a module of its own ([`cli::check`], [`cli::render`], [`cli::status`], [`cli::top`]); `main.rs` only dispatches | `status` and `top` read HTTP; `render` writes files |
//! | [`run`], [`supervisor`] | wiring the live agent; ending it when one of its tasks dies | signals |
//! | [`evaluate`] | reading a workspace (a file, or text read once) and evaluating it with the bundled contract in a confined child process, its imports kept in its tree; Nickel's diagnostics reworded | reads the workspace |
//! | [`workspace`] | the validated model an operator declared: routes and their kinds ([`workspace::RouteKind`]), route policies, listener policy, the `traefik` record and the routes it adds | none |
//! | [`plan`] | sozu's vocabulary ([`plan::state`], [`plan::route_policy`]), the workspace in those terms ([`plan::desired`]), and the requests from what sozu holds to that | none |
//! | [`render`], [`deploy`] | files made from the model: sozu's configuration, the JSON model and the alert rules ([`render::alerts`]); Kubernetes manifests and DNS records | writes files |
//! | [`sources`] | the slow inputs, each a task publishing facts: the workspace (joined with the routes of its `traefik` record's files and endpoint), DNS answers, certificate pairs (through [`certs`]), the files route and listener policies name, sozu's socket and events | files, DNS, sozu's events |
//! | [`reconcile`] | the loop, in two parts: the reconciler's state ([`reconcile::state`]: facts → desired state → plan → sozu, and the status) and the driver that decides when (timers, the back-off, settling) | through traits |
//! | [`sozu`] | talking to sozu: requests, state reads, bulk loads, who sozu is | sozu's socket |
//! | [`traffic`] | sozu's access-log records: per-route counts, the last minute, the JSON access log | UDP, writes the log |
//! | [`translate`] | other route languages into the workspace's routes: Kubernetes `Ingress` with ingress-nginx annotations, the Gateway API's routes, Traefik's dynamic configuration (`import`); each route with where it comes from, what is left out with its reason, written as workspace text | none |
//! | [`document`] | the `/v1/state` document: every type of it (a leaf) | none |
//! | [`api`] | serving it: the admin HTTP server, the snapshots, `/metrics`, `/v1/events` ([`api::events`]) | HTTP |
//! | [`acme`] | `tls_rotation = 'sozu_managed`: ordering certificates into the tls dir, by its renewal policy | ACME, DNS, files |
//! | [`clock`], [`text`], [`memory`], [`priority`] | time, printable text, the allocator, the CPU priority of work that can wait | none |
//!
//! To add a kind of route: a variant of [`workspace::RouteKind`], then wherever the compiler
//! says (docs/agent.md, "Kinds of routes"). To add a field to a route's policy: [`workspace::RoutePolicy`], then
//! wherever the compiler says: it is taken apart field by field where it is put in sozu's terms,
//! sent, read back, rendered and shown (docs/agent.md, "A new route field"). To add a field to `/v1/state`: [`document`], then
//! where its fact is known ([`reconcile`]'s `publish` for a route's, a source, or the issuer), then
//! [`cli::status`] or [`api::metrics`] to show it. To add a DNS provider for ACME:
//! [`acme::provider`], beside [`acme::rfc2136`] and [`acme::cloudflare`], and its settings in
//! [`workspace`] and the contract.
#![deny(unsafe_code)]

pub mod acme;
pub mod api;
pub mod certs;
pub mod cli;
pub mod clock;
pub mod deploy;
pub mod document;
pub mod evaluate;
pub mod memory;
pub mod plan;
pub mod priority;
pub mod reconcile;
pub mod render;
pub mod run;
pub mod sources;
pub mod sozu;
pub mod supervisor;
pub mod text;
pub mod traffic;
pub mod translate;
pub mod workspace;
