//! Sans-IO core of crest, a distributed priority queue built as an aggregation tree.
//!
//! Nothing here performs I/O, reads a clock, spawns a task or uses a global random source:
//! callers pass `now` into every input and drain outputs by polling (see [`machine`]). The same
//! state machines run in production nodes (`crest-node`) and under virtual time in tests.
//!
//! # Layout
//! - [`key`]: the priority key, the total order of ready messages;
//! - [`id`]: message ids (which encode the owning leaf), receipt handles, connection ids;
//! - [`time`]: the `Time` the caller passes in;
//! - [`config`]: every bound, named, with defaults;
//! - [`wire`]: protocol messages; [`frame`]: how they travel on a stream;
//! - [`record`]: the leaf's log records;
//! - [`metrics`]: histograms, counters and the reports nodes send up the tree;
//! - [`topology`]: the topology file (TOML) and what each node derives from it;
//! - [`trace`]: the per-message spans (push, offer, reserve, delivery, ack);
//! - [`machine`]: the driver contract shared by the three roles;
//! - [`leaf`], [`aggregator`], [`root`]: the state machines.

pub mod access;
pub mod aggregator;
mod ahead;
mod bounded;
mod codec;
pub mod config;
mod downstream;
pub mod frame;
pub mod id;
pub mod key;
mod lanes;
pub mod leaf;
pub mod machine;
pub mod metrics;
mod offer;
pub mod quota;
pub mod record;
pub mod rng;
pub mod root;
mod sorted;
#[cfg(test)]
mod tests;
pub mod time;
pub mod topology;
pub mod trace;
mod upstream;
mod validate;
mod window;
pub mod wire;

pub use id::{LeafId, MessageId, Receipt};
pub use key::{Key, tier};
pub use machine::{ConnId, Link, Machine, NodeStats, StorageDone, StorageOp, Transmit};
pub use time::Time;
