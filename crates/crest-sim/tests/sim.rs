//! The simulator end to end: determinism (same seed and files → the same report, byte for
//! byte), and a set of seeds on the default tree with invariants checked on each (what CI runs
//! on every change): every acknowledged message delivered once, windows above the leaves
//! within their credit bound, and exact ordering when there is only one priority.

use crest_core::topology::Topology;
use crest_sim::{Workload, run};

const LOCAL: &str = include_str!("../../../topology/local.toml");
const SIXTEEN: &str = include_str!("../../../topology/sim-16.toml");
const STEADY: &str = include_str!("../../../examples/sim/steady.toml");

fn workload(producer_rate: u32, priorities: &str, consumers: usize) -> Workload {
    let mut text = format!(
        "duration_ms = 300\ndrain_ms = 3000\n[link]\nlatency_us = 1000\njitter_us = 300\n\
         [[producer]]\nrate = {producer_rate}\npriorities = \"{priorities}\"\n"
    );
    for _ in 0..consumers {
        text.push_str("[[consumer]]\nmax = 32\n");
    }
    Workload::parse(&text).unwrap()
}

#[test]
fn the_same_seed_gives_the_same_report_byte_for_byte() {
    let topology = Topology::parse(SIXTEEN).unwrap();
    let workload = Workload::parse(STEADY).unwrap();
    let a = run(&topology, &workload, 7).unwrap();
    let b = run(&topology, &workload, 7).unwrap();
    assert_eq!(a.text(), b.text());
    assert_eq!(
        serde_json_like(&a.series),
        serde_json_like(&b.series),
        "the time series too"
    );
    let c = run(&topology, &workload, 8).unwrap();
    assert_ne!(a.text(), c.text(), "another seed, another run");
    assert_eq!(a.nodes, 21);
    assert!(a.pushed > 90_000, "{}", a.text());
}

fn serde_json_like<T: std::fmt::Debug>(value: &T) -> String {
    format!("{value:?}")
}

#[test]
fn seeds_on_the_default_tree_keep_the_invariants() {
    let topology = Topology::parse(LOCAL).unwrap();
    for seed in 1..=6 {
        let report = run(&topology, &workload(20_000, "skewed", 2), seed).unwrap();
        let text = report.text();
        assert!(report.pushed > 5_000, "seed {seed}:\n{text}");
        assert_eq!(
            report.delivered, report.pushed,
            "seed {seed}: all delivered\n{text}"
        );
        assert_eq!(report.undelivered, 0, "seed {seed}\n{text}");
        assert_eq!(report.duplicates, 0, "seed {seed}\n{text}");
        assert_eq!(report.push_errors, 0, "seed {seed}\n{text}");
        assert!(
            report.window_entries_max <= report.window_entries_bound,
            "seed {seed}: memory above the leaves bounded\n{text}"
        );
        assert_eq!(report.rank_error.count, report.delivered);
        assert!(report.violations().is_empty(), "seed {seed}");
        assert!(report.bubble_up_to_root_us.count > 0);
        assert!(!report.series.is_empty());
    }
}

#[test]
fn one_priority_means_no_rank_error_and_no_inversion() {
    let topology = Topology::parse(LOCAL).unwrap();
    let report = run(&topology, &workload(10_000, "fixed:4", 1), 3).unwrap();
    assert_eq!(report.delivered, report.pushed);
    assert_eq!(report.rank_error.max, 0, "{}", report.text());
    assert!(report.inversion_time_us.max <= 1, "{}", report.text());
}

/// The default tree with the whole pop path through the aggregators (`direct_pop_path` off).
fn local_through_the_tree() -> Topology {
    let text = LOCAL.replace("[settings]\n", "[settings]\ndirect_pop_path = false\n");
    let topology = Topology::parse(&text).unwrap();
    assert!(!topology.root().settings.direct_pop_path);
    topology
}

#[test]
fn a_drain_too_short_for_cut_leases_is_reported_as_a_violation_with_its_cause() {
    // Leases cut by a crash come back only after their visibility timeout: with a 1 s drain and
    // the pop path through the aggregators, messages leased through the crashed aggregator are
    // still out. The check says so.
    let topology = local_through_the_tree();
    let workload =
        Workload::parse(&LEAF_CRASH.replace("drain_ms = 35000", "drain_ms = 1000")).unwrap();
    let failed = (1..=4).any(|seed| {
        let report = run(&topology, &workload, seed).unwrap();
        let violations = report.violations();
        violations
            .iter()
            .any(|v| v.contains("never delivered") && v.contains("drain_ms"))
    });
    assert!(
        failed,
        "some seed leaves leases cut by the aggregator crash"
    );
}

