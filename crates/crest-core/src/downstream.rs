//! The children side of a parent node (aggregator or root): handshakes, routing, windows.
//!
//! It accepts `Hello`s, answers `Welcome`, keeps the route from each leaf id to the child
//! connection that leads to it, and keeps one [`Window`] per topic. A child that connects again
//! under the same name supersedes its old session: everything the old one offered is dropped
//! and the old connection is closed (its process probably restarted before the old connection
//! timed out).

use crate::config::Settings;
use crate::id::ConnId;
use crate::id::LeafId;
use crate::time::Time;
use crate::window::Window;
use crate::wire::{
    ErrorCode, Hello, PROTOCOL_VERSION, PeerKind, ReceiptError, Role, Welcome, Wire,
};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;
use std::time::Duration;

/// Interned topic name.
pub(crate) type Topic = Arc<str>;

/// A map keyed by topic. FxHash: topic names are hashed several times per message, SipHash
/// showed in profiles, and the number of topics is bounded (`topics_max`), so hash flooding
/// cannot grow a map without bound.
pub(crate) type TopicMap<V> = rustc_hash::FxHashMap<Topic, V>;

/// A set of topics (see [`TopicMap`]).
pub(crate) type TopicSet = rustc_hash::FxHashSet<Topic>;

/// What a connection turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Peer {
    /// No `Hello` yet.
    Pending,
    /// A child node.
    Child { name: String, leaves: Vec<LeafId> },
    /// The root, on its direct link to this leaf.
    Root,
    /// A producer.
    Producer,
    /// A consumer.
    Consumer,
}

/// The result of a `Hello`.
pub(crate) struct HelloOutcome {
    /// The answer to send on the connection.
    pub(crate) reply: Wire,
    /// Whether the connection must be closed after the answer.
    pub(crate) close: bool,
    /// An older session of the same child that this one supersedes.
    pub(crate) superseded: Option<ConnId>,
}

impl HelloOutcome {
    /// The reason a refused connection is closed with: the refusal's `CODE: text`, which the
    /// peer reads when the close overtakes the answer.
    pub(crate) fn close_reason(&self) -> String {
        match &self.reply {
            Wire::Error(error) => format!("{}: {}", error.code, error.message),
            _ => "handshake refused".into(),
        }
    }
}

/// See the module doc.
pub(crate) struct Downstream {
    name: String,
    role: Role,
    settings: Settings,
    /// Leaves below this node according to the topology: receipts naming others are refused.
    subtree: HashSet<LeafId>,
    pub(crate) peers: HashMap<ConnId, Peer>,
    children_by_name: HashMap<String, ConnId>,
    routes: HashMap<LeafId, ConnId>,
    pub(crate) windows: TopicMap<Window>,
    /// The lanes with a window of each weighted topic, in tier order (`crate::lanes`).
    lanes: HashMap<Arc<str>, Vec<(u32, Topic)>>,
    /// Leaves below this node whose state it does not know: no child has reported them since
    /// this node started, or since the session that led to them ended. With when that began
    /// (`None`: at the start), until `absent_child_wait_ms` after it.
    unknown: HashMap<LeafId, Option<Time>>,
    /// Children welcomed that have not sent their first report: their leaves stay unknown.
    unheard: HashSet<ConnId>,
    /// When this node started (the first time it was told the time).
    started: Option<Time>,
}

impl Downstream {
    pub(crate) fn new(name: String, role: Role, settings: Settings, subtree: Vec<LeafId>) -> Self {
        Downstream {
            name,
            role,
            settings,
            subtree: subtree.iter().copied().collect(),
            peers: HashMap::default(),
            children_by_name: HashMap::default(),
            unknown: subtree.iter().map(|leaf| (*leaf, None)).collect(),
            routes: HashMap::default(),
            windows: Default::default(),
            lanes: HashMap::default(),
            unheard: HashSet::default(),
            started: None,
        }
    }

    /// Notes the time: the first call is this node's start.
    pub(crate) fn clock(&mut self, now: Time) {
        self.started.get_or_insert(now);
    }

    /// A connection arrived; it says who it is in its `Hello`.
    pub(crate) fn accept(&mut self, conn: ConnId) {
        self.peers.insert(conn, Peer::Pending);
    }

