//! FIFO topics (`fifo = true`): a message's group is its fairness key (messages without one
//! form the group `""`), and a group is served one run at a time, in key order.
//!
//! Every available message of a group stays in its topic's lanes, so everything that finds a
//! message by key (time to live, purge, compaction, checkpoints, stats) finds it as before.
//! While the group's first message (in key order, of those available or leased) is leased, the
//! group is *closed*: its available messages are *held*, out of the offers and the frontier
//! ([`crate::offer::OfferSet::hold`]), so the tree cannot serve them. When it opens (that lease
//! ends, or an earlier message is given back while a later one is still leased, as SQS opens a
//! group once its first message is visible again) they are offered again, the one given back
//! first, as a released message keeps its key. Opening and closing a group moves each of its
//! available messages once: the cost grows with a group's backlog, not the topic's.
//!
//! A reserve leases a message of a FIFO topic only when it is its group's first available one
//! and no earlier message of the group is leased, except by this reserve: one reserve (so one
//! pop) may take a run of a group, in order, never two consumers at once. A reserve the root makes ahead of
//! its pops is refused for a FIFO topic ([`ReserveDenied::InOrder`]): its grants would be
//! handed to several pops. A refused entry is offered again.
//!
//! The state is derived, never logged: which messages are leased and their keys are what the
//! log keeps already, so a restart (or a replica taking over) rebuilds the groups from them.

use super::*;
use crate::wire::ReserveDenied;
use std::collections::BTreeSet;

/// The group of messages without a fairness key.
const NO_GROUP: &str = "";

/// A FIFO topic's groups that have available or leased messages.
#[derive(Debug, Default)]
pub(super) struct Groups {
    by_name: HashMap<Arc<str>, Group>,
}

#[derive(Debug, Default)]
struct Group {
    /// Its available messages, in key order.
    available: BTreeSet<Key>,
    /// Its leased messages, in key order.
    leased: BTreeSet<Key>,
}

impl Group {
    /// Whether the group waits: its first message is leased (a later one leased while the
    /// first is available again does not close it, as on SQS).
    fn closed(&self) -> bool {
        match (self.leased.first(), self.available.first()) {
            (Some(leased), Some(available)) => leased < available,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    fn is_empty(&self) -> bool {
        self.available.is_empty() && self.leased.is_empty()
    }
}

impl LeafTopic {
    fn group_of(&self, id: MessageId) -> Arc<str> {
        self.offers
            .key_of(id)
            .cloned()
            .unwrap_or_else(|| Arc::from(NO_GROUP))
    }

    /// Applies `change` to the group of message `id`, then holds or releases its available
    /// messages if it closed or opened (`added`: a message it just made available, held if
    /// the group stays closed). Whether messages were released (the topic has new candidates).
    fn change_group(
        &mut self,
        id: MessageId,
        added: Option<Key>,
        change: impl FnOnce(&mut Group),
    ) -> bool {
        if self.groups.is_none() {
            return false;
        }
        let name = self.group_of(id);
        let groups = self.groups.as_mut().expect("checked");
        let group = groups.by_name.entry(name.clone()).or_default();
        let was_closed = group.closed();
        change(group);
        let closed = group.closed();
        let mut released = false;
        match (was_closed, closed) {
            (false, true) => {
                for key in &group.available {
                    self.offers.hold(key);
                }
            }
            (true, false) => {
                for key in &group.available {
                    released |= self.offers.release(key);
                }
            }
            (true, true) => {
                if let Some(key) = added {
                    self.offers.hold(&key);
                }
            }
            (false, false) => {}
        }
        if group.is_empty() {
            groups.by_name.remove(&name);
        }
        released
    }

    /// Message `key` became available (it is in the lanes): its group knows it.
    pub(super) fn fifo_available(&mut self, key: Key) {
        self.change_group(key.id, Some(key), |group| {
            group.available.insert(key);
        });
    }

    /// Message `key` is no longer available.
    pub(super) fn fifo_unavailable(&mut self, key: &Key) {
        self.change_group(key.id, None, |group| {
            group.available.remove(key);
        });
    }

    /// Message `key` was leased.
    pub(super) fn fifo_leased(&mut self, key: Key) {
        self.change_group(key.id, None, |group| {
            group.leased.insert(key);
        });
    }

    /// The lease of message `key` ended. Whether its group opened with messages to offer.
    pub(super) fn fifo_unleased(&mut self, key: &Key) -> bool {
        self.change_group(key.id, None, |group| {
            group.leased.remove(key);
        })
    }

    /// Why a reserve may not lease available message `key`, if it may not: `granted` counts the
    /// messages this reserve has leased so far by group, `ahead` says whether it is a reserve
    /// made ahead of pops.
    pub(super) fn fifo_refusal(
        &self,
        key: &Key,
        granted: &HashMap<Arc<str>, usize>,
        ahead: bool,
    ) -> Option<ReserveDenied> {
        let groups = self.groups.as_ref()?;
        if ahead {
            return Some(ReserveDenied::InOrder);
        }
        let name = self.group_of(key.id);
        let group = groups.by_name.get(&name)?;
        // The group's next message, and every earlier one leased is of this reserve's run (a
        // run stops at a message someone else holds, as on SQS).
        let head = group.available.first() == Some(key);
        let mine = granted.get(&name).copied().unwrap_or(0);
        let ours = group.leased.range(..*key).count() == mine;
        (!(ours && head)).then_some(ReserveDenied::InOrder)
    }

    /// The group of message `id`, for a reserve's record of the groups it leased in.
    pub(super) fn fifo_group(&self, id: MessageId) -> Option<Arc<str>> {
        self.groups.as_ref().map(|_| self.group_of(id))
    }

    /// Turns the topic's FIFO delivery on or off; on, its groups are rebuilt from the
    /// available messages and the leased ones (`leased`).
    pub(super) fn set_fifo(&mut self, on: bool, leased: impl Iterator<Item = Key>) -> bool {
        match (on, self.groups.is_some()) {
            (true, true) | (false, false) => false,
            (false, true) => {
                let groups = self.groups.take().expect("checked");
                for group in groups.by_name.values() {
                    for key in &group.available {
                        self.offers.release(key);
                    }
                }
                true
            }
            (true, false) => {
                self.groups = Some(Groups::default());
                let keys: Vec<Key> = self.offers.iter().map(|(key, _)| *key).collect();
                for key in keys {
                    self.fifo_available(key);
                }
                for key in leased {
                    self.fifo_leased(key);
                }
                true
            }
        }
    }
}
