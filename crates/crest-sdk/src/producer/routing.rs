//! Which lane a message or a stranded batch goes to: each lane's health (whether its leaf is
//! being avoided after failures) and the round-robin over the lanes that answer.

use super::{Lane, ProducerConfig};
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
    let n = lanes.len();
    let start = next.fetch_add(1, Ordering::Relaxed) % n;
    let candidates = (0..n).map(|i| (start + i) % n).filter(|&l| Some(l) != not);
    let mut any = None;
    for lane in candidates {
        if lanes[lane].health.is_up() {
            return Some(lane);
        }
        any.get_or_insert(lane);
    }
    if not.is_some() { None } else { any }
}

/// The lane a part that no lane takes tries next: after `leaf_retry_initial`, the next lane in
/// turn whether its leaf is avoided or not (when every leaf failed lately, the avoidance
/// backoffs say nothing of which will answer first: a replica elected a moment ago was
/// refusing until then); `None` once `deadline` passed.
pub(super) async fn wait_for_lane(
    lanes: &[Lane],
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
    spread(lanes, next, None)
}
