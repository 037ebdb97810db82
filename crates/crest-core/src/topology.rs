//! The topology file: every node of a tree, its role, addresses, parent and settings.
//!
//! ```toml
//! [settings]                 # cluster-wide settings (see `config::Settings`); optional
//! credits_per_topic = 64
//!
//! [tls]                      # optional: certificate files made by `crest certs`
//! ca = "certs/ca.pem"        # paths relative to the topology file
//! cert_dir = "certs"         # node NAME uses cert_dir/NAME.pem and cert_dir/NAME.key
//!
//! [[node]]
//! name = "root"
//! role = "root"              # root | aggregator | leaf
//! listen = "127.0.0.1:7400"  # where the node binds (UDP)
//! address = "10.0.0.1:7400"  # where others reach it; defaults to `listen`
//!
//! [[node]]                   # optional: a standby root (any number, after the root)
//! name = "root-standby"
//! role = "root"
//! listen = "10.0.0.2:7400"
//!
//! [[node]]
//! name = "leaf-1"
//! role = "leaf"
//! id = 1                     # leaf id, 1..=65535, unique; defaults to its rank among leaves
//! listen = "127.0.0.1:7411"
//! parent = "root"
//! data_dir = "data/leaf-1"  # where a leaf keeps its log (default: data/NAME)
//! http = "127.0.0.1:7491"   # HTTP: /metrics, /stats, /healthz, the dashboard (default: none)
//! settings = { lease_timeout_ms = 60000 }   # per-node overrides
//!
//! [[node]]                   # a replicated leaf: one node per replica, sharing a group
//! name = "leaf-2a"
//! role = "leaf"
//! group = "leaf-2"           # the leaf's name in the tree; its replicas share parent and id
//! listen = "10.0.0.21:7411"
//! replication = "10.0.0.21:7421"   # where the group's Raft RPCs reach it (UDP)
//! parent = "root"
//!
//! [[node]]                   # optional: the SQS-compatible API (docs/sqs.md), any number
//! name = "sqs-1"
//! role = "gateway"
//! listen = "0.0.0.0:9324"    # where it serves HTTP
//! keys = "sqs-keys.toml"     # its access keys, relative to the topology file
//! ```
//!
//! Parsing checks the shape of the tree: a root without a parent, every other node's parent
//! exists and is not a leaf, no cycles, unique names, addresses and leaf ids, and valid
//! settings for every node. Errors name the node and the field.
//!
//! The first root in the file is *the* root; the nodes that name it as their parent are its
//! children. Roots after it stand by: they run the same way, and the root's children go to
//! one of them when they cannot reach the root (and back when that one fails), and so do
//! consumers. A root's state is soft (rebuilt from its children's offers), so whichever root
//! a child is with serves its messages; a leaf grants one live lease per message whichever
//! root asks.
//!
//! A replicated leaf is one leaf of the tree kept by a group of replicas (ARCHITECTURE.md,
//! "Replica groups"): the tree knows it by its group's name and id, and whichever replica
//! leads the group serves it. Members are numbered from 1 in file order.

use crate::config::Settings;
use crate::id::LeafId;
use crate::wire::Role;
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;

/// A topology that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// The file is not valid TOML of the expected shape.
    #[error("topology is not valid: {0}")]
    Syntax(String),
    /// The tree described is not valid; the message names the node and the problem.
    #[error("topology node {node:?}: {problem}")]
    Node {
        /// The node concerned.
        node: String,
        /// What is wrong.
        problem: String,
    },
    /// The tree as a whole is not valid.
    #[error("topology: {0}")]
    Tree(String),
}

/// Certificate files of a cluster (made by `crest certs`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The cluster CA certificate (PEM), relative to the topology file.
    pub ca: PathBuf,
    /// Directory of node certificates `NAME.pem` and keys `NAME.key`.
    pub cert_dir: PathBuf,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTopology {
    #[serde(default)]
    settings: toml::Table,
    tls: Option<TlsFiles>,
    #[serde(default)]
    node: Vec<RawNode>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    name: String,
    role: String,
    listen: String,
    address: Option<String>,
    parent: Option<String>,
    id: Option<u16>,
    data_dir: Option<PathBuf>,
    http: Option<String>,
    group: Option<String>,
    replication: Option<String>,
    keys: Option<PathBuf>,
    #[serde(default)]
    settings: toml::Table,
}

