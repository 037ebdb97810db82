//! The parent side of a child node (leaf or aggregator): one session with its parent.
//!
//! The driver connects to the parent and calls `handle_connected(.., Link::Parent)`; the child
//! sends `Hello`, and the session is established when the parent's `Welcome` arrives with the
//! credit. A session ends when the connection does; everything offered on it is then taken
//! back (the parent's window is soft state) and offered again on the next session.

use crate::id::ConnId;
use crate::id::LeafId;
use crate::machine::Transmit;
use crate::wire::{Hello, PROTOCOL_VERSION, PeerKind, Role, Welcome, Wire};

/// See the module doc.
#[derive(Debug)]
pub(crate) struct Upstream {
    name: String,
    role: Role,
    leaves: Vec<LeafId>,
    /// The parent connection, once connected.
    conn: Option<ConnId>,
    /// Credit per topic; 0 until the `Welcome` arrives.
    credits: u32,
    /// Credit per fairness key's lane (see [`crate::lanes`]).
    key_credits: u32,
    /// The parent's name, from its latest `Welcome`.
    parent_name: Option<String>,
}

impl Upstream {
    pub(crate) fn new(name: String, role: Role, leaves: Vec<LeafId>) -> Self {
        Upstream {
            name,
            role,
            leaves,
            conn: None,
            credits: 0,
            key_credits: 0,
            parent_name: None,
        }
    }

    /// A parent connection is up: returns the `Hello` to send.
    pub(crate) fn connected(&mut self, conn: ConnId) -> Transmit {
        self.conn = Some(conn);
        self.credits = 0;
        let peer = PeerKind::Node {
            name: self.name.clone(),
            role: self.role,
            leaves: self.leaves.clone(),
            replica: None,
        };
        Transmit {
            conn,
            msg: Wire::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                token: None,
                peer,
            }),
        }
    }

    /// The parent accepted us. Returns whether the session is now established.
    pub(crate) fn welcomed(&mut self, conn: ConnId, welcome: &Welcome) -> bool {
        if self.conn != Some(conn) {
            return false;
        }
        self.credits = welcome.credits_per_topic;
        self.key_credits = welcome.credits_per_key.min(welcome.credits_per_topic);
        self.parent_name = Some(welcome.node.clone());
        true
    }

    /// The parent's name, once a parent welcomed us.
    pub(crate) fn parent_name(&self) -> Option<String> {
        self.parent_name.clone()
    }

    /// A connection ended. Returns whether it was the parent session.
    pub(crate) fn disconnected(&mut self, conn: ConnId) -> bool {
        if self.conn != Some(conn) {
            return false;
        }
        self.conn = None;
        self.credits = 0;
        true
    }

    /// The parent connection, established or not.
    pub(crate) fn current(&self) -> Option<ConnId> {
        self.conn
    }

    /// Whether `conn` is the parent connection.
    pub(crate) fn is(&self, conn: ConnId) -> bool {
        self.conn == Some(conn)
    }

    /// The parent connection when the session is established (welcomed).
    pub(crate) fn session(&self) -> Option<ConnId> {
        self.conn.filter(|_| self.credits > 0)
    }

    /// Credit per topic on the current session (0 when none).
    pub(crate) fn credits(&self) -> u32 {
        self.credits
    }

    /// Credit per fairness key's lane on the current session (0 when none).
    pub(crate) fn key_credits(&self) -> u32 {
        if self.credits == 0 {
            0
        } else {
            self.key_credits
        }
    }
}
