//! An ordered map stored as sorted chunks: the leaf's index of queued messages.
//!
//! `std`'s `BTreeMap` keeps 11 entries per node and splits a full node in the middle, so a
//! map filled in key order (how a queue fills: each priority tier grows at its end) keeps its
//! nodes about half full: with 48-byte entries that is ~90 bytes per entry. This map keeps its
//! entries in chunks of up to [`CHUNK`] (a `VecDeque` each, so taking the first entry is
//! cheap), found through a `BTreeMap` of each chunk's lower bound. A full chunk that receives
//! an entry at its end starts a new chunk instead of splitting, so appends leave full chunks
//! behind: ~50 bytes per 48-byte entry. Removals shrink a chunk that falls below a quarter of
//! its room and merge it into its predecessor when both fit in one.
//!
//! Invariants (checked by `check` in tests): chunks are non-empty; each chunk's lower bound is
//! at most its first key and above every key of the chunks before it; keys ascend within and
//! across chunks; `len` is the number of entries.

use std::collections::{BTreeMap, VecDeque};

/// Most entries a chunk holds.
pub(crate) const CHUNK: usize = 512;

/// See the module doc.
#[derive(Clone, Debug)]
pub(crate) struct SortedMap<K, V> {
    /// Chunks by lower bound.
    chunks: BTreeMap<K, VecDeque<(K, V)>>,
    len: usize,
}

impl<K, V> Default for SortedMap<K, V> {
    fn default() -> Self {
        SortedMap {
            chunks: BTreeMap::new(),
            len: 0,
        }
    }
}

impl<K: Ord + Copy, V> SortedMap<K, V> {
    /// A map of `entries`, which must be sorted by key with no key twice.
    pub(crate) fn from_sorted(entries: Vec<(K, V)>) -> SortedMap<K, V> {
        debug_assert!(entries.windows(2).all(|w| w[0].0 < w[1].0), "not sorted");
        let len = entries.len();
        let mut chunks = BTreeMap::new();
        let mut entries = entries.into_iter().peekable();
        while let Some(&(lower, _)) = entries.peek() {
            let chunk: VecDeque<(K, V)> = entries.by_ref().take(CHUNK).collect();
            chunks.insert(lower, chunk);
        }
        SortedMap { chunks, len }
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunk that holds `key` or would take it, with its lower bound (`None`: no chunks,
    /// or `key` is below every chunk).
    fn chunk_of(&self, key: &K) -> Option<(K, &VecDeque<(K, V)>)> {
        self.chunks
            .range(..=key)
            .next_back()
            .map(|(lower, chunk)| (*lower, chunk))
    }

    /// As [`SortedMap::chunk_of`], to change.
    fn chunk_of_mut(&mut self, key: &K) -> Option<(K, &mut VecDeque<(K, V)>)> {
        self.chunks
            .range_mut(..=key)
            .next_back()
            .map(|(lower, chunk)| (*lower, chunk))
    }

    /// Where `key` is or would go in `chunk`. Most inserts append to a run of keys (a
    /// priority tier grows at its end), so the last entry is tried before a binary search.
    fn position(chunk: &VecDeque<(K, V)>, key: &K) -> Result<usize, usize> {
        match chunk.back() {
            Some((last, _)) if last < key => Err(chunk.len()),
            _ => chunk.binary_search_by(|(k, _)| k.cmp(key)),
        }
    }

    /// The value of `key`.
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        let (_, chunk) = self.chunk_of(key)?;
        let index = chunk.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
        Some(&chunk[index].1)
    }

    /// The value of `key`, to change in place.
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let (_, chunk) = self.chunk_of_mut(key)?;
        let index = chunk.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
        Some(&mut chunk[index].1)
    }

