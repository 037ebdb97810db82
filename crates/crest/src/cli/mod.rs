//! The `crest` command's subcommands, one module each; `main.rs` parses the command line and
//! dispatches.

pub(crate) mod admin;
pub(crate) mod bench;
pub(crate) mod client;
pub(crate) mod node;
pub(crate) mod sim;
pub(crate) mod wal;
