//! crest: a distributed priority queue built as a hierarchical aggregation tree over QUIC.
//!
//! This facade re-exports the workspace crates and embeds the default local topology; the
//! `crest` command (crates/crest-cli/src) is this package's binary.
//!
//! - [`core`]: sans-IO core (keys, wire protocol, topology, state machines);
//! - [`node`]: running nodes (`start_node`, `LocalTree`);
//! - [`sdk`]: `Producer` and `Consumer`;
//! - [`bench`]: the load generator behind `crest bench` and the disk latency bench behind
//!   `crest wal bench`.

pub use crest_bench as bench;
pub use crest_core as core;
pub use crest_node as node;
pub use crest_sdk as sdk;
pub use crest_sim as sim;
pub use crest_storage as storage;
pub use crest_transport as transport;

/// The embedded default topology (`topology/local.toml`): root, two aggregators, four leaves.
pub const DEFAULT_TOPOLOGY: &str = include_str!("../../../topology/local.toml");

/// Where `crest local` writes the CA certificate of its ephemeral cluster, and where client
/// commands look for it by default.
pub const LOCAL_CA_PATH: &str = ".crest/local/ca.pem";

/// Where `crest local` writes the API token of its `admin` principal, and where client
/// commands trusting [`LOCAL_CA_PATH`] look for a credential by default.
pub const LOCAL_TOKEN_PATH: &str = ".crest/local/admin.token";
