//! The bench's accounting: stamps, rank errors live and at lease time, summaries and
//! comparisons.

use super::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::time::Duration;

#[test]
fn lease_rank_error_counts_only_messages_certainly_ready_and_unleased() {
    let entry = |priority, acked_ns, popped_asked_ns| LedgerEntry {
        priority,
        acked_ns,
        popped_asked_ns,
    };
    let messages = [
        // More urgent, acked early, delivered by a pop asked after A answered: counts.
        entry(0, 10, 50),
        // A's own message.
        entry(1, 10, 20),
        // More urgent, but in flight to another consumer (asked before A answered).
        entry(0, 10, 25),
        // More urgent, but acked only after A was asked: maybe not ready yet.
        entry(0, 21, 60),
        // Less urgent: never counts against A.
        entry(2, 5, 70),
        // More urgent, acked early, never delivered: counts.
        entry(0, 10, u64::MAX),
        // Never acked: not a message of the run.
        entry(0, u64::MAX, u64::MAX),
    ];
    let pop = |asked_ns, answered_ns, priorities: &[u8]| PopRecord {
        asked_ns,
        answered_ns,
        priorities: priorities.to_vec(),
    };
    // Given out of answer order on purpose.
    let mut pops = [
        pop(50, 55, &[0]),
        pop(20, 30, &[1]),
        pop(25, 28, &[0]),
        pop(60, 65, &[0]),
        pop(70, 75, &[2]),
    ];
    let errors = lease_rank_errors(&messages, &mut pops);
    assert_eq!(errors.len(), 5, "one value per delivery");
    // A (answered at 30): the messages delivered at 50 and never: 2. The pop at 70
    // (priority 2): the never-delivered one only (the others were delivered before).
    assert_eq!(errors.max(), 2);
    assert_eq!(errors.count_between(1, u64::MAX / 4), 2);
    assert_eq!(errors.count_at(2), 1);
    assert_eq!(errors.count_at(1), 1);
}

#[test]
fn rank_counters_count_values_below_a_rank() {
    let mut counter = RankCounter::new(5);
    assert_eq!(counter.below(5), 0);
    for rank in [0, 2, 2, 4] {
        counter.insert(rank);
    }
    assert_eq!(counter.below(0), 0);
    assert_eq!(counter.below(1), 1);
    assert_eq!(counter.below(3), 3);
    assert_eq!(counter.below(5), 4);
    assert_eq!(counter.below(99), 4);
}

#[test]
fn spreads_take_the_median_and_range() {
    assert_eq!(Spread::of([]), None);
    let odd = Spread::of([3.0, 1.0, 2.0]).unwrap();
    assert_eq!((odd.median, odd.min, odd.max), (2.0, 1.0, 3.0));
    let even = Spread::of([4.0, 1.0, 3.0, 2.0]).unwrap();
    assert_eq!((even.median, even.min, even.max), (2.5, 1.0, 4.0));
}

#[test]
fn cpu_use_splits_fill_and_drain_and_divides_by_messages() {
    let marks = CpuMarks {
        start: Duration::from_millis(100),
        producers_done: Duration::from_millis(300),
        end: Duration::from_millis(900),
    };
    let fill_then_drain = marks.usage(Phase::FillThenDrain, 1000, 500);
    assert!((fill_then_drain.seconds - 0.8).abs() < 1e-9);
    assert!((fill_then_drain.us_per_message - 800.0).abs() < 1e-6);
    assert!((fill_then_drain.fill_seconds.unwrap() - 0.2).abs() < 1e-9);
    assert!((fill_then_drain.fill_us_per_message.unwrap() - 200.0).abs() < 1e-6);
    assert!((fill_then_drain.drain_seconds.unwrap() - 0.6).abs() < 1e-9);
    assert!((fill_then_drain.drain_us_per_message.unwrap() - 1200.0).abs() < 1e-6);
    let line = fill_then_drain.line();
    assert!(
        line.contains("CPU (load generator): 0.80 s = 800.0 us/msg"),
        "{line}"
    );
    assert!(
        line.contains("fill 0.20 s = 200.0 us/msg, drain 0.60 s"),
        "{line}"
    );
    // Mixed: no split; nothing pushed: no division by zero.
    let mixed = marks.usage(Phase::Mixed, 0, 0);
    assert_eq!(mixed.fill_seconds, None);
    assert_eq!(mixed.us_per_message, 0.0);
    assert!(!mixed.line().contains("fill"));
    // The clock reads this process's time: it moves when the process works.
    let before = process_cpu();
    let mut x = 0u64;
    for i in 0..5_000_000u64 {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
    }
    std::hint::black_box(x);
    assert!(process_cpu() > before);
}