/// A gateway of the topology (`role = "gateway"`): the SQS-compatible API in front of the
/// tree, a client of it (not a node of the tree: it has no parent and holds no messages).
#[derive(Clone, Debug, PartialEq)]
pub struct GatewaySpec {
    /// Unique name (among nodes and gateways).
    pub name: String,
    /// Where it serves HTTP.
    pub listen: SocketAddr,
    /// Its access keys file, relative to the topology file.
    pub keys: PathBuf,
    /// Its settings (the `gateway_*` ones bound it).
    pub settings: Settings,
}

/// A replica's place in its group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    /// The group's name: the leaf's name in the tree.
    pub group: String,
    /// Its number in the group, from 1 (file order).
    pub number: u64,
    /// Where it takes the group's RPCs.
    pub address: SocketAddr,
}

/// One node of the topology.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSpec {
    /// Unique name.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// Where it binds.
    pub listen: SocketAddr,
    /// Where others reach it (`host:port`).
    pub address: String,
    /// Its parent's name (`None` for the root).
    pub parent: Option<String>,
    /// Its leaf id (leaves only).
    pub leaf_id: Option<LeafId>,
    /// Where a leaf keeps its log, relative to the topology file (`None`: the launcher's
    /// default, `data/NAME`).
    pub data_dir: Option<PathBuf>,
    /// Its settings: defaults, then `[settings]`, then its own overrides.
    pub settings: Settings,
    /// Where it serves HTTP (`/metrics`, `/stats`, `/healthz`, the dashboard), if anywhere.
    pub http: Option<SocketAddr>,
    /// The replica group it belongs to, for a replica of a replicated leaf.
    pub replica: Option<Replica>,
}

impl NodeSpec {
    /// The address a client dials it at, naming it: `NAME@HOST:PORT`. A client takes only
    /// this node's certificate there, so no other node of the cluster can stand in for it.
    pub fn dial_address(&self) -> String {
        format!("{}@{}", self.name, self.address)
    }

    /// The name the tree knows it by: its group's for a replica, else its own.
    pub fn tree_name(&self) -> &str {
        self.replica.as_ref().map_or(&self.name, |r| &r.group)
    }
}

/// A parsed, validated topology.
#[derive(Clone, Debug, PartialEq)]
pub struct Topology {
    /// All nodes, in file order.
    pub nodes: Vec<NodeSpec>,
    /// The SQS gateways, in file order.
    pub gateways: Vec<GatewaySpec>,
    /// Certificate files, if the cluster uses its own CA.
    pub tls: Option<TlsFiles>,
}