    /// Inserts `key`, returning the value it replaces.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        if self
            .chunks
            .first_key_value()
            .is_none_or(|(first, _)| key < *first)
        {
            // Below every chunk (or none): the first chunk takes it and `key` becomes its
            // lower bound.
            let Some((_, chunk)) = self.chunks.pop_first() else {
                self.chunks.insert(key, VecDeque::from([(key, value)]));
                self.len += 1;
                return None;
            };
            self.chunks.insert(key, chunk);
        }
        let (_, chunk) = (self.chunks.range_mut(..=key).next_back()).expect("a chunk at or below");
        let index = match Self::position(chunk, &key) {
            Ok(index) => return Some(std::mem::replace(&mut chunk[index].1, value)),
            Err(index) => index,
        };
        self.len += 1;
        if chunk.len() < CHUNK {
            chunk.insert(index, (key, value));
            return None;
        }
        if index == chunk.len() {
            // An append to a full chunk: a new chunk, leaving this one full.
            self.chunks.insert(key, VecDeque::from([(key, value)]));
            return None;
        }
        // Split where the key goes: a tier that grows at its end inside a chunk (its successor
        // tier follows) leaves that end to the left part, which then fills up, and the right
        // part untouched. Bounded away from the ends so that scattered inserts do not leave
        // slivers.
        let at = index.clamp(CHUNK / 8, CHUNK - CHUNK / 8);
        let mut right = chunk.split_off(at);
        let right_lower = right[0].0;
        if index <= at {
            chunk.insert(index, (key, value));
        } else {
            right.insert(index - at, (key, value));
        }
        self.chunks.insert(right_lower, right);
        None
    }

    /// Removes `key`, returning its value.
    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let (lower, chunk) = self.chunk_of_mut(key)?;
        let index = chunk.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
        let (_, value) = chunk.remove(index).expect("found");
        self.len -= 1;
        self.tidy(lower);
        Some(value)
    }

    /// After a removal from the chunk at `lower`: drops it when empty, shrinks it when mostly
    /// empty, merges it into its predecessor when both fit in one chunk.
    fn tidy(&mut self, lower: K) {
        let chunk = self.chunks.get_mut(&lower).expect("present");
        let len = chunk.len();
        if len == 0 {
            self.chunks.remove(&lower);
            return;
        }
        if len * 4 >= chunk.capacity() || chunk.capacity() <= 16 {
            return;
        }
        let previous = self
            .chunks
            .range(..lower)
            .next_back()
            .filter(|(_, p)| p.len() + len <= CHUNK)
            .map(|(p, _)| *p);
        match previous {
            Some(previous) => {
                let chunk = self.chunks.remove(&lower).expect("present");
                let previous = self.chunks.get_mut(&previous).expect("present");
                previous.reserve_exact(chunk.len());
                previous.extend(chunk);
            }
            None => self
                .chunks
                .get_mut(&lower)
                .expect("present")
                .shrink_to(len * 2),
        }
    }

    /// The first entry.
    pub(crate) fn first_key_value(&self) -> Option<(&K, &V)> {
        let (_, chunk) = self.chunks.first_key_value()?;
        chunk.front().map(|(k, v)| (k, v))
    }

    /// Removes the first entry.
    pub(crate) fn pop_first(&mut self) -> Option<(K, V)> {
        let mut entry = self.chunks.first_entry()?;
        let chunk = entry.get_mut();
        let first = chunk.pop_front().expect("chunks are not empty");
        self.len -= 1;
        if chunk.is_empty() {
            entry.remove();
        }
        Some(first)
    }

    /// The entries from `from` on, in key order.
    pub(crate) fn range_from(&self, from: &K) -> impl Iterator<Item = (&K, &V)> {
        // The chunk that would hold `from` (or the first), then the chunks after it.
        let start = self.chunk_of(from).map_or_else(
            || self.chunks.first_key_value().map(|(k, _)| *k),
            |(k, _)| Some(k),
        );
        start
            .into_iter()
            .flat_map(move |start| self.chunks.range(start..))
            .flat_map(|(_, chunk)| chunk.iter().map(|(k, v)| (k, v)))
            .skip_while(move |(k, _)| *k < from)
    }

    /// Every entry in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.chunks
            .values()
            .flat_map(|chunk| chunk.iter().map(|(k, v)| (k, v)))
    }

    /// Bytes of memory the entries' chunks take (room included), for measurements.
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> usize {
        self.chunks
            .values()
            .map(|chunk| chunk.capacity() * std::mem::size_of::<(K, V)>())
            .sum()
    }

    #[cfg(test)]
    fn check(&self)
    where
        K: std::fmt::Debug,
    {
        let mut previous: Option<K> = None;
        let mut len = 0;
        for (lower, chunk) in &self.chunks {
            assert!(!chunk.is_empty(), "empty chunk at {lower:?}");
            assert!(chunk.len() <= CHUNK);
            assert!(*lower <= chunk[0].0, "lower bound above first key");
            for (key, _) in chunk {
                assert!(previous.is_none_or(|p| p < *key), "keys out of order");
                previous = Some(*key);
            }
            len += chunk.len();
        }
        assert_eq!(len, self.len);
    }
}

