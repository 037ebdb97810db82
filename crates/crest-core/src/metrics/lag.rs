//! Consumer lag at the root: from a message being ready to its delivery, per topic and
//! priority, in buckets as Prometheus counts them (`crest_consumer_lag_seconds`).

use crate::time::Time;

/// Upper bounds of the consumer-lag buckets, in milliseconds (from a message being ready to
/// its delivery: a millisecond to an hour).
pub const LAG_BOUNDS_MS: [u64; 15] = [
    1, 10, 100, 500, 1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000, 600_000, 1_800_000,
    3_600_000, 21_600_000,
];

/// The consumer lag of one topic and priority, measured at the root as it delivers: from the
/// time a message became ready (its ready time in its key, on its leaf's clock) to its
/// delivery. Buckets as Prometheus counts them (a value is in the first bucket whose bound is
/// at least it), the last one past every bound.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LagSeries {
    /// The topic.
    pub topic: String,
    /// The priority the messages were delivered at.
    pub priority: u32,
    /// Deliveries per bucket of [`LAG_BOUNDS_MS`], and one past them.
    pub buckets: [u64; LAG_BOUNDS_MS.len() + 1],
    /// Sum of the lags, in microseconds.
    pub sum_micros: u64,
    /// Deliveries.
    pub count: u64,
}

/// Consumer lag per topic and priority (at most `consumer_lag_series_max` pairs).
#[derive(Debug, Default)]
pub(crate) struct ConsumerLag {
    /// FxHash: looked up at every delivery.
    topics: rustc_hash::FxHashMap<String, Vec<LagSeries>>,
    series: usize,
    /// Deliveries of pairs past the bound.
    pub(crate) unmeasured: u64,
}

impl ConsumerLag {
    /// Records the deliveries of one pop of `topic`: each one's priority and ready time (the
    /// topic is looked up once per pop, not per delivery).
    pub(crate) fn record_pop(
        &mut self,
        now: Time,
        topic: &str,
        deliveries: impl Iterator<Item = (u32, Time)>,
        max: usize,
    ) {
        let list = match self.topics.get_mut(topic) {
            Some(list) => list,
            None if self.series < max => self.topics.entry(topic.to_string()).or_default(),
            None => {
                self.unmeasured += deliveries.count() as u64;
                return;
            }
        };
        for (priority, ready_at) in deliveries {
            let at = match list.iter().position(|s| s.priority == priority) {
                Some(at) => at,
                None if self.series < max => {
                    self.series += 1;
                    list.push(LagSeries {
                        topic: topic.to_string(),
                        priority,
                        ..LagSeries::default()
                    });
                    list.len() - 1
                }
                None => {
                    self.unmeasured += 1;
                    continue;
                }
            };
            let series = &mut list[at];
            let micros = now.saturating_since(ready_at).as_micros() as u64;
            let bucket = LAG_BOUNDS_MS.partition_point(|bound| bound * 1_000 < micros);
            series.buckets[bucket] += 1;
            series.sum_micros = series.sum_micros.saturating_add(micros);
            series.count += 1;
        }
    }

    /// Every series, by topic and priority.
    pub(crate) fn snapshot(&self) -> Vec<LagSeries> {
        let mut all: Vec<LagSeries> = self.topics.values().flatten().cloned().collect();
        all.sort_by(|a, b| (&a.topic, a.priority).cmp(&(&b.topic, b.priority)));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_lag_falls_in_the_first_bucket_at_least_it_and_its_series_are_bounded() {
        let mut lag = ConsumerLag::default();
        let now = Time::from_millis(100_000);
        let ready = |ms: u64| Time::from_millis(100_000 - ms);
        // 1 ms exactly is in the 1 ms bucket; 2 ms in the 10 ms one; 7 hours past them all.
        lag.record_pop(now, "jobs", std::iter::once((2, ready(1))), 2);
        lag.record_pop(now, "jobs", std::iter::once((2, ready(2))), 2);
        lag.record_pop(now, "jobs", std::iter::once((2, Time::ZERO)), 2);
        lag.record_pop(now, "mail", std::iter::once((0, ready(45_000))), 2);
        // A third pair is past the bound of two: counted, not measured.
        lag.record_pop(now, "jobs", std::iter::once((3, ready(5))), 2);
        lag.record_pop(now, "other", std::iter::once((0, ready(5))), 2);
        assert_eq!(lag.unmeasured, 2);
        let all = lag.snapshot();
        assert_eq!(all.len(), 2);
        let jobs = &all[0];
        assert_eq!(
            (jobs.topic.as_str(), jobs.priority, jobs.count),
            ("jobs", 2, 3)
        );
        assert_eq!(jobs.buckets[0], 1);
        assert_eq!(jobs.buckets[1], 1);
        assert_eq!(jobs.buckets[LAG_BOUNDS_MS.len()], 0, "100 s is within 6 h");
        assert_eq!(jobs.sum_micros, 1_000 + 2_000 + 100_000_000);
        let mail = &all[1];
        let at = LAG_BOUNDS_MS.iter().position(|b| *b == 60_000).unwrap();
        assert_eq!(mail.buckets[at], 1, "45 s is in the 60 s bucket");
    }
}