impl Topology {
    /// Parses and validates a topology.
    ///
    /// # Errors
    /// A [`TopologyError`] naming the node and the problem.
    pub fn parse(text: &str) -> Result<Topology, TopologyError> {
        let raw: RawTopology =
            toml::from_str(text).map_err(|e| TopologyError::Syntax(e.to_string()))?;
        let mut nodes = Vec::with_capacity(raw.node.len());
        let mut gateways = Vec::new();
        let mut next_leaf = 1u16;
        // Each group's id (given by a member or the next free one) and member count so far.
        let mut groups: HashMap<String, (Option<u16>, u64)> = HashMap::new();
        // Settings whose default differs in a tree with replicated leaves, unless it sets them.
        let mut tree_defaults = toml::Table::new();
        if raw.node.iter().any(|node| node.group.is_some()) {
            tree_defaults.insert(
                "reserve_ahead_max".into(),
                i64::from(crate::config::RESERVED_AHEAD_REPLICATED).into(),
            );
        }
        for node in raw.node {
            let fail = |problem: String| TopologyError::Node {
                node: node.name.clone(),
                problem,
            };
            let listen: SocketAddr = node
                .listen
                .parse()
                .map_err(|e| fail(format!("listen {:?}: {e}", node.listen)))?;
            let mut table = tree_defaults.clone();
            table.extend(raw.settings.clone());
            table.extend(node.settings.clone());
            let settings: Settings = table
                .try_into()
                .map_err(|e: toml::de::Error| fail(format!("settings: {}", e.message())))?;
            settings.validate().map_err(|e| fail(e.to_string()))?;
            let role = match node.role.as_str() {
                "root" => Role::Root,
                "aggregator" => Role::Aggregator,
                "leaf" => Role::Leaf,
                "gateway" => {
                    let extra = [
                        ("parent", node.parent.is_some()),
                        ("address", node.address.is_some()),
                        ("id", node.id.is_some()),
                        ("data_dir", node.data_dir.is_some()),
                        ("http", node.http.is_some()),
                        ("group", node.group.is_some()),
                        ("replication", node.replication.is_some()),
                    ];
                    if let Some((field, _)) = extra.iter().find(|(_, set)| *set) {
                        return Err(fail(format!("a gateway has no {field}")));
                    }
                    let keys = node
                        .keys
                        .clone()
                        .ok_or_else(|| fail("a gateway needs its keys file (keys)".into()))?;
                    gateways.push(GatewaySpec {
                        name: node.name,
                        listen,
                        keys,
                        settings,
                    });
                    continue;
                }
                other => {
                    return Err(fail(format!(
                        "role {other:?} is not root, aggregator, leaf or gateway"
                    )));
                }
            };
            if node.keys.is_some() {
                return Err(fail("only gateways have keys".into()));
            }
            let replica = match (&node.group, &node.replication) {
                (None, None) => None,
                (Some(_), _) if role != Role::Leaf => {
                    return Err(fail("only leaves are replicated (group)".into()));
                }
                (None, Some(_)) => {
                    return Err(fail("replication needs a group".into()));
                }
                (Some(group), None) => {
                    return Err(fail(format!(
                        "replica of {group:?} needs a replication address"
                    )));
                }
                (Some(group), Some(address)) => {
                    let address = address
                        .parse()
                        .map_err(|e| fail(format!("replication {address:?}: {e}")))?;
                    let (_, members) = groups.entry(group.clone()).or_default();
                    *members += 1;
                    Some(Replica {
                        group: group.clone(),
                        number: *members,
                        address,
                    })
                }
            };
            // Replicas after a group's first take its id unless they name one.
            let group_id = replica
                .as_ref()
                .and_then(|r| groups.get(&r.group))
                .and_then(|(id, _)| *id);
            let first_of_group = replica.as_ref().is_none_or(|r| r.number == 1);
            let leaf_id = match (role, node.id.or(group_id)) {
                (Role::Leaf, Some(0)) => {
                    return Err(fail("leaf id 0 is reserved; use 1..=65535".into()));
                }
                (Role::Leaf, Some(id)) => Some(LeafId(id)),
                (Role::Leaf, None) => Some(LeafId(next_leaf)),
                (_, Some(_)) => return Err(fail("only leaves have an id".into())),
                (_, None) => None,
            };
            if let (Some(replica), Some(id)) = (&replica, leaf_id) {
                let (group_id, _) = groups.get_mut(&replica.group).expect("inserted above");
                match group_id {
                    None => *group_id = Some(id.0),
                    Some(earlier) if *earlier != id.0 => {
                        return Err(fail(format!(
                            "leaf id {id} differs from its group's ({earlier})"
                        )));
                    }
                    Some(_) => {}
                }
            }
            if role == Role::Leaf && first_of_group {
                next_leaf = next_leaf.saturating_add(1);
            }
            let http = match &node.http {
                None => None,
                Some(text) => Some(
                    text.parse::<SocketAddr>()
                        .map_err(|e| fail(format!("http {text:?}: {e}")))?,
                ),
            };
            nodes.push(NodeSpec {
                address: node.address.clone().unwrap_or_else(|| node.listen.clone()),
                name: node.name,
                role,
                listen,
                parent: node.parent,
                leaf_id,
                data_dir: node.data_dir,
                settings,
                http,
                replica,
            });
        }
        let topology = Topology {
            nodes,
            gateways,
            tls: raw.tls,
        };
        topology.check_tree()?;
        Ok(topology)
    }