impl<K: Ord + Copy, V> Extend<(K, V)> for SortedMap<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        for (key, value) in iter {
            self.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u32),
        Remove(u16),
        PopFirst,
        Get(u16),
        Bump(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (any::<u16>(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k % 4000, v)),
            2 => any::<u16>().prop_map(|k| Op::Remove(k % 4000)),
            1 => Just(Op::PopFirst),
            1 => any::<u16>().prop_map(|k| Op::Get(k % 4000)),
            1 => any::<u16>().prop_map(|k| Op::Bump(k % 4000)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn behaves_like_a_btreemap(ops in proptest::collection::vec(op(), 1..3000)) {
            let mut map = SortedMap::default();
            let mut model = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(map.insert(k, v), model.insert(k, v)),
                    Op::Remove(k) => prop_assert_eq!(map.remove(&k), model.remove(&k)),
                    Op::PopFirst => prop_assert_eq!(map.pop_first(), model.pop_first()),
                    Op::Get(k) => prop_assert_eq!(map.get(&k), model.get(&k)),
                    Op::Bump(k) => {
                        if let Some(v) = map.get_mut(&k) {
                            *v = v.wrapping_add(1);
                        }
                        if let Some(v) = model.get_mut(&k) {
                            *v = v.wrapping_add(1);
                        }
                    }
                }
                prop_assert_eq!(map.len(), model.len());
                prop_assert_eq!(map.first_key_value(), model.first_key_value());
            }
            map.check();
            let ours: Vec<_> = map.iter().map(|(k, v)| (*k, *v)).collect();
            let theirs: Vec<_> = model.into_iter().collect();
            prop_assert_eq!(ours, theirs);
        }

        #[test]
        fn built_in_bulk_equals_built_by_inserts(keys in proptest::collection::btree_set(any::<u32>(), 0..3000)) {
            let entries: Vec<(u32, u32)> = keys.iter().map(|&k| (k, k ^ 7)).collect();
            let bulk = SortedMap::from_sorted(entries.clone());
            bulk.check();
            prop_assert_eq!(bulk.len(), entries.len());
            let ours: Vec<_> = bulk.iter().map(|(k, v)| (*k, *v)).collect();
            prop_assert_eq!(ours, entries);
        }
    }

    #[test]
    fn tiers_filled_at_their_ends_keep_chunks_nearly_full() {
        // Ten priority tiers, each growing at its end, as a queue fills.
        let mut map = SortedMap::default();
        for seq in 0..200_000u64 {
            map.insert(((seq % 10) as u32, seq), [0u64; 4]);
        }
        map.check();
        let per_entry = map.heap_bytes() as f64 / map.len() as f64;
        let entry = std::mem::size_of::<((u32, u64), [u64; 4])>() as f64;
        assert!(
            per_entry < entry * 1.1,
            "{per_entry:.1} bytes per {entry}-byte entry"
        );
    }

    #[test]
    fn draining_from_the_front_frees_chunks() {
        let mut map = SortedMap::default();
        for key in 0..10_000u32 {
            map.insert(key, ());
        }
        for key in 0..9_990u32 {
            assert_eq!(map.pop_first(), Some((key, ())));
        }
        map.check();
        assert!(map.chunks.len() <= 1);
        // Removing most of what is left from the middle shrinks what holds it.
        let mut map = SortedMap::from_sorted((0..10_000u32).map(|k| (k, 0u64)).collect());
        for key in 0..10_000u32 {
            if key % 16 != 0 {
                map.remove(&key);
            }
        }
        map.check();
        assert!(map.heap_bytes() <= 4 * map.len() * std::mem::size_of::<(u32, u64)>());
    }
}
