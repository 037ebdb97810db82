//! The ground truth the bench keeps of every message: which were seen, which wait by priority
//! (the live rank error), and the ledger behind the rank error at lease time.

use super::*;
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};

/// Which sequence numbers were popped: a growable bitmap.
#[derive(Default)]
pub(super) struct Seen {
    pub(super) words: Vec<u64>,
    pub(super) distinct: u64,
    pub(super) duplicates: u64,
}

impl Seen {
    /// Marks `seq`; whether it was new.
    pub(super) fn mark(&mut self, seq: u64) -> bool {
        let word = (seq / 64) as usize;
        if word >= self.words.len() {
            self.words.resize((word + 1).next_power_of_two(), 0);
        }
        let bit = 1u64 << (seq % 64);
        if self.words[word] & bit != 0 {
            self.duplicates += 1;
            false
        } else {
            self.words[word] |= bit;
            self.distinct += 1;
            true
        }
    }
}

/// Messages present per priority: acknowledged by a leaf and not yet popped. A message popped
/// before its producer saw the ack makes its level dip below zero for a moment; sums clamp.
pub(super) struct Present([AtomicI64; PRIORITY_LEVELS]);

impl Present {
    pub(super) fn new() -> Present {
        Present(std::array::from_fn(|_| AtomicI64::new(0)))
    }

