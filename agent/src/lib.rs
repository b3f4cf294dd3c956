//! private-ingress: keeps a sozu reverse proxy equal to a Nickel routes workspace.
//!
//! Layering, outside in: [`contract`] evaluates a workspace file with the bundled Nickel contract
//! (in-process, or isolated in a child process by [`sandbox`]) into a [`workspace::Workspace`];
//! [`render`] turns that model into files. Only `contract`, `sandbox` and `render::write_atomic`
//! touch the outside world.
#![forbid(unsafe_code)]

pub mod cli;
pub mod contract;
pub mod render;
pub mod sandbox;
pub mod workspace;