    /// Handles a `Hello`. `accepts` says which client kinds this role serves.
    pub(crate) fn hello(
        &mut self,
        conn: ConnId,
        hello: Hello,
        accepts: &[PeerKindTag],
        now: Time,
    ) -> HelloOutcome {
        let refuse = |code, message: String| HelloOutcome {
            reply: Wire::error(None, code, message),
            close: true,
            superseded: None,
        };
        if hello.protocol != PROTOCOL_VERSION {
            return refuse(
                ErrorCode::UnsupportedProtocol,
                format!(
                    "protocol {} is not supported; this node speaks {PROTOCOL_VERSION}",
                    hello.protocol
                ),
            );
        }
        if self.peers.get(&conn) != Some(&Peer::Pending) {
            return refuse(
                ErrorCode::UnexpectedMessage,
                "second Hello on one connection".into(),
            );
        }
        let tag = PeerKindTag::of(&hello.peer);
        if !accepts.contains(&tag) {
            return refuse(
                ErrorCode::UnexpectedMessage,
                format!(
                    "{} {:?} does not accept {tag:?} connections",
                    self.role, self.name
                ),
            );
        }
        let mut superseded = None;
        let credits = match hello.peer {
            PeerKind::Node { name, leaves, .. } => {
                if let Some(unknown) = leaves.iter().find(|leaf| !self.subtree.contains(leaf)) {
                    return refuse(
                        ErrorCode::InvalidArgument,
                        format!(
                            "child {name:?} claims leaf {unknown}, which is not below {:?}",
                            self.name
                        ),
                    );
                }
                superseded = self.children_by_name.insert(name.clone(), conn);
                // A new session's leaves are known once it reports (it offers, then reports,
                // as soon as it is welcomed).
                for leaf in &leaves {
                    self.routes.insert(*leaf, conn);
                    self.unknown.entry(*leaf).or_insert(Some(now));
                }
                self.unheard.insert(conn);
                self.peers.insert(conn, Peer::Child { name, leaves });
                self.settings.credits_per_topic
            }
            PeerKind::Root { .. } => {
                self.peers.insert(conn, Peer::Root);
                0
            }
            PeerKind::Producer => {
                self.peers.insert(conn, Peer::Producer);
                0
            }
            PeerKind::Consumer => {
                self.peers.insert(conn, Peer::Consumer);
                0
            }
        };
        let reply = Wire::Welcome(Welcome {
            node: self.name.clone(),
            role: self.role,
            credits_per_topic: credits,
            payload_bytes_max: self.settings.payload_bytes_max,
            frame_bytes_max: self.settings.frame_bytes_max,
            credits_per_key: if credits == 0 {
                0
            } else {
                self.settings.credits_per_key
            },
        });
        HelloOutcome {
            reply,
            close: false,
            superseded,
        }
    }

    /// Forgets a connection. For a child, drops its routes and window entries and returns the
    /// removed keys per topic.
    /// When a child that went silent was last heard: `link_idle_timeout_ms` before `now`.
    pub(crate) fn last_heard_of_silent(&self, now: Time) -> Time {
        now - Duration::from_millis(self.settings.link_idle_timeout_ms)
    }

    /// Forgets child `conn`; the leaves it led to are unknown from `since` (when it was last
    /// heard: now, or before for a child that went silent), waited for until
    /// `absent_child_wait_ms` after that.
    pub(crate) fn disconnect(
        &mut self,
        conn: ConnId,
        since: Time,
    ) -> Option<Vec<(Topic, Vec<crate::key::Key>)>> {
        let Peer::Child { name, leaves } = self.peers.remove(&conn)? else {
            return None;
        };
        self.unheard.remove(&conn);
        if self.children_by_name.get(&name) == Some(&conn) {
            self.children_by_name.remove(&name);
        }
        for leaf in leaves {
            if self.routes.get(&leaf) == Some(&conn) {
                self.routes.remove(&leaf);
                self.unknown.entry(leaf).or_insert(Some(since));
            }
        }
        let mut removed = Vec::new();
        for (topic, window) in &mut self.windows {
            let keys = window.remove_child(conn);
            if !keys.is_empty() {
                removed.push((topic.clone(), keys));
            }
        }
        Some(removed)
    }

    /// A child sent a report: if it is its first, the leaves it leads to are known now (its
    /// offers came before it). Returns whether that is so.
    pub(crate) fn heard(&mut self, conn: ConnId) -> bool {
        if !self.unheard.remove(&conn) {
            return false;
        }
        if let Some(Peer::Child { leaves, .. }) = self.peers.get(&conn) {
            for leaf in leaves {
                if self.routes.get(leaf) == Some(&conn) {
                    self.unknown.remove(leaf);
                }
            }
        }
        true
    }