#[test]
fn with_the_direct_pop_path_an_aggregator_crash_cuts_no_lease() {
    // The same aggregator crash with the root linked to the leaves directly (the default):
    // grants and confirms do not pass through the aggregator, so its crash strands no lease
    // and the 1 s drain delivers everything. (The leaf's crash is left out: leases it granted
    // outlive it, and those whose grant was lost with it come back after their timeout.)
    let topology = Topology::parse(LOCAL).unwrap();
    assert!(topology.root().settings.direct_pop_path);
    let leaf_fault = "[[fault]]\nnode = \"leaf-3\"\nat_ms = 300\nrestart_after_ms = 100\n";
    assert!(LEAF_CRASH.contains(leaf_fault));
    let workload = Workload::parse(
        &LEAF_CRASH
            .replace("drain_ms = 35000", "drain_ms = 1000")
            .replace(leaf_fault, ""),
    )
    .unwrap();
    for seed in 1..=4 {
        let report = run(&topology, &workload, seed).unwrap();
        let text = report.text();
        assert!(report.pushed > 30_000, "seed {seed}:\n{text}");
        assert_eq!(report.undelivered, 0, "seed {seed}:\n{text}");
        assert!(report.violations().is_empty(), "seed {seed}:\n{text}");
    }
}

#[test]
fn workloads_that_do_not_fit_are_refused_with_a_clear_error() {
    let topology = Topology::parse(LOCAL).unwrap();
    let text = "[[producer]]\nrate = 10\nleaf = \"nowhere\"\n[[consumer]]\n";
    let workload = Workload::parse(text).unwrap();
    let error = run(&topology, &workload, 1).unwrap_err().to_string();
    assert!(error.contains("nowhere"), "{error}");
    assert!(
        Workload::parse("[[consumer]]\n")
            .unwrap_err()
            .contains("producer")
    );
    assert!(
        Workload::parse("[[producer]]\nrate = 10\npriorities = \"zipf\"\n[[consumer]]\n")
            .unwrap_err()
            .contains("zipf")
    );
    assert!(Workload::parse("bogus = 1").is_err());
}

const LEAF_CRASH: &str = include_str!("../../../examples/sim/leaf-crash.toml");

#[test]
fn crashes_lose_nothing_acknowledged_and_duplicate_only_what_was_in_flight() {
    // A leaf crashes (unsynced writes lost) and recovers from its log; then an aggregator
    // crashes and restarts empty. Every acknowledged message is delivered; a duplicate is
    // only ever a message delivered but not yet confirmed when a node crashed (before the
    // leaf waited for its delete records to be durable before confirming an ack, a seed of
    // this test found confirmed acks undone by the crash).
    let topology = Topology::parse(LOCAL).unwrap();
    // Seeds alternate the defaults and reserve-ahead with a linger (their grants must not
    // outlive their leaf's crash).
    let mut tuned = topology.clone();
    tuned.set_setting("reserve_ahead_max=1024").unwrap();
    tuned.set_setting("offer_linger_us=500").unwrap();
    let workload = Workload::parse(LEAF_CRASH).unwrap();
    for (seed, topology) in (1..=4).zip([&topology, &tuned, &topology, &tuned]) {
        let report = run(topology, &workload, seed).unwrap();
        let text = report.text();
        assert_eq!(report.crashes, 2, "seed {seed}\n{text}");
        assert_eq!(report.undelivered, 0, "seed {seed}: nothing lost\n{text}");
        assert_eq!(report.delivered, report.pushed, "seed {seed}\n{text}");
        assert_eq!(report.unexpected_duplicates, 0, "seed {seed}\n{text}");
        assert!(report.window_entries_max <= report.window_entries_bound);
        assert!(report.violations().is_empty(), "seed {seed}");
    }
    let a = run(&topology, &workload, 9).unwrap();
    let b = run(&topology, &workload, 9).unwrap();
    assert_eq!(a.text(), b.text(), "faults are as reproducible as the rest");
}

#[test]
fn leaves_whose_grants_wait_for_their_log_lose_nothing_in_a_crash() {
    // With `lease_grants_wait_for_log` (what a replicated leaf does), a reserve is answered
    // only once its lease records are durable, so every lease a consumer holds is in the log
    // the crashed leaf recovers from. The same crashes: nothing acknowledged lost, no lease
    // granted twice, duplicates only of what was in flight.
    let mut topology = Topology::parse(LOCAL).unwrap();
    topology
        .set_setting("lease_grants_wait_for_log=true")
        .unwrap();
    let workload = Workload::parse(LEAF_CRASH).unwrap();
    for seed in 1..=4 {
        let report = run(&topology, &workload, seed).unwrap();
        let text = report.text();
        assert_eq!(report.crashes, 2, "seed {seed}\n{text}");
        assert_eq!(report.undelivered, 0, "seed {seed}: nothing lost\n{text}");
        assert_eq!(report.delivered, report.pushed, "seed {seed}\n{text}");
        assert_eq!(report.unexpected_duplicates, 0, "seed {seed}\n{text}");
        assert!(report.violations().is_empty(), "seed {seed}");
    }
}

