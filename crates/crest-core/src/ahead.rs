//! Reserve-ahead: the root's small buffer of already-leased top entries of a topic.
//!
//! A pop normally costs a round trip from the root to the owning leaf (`Reserve` down,
//! `Reserved` with the payload back up) before the consumer gets anything. When a topic is being
//! popped steadily, the root reserves its next certain entries *before* the pops ask, so a pop
//! finds them granted and is answered at once.
//!
//! - **Sizing.** The buffer's target is what the topic's consumers take during two reserve
//!   round trips: `delivery rate × round trip × 2` ([`Demand`]), at most
//!   `reserve_ahead_max` entries per topic, and all buffers together hold at most
//!   `reserve_ahead_bytes_max` payload bytes. A topic nobody pops has a target of 0.
//! - **Order.** Buffered entries are served merged with the window in key order: a more urgent
//!   entry that arrived in the window after the buffer was filled still goes first (it costs
//!   that pop a round trip).
//! - **Release.** An entry held longer than `reserve_ahead_hold_ms` is given back to its leaf
//!   (`Release`: available again, attempt returned), so a buffer of a topic whose consumers
//!   stopped does not keep messages leased.
//! - **Leases.** Buffered entries are leased for the topic's default visibility timeout from
//!   the moment they were reserved; a pop that asks for another visibility has its deliveries
//!   extended to it (an `Extend` to the leaf, answered to nobody).

use crate::key::Key;
use crate::time::Time;
use crate::wire::Delivery;
use std::collections::BTreeMap;

/// Length of one demand-measuring period, in microseconds.
const DEMAND_PERIOD_US: u64 = 10_000;

/// How fast a topic's pops take entries: an exponentially smoothed delivery rate.
#[derive(Debug, Default)]
pub(crate) struct Demand {
    /// Deliveries in the current period.
    count: u64,
    /// Start of the current period.
    period_start: Time,
    /// Smoothed deliveries per second.
    rate: u64,
}

impl Demand {
    /// Counts `n` deliveries taken at `now`.
    pub(crate) fn taken(&mut self, now: Time, n: u64) {
        self.roll(now);
        self.count += n;
    }

    /// Closes the periods that ended by `now`: each moves the rate a quarter of the way to
    /// the rate measured in it (idle periods pull it towards 0).
    pub(crate) fn roll(&mut self, now: Time) {
        let elapsed = now.0.saturating_sub(self.period_start.0);
        if elapsed < DEMAND_PERIOD_US {
            return;
        }
        let measured = self.count.saturating_mul(1_000_000) / elapsed;
        // Long silences count as several empty periods (at most 8: the rate is then ~10 %).
        let periods = (elapsed / DEMAND_PERIOD_US).min(8);
        self.rate = (self.rate * 3 + measured) / 4;
        for _ in 1..periods {
            self.rate = self.rate * 3 / 4;
        }
        self.count = 0;
        self.period_start = now;
    }

    /// Forgets the demand measured so far: entries held for the whole hold time went unused,
    /// so there is none (new pops measure it again).
    pub(crate) fn reset(&mut self) {
        self.rate = 0;
        self.count = 0;
    }

    /// Entries to keep reserved ahead for a reserve round trip of `round_trip_us`.
    pub(crate) fn target(&self, round_trip_us: u64, max: u32) -> usize {
        let wanted = self.rate.saturating_mul(round_trip_us).saturating_mul(2) / 1_000_000;
        // Any demand at all is worth one entry: a lone consumer popping one at a time.
        let wanted = if self.rate > 0 { wanted.max(1) } else { 0 };
        wanted.min(u64::from(max)) as usize
    }
}

/// One granted delivery waiting in the buffer.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) delivery: Delivery,
    /// When the root reserved it (its hold time starts here).
    pub(crate) reserved_at: Time,
    /// The visibility timeout it was leased for, in milliseconds.
    pub(crate) lease_ms: u64,
}

/// The buffer of one topic.
#[derive(Debug, Default)]
pub(crate) struct AheadBuffer {
    /// Granted deliveries by key.
    pub(crate) held: BTreeMap<Key, Held>,
    /// Entries reserved ahead whose answer has not come yet, with their reservation numbers.
    /// A pop whose next entry is one of these claims the reservation (it becomes the pop's
    /// own reserve), so it never serves a less urgent entry before it.
    pub(crate) outstanding: BTreeMap<Key, u64>,
    /// Demand of the topic's pops.
    pub(crate) demand: Demand,
    /// A leaf refused a grant ahead as the topic delivers its groups in order (a FIFO topic):
    /// none are made while the buffer lives.
    pub(crate) in_order: bool,
}

impl AheadBuffer {
    /// The most urgent held entry.
    pub(crate) fn first(&self) -> Option<Key> {
        self.held.keys().next().copied()
    }

    /// Entries held or on their way.
    pub(crate) fn len(&self) -> usize {
        self.held.len() + self.outstanding.len()
    }

    /// The most urgent entry whose grant is on its way, with its reservation number.
    pub(crate) fn first_awaited(&self) -> Option<(Key, u64)> {
        self.outstanding
            .first_key_value()
            .map(|(key, reservation)| (*key, *reservation))
    }

    /// Whether the buffer holds nothing, expects nothing and sees no demand (none measured,
    /// none counted in the current period).
    pub(crate) fn is_idle(&self) -> bool {
        self.held.is_empty()
            && self.outstanding.is_empty()
            && self.demand.rate == 0
            && self.demand.count == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_follows_the_delivery_rate_and_decays_when_idle() {
        let mut demand = Demand::default();
        // 100 deliveries every 10 ms = 10,000/s for 200 ms.
        for period in 1..=20u64 {
            demand.taken(Time(period * 10_000), 100);
        }
        demand.roll(Time(210_000));
        assert!((9_000..=10_000).contains(&demand.rate), "{}", demand.rate);
        // 4 ms round trips: 10,000/s × 4 ms × 2 = 80 entries, bounded by the maximum.
        assert_eq!(demand.target(4_000, 64), 64);
        assert!((72..=80).contains(&demand.target(4_000, 1000)));
        // A second of silence brings the target down to a few entries; then to nothing.
        demand.roll(Time(1_210_000));
        assert!(
            demand.target(4_000, 1000) <= 8,
            "{}",
            demand.target(4_000, 1000)
        );
        for step in 2..=20u64 {
            demand.roll(Time(1_210_000 + step * 100_000));
        }
        assert_eq!(demand.target(4_000, 1000), 0);
    }
}
