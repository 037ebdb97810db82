//! The root's count of each namespace's topics (`topics_max`): topics are implicit (a leaf
//! creates one at its first push and drops it once empty), so the tree's count is the union of
//! the names the leaves hold, not a sum. A leaf asks before it holds a topic new to it; the root
//! admits a name the tree holds already, or a new one while the union, with the names admitted
//! and not yet reported, stays under the limit.

use super::*;

/// Each topics-limited scope's names, by leaf, and those admitted but not yet reported.
#[derive(Debug, Default)]
pub(super) struct TopicCounts {
    /// The topics each leaf last reported holding, per scope.
    held: BTreeMap<String, BTreeMap<LeafId, BTreeSet<String>>>,
    /// Topics admitted to a leaf that no leaf reported holding yet, with the leaf and when.
    admitted: BTreeMap<String, BTreeMap<String, (LeafId, Time)>>,
}

impl TopicCounts {
    /// Takes `leaf`'s report of `scope` (limited to `limit` topics) at `now`: the topics it
    /// holds and those pushes wait for. Answers the topics it may hold (those the tree holds
    /// already, or admitted now or before and not yet reported) and those refused; nothing
    /// new is decided before the root is `ready`. An admitted name counts for `expiry` unless
    /// a leaf reports it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn report(
        &mut self,
        now: Time,
        leaf: LeafId,
        scope: &str,
        limit: u64,
        held: &[String],
        wanted: &[String],
        ready: bool,
        expiry: Duration,
    ) -> (Vec<String>, Vec<String>) {
        let leaves = self.held.entry(scope.to_string()).or_default();
        leaves.insert(leaf, held.iter().cloned().collect());
        let mut union: BTreeSet<&String> = leaves.values().flatten().collect();
        let admitted = self.admitted.entry(scope.to_string()).or_default();
        admitted.retain(|name, (_, at)| !union.contains(name) && now < *at + expiry);
        union.extend(admitted.keys());
        let mut count = union.len() as u64;
        let mut granted: Vec<String> = Vec::new();
        let mut refused = Vec::new();
        let mut new = Vec::new();
        for name in wanted {
            if union.contains(name) {
                granted.push(name.clone());
            } else if !ready {
                continue;
            } else if count < limit {
                count += 1;
                new.push(name.clone());
                granted.push(name.clone());
            } else {
                refused.push(name.clone());
            }
        }
        for name in new {
            admitted.insert(name, (leaf, now));
        }
        for (name, (to, _)) in admitted.iter() {
            if *to == leaf && !granted.contains(name) {
                granted.push(name.clone());
            }
        }
        (granted, refused)
    }

    /// How many topics `scope` holds in the tree, with those admitted and not yet reported.
    pub(super) fn count(&self, scope: &str) -> u64 {
        let mut union: BTreeSet<&String> = self
            .held
            .get(scope)
            .map(|leaves| leaves.values().flatten().collect())
            .unwrap_or_default();
        if let Some(admitted) = self.admitted.get(scope) {
            union.extend(admitted.keys());
        }
        union.len() as u64
    }

    /// `leaf` no longer reports `scope` (or is another incarnation).
    pub(super) fn forget(&mut self, leaf: LeafId, scope: &str) {
        if let Some(leaves) = self.held.get_mut(scope) {
            leaves.remove(&leaf);
        }
    }

    /// No leaf reports `scope` any more, or it lost its `topics_max`.
    pub(super) fn drop_scope(&mut self, scope: &str) {
        self.held.remove(scope);
        self.admitted.remove(scope);
    }
}
