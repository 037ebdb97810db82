//! Who may say what `Hello` to a node: a peer claiming to be a node of the tree must present a
//! certificate made out to that node's name, and the topology must place that node where it
//! claims to be (a child of this node with that role, or the root on a leaf's direct link).
//! Producers and consumers are not checked here.

use crest_core::machine::Link;
use crest_core::topology::Topology;
use crest_core::wire::{ErrorCode, PeerKind, Role, Wire};
use std::collections::HashMap;

/// What a node checks of the peers that say `Hello` to it.
pub(crate) struct Admission {
    /// This node's name, for the refusals.
    name: String,
    /// The nodes the topology places directly below this one, with their roles.
    children: HashMap<String, Role>,
    /// The root's name, if this node is a leaf the root may link to directly.
    root: Option<String>,
}

/// Why a peer was refused: the code and text of the error it is sent.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) code: ErrorCode,
    pub(crate) text: String,
}

impl Admission {
    /// What node `name` of `topology` admits.
    pub(crate) fn for_node(topology: &Topology, name: &str) -> Admission {
        let children = topology
            .nodes
            .iter()
            .filter(|node| node.parent.as_deref() == Some(name))
            .map(|node| (node.name.clone(), node.role))
            .collect();
        let is_leaf = topology
            .node(name)
            .is_some_and(|node| node.role == Role::Leaf);
        Admission {
            name: name.to_string(),
            children,
            root: is_leaf.then(|| topology.root().name.clone()),
        }
    }

    /// Checks `msg` arriving on `connection` (a `Hello` claiming a node of the tree); every
    /// other message passes.
    pub(crate) fn check(
        &self,
        connection: &quinn::Connection,
        link: Link,
        msg: &Wire,
    ) -> Result<(), Refusal> {
        let (Link::Incoming, Wire::Hello(hello)) = (link, msg) else {
            return Ok(());
        };
        let forbidden = |text: String| Refusal {
            code: ErrorCode::Forbidden,
            text,
        };
        let claimed = match &hello.peer {
            PeerKind::Node { name, role, .. } => {
                if self.children.get(name) != Some(role) {
                    return Err(forbidden(format!(
                        "the topology has no {role} {name:?} below {:?}",
                        self.name
                    )));
                }
                name
            }
            PeerKind::Root { name } => match &self.root {
                Some(root) if root == name => name,
                _ => {
                    return Err(forbidden(format!(
                        "{name:?} is not the root that may link to {:?}",
                        self.name
                    )));
                }
            },
            PeerKind::Producer | PeerKind::Consumer => return Ok(()),
        };
        crest_transport::tls::peer_is(connection, claimed).map_err(|text| Refusal {
            code: ErrorCode::Unauthenticated,
            text,
        })
    }
}