    /// Overrides one setting on every node: `name=value`, the value in TOML (`offer_swap=false`,
    /// `offer_linger_us=0`). For measuring what a setting is worth without editing files.
    ///
    /// # Errors
    /// [`TopologyError::Syntax`] for a malformed assignment, or the node whose settings the
    /// value makes invalid.
    pub fn set_setting(&mut self, assignment: &str) -> Result<(), TopologyError> {
        let syntax = |problem: String| TopologyError::Syntax(format!("{assignment:?}: {problem}"));
        let (name, _) = assignment
            .split_once('=')
            .ok_or_else(|| syntax("expected name=value".into()))?;
        let patch: toml::Table = toml::from_str(assignment).map_err(|e| syntax(e.to_string()))?;
        if patch.len() != 1 {
            return Err(syntax("expected exactly one name=value".into()));
        }
        for node in &mut self.nodes {
            let fail = |problem: String| TopologyError::Node {
                node: node.name.clone(),
                problem,
            };
            let mut table = toml::Table::try_from(&node.settings)
                .map_err(|e| fail(format!("settings: {e}")))?;
            table.extend(patch.clone());
            let settings: Settings = table.try_into().map_err(|e: toml::de::Error| {
                fail(format!("setting {}: {}", name.trim(), e.message()))
            })?;
            settings.validate().map_err(|e| fail(e.to_string()))?;
            node.settings = settings;
        }
        Ok(())
    }

