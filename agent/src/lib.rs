//! private-ingress: keeps a sozu reverse proxy equal to a Nickel routes workspace.
//!
//! Layering, outside in: [`contract`] evaluates a workspace file with the bundled Nickel contract
//! (in-process, or isolated in a child process by [`sandbox`]) into a [`workspace::Workspace`];
//! [`render`] turns that model into files. Only `contract`, `sandbox` and `render::write_atomic`
//! touch the outside world.
#![deny(unsafe_code)]

pub mod acme;
pub mod admin;
pub mod certs;
pub mod cli;
pub mod contract;
pub mod deploy;
pub mod desired;
pub mod memory;
pub mod plan;
pub mod reconcile;
pub mod render;
pub mod resolve;
pub mod run;
pub mod sandbox;
pub mod sozu;
pub mod state;
pub mod status;
pub mod watch;
pub mod workspace;
