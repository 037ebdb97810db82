//! Which lane a message or a stranded batch goes to: each lane's health (whether its leaf is
//! being avoided after failures) and the round-robin over the lanes that answer.

use super::{Lane, ProducerConfig};
use crate::ClientError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Whether new messages should avoid a lane: its leaf could not be reached lately. Read for
/// every message, so the healthy case is one atomic load.
pub(super) struct Health {
    /// Until when the lane is avoided, in microseconds since `epoch` (0: the leaf answers).
    down_until_us: AtomicU64,
    /// How long it was avoided last time, in microseconds (doubles while failures go on).
    backoff_us: AtomicU64,
    epoch: tokio::time::Instant,
}

impl Health {
    pub(super) fn new() -> Health {
        Health {
            down_until_us: AtomicU64::new(0),
            backoff_us: AtomicU64::new(0),
            epoch: tokio::time::Instant::now(),
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    pub(super) fn is_up(&self) -> bool {
        let until = self.down_until_us.load(Ordering::Relaxed);
        until == 0 || self.now_us() >= until
    }

    /// The leaf could not be reached (again): avoid it for twice as long as last time.
    pub(super) fn failed(&self, config: &ProducerConfig) {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let last = self.backoff_us.load(Ordering::Relaxed);
        let backoff = if last == 0 {
            micros(config.leaf_retry_initial)
        } else {
            last.saturating_mul(2).min(micros(config.leaf_retry_max))
        };
        self.backoff_us.store(backoff.max(1), Ordering::Relaxed);
        self.down_until_us.store(
            self.now_us().saturating_add(backoff).max(1),
            Ordering::Relaxed,
        );
    }

    pub(super) fn answered(&self) {
        if self.down_until_us.load(Ordering::Relaxed) != 0 {
            self.down_until_us.store(0, Ordering::Relaxed);
            self.backoff_us.store(0, Ordering::Relaxed);
        }
    }
}

/// The next lane for a message without a dedup key: round-robin over the lanes whose leaf
/// answers. A new message goes to some lane even if none answers (its batch then finds
/// another or fails); a batch moved away from lane `not` goes only to a lane that answers.
pub(super) fn spread(lanes: &[Lane], next: &AtomicUsize, not: Option<usize>) -> Option<usize> {
    pick(lanes, lanes.len(), |i| i, next, not)
}

/// As [`spread`], over the lanes `among` only (a replicated leaf's replicas).
pub(super) fn spread_among(
    lanes: &[Lane],
    among: &[usize],
    next: &AtomicUsize,
    not: Option<usize>,
) -> Option<usize> {
    pick(lanes, among.len(), |i| among[i], next, not)
}

/// Round-robin over `n` candidates (`lane(i)` is the i-th), preferring lanes that answer.
fn pick(
    lanes: &[Lane],
    n: usize,
    lane: impl Fn(usize) -> usize,
    next: &AtomicUsize,
    not: Option<usize>,
) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let start = next.fetch_add(1, Ordering::Relaxed) % n;
    let candidates = (0..n)
        .map(|i| lane((start + i) % n))
        .filter(|&l| Some(l) != not);
    let mut any = None;
    for candidate in candidates {
        if lanes[candidate].health.is_up() {
            return Some(candidate);
        }
        any.get_or_insert(candidate);
    }
    if not.is_some() { None } else { any }
}

/// The lane a part that no lane takes tries next: after `leaf_retry_initial`, the next lane in
/// turn (of `among`, if given) whether its leaf is avoided or not (when every leaf failed
/// lately, the avoidance backoffs say nothing of which will answer first: a replica elected a
/// moment ago was refusing until then); `None` once `deadline` passed.
pub(super) async fn wait_for_lane(
    lanes: &[Lane],
    among: Option<&[usize]>,
    next: &AtomicUsize,
    deadline: tokio::time::Instant,
    config: &ProducerConfig,
) -> Option<usize> {
    let now = tokio::time::Instant::now();
    if now >= deadline {
        return None;
    }
    tokio::time::sleep(config.leaf_retry_initial.min(deadline - now)).await;
    if tokio::time::Instant::now() >= deadline {
        return None;
    }
    match among {
        Some(among) => spread_among(lanes, among, next, None),
        None => spread(lanes, next, None),
    }
}

/// The producer's leaves as dedup keys see them: a replicated leaf is one leaf with a lane
/// per replica; any other address is a leaf of its own.
pub(super) struct Leaves {
    /// Per leaf: the address its dedup keys hash on (its first replica's), and its lanes.
    leaves: Vec<(String, Vec<usize>)>,
}

impl Leaves {
    /// The leaves of `addresses` (one lane each, in order), with `groups` the replica groups.
    ///
    /// # Errors
    /// [`ClientError::InvalidArgument`] for a group address that is not among `addresses`,
    /// an address in two groups, or an empty group.
    pub(super) fn new(addresses: &[String], groups: &[Vec<String>]) -> Result<Leaves, ClientError> {
        let mut group_of = HashMap::new();
        for (group, members) in groups.iter().enumerate() {
            if members.is_empty() {
                return Err(ClientError::InvalidArgument(
                    "an empty replica group".into(),
                ));
            }
            for member in members {
                if !addresses.contains(member) {
                    return Err(ClientError::InvalidArgument(format!(
                        "replica {member} is not among the producer's leaves"
                    )));
                }
                if group_of.insert(member.as_str(), group).is_some() {
                    return Err(ClientError::InvalidArgument(format!(
                        "replica {member} is in two replica groups"
                    )));
                }
            }
        }
        let mut leaves: Vec<(String, Vec<usize>)> = Vec::new();
        let mut leaf_of_group = HashMap::new();
        for (lane, address) in addresses.iter().enumerate() {
            match group_of.get(address.as_str()) {
                Some(&group) => {
                    let leaf = *leaf_of_group.entry(group).or_insert_with(|| {
                        leaves.push((groups[group][0].clone(), Vec::new()));
                        leaves.len() - 1
                    });
                    leaves[leaf].1.push(lane);
                }
                None => leaves.push((address.clone(), vec![lane])),
            }
        }
        Ok(Leaves { leaves })
    }