    fn check_tree(&self) -> Result<(), TopologyError> {
        let roots: Vec<&NodeSpec> = self.nodes.iter().filter(|n| n.role == Role::Root).collect();
        if roots.is_empty() {
            return Err(TopologyError::Tree("needs a root".into()));
        }
        if !self.nodes.iter().any(|n| n.role == Role::Leaf) {
            return Err(TopologyError::Tree("needs at least one leaf".into()));
        }
        let mut names = HashSet::new();
        let mut listens = HashSet::new();
        for gateway in &self.gateways {
            let fail = |problem: String| TopologyError::Node {
                node: gateway.name.clone(),
                problem,
            };
            if gateway.name.is_empty() || gateway.name.chars().any(|c| c.is_whitespace()) {
                return Err(fail("name must be non-empty, without whitespace".into()));
            }
            if !names.insert(gateway.name.as_str()) {
                return Err(fail("name used twice".into()));
            }
        }
        let mut leaf_ids: HashMap<LeafId, &str> = HashMap::new();
        let mut replication = HashSet::new();
        for node in &self.nodes {
            let fail = |problem: String| TopologyError::Node {
                node: node.name.clone(),
                problem,
            };
            if node.name.is_empty()
                || node
                    .name
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(fail("name must be non-empty, without whitespace".into()));
            }
            if !names.insert(node.name.as_str()) {
                return Err(fail("name used twice".into()));
            }
            // Port 0 means "any free port" (tests); such nodes cannot clash.
            if node.listen.port() != 0 && !listens.insert((node.address.as_str(), node.listen)) {
                return Err(fail(format!("address {} used twice", node.address)));
            }
            // The replicas of a group share its id.
            if let Some(id) = node.leaf_id
                && *leaf_ids.entry(id).or_insert(node.tree_name()) != node.tree_name()
            {
                return Err(fail(format!("leaf id {id} used twice")));
            }
            if let Some(replica) = &node.replica {
                if self.node(&replica.group).is_some() {
                    return Err(fail(format!(
                        "group {:?} is also the name of a node",
                        replica.group
                    )));
                }
                if !replication.insert(replica.address) {
                    return Err(fail(format!(
                        "replication address {} used twice",
                        replica.address
                    )));
                }
                let first = self
                    .nodes
                    .iter()
                    .find(|n| n.replica.as_ref().is_some_and(|r| r.group == replica.group))
                    .expect("the node itself");
                if first.parent != node.parent {
                    return Err(fail(format!(
                        "parent differs from that of {:?}, the first of group {:?}",
                        first.name, replica.group
                    )));
                }
            }
            match (&node.parent, node.role) {
                (Some(_), Role::Root) => return Err(fail("the root has no parent".into())),
                (None, Role::Root) => {}
                (None, _) => return Err(fail("needs a parent".into())),
                (Some(parent), _) => match self.node(parent) {
                    None => return Err(fail(format!("parent {parent:?} is not in the topology"))),
                    Some(p) if p.role == Role::Leaf => {
                        return Err(fail(format!("parent {parent:?} is a leaf")));
                    }
                    Some(p) if p.role == Role::Root && p.name != roots[0].name => {
                        return Err(fail(format!(
                            "parent {parent:?} stands by for root {:?}: name {:?} as the parent",
                            roots[0].name, roots[0].name
                        )));
                    }
                    Some(_) => {}
                },
            }
        }
        for node in &self.nodes {
            // Every chain of parents must reach the root within as many steps as there are nodes.
            let mut current = node;
            for _ in 0..=self.nodes.len() {
                match &current.parent {
                    None => break,
                    Some(parent) => current = self.node(parent).expect("checked above"),
                }
            }
            if current.role != Role::Root {
                return Err(TopologyError::Node {
                    node: node.name.clone(),
                    problem: "its chain of parents forms a cycle".into(),
                });
            }
        }
        Ok(())
    }

    /// The same tree with every node listening on an ephemeral loopback port (port 0), so that
    /// several trees can run side by side (tests). `LocalTree` fills in the bound addresses.
    pub fn with_ephemeral_ports(&self) -> Topology {
        let mut topology = self.clone();
        for node in &mut topology.nodes {
            node.listen = SocketAddr::from(([127, 0, 0, 1], 0));
            node.address = node.listen.to_string();
            if node.http.is_some() {
                node.http = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
            }
        }
        topology
    }

    /// The gateway named `name`.
    pub fn gateway(&self, name: &str) -> Option<&GatewaySpec> {
        self.gateways.iter().find(|g| g.name == name)
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> Option<&NodeSpec> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The root: the first in the file.
    pub fn root(&self) -> &NodeSpec {
        self.nodes
            .iter()
            .find(|n| n.role == Role::Root)
            .expect("validated: a root")
    }

    /// Every root: the root, then those standing by for it, in file order.
    pub fn roots(&self) -> impl Iterator<Item = &NodeSpec> {
        self.nodes.iter().filter(|n| n.role == Role::Root)
    }

    /// The parents `node` may have, in the order it tries them: its parent, then, for a child
    /// of the root, the roots standing by.
    pub fn parents_of(&self, node: &NodeSpec) -> Vec<&NodeSpec> {
        let Some(parent) = node.parent.as_deref().and_then(|name| self.node(name)) else {
            return Vec::new();
        };
        if parent.role != Role::Root {
            return vec![parent];
        }
        self.roots().collect()
    }

    /// All leaves, in file order.
    pub fn leaves(&self) -> impl Iterator<Item = &NodeSpec> {
        self.nodes.iter().filter(|n| n.role == Role::Leaf)
    }

    /// The leaves the root links to directly for its pop path (the root's `direct_pop_path`):
    /// every leaf whose parent is not the root itself; none with the setting off. One node per
    /// leaf of the tree: a replicated leaf's first replica ([`Topology::members`] lists all).
    pub fn direct_leaves(&self) -> impl Iterator<Item = &NodeSpec> {
        let root = self.root();
        let on = root.settings.direct_pop_path;
        self.leaves().filter(move |n| {
            on && n.parent.as_deref() != Some(root.name.as_str())
                && n.replica.as_ref().is_none_or(|r| r.number == 1)
        })
    }

    /// The nodes that are the tree's node `tree_name`: the replicas of a group, in file order,
    /// or the one node of that name.
    pub fn members(&self, tree_name: &str) -> Vec<&NodeSpec> {
        self.nodes
            .iter()
            .filter(|n| n.tree_name() == tree_name)
            .collect()
    }

    /// The nodes below `name`: those naming it as their parent (for any root, the root's).
    pub fn children_of(&self, name: &str) -> impl Iterator<Item = &NodeSpec> {
        let name = match self.node(name) {
            Some(node) if node.role == Role::Root => self.root().name.clone(),
            _ => name.to_string(),
        };
        self.nodes
            .iter()
            .filter(move |n| n.parent.as_deref() == Some(name.as_str()))
    }

    /// Ids of every leaf at or below `name`.
    pub fn subtree_leaves(&self, name: &str) -> Vec<LeafId> {
        let mut children: HashMap<&str, Vec<&NodeSpec>> = HashMap::new();
        for node in &self.nodes {
            if let Some(parent) = &node.parent {
                children.entry(parent.as_str()).or_default().push(node);
            }
        }
        let mut leaves = Vec::new();
        // A root standing by has the root's subtree.
        let start = match self.node(name) {
            Some(node) if node.role == Role::Root => Some(self.root()),
            other => other,
        };
        let mut stack: Vec<&NodeSpec> = start.into_iter().collect();
        while let Some(node) = stack.pop() {
            leaves.extend(node.leaf_id);
            stack.extend(children.get(node.name.as_str()).into_iter().flatten());
        }
        leaves.sort();
        // The replicas of a group share its id.
        leaves.dedup();
        leaves
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"
        [settings]
        credits_per_topic = 8
        [[node]]
        name = "root"
        role = "root"
        listen = "127.0.0.1:7400"
        [[node]]
        name = "agg"
        role = "aggregator"
        listen = "127.0.0.1:7401"
        parent = "root"
        [[node]]
        name = "a"
        role = "leaf"
        listen = "127.0.0.1:7411"
        parent = "agg"
        settings = { credits_per_topic = 4 }
        [[node]]
        name = "b"
        role = "leaf"
        id = 9
        listen = "127.0.0.1:7412"
        parent = "root"
    "#;

    #[test]
    fn parses_roles_ids_settings_and_subtrees() {
        let topology = Topology::parse(SMALL).unwrap();
        assert_eq!(topology.root().name, "root");
        let a = topology.node("a").unwrap();
        assert_eq!(a.leaf_id, Some(LeafId(1)));
        assert_eq!(a.settings.credits_per_topic, 4, "node override wins");
        assert_eq!(topology.node("agg").unwrap().settings.credits_per_topic, 8);
        assert_eq!(topology.subtree_leaves("root"), vec![LeafId(1), LeafId(9)]);
        assert_eq!(topology.subtree_leaves("agg"), vec![LeafId(1)]);
    }

    const GROUPS: &str = r#"
        [[node]]
        name = "root"
        role = "root"
        listen = "127.0.0.1:7400"
        [[node]]
        name = "agg"
        role = "aggregator"
        listen = "127.0.0.1:7401"
        parent = "root"
        [[node]]
        name = "a1"
        role = "leaf"
        group = "a"
        listen = "127.0.0.1:7411"
        replication = "127.0.0.1:7421"
        parent = "agg"
        [[node]]
        name = "b"
        role = "leaf"
        listen = "127.0.0.1:7412"
        parent = "agg"
        [[node]]
        name = "a2"
        role = "leaf"
        group = "a"
        listen = "127.0.0.1:7413"
        replication = "127.0.0.1:7423"
        parent = "agg"
    "#;

    #[test]
    fn the_replicas_of_a_group_are_one_leaf_of_the_tree() {
        let topology = Topology::parse(GROUPS).unwrap();
        let (a1, a2) = (topology.node("a1").unwrap(), topology.node("a2").unwrap());
        assert_eq!((a1.tree_name(), a2.tree_name()), ("a", "a"));
        assert_eq!(a1.leaf_id, Some(LeafId(1)));
        assert_eq!(a2.leaf_id, Some(LeafId(1)), "a group shares its id");
        assert_eq!(topology.node("b").unwrap().leaf_id, Some(LeafId(2)));
        let numbers: Vec<u64> = topology
            .members("a")
            .iter()
            .map(|n| n.replica.as_ref().unwrap().number)
            .collect();
        assert_eq!(numbers, vec![1, 2]);
        assert_eq!(topology.subtree_leaves("root"), vec![LeafId(1), LeafId(2)]);
        let direct: Vec<&str> = topology.direct_leaves().map(|n| n.name.as_str()).collect();
        assert_eq!(
            direct,
            vec!["a1", "b"],
            "one direct link per leaf of the tree"
        );
    }

    #[test]
    fn a_tree_with_replicated_leaves_reserves_ahead_unless_it_says_otherwise() {
        let ahead = |text: &str| {
            Topology::parse(text)
                .unwrap()
                .root()
                .settings
                .reserve_ahead_max
        };
        assert_eq!(ahead(SMALL), 0, "no replicated leaf: off");
        assert_eq!(ahead(GROUPS), crate::config::RESERVED_AHEAD_REPLICATED);
        let set = |value: &str| format!("[settings]\nreserve_ahead_max = {value}\n{GROUPS}");
        assert_eq!(ahead(&set("0")), 0, "the tree's own setting wins");
        assert_eq!(ahead(&set("16")), 16);
        let on_root = GROUPS.replacen(
            "listen = \"127.0.0.1:7400\"",
            "listen = \"127.0.0.1:7400\"\n        settings = { reserve_ahead_max = 0 }",
            1,
        );
        assert_eq!(ahead(&on_root), 0, "and so does the root's");
    }

    #[test]
    fn a_group_must_agree_on_parent_and_id_and_not_share_addresses() {
        let last_parent = GROUPS.rfind("parent = \"agg\"").unwrap();
        let cases = [
            (
                format!(
                    "{}parent = \"root\"{}",
                    &GROUPS[..last_parent],
                    &GROUPS[last_parent + "parent = \"agg\"".len()..]
                ),
                "parent differs",
            ),
            (
                GROUPS.replace("name = \"a2\"", "name = \"a2\"\n        id = 7"),
                "differs from its group's",
            ),
            (
                GROUPS.replace("127.0.0.1:7423", "127.0.0.1:7421"),
                "replication address 127.0.0.1:7421 used twice",
            ),
            (
                GROUPS.replace("replication = \"127.0.0.1:7423\"", ""),
                "needs a replication address",
            ),
            (
                GROUPS.replace(
                    "group = \"a\"\n        listen = \"127.0.0.1:7411\"",
                    "group = \"b\"\n        listen = \"127.0.0.1:7411\"",
                ),
                "is also the name of a node",
            ),
        ];
        for (text, expected) in cases {
            let error = Topology::parse(&text).unwrap_err().to_string();
            assert!(error.contains(expected), "{expected:?} in {error}");
        }
        let replicated_root = GROUPS.replacen(
            "role = \"root\"",
            "role = \"root\"\n        group = \"r\"\n        replication = \"127.0.0.1:7500\"",
            1,
        );
        let error = Topology::parse(&replicated_root).unwrap_err().to_string();
        assert!(error.contains("only leaves are replicated"), "{error}");
    }

    #[test]
    fn a_setting_is_overridden_on_every_node_and_bad_values_are_named() {
        let mut topology = Topology::parse(SMALL).unwrap();
        topology.set_setting("offer_swap=false").unwrap();
        topology.set_setting("credits_per_topic = 16").unwrap();
        for node in &topology.nodes {
            assert!(!node.settings.offer_swap, "{}", node.name);
            assert_eq!(node.settings.credits_per_topic, 16);
        }
        let error = topology.set_setting("credits_per_topic=0").unwrap_err();
        assert!(error.to_string().contains("credits_per_topic"), "{error}");
        let error = topology.set_setting("no_such_setting=1").unwrap_err();
        assert!(error.to_string().contains("no_such_setting"), "{error}");
        assert!(topology.set_setting("offer_swap").is_err(), "no value");
        assert_eq!(
            topology.nodes[0].settings.credits_per_topic, 16,
            "unchanged"
        );
    }

    #[test]
    fn gateways_are_apart_from_the_tree_and_need_their_keys() {
        let gateway =
            "\n[[node]]\nname = \"sqs\"\nrole = \"gateway\"\nlisten = \"127.0.0.1:9324\"\n";
        let with = format!(
            "{SMALL}{gateway}keys = \"keys.toml\"\nsettings = {{ gateway_requests_max = 8 }}\n"
        );
        let topology = Topology::parse(&with).unwrap();
        let spec = topology.gateway("sqs").unwrap();
        assert_eq!(spec.keys, PathBuf::from("keys.toml"));
        assert_eq!(spec.settings.gateway_requests_max, 8);
        assert!(topology.node("sqs").is_none(), "not a node of the tree");
        let cases = [
            (format!("{SMALL}{gateway}"), "needs its keys file"),
            (
                format!("{SMALL}{gateway}keys = \"k\"\nparent = \"root\"\n"),
                "no parent",
            ),
            (
                with.replace("name = \"sqs\"", "name = \"root\""),
                "name used twice",
            ),
            (
                SMALL.replacen("role = \"leaf\"", "role = \"leaf\"\nkeys = \"k\"", 1),
                "only gateways",
            ),
        ];
        for (text, expected) in cases {
            let error = Topology::parse(&text).unwrap_err().to_string();
            assert!(error.contains(expected), "{expected}: {error}");
        }
    }

    #[test]
    fn errors_name_the_node_and_the_problem() {
        let bad_parent = SMALL.replace("parent = \"agg\"", "parent = \"b\"");
        let error = Topology::parse(&bad_parent).unwrap_err().to_string();
        assert!(
            error.contains("\"a\"") && error.contains("is a leaf"),
            "{error}"
        );

        let bad_setting = SMALL.replace("credits_per_topic = 8", "credits_per_topic = 0");
        let error = Topology::parse(&bad_setting).unwrap_err().to_string();
        assert!(error.contains("credits_per_topic"), "{error}");

        let unknown = SMALL.replace("credits_per_topic = 8", "no_such_setting = 1");
        assert!(
            Topology::parse(&unknown)
                .unwrap_err()
                .to_string()
                .contains("no_such_setting")
        );

        let cycle = SMALL.replace(
            "parent = \"root\"\n        [[node]]\n        name = \"a\"",
            "parent = \"a\"\n        [[node]]\n        name = \"a\"",
        );
        assert!(Topology::parse(&cycle).is_err());
    }

    #[test]
    fn roots_standing_by_take_the_root_s_children_and_subtree() {
        // Goal: roots after the first stand by: the root's children may go to them, they
        // have its subtree, and no node may name one as its parent.
        let text = format!(
            "{SMALL}\n[[node]]\nname = \"root-b\"\nrole = \"root\"\nlisten = \"127.0.0.1:7420\"\n"
        );
        let topology = Topology::parse(&text).unwrap();
        assert_eq!(topology.root().name, "root");
        let roots: Vec<&str> = topology.roots().map(|n| n.name.as_str()).collect();
        assert_eq!(roots, ["root", "root-b"]);
        let agg = topology.node("agg").unwrap();
        let parents: Vec<&str> = topology
            .parents_of(agg)
            .iter()
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(parents, ["root", "root-b"]);
        let a = topology.node("a").unwrap();
        assert_eq!(
            topology.parents_of(a)[0].name,
            "agg",
            "below an aggregator: one"
        );
        assert_eq!(topology.parents_of(a).len(), 1);
        let children: Vec<&str> = topology
            .children_of("root-b")
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(children, ["agg", "b"]);
        assert_eq!(
            topology.subtree_leaves("root-b"),
            vec![LeafId(1), LeafId(9)]
        );
        let wrong = text.replace("parent = \"root\"\n    \"#", "");
        let wrong = format!(
            "{wrong}\n[[node]]\nname = \"c\"\nrole = \"leaf\"\nlisten = \"127.0.0.1:7421\"\nparent = \"root-b\"\n"
        );
        let error = Topology::parse(&wrong).unwrap_err().to_string();
        assert!(error.contains("stands by for root \"root\""), "{error}");
    }
}
