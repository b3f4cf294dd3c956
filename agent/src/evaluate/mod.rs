//! Reading and evaluating a workspace: where it comes from (a file, or text read once from
//! standard input or a pipe: [`input`]), its imports kept in its tree ([`imports`]), the bundled
//! contract applied by Nickel ([`contract`]) in a confined child process with a deadline and a
//! memory cap ([`sandbox`]), and Nickel's diagnostics reworded where they mislead a workspace's
//! author ([`diagnostics`]). What comes out is a [`crate::workspace::Workspace`], or a
//! diagnostic with the file, line and column of the mistake.

pub mod contract;
pub mod diagnostics;
pub mod imports;
pub mod input;
pub mod sandbox;