#[test]
fn priority_mixes_parse_and_draw_in_range() {
    assert_eq!("skewed".parse::<PriorityMix>(), Ok(PriorityMix::Skewed));
    assert_eq!(
        "uniform:4".parse::<PriorityMix>(),
        Ok(PriorityMix::Uniform { levels: 4 })
    );
    assert_eq!(
        "fixed:3".parse::<PriorityMix>(),
        Ok(PriorityMix::Fixed { priority: 3 })
    );
    for bad in [
        "",
        "uniform:0",
        "uniform:65",
        "fixed:64",
        "fixed",
        "zipf",
        "uniform:x",
    ] {
        assert!(bad.parse::<PriorityMix>().is_err(), "{bad}");
    }
    let mut rng = SmallRng::seed_from_u64(7);
    let mut tiers = [0u32; 3];
    for _ in 0..100_000 {
        match PriorityMix::Skewed.draw(&mut rng) {
            0..=2 => tiers[0] += 1,
            3..=6 => tiers[1] += 1,
            7..=9 => tiers[2] += 1,
            other => panic!("skewed drew {other}"),
        }
    }
    // 10 / 20 / 70 percent, within a percent.
    assert!((9_000..11_000).contains(&tiers[0]), "{tiers:?}");
    assert!((19_000..21_000).contains(&tiers[1]), "{tiers:?}");
    assert!((69_000..71_000).contains(&tiers[2]), "{tiers:?}");
    let uniform = PriorityMix::Uniform { levels: 4 };
    assert!((0..1000).all(|_| uniform.draw(&mut rng) < 4));
}

#[test]
fn a_pop_waits_from_its_request_or_its_first_message_s_push_whichever_is_later() {
    // A message was there before the pop was asked: the whole request counts.
    assert_eq!(pop_wait_ns(1_000, 400, 3_000), Some(2_000));
    // Every message came after the request: from the first one's push.
    assert_eq!(pop_wait_ns(1_000, 2_500, 3_000), Some(500));
    // Nothing of the bench's was delivered: no figure.
    assert_eq!(pop_wait_ns(1_000, u64::MAX, 3_000), None);
}

#[test]
fn stamps_round_trip_and_foreign_payloads_are_told_apart() {
    let payload = stamp(100, 42, 7, 123_456);
    assert_eq!(payload.len(), 100);
    assert_eq!(read_stamp(&payload, 42), Some((7, 123_456)));
    assert_eq!(read_stamp(&payload, 43), None, "another run's nonce");
    assert_eq!(read_stamp(b"short", 42), None);
}

#[test]
fn rank_error_counts_more_urgent_present_messages() {
    let present = Present::new();
    for priority in [0, 0, 1, 3, 3, 5] {
        present.add(priority);
    }
    assert_eq!(present.pop(3), 3, "two of 0 and one of 1 were more urgent");
    assert_eq!(present.pop(0), 0);
    assert_eq!(present.pop(0), 0);
    assert_eq!(present.pop(5), 2, "1 and the other 3");
    // A message popped before its ack was seen: its level dips below zero, never
    // counted as negative.
    assert_eq!(present.pop(2), 1);
    assert_eq!(present.pop(4), 2, "level 2 at -1 counts as 0");
}

#[test]
fn seen_counts_distinct_and_duplicate_sequence_numbers() {
    let mut seen = Seen::default();
    assert!(seen.mark(0));
    assert!(seen.mark(100_000));
    assert!(!seen.mark(0));
    assert!(seen.mark(63));
    assert!(seen.mark(64));
    assert_eq!((seen.distinct, seen.duplicates), (4, 1));
}

#[test]
fn nodes_of_one_process_share_one_cpu_line() {
    // In `crest local` every node is one process: its figure is printed once, naming them.
    let node = |name: &str, process: Option<(u64, u64)>, seconds: f64| crate::NodeCpu {
        name: name.into(),
        process,
        seconds,
        us_per_message: seconds,
        fill_us_per_message: None,
        drain_us_per_message: None,
    };
    let text = crate::NodeCpu::lines(&[
        node("root", Some((7, 100)), 1.0),
        node("leaf-1a", Some((7, 100)), 1.0),
        node("leaf-1b", Some((8, 100)), 2.0),
        node("leaf-1c", Some((7, 100)), 1.0),
        node("old", None, 3.0),
        node("older", None, 4.0),
    ]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[0].starts_with("  CPU of root, leaf-1a, leaf-1c (one process): 1.00 s"),
        "{text}"
    );
    assert!(lines[1].starts_with("  CPU of leaf-1b: 2.00 s"), "{text}");
    // Nodes that do not say which process they run in keep a line each.
    assert!(lines[2].starts_with("  CPU of old: 3.00 s"), "{text}");
    assert!(lines[3].starts_with("  CPU of older: 4.00 s"), "{text}");
}
