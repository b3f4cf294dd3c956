//! private-ingress: keeps a sozu reverse proxy equal to a Nickel routes workspace.
//!
//! The map, from the outside in (each module's own header says more):
//!
//! | module | owns | I/O |
//! |---|---|---|
//! | [`cli`] | the command line; [`cli::status`] prints a running agent's `/v1/state` | `status` reads HTTP |
//! | [`run`], [`supervisor`] | wiring the live agent; ending it when one of its tasks dies | signals |
//! | [`input`], [`contract`], [`sandbox`], [`imports`], [`diagnostics`] | evaluating a workspace (a file, or text read once from standard input or a pipe) with the bundled contract, in a confined child process, its imports kept in its tree; Nickel's diagnostics reworded where they mislead a workspace's author | reads the workspace |
//! | [`workspace`] | the validated model an operator declared | none |
//! | [`desired`], [`plan`] | the workspace in sozu's terms ([`sozu_state`]: sozu's vocabulary), and the requests from what sozu holds to that | none |
//! | [`render`], [`deploy`], [`alerts`] | files made from the model: sozu's configuration, Kubernetes manifests, DNS records, alert rules | writes files |
//! | [`sources`] | the slow inputs, each a task publishing facts: the workspace, DNS answers, certificate pairs (through [`certs`]), sozu's socket and events | files, DNS, sozu's events |
//! | [`reconcile`] | the loop: facts → desired state → plan → sozu | through traits |
//! | [`sozu`] | talking to sozu: requests, state reads, bulk loads, who sozu is | sozu's socket |
//! | [`document`] | the `/v1/state` document: every type of it (a leaf) | none |
//! | [`api`] | serving it: the admin HTTP server, the snapshots, `/metrics` | HTTP |
//! | [`acme`] | `tls_rotation = 'sozu_managed`: ordering certificates into the tls dir | ACME, DNS, files |
//! | [`clock`], [`text`], [`memory`] | time, printable text, the allocator | none |
//!
//! To add a field to `/v1/state`: [`document`], then where its fact is known ([`reconcile`]'s
//! `publish` for a route's, a source, or the issuer), then [`cli::status`] or [`api::metrics`] to
//! show it. To add a DNS provider for ACME: [`acme::provider`], beside [`acme::rfc2136`] and
//! [`acme::cloudflare`], and its settings in [`workspace`] and the contract.
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
pub mod reconcile;
pub mod render;
pub mod run;
pub mod sources;
pub mod sozu;
pub mod supervisor;
pub mod text;
pub mod traffic;
pub mod workspace;