    /// A child's report names the leaves below it that it waits for ([`Report::absent`]):
    /// those it leads to are unknown here too, and the others it leads to are known again
    /// (once its first report arrived: [`Self::heard`]). Leaves not below it are ignored.
    /// Returns whether that changed anything.
    ///
    /// [`Report::absent`]: crate::metrics::Report::absent
    pub(crate) fn reported_absent(&mut self, conn: ConnId, absent: &[LeafId], now: Time) -> bool {
        if self.unheard.contains(&conn) {
            return false;
        }
        let Some(Peer::Child { leaves, .. }) = self.peers.get(&conn) else {
            return false;
        };
        let mut changed = false;
        for leaf in leaves {
            if self.routes.get(leaf) != Some(&conn) {
                continue;
            }
            if absent.binary_search(leaf).is_ok() {
                if !self.unknown.contains_key(leaf) {
                    self.unknown.insert(*leaf, Some(now));
                    changed = true;
                }
            } else {
                changed |= self.unknown.remove(leaf).is_some();
            }
        }
        changed
    }

    /// The leaves below that are unknown and still waited for, sorted.
    pub(crate) fn absent(&self, now: Time) -> Vec<LeafId> {
        let wait = Duration::from_millis(self.settings.absent_child_wait_ms);
        let started = self.started.unwrap_or(Time::ZERO);
        let mut absent: Vec<LeafId> = self
            .unknown
            .iter()
            .filter(|(_, since)| since.unwrap_or(started) + wait > now)
            .map(|(leaf, _)| *leaf)
            .collect();
        absent.sort_unstable();
        absent
    }

