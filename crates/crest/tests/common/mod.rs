//! Helpers shared by the end-to-end tests of a local tree.
#![allow(dead_code)]

use crest::core::topology::Topology;
use crest::node::LocalTree;
use std::time::Duration;

/// How long a test waits for a condition before failing.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// `topology/local.toml` on ephemeral ports, started in this process and connected.
pub(crate) async fn start_tree() -> LocalTree {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../topology/local.toml"
    ))
    .unwrap();
    let topology = Topology::parse(&text).unwrap().with_ephemeral_ports();
    let tree = LocalTree::start(&topology).await.unwrap();
    assert!(tree.wait_connected(WAIT).await, "tree connects");
    tree
}