    pub(super) fn add(&self, priority: u32) {
        self.0[priority as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Whether any message is present.
    pub(super) fn any(&self) -> bool {
        self.0.iter().any(|level| level.load(Ordering::Relaxed) > 0)
    }

    /// Rank error of popping a message of `priority`, and the pop itself.
    pub(super) fn pop(&self, priority: u32) -> u64 {
        let ahead: i64 = self.0[..priority as usize]
            .iter()
            .map(|level| level.load(Ordering::Relaxed).max(0))
            .sum();
        self.0[priority as usize].fetch_sub(1, Ordering::Relaxed);
        ahead as u64
    }
}

/// Runs of at most this many messages also measure the lease-time rank error (its ledger
/// takes 17 bytes per message).
pub const LEASE_RANK_MESSAGES_MAX: u64 = 4_000_000;

/// What the lease-time rank error needs of each message, by sequence number.
pub(super) struct Ledger {
    /// When its push was acknowledged (`u64::MAX`: never).
    pub(super) acked_ns: Box<[AtomicU64]>,
    /// When the pop that first delivered it was asked (`u64::MAX`: never delivered).
    pub(super) popped_asked_ns: Box<[AtomicU64]>,
    /// Its priority.
    pub(super) priority: Box<[AtomicU8]>,
}

impl Ledger {
    pub(super) fn new(messages: u64) -> Option<Ledger> {
        if messages > LEASE_RANK_MESSAGES_MAX {
            return None;
        }
        let never = |_| AtomicU64::new(u64::MAX);
        let count = messages as usize;
        Some(Ledger {
            acked_ns: (0..count).map(never).collect(),
            popped_asked_ns: (0..count).map(never).collect(),
            priority: (0..count).map(|_| AtomicU8::new(0)).collect(),
        })
    }

    pub(super) fn acked(&self, seq: u64, priority: u32, at_ns: u64) {
        if let (Some(acked), Some(level)) = (
            self.acked_ns.get(seq as usize),
            self.priority.get(seq as usize),
        ) {
            level.store(
                priority.min(PRIORITY_LEVELS as u32 - 1) as u8,
                Ordering::Relaxed,
            );
            acked.store(at_ns, Ordering::Relaxed);
        }
    }

    pub(super) fn popped(&self, seq: u64, asked_ns: u64) {
        if let Some(popped) = self.popped_asked_ns.get(seq as usize) {
            popped.store(asked_ns, Ordering::Relaxed);
        }
    }

    /// Each message as (priority, acked, asked of its delivering pop).
    pub(super) fn messages(&self) -> Vec<LedgerEntry> {
        (0..self.acked_ns.len())
            .map(|i| LedgerEntry {
                priority: self.priority[i].load(Ordering::Relaxed),
                acked_ns: self.acked_ns[i].load(Ordering::Relaxed),
                popped_asked_ns: self.popped_asked_ns[i].load(Ordering::Relaxed),
            })
            .collect()
    }
}

/// One message of the ledger.
#[derive(Clone, Copy, Debug)]
pub(super) struct LedgerEntry {
    pub(super) priority: u8,
    pub(super) acked_ns: u64,
    pub(super) popped_asked_ns: u64,
}

/// One pop that delivered messages new to the run.
#[derive(Clone, Debug)]
pub(super) struct PopRecord {
    pub(super) asked_ns: u64,
    pub(super) answered_ns: u64,
    /// The priorities of the messages it delivered first, in the order delivered.
    pub(super) priorities: Vec<u8>,
}

/// A count of values below a bound, for values inserted one at a time (a Fenwick tree over
/// value ranks).
pub(super) struct RankCounter(Vec<u32>);

impl RankCounter {
    pub(super) fn new(len: usize) -> RankCounter {
        RankCounter(vec![0; len + 1])
    }

    /// Counts the value of rank `rank` (0-based).
    pub(super) fn insert(&mut self, rank: usize) {
        let mut i = rank + 1;
        while i < self.0.len() {
            self.0[i] += 1;
            i += i & i.wrapping_neg();
        }
    }

    /// How many inserted values have a rank below `rank`.
    pub(super) fn below(&self, rank: usize) -> u64 {
        let mut i = rank.min(self.0.len() - 1);
        let mut count = 0u64;
        while i > 0 {
            count += u64::from(self.0[i]);
            i -= i & i.wrapping_neg();
        }
        count
    }
}

/// The lease-time rank error of every delivery, as a lower bound: for a message a pop
/// delivered, the strictly more urgent messages that were certainly ready and unleased when
/// the root served that pop — acknowledged before the pop was asked, and delivered only by a
/// pop asked after it was answered (or never). A more urgent message in flight to another
/// consumer at the time is not counted (the definition counts only unleased messages); the live
/// rank error counts it, so the truth lies between the two.
pub(super) fn lease_rank_errors(
    messages: &[LedgerEntry],
    pops: &mut [PopRecord],
) -> Histogram<u64> {
    let mut errors = Histogram::<u64>::new_with_bounds(1, u64::MAX / 4, 3).expect("bounds");
    // Per priority level: the acknowledged messages' ack times (sorted), and the same
    // messages as (asked of their delivering pop, rank of their ack time), by that time.
    struct Level {
        acks: Vec<u64>,
        by_popped: Vec<(u64, usize)>,
        next: usize,
        counter: RankCounter,
    }
    let mut levels: Vec<Level> = (0..PRIORITY_LEVELS)
        .map(|_| Level {
            acks: Vec::new(),
            by_popped: Vec::new(),
            next: 0,
            counter: RankCounter::new(0),
        })
        .collect();
    for entry in messages.iter().filter(|e| e.acked_ns != u64::MAX) {
        levels[entry.priority as usize].acks.push(entry.acked_ns);
    }
    for level in &mut levels {
        level.acks.sort_unstable();
        level.counter = RankCounter::new(level.acks.len());
    }
    for entry in messages.iter().filter(|e| e.acked_ns != u64::MAX) {
        let level = &mut levels[entry.priority as usize];
        let rank = level.acks.partition_point(|&a| a < entry.acked_ns);
        level.by_popped.push((entry.popped_asked_ns, rank));
    }
    for level in &mut levels {
        level.by_popped.sort_unstable();
    }
    pops.sort_unstable_by_key(|pop| pop.answered_ns);
    let mut ahead = vec![0u64; PRIORITY_LEVELS];
    for pop in pops.iter() {
        let top = pop.priorities.iter().copied().max().unwrap_or(0) as usize;
        for (index, level) in levels.iter_mut().enumerate().take(top) {
            // Messages delivered by pops asked by the time this one was answered: leased
            // (or possibly leased) when it was served.
            while let Some(&(popped, rank)) = level.by_popped.get(level.next)
                && popped <= pop.answered_ns
            {
                level.counter.insert(rank);
                level.next += 1;
            }
            let acked_before = level.acks.partition_point(|&a| a < pop.asked_ns);
            ahead[index] = acked_before as u64 - level.counter.below(acked_before);
        }
        for &priority in &pop.priorities {
            let error: u64 = ahead[..priority as usize].iter().sum();
            errors.saturating_record(error);
        }
    }
    errors
}