    /// When the wait for each unknown leaf ends (see `absent_child_wait_ms`).
    fn wait_ends(&self) -> impl Iterator<Item = Time> + '_ {
        let wait = Duration::from_millis(self.settings.absent_child_wait_ms);
        let started = self.started.unwrap_or(Time::ZERO);
        self.unknown
            .values()
            .map(move |since| since.unwrap_or(started) + wait)
    }

    /// Whether some leaf below is unknown and still waited for: nothing is certain then.
    pub(crate) fn awaiting(&self, now: Time) -> bool {
        self.wait_ends().any(|end| end > now)
    }

    /// When the first wait for an unknown leaf ends (perhaps past: [`Self::stop_waiting`]
    /// then forgets it).
    pub(crate) fn next_wait_end(&self) -> Option<Time> {
        self.wait_ends().min()
    }

    /// Stops waiting for the unknown leaves whose wait ended (they count as empty until
    /// reported); returns whether there were any.
    pub(crate) fn stop_waiting(&mut self, now: Time) -> bool {
        let wait = Duration::from_millis(self.settings.absent_child_wait_ms);
        let started = self.started.unwrap_or(Time::ZERO);
        let before = self.unknown.len();
        self.unknown
            .retain(|_, since| since.unwrap_or(started) + wait > now);
        self.unknown.len() != before
    }

    /// Checks an offer from child `conn` before anything of it is applied: a valid topic name,
    /// and every added entry owned by a leaf that this child leads to (otherwise the parent
    /// would route that message's reserves and acks to the wrong subtree).
    ///
    /// # Errors
    /// A sentence naming the problem.
    pub(crate) fn check_offer(
        &self,
        conn: ConnId,
        offer: &crate::wire::Offer,
    ) -> Result<(), String> {
        crate::lanes::check(&self.settings, &offer.topic)?;
        // Each leaf holds at most `topics_max` topics, so the subtree offers at most that many
        // per leaf: more windows than that are a child's invention. A weighted topic's lanes
        // count as one topic; it has at most `TIERS_MAX` lanes, twice while its tiers change.
        let topics_max = self.settings.topics_max as usize * self.subtree.len().max(1);
        if !self.windows.contains_key(offer.topic.as_str()) {
            let lanes: usize = self.lanes.values().map(Vec::len).sum();
            let bare = self.lanes.keys();
            let bare = bare.filter(|topic| !self.windows.contains_key(&***topic));
            let topics = self.windows.len() - lanes + bare.count();
            let topic = crate::lanes::topic_of(&offer.topic);
            let lanes_of = self.lanes_of(topic).len();
            let new_topic = lanes_of == 0 && !self.windows.contains_key(topic);
            if new_topic && topics >= topics_max {
                return Err(format!(
                    "offer on a new topic past {topics_max} topics (topics_max per leaf below)"
                ));
            }
            // Each leaf gives at most `fairness_keys_max` keys a lane; tiers' and keys' lanes
            // are each twice their bound while a topic's tiers change.
            let (max, what) = if crate::lanes::is_key_lane(&offer.topic) {
                let leaves = self.subtree.len().max(1);
                (
                    2 * self.settings.fairness_keys_max as usize * leaves,
                    "fairness key lanes (fairness_keys_max per leaf below)",
                )
            } else {
                (2 * crate::config::TIERS_MAX, "tier lanes")
            };
            let keyed = crate::lanes::is_key_lane(&offer.topic);
            let same = self.lanes_of(topic).iter();
            let same = same.filter(|(_, lane)| crate::lanes::is_key_lane(lane) == keyed);
            if lanes_of > 0 && same.count() >= max {
                return Err(format!("offer on a new lane of {topic} past {max} {what}"));
            }
        }
        if let Some(entry) = offer
            .adds
            .iter()
            .find(|entry| self.routes.get(&entry.key.id.leaf()) != Some(&conn))
        {
            return Err(format!(
                "offered message {} belongs to a leaf this child does not lead to",
                entry.key.id
            ));
        }
        Ok(())
    }

    /// The child connection that leads to `leaf`.
    pub(crate) fn route(&self, leaf: LeafId) -> Result<ConnId, ReceiptError> {
        if !self.subtree.contains(&leaf) {
            return Err(ReceiptError::UnknownLeaf);
        }
        self.routes
            .get(&leaf)
            .copied()
            .ok_or(ReceiptError::Unavailable)
    }

    /// Every leaf below this node per the topology, in id order.
    pub(crate) fn subtree_leaves(&self) -> Vec<LeafId> {
        let mut leaves: Vec<LeafId> = self.subtree.iter().copied().collect();
        leaves.sort_unstable();
        leaves
    }

    /// Whether `conn` is a connected child.
    pub(crate) fn is_child(&self, conn: ConnId) -> bool {
        matches!(self.peers.get(&conn), Some(Peer::Child { .. }))
    }

    /// The interned topic for `name`, creating its window.
    pub(crate) fn topic(&mut self, name: &str) -> Topic {
        if let Some((topic, _)) = self.windows.get_key_value(name) {
            return topic.clone();
        }
        let topic: Topic = Arc::from(name);
        self.windows.insert(topic.clone(), Window::default());
        if let Some(lane) = crate::lanes::parse(name)
            && let Some(tier) = lane.tier
        {
            let lanes = self.lanes.entry(Arc::from(lane.topic)).or_default();
            let at = lanes.partition_point(|(t, _)| *t <= tier);
            lanes.insert(at, (tier, topic.clone()));
        }
        topic
    }

    /// Drops the window of `name` (a topic's or a lane's).
    pub(crate) fn remove_window(&mut self, name: &Topic) {
        if self.windows.remove(name).is_none() {
            return;
        }
        let topic = crate::lanes::topic_of(name);
        if topic.len() != name.len()
            && let Some(lanes) = self.lanes.get_mut(topic)
        {
            lanes.retain(|(_, lane)| lane != name);
            if lanes.is_empty() {
                self.lanes.remove(topic);
            }
        }
    }

    /// The lanes with a window of the weighted topic `topic`, in tier order (none: `topic` is
    /// strict, or has nothing below).
    pub(crate) fn lanes_of(&self, topic: &str) -> &[(u32, Topic)] {
        self.lanes.get(topic).map_or(&[], Vec::as_slice)
    }

    /// Number of connected children.
    pub(crate) fn children(&self) -> usize {
        self.peers
            .values()
            .filter(|peer| matches!(peer, Peer::Child { .. }))
            .count()
    }

    /// Checks every window against the credits (see [`Window::check`]).
    pub(crate) fn check_windows(&self) {
        for (name, window) in &self.windows {
            window.check(self.credit(name));
        }
    }

    /// Entries held in all windows.
    pub(crate) fn window_entries(&self) -> usize {
        self.windows.values().map(Window::len).sum()
    }

    /// The credit granted to each child for lane `name` (a topic's, a tier's or a fairness
    /// key's: see [`crate::lanes::credit`]).
    pub(crate) fn credit(&self, name: &str) -> u32 {
        let s = &self.settings;
        crate::lanes::credit(name, s.credits_per_topic, s.credits_per_key)
    }
}

/// The kind of a peer, without its details.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum PeerKindTag {
    /// A child node.
    Node,
    /// The root's direct link (accepted by leaves).
    Root,
    /// A producer.
    Producer,
    /// A consumer.
    Consumer,
}

impl PeerKindTag {
    fn of(peer: &PeerKind) -> PeerKindTag {
        match peer {
            PeerKind::Node { .. } => PeerKindTag::Node,
            PeerKind::Root { .. } => PeerKindTag::Root,
            PeerKind::Producer => PeerKindTag::Producer,
            PeerKind::Consumer => PeerKindTag::Consumer,
        }
    }
}