    /// For each lane, the lanes of its leaf (itself included), in lane order.
    pub(super) fn replicas(&self, lanes: usize) -> Vec<Vec<usize>> {
        let mut replicas = vec![Vec::new(); lanes];
        for (_, members) in &self.leaves {
            for &lane in members {
                replicas[lane].clone_from(members);
            }
        }
        replicas
    }

    /// The lane for a message with dedup key `key`: its leaf by rendezvous hashing, then that
    /// leaf's lane that answers (the replica that leads).
    pub(super) fn dedup_lane(
        &self,
        lanes: &[Lane],
        next: &AtomicUsize,
        topic: &str,
        key: &str,
    ) -> usize {
        // Where each leaf is, not the name an address may give it: producers configured from
        // a topology (named) and by hand (bare) pick the same leaf.
        let hashed: Vec<&str> = self
            .leaves
            .iter()
            .map(|(key, _)| crate::link::named(key).1)
            .collect();
        let members = &self.leaves[dedup_leaf(&hashed, topic, key)].1;
        match members.as_slice() {
            [only] => *only,
            _ => spread_among(lanes, members, next, None).unwrap_or(members[0]),
        }
    }
}

/// The leaf a dedup key goes to: rendezvous hashing over the leaves' addresses, so every
/// producer listing the same leaves (in any order) picks the same one, and adding a leaf moves
/// only the keys that now hash to it.
fn dedup_leaf(addresses: &[&str], topic: &str, key: &str) -> usize {
    let score = |address: &str| {
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        for part in [address, "\0", topic, "\0", key] {
            for byte in part.bytes() {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        // splitmix64 finaliser: FNV alone mixes the last bytes poorly.
        hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        hash ^ (hash >> 31)
    };
    (0..addresses.len())
        .max_by_key(|&index| (score(addresses[index]), std::cmp::Reverse(index)))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{Leaves, dedup_leaf};

    #[test]
    fn a_dedup_key_picks_the_same_leaf_whatever_the_order_of_addresses() {
        let forward: Vec<String> = (0..5).map(|i| format!("10.0.0.{i}:7411")).collect();
        let forward: Vec<&str> = forward.iter().map(String::as_str).collect();
        let mut backward = forward.clone();
        backward.reverse();
        let mut used = std::collections::HashSet::new();
        for key in 0..200 {
            let key = format!("order-{key}");
            let a = forward[dedup_leaf(&forward, "jobs", &key)];
            let b = backward[dedup_leaf(&backward, "jobs", &key)];
            assert_eq!(a, b, "{key}");
            used.insert(a);
        }
        assert_eq!(used.len(), 5, "keys spread over every leaf");
    }

    #[test]
    fn a_replicated_leaf_is_one_leaf_with_a_lane_per_replica() {
        let addresses: Vec<String> = ["a:1", "b:1", "c:1", "d:1"].map(String::from).to_vec();
        let group = vec!["b:1".to_string(), "d:1".to_string()];
        let leaves = Leaves::new(&addresses, std::slice::from_ref(&group)).unwrap();
        assert_eq!(
            leaves.replicas(4),
            vec![vec![0], vec![1, 3], vec![2], vec![1, 3]]
        );
        // The group hashes on its first replica's address: producers that list the leaves
        // plainly and those that know the group agree on a single leaf's keys.
        let hashed: Vec<&str> = leaves.leaves.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(hashed, ["a:1", "b:1", "c:1"]);
        let stray = vec!["e:1".to_string()];
        assert!(Leaves::new(&addresses, &[stray]).is_err(), "not a leaf");
        assert!(
            Leaves::new(&addresses, &[group.clone(), group]).is_err(),
            "in two groups"
        );
    }
}