const BACKLOG_BURST: &str = include_str!("../../../examples/sim/backlog-burst.toml");

#[test]
fn swapping_lets_an_urgent_burst_overtake_full_windows() {
    // Windows above the leaves fill with less urgent entries (a backlog), then one leaf gets a
    // burst of the most urgent ones. With the swap rule they climb at once; without it they
    // wait for the windows to drain. Virtual time, fixed seed: a property of the protocol.
    let with = Topology::parse(SIXTEEN).unwrap();
    let without = Topology::parse(&SIXTEEN.replace(
        "credits_per_topic = 256",
        "credits_per_topic = 256\noffer_swap = false",
    ))
    .unwrap();
    let workload = Workload::parse(BACKLOG_BURST).unwrap();
    let on = run(&with, &workload, 1).unwrap();
    let off = run(&without, &workload, 1).unwrap();
    assert!(
        on.window_entries_max >= 4 * 256,
        "windows were full: {}",
        on.text()
    );
    assert_eq!(on.undelivered + off.undelivered, 0);
    assert!(
        on.inversion_time_us.p99 * 10 < off.inversion_time_us.p99,
        "swap on:\n{}\nswap off:\n{}",
        on.text(),
        off.text()
    );
    assert!(on.rank_error.p999 < off.rank_error.p999);
}

#[test]
fn a_million_messages_never_grow_the_windows_above_their_credit_bound() {
    // Memory above the leaves is bounded by configuration, not by queue depth: a million
    // messages pushed much faster than they are popped (the backlog stays at the leaves), and
    // every window, sampled after every offer, stays within credits × children.
    let topology = Topology::parse(LOCAL).unwrap();
    let workload = Workload::parse(
        "duration_ms = 2000\ndrain_ms = 10\n[link]\njitter_us = 100\n\
         [[producer]]\nrate = 500000\nbatch_max = 1024\npriorities = \"uniform:10\"\n\
         [[consumer]]\nmax = 64\nrate = 200\n",
    )
    .unwrap();
    let report = run(&topology, &workload, 1).unwrap();
    assert!(report.pushed >= 999_000, "{}", report.text());
    assert!(
        report.undelivered > 900_000,
        "the backlog stayed below: {}",
        report.text()
    );
    // Two aggregators' windows at the root (2 × the credits); reserve-ahead (off by default)
    // would add its buffer to the bound.
    let bound = 2 * u64::from(topology.root().settings.credits_per_topic);
    assert_eq!(report.window_entries_bound, bound);
    assert_eq!(
        report.window_entries_max,
        bound,
        "full, never over: {}",
        report.text()
    );
    assert!(report.series.iter().all(|s| s.window_entries <= 3 * bound));
}

const PARTITION: &str = include_str!("../../../examples/sim/partition.toml");
const CHAOS: &str = include_str!("../../../examples/sim/chaos.toml");

#[test]
fn partitions_short_and_long_lose_nothing_and_everything_flows_after_the_heal() {
    // A cut shorter than the idle timeout only delays traffic; a longer one ends the
    // connections across it, which are made again at the heal and offered anew. With 1 % of
    // packets lost on top, every acknowledged message is delivered, no lease is ever granted
    // while another of the same message is live, and duplicates come only from deliveries the
    // long cut left unconfirmed.
    let topology = Topology::parse(SIXTEEN).unwrap();
    let workload = Workload::parse(PARTITION).unwrap();
    let report = run(&topology, &workload, 1).unwrap();
    let text = report.text();
    assert_eq!(report.partitions, 2, "{text}");
    assert!(
        report.partition_disconnects >= 2,
        "the long cut ended connections: {text}"
    );
    assert!(report.packets_lost > 100, "{text}");
    assert_eq!(report.undelivered, 0, "{text}");
    assert_eq!(report.delivered, report.pushed, "{text}");
    assert_eq!(report.lease_violations, 0, "{text}");
    assert_eq!(report.unexpected_duplicates, 0, "{text}");
    assert!(report.violations().is_empty(), "{text}");
}

