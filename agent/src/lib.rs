//! private-ingress: keeps a sozu reverse proxy equal to a Nickel routes workspace.
//!
//! From the outside in:
//! - [`contract`] evaluates a workspace file with the bundled Nickel contract (isolated in a
//!   child process by [`sandbox`], its imports confined by [`imports`]) into a
//!   [`workspace::Workspace`]; [`text`] makes what it says safe to print;
//! - [`desired`] maps it to sozu's vocabulary ([`state`]), the one mapping both outputs share;
//!   [`plan`] turns the difference between that and what sozu holds into requests. Both pure;
//! - [`render`] and [`deploy`] write files from the model (a sozu configuration, Kubernetes
//!   manifests, DNS records); [`alerts`] holds the alert rules on the agent's metrics;
//! - the live agent: [`sources`] fetch the slow inputs (the workspace, DNS answers, certificate
//!   pairs through [`certs`], sozu's socket and event stream) in tasks of their own;
//!   [`reconcile`] decides and applies through [`sozu`], the only code that changes sozu; [`api`]
//!   serves what it knows, and [`status`] prints it; with `tls_rotation = 'sozu_managed`,
//!   [`acme`] obtains the certificates itself and writes them where the certificate source reads
//!   them. [`run`] wires them, and [`supervisor`] ends the agent when one of them dies.
#![deny(unsafe_code)]

pub mod acme;
pub mod alerts;
pub mod api;
pub mod certs;
pub mod cli;
pub mod clock;
pub mod contract;
pub mod deploy;
pub mod desired;
pub mod imports;
pub mod memory;
pub mod plan;
pub mod reconcile;
pub mod render;
pub mod run;
pub mod sandbox;
pub mod sources;
pub mod sozu;
pub mod state;
pub mod status;
pub mod supervisor;
pub mod text;
pub mod workspace;
