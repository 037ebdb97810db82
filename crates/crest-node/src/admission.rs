//! Who may say what `Hello` to a node: a peer claiming to be a node of the tree must present a
//! certificate made out to that node's name, and the topology must place that node where it
//! claims to be (a child of this node with that role, or the root on a leaf's direct link).
//! A producer or consumer must prove a principal of the access file, if the node has one
//! ([`crate::access`]): a client certificate naming it, or an API token in its `Hello`.

use crate::access::{Access, Credential};
use crest_core::access::Principal;
use crest_core::machine::Link;
use crest_core::topology::Topology;
use crest_core::wire::{ErrorCode, PeerKind, Role, Wire};
use std::collections::HashMap;

/// What a node checks of the peers that say `Hello` to it.
pub(crate) struct Admission {
    /// This node's name, for the refusals.
    name: String,
    /// The nodes the topology places directly below this one, with their roles, by the name
    /// the tree knows them by (a replicated leaf's group name).
    children: HashMap<String, Role>,
    /// The replicas among them: each replica's group.
    replicas: HashMap<String, String>,
    /// The newest term in which a leader of each replicated child was welcomed.
    terms: HashMap<String, u64>,
    /// The roots' names (the root and those standing by), if this node is a leaf a root may
    /// link to directly.
    roots: Vec<String>,
    /// The principals clients must prove (`None`: clients are not authenticated).
    pub(crate) access: Option<Access>,
    /// Most connections one principal may hold to this node (`principal_connections_max`).
    pub(crate) principal_connections_max: u32,
}

/// Who a peer admitted by [`Admission::check`] is.
pub(crate) enum Admitted {
    /// A node of the tree, or a message after the `Hello`.
    Peer,
    /// A client of a node without access control.
    Anonymous,
    /// A client that proved `credential`, standing for `principal`.
    Client(Credential, Principal),
}

/// Why a peer was refused: the code and text of the error it is sent.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) code: ErrorCode,
    pub(crate) text: String,
}

impl Admission {
    /// What node `name` of `topology` admits.
    pub(crate) fn for_node(topology: &Topology, name: &str, access: Option<Access>) -> Admission {
        // Roots standing by take the root's children.
        let children = topology
            .children_of(name)
            .map(|node| (node.tree_name().to_string(), node.role))
            .collect();
        let replicas = topology
            .children_of(name)
            .filter_map(|node| {
                let replica = node.replica.as_ref()?;
                Some((node.name.clone(), replica.group.clone()))
            })
            .collect();
        let is_leaf = topology
            .node(name)
            .is_some_and(|node| node.role == Role::Leaf);
        Admission {
            name: name.to_string(),
            children,
            replicas,
            terms: HashMap::new(),
            roots: if is_leaf {
                topology.roots().map(|root| root.name.clone()).collect()
            } else {
                Vec::new()
            },
            access,
            principal_connections_max: topology
                .node(name)
                .map_or(u32::MAX, |node| node.settings.principal_connections_max),
        }
    }

    /// Checks `msg` arriving on `connection` (a `Hello` claiming a node of the tree, or a
    /// client's); every other message passes.
    pub(crate) fn check(
        &mut self,
        connection: &quinn::Connection,
        link: Link,
        msg: &Wire,
    ) -> Result<Admitted, Refusal> {
        let (Link::Incoming, Wire::Hello(hello)) = (link, msg) else {
            return Ok(Admitted::Peer);
        };
        let forbidden = |text: String| Refusal {
            code: ErrorCode::Forbidden,
            text,
        };
        let claimed = match &hello.peer {
            PeerKind::Node {
                name,
                role,
                replica,
                ..
            } => {
                if self.children.get(name) != Some(role) {
                    return Err(forbidden(format!(
                        "the topology has no {role} {name:?} below {:?}",
                        self.name
                    )));
                }
                let is_group = self.replicas.values().any(|group| group == name);
                match replica {
                    None if is_group => {
                        return Err(forbidden(format!(
                            "{name:?} is a replica group: its leader must say which replica it is"
                        )));
                    }
                    None => name,
                    Some(claim) => {
                        if self.replicas.get(&claim.name) != Some(name) {
                            return Err(forbidden(format!(
                                "the topology has no replica {:?} in group {name:?}",
                                claim.name
                            )));
                        }
                        crest_transport::tls::peer_is(connection, &claim.name).map_err(|text| {
                            Refusal {
                                code: ErrorCode::Unauthenticated,
                                text,
                            }
                        })?;
                        let newest = self.terms.entry(name.clone()).or_insert(claim.term);
                        if claim.term < *newest {
                            return Err(forbidden(format!(
                                "replica {:?} leads group {name:?} in term {}, but a leader of \
                                 term {} was welcomed: it was deposed",
                                claim.name, claim.term, *newest
                            )));
                        }
                        *newest = claim.term;
                        return Ok(Admitted::Peer);
                    }
                }
            }
            PeerKind::Root { name } => {
                if !self.roots.contains(name) {
                    return Err(forbidden(format!(
                        "{name:?} is not a root that may link to {:?}",
                        self.name
                    )));
                }
                name
            }
            PeerKind::Producer | PeerKind::Consumer => {
                return self.authenticate(connection, hello.token.as_ref().map(|t| &t.0));
            }
        };
        crest_transport::tls::peer_is(connection, claimed)
            .map(|()| Admitted::Peer)
            .map_err(|text| Refusal {
                code: ErrorCode::Unauthenticated,
                text,
            })
    }

    /// Which principal a client proves: its client certificate's, else its token's.
    fn authenticate(
        &self,
        connection: &quinn::Connection,
        token: Option<&String>,
    ) -> Result<Admitted, Refusal> {
        let Some(access) = &self.access else {
            return Ok(Admitted::Anonymous);
        };
        let unauthenticated = |text: String| Refusal {
            code: ErrorCode::Unauthenticated,
            text,
        };
        let credential = match (crest_transport::tls::client_name(connection), token) {
            (Some(name), _) => Credential::Certificate(name),
            (None, Some(token)) => access.check_token(token).map_err(unauthenticated)?,
            (None, None) => {
                return Err(unauthenticated(format!(
                    "{:?} requires a credential: an API token (CREST_TOKEN) or a client certificate",
                    self.name
                )));
            }
        };
        let principal = access.resolve(&credential).map_err(unauthenticated)?;
        Ok(Admitted::Client(credential, principal))
    }
}