#[test]
fn seed_drawn_crashes_and_partitions_keep_every_invariant() {
    // The swarm: each seed draws its own crash and partition times, nodes and durations. The
    // checkers (no acknowledged message lost, leases exclusive, duplicates only from crashes,
    // windows within bound) must hold on every one; a failure names the seed.
    let topology = Topology::parse(SIXTEEN).unwrap();
    let mut tuned = topology.clone();
    tuned.set_setting("reserve_ahead_max=1024").unwrap();
    tuned.set_setting("offer_linger_us=500").unwrap();
    let workload = Workload::parse(CHAOS).unwrap();
    let mut faults = 0;
    for (seed, topology) in (1..=4).zip([&topology, &tuned, &topology, &tuned]) {
        let report = run(topology, &workload, seed).unwrap();
        faults += report.crashes + report.partitions;
        assert!(
            report.violations().is_empty(),
            "reproduce with --seed {seed}: {:?}\n{}",
            report.violations(),
            report.text()
        );
        assert_eq!(report.delivered, report.pushed, "seed {seed}");
    }
    assert!(faults >= 12, "the seeds drew their faults: {faults}");
    let a = run(&topology, &workload, 3).unwrap();
    let b = run(&topology, &workload, 3).unwrap();
    assert_eq!(
        a.text(),
        b.text(),
        "drawn faults are as reproducible as the rest"
    );
}

const DISK_FAULTS: &str = include_str!("../../../examples/sim/disk-faults.toml");

#[test]
fn a_failing_disk_and_torn_writes_lose_nothing_acknowledged() {
    // Goal: 1 % of the leaves' appends and checkpoints fail (their waiters are told: a
    // producer sees a push error, a consumer retries its ack) and crashes tear the write under
    // way (records before a random point survive, from batches nobody was told of). Every
    // acknowledged message is still delivered, duplicates only of what a crash left
    // unconfirmed, leases exclusive. A failure names the seed (`crest sim --seeds` runs
    // thousands the same way).
    let topology = Topology::parse(LOCAL).unwrap();
    let workload = Workload::parse(DISK_FAULTS).unwrap();
    let (mut failures, mut torn, mut push_errors) = (0, 0, 0);
    for seed in 1..=16 {
        let report = run(&topology, &workload, seed).unwrap();
        assert!(
            report.violations().is_empty(),
            "reproduce with --seed {seed}: {:?}\n{}",
            report.violations(),
            report.text()
        );
        assert_eq!(report.undelivered, 0, "seed {seed}");
        assert!(report.delivered >= report.pushed, "seed {seed}");
        failures += report.disk_failures;
        torn += report.torn_records;
        push_errors += report.push_errors;
    }
    assert!(failures >= 16 * 20, "the disk failed: {failures}");
    assert!(torn > 0, "some crash tore a write");
    assert!(push_errors > 0, "some producer was told its push failed");
    assert!(
        Workload::parse("[disk]\nappend_failures = 0.9\n[[producer]]\nrate = 1\n[[consumer]]\n")
            .unwrap_err()
            .contains("append_failures")
    );
}

const NOISY_NEIGHBOUR: &str = include_str!("../../../examples/sim/noisy-neighbour.toml");

#[test]
fn a_noisy_namespace_is_held_to_its_rate_and_its_neighbours_see_what_they_would_alone() {
    // Goal: namespace `noisy` offering 20x its push rate over every leaf is admitted at its
    // rate, tree-wide; the two well-behaved namespaces next to it see no refusal, get every
    // message delivered, and push-ack and pop latencies within 20 % of a run without it.
    let topology = Topology::parse(LOCAL).unwrap();
    let workload = Workload::parse(NOISY_NEIGHBOUR).unwrap();
    let mut alone = workload.clone();
    alone
        .producers
        .retain(|p| p.topic.as_deref() != Some("noisy/jobs"));
    for seed in 1..=2 {
        let with = run(&topology, &workload, seed).unwrap();
        let without = run(&topology, &alone, seed).unwrap();
        let text = format!("with:\n{}\nwithout:\n{}", with.text(), without.text());
        assert!(with.violations().is_empty(), "{text}");
        let noisy = &with.topics["noisy/jobs"];
        // 1,000/s for 3 s, and the burst of 100.
        let expected = 1_000.0 * 3.0 + 100.0;
        let admitted = noisy.pushed as f64;
        assert!(
            (admitted - expected).abs() <= expected * 0.1,
            "seed {seed}: noisy admitted {admitted}, expected {expected} ± 10 %\n{text}"
        );
        assert!(noisy.refused > 10 * noisy.pushed, "seed {seed}\n{text}");
        for topic in ["quiet-a/jobs", "quiet-b/jobs"] {
            let (near, apart) = (&with.topics[topic], &without.topics[topic]);
            assert_eq!(near.refused, 0, "seed {seed} {topic}\n{text}");
            assert_eq!(near.delivered, near.pushed, "seed {seed} {topic}\n{text}");
            assert!(near.pushed >= 5_900, "seed {seed} {topic}\n{text}");
            for (what, near, apart) in [
                ("push-ack p99", near.push_ack_us.p99, apart.push_ack_us.p99),
                ("pop p99", near.pop_latency_us.p99, apart.pop_latency_us.p99),
            ] {
                assert!(
                    near as f64 <= apart as f64 * 1.2,
                    "seed {seed} {topic}: {what} {near} us next to the noisy one, {apart} us \
                     without it\n{text}"
                );
            }
        }
    }
}
