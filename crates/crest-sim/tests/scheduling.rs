//! Scheduling policies in the simulator, with fixed seeds (virtual time): what `strict` does
//! to a less urgent tier under a flood, the shares `weighted` gives every tier, and what a
//! noisy fairness key does to quiet ones, and how aging bounds the wait of a flooded tier.

use crest_core::topology::Topology;
use crest_sim::{SimReport, Workload, run};

const LOCAL: &str = include_str!("../../../topology/local.toml");
const STARVATION: &str = include_str!("../../../examples/sim/starvation.toml");
const SHARES: &str = include_str!("../../../examples/sim/weighted-shares.toml");
const NOISY: &str = include_str!("../../../examples/sim/noisy-key.toml");
const AGING: &str = include_str!("../../../examples/sim/aging-flood.toml");

fn starvation(duration_ms: u64) -> SimReport {
    flood(STARVATION, duration_ms)
}

/// Scenario `file` with its flood lasting `duration_ms` and twice that to drain, seed 1.
fn flood(file: &str, duration_ms: u64) -> SimReport {
    let mut workload = Workload::parse(file).unwrap();
    workload.duration_ms = duration_ms;
    workload.drain_ms = 2 * duration_ms;
    let report = run(&Topology::parse(LOCAL).unwrap(), &workload, 1).unwrap();
    assert_eq!(
        report.violations(),
        Vec::<String>::new(),
        "{}",
        report.text()
    );
    report
}

#[test]
fn under_a_flood_strict_starves_background_for_as_long_as_the_flood_and_weighted_does_not() {
    let short = starvation(2_000);
    let long = starvation(4_000);
    for report in [&short, &long] {
        let text = report.text();
        let strict = &report.topics["strict"].priorities[&4];
        let weighted = &report.topics["weighted"].priorities[&4];
        // Strict: no BACKGROUND message leaves while CRITICAL ones are ready.
        assert_eq!(strict.delivered_in_load, 0, "{text}");
        assert_eq!(strict.delivered, weighted.delivered, "{text}");
        // Weighted: each waits a few pops (one pop every 10 ms), however long the flood.
        assert!(weighted.wait_us.max < 50_000, "{text}");
        assert_eq!(weighted.delivered_in_load, weighted.delivered, "{text}");
    }
    // Strict: the wait grows with the flood (without bound as it lasts).
    let (short_wait, long_wait) = (
        short.topics["strict"].priorities[&4].wait_us.p50,
        long.topics["strict"].priorities[&4].wait_us.p50,
    );
    assert!(
        long_wait > short_wait * 18 / 10 && short_wait > 2_000_000,
        "strict BACKGROUND waits {short_wait} us (2 s flood), {long_wait} us (4 s)"
    );
}

#[test]
fn under_a_flood_aging_bounds_background_waits_by_its_thresholds_however_long_the_flood() {
    // Thresholds 1 s at each of 4, 3, 2, 1 up to 0, cumulative from the message's ready
    // time, checked every second: it reaches CRITICAL at the first check after 4 s (at most
    // 5 s) and goes ahead of the flood's backlog there, to leave within a few pops (10 ms
    // apart).
    let bound_us = 5_000_000 + 100_000;
    let mut strict_waits = Vec::new();
    for duration_ms in [6_000, 12_000] {
        let report = flood(AGING, duration_ms);
        let text = report.text();
        let aged = &report.topics["aging"].priorities[&4];
        let strict = &report.topics["strict"].priorities[&4];
        assert_eq!(aged.delivered, strict.delivered, "{text}");
        assert!(aged.delivered > 100, "{text}");
        assert!(aged.wait_us.max < bound_us, "{text}");
        // All but those pushed in the flood's last `bound` leave while it lasts.
        let early = aged.delivered * (duration_ms - bound_us / 1000) / duration_ms;
        assert!(aged.delivered_in_load >= early, "{text}");
        assert_eq!(strict.delivered_in_load, 0, "{text}");
        strict_waits.push(strict.wait_us.p50);
    }
    // Without aging the wait grows with the flood, past the aging bound.
    assert!(
        strict_waits[1] > strict_waits[0] * 18 / 10 && strict_waits[0] > bound_us,
        "strict BACKGROUND p50 waits {strict_waits:?} us"
    );
}

#[test]
fn weighted_tiers_each_take_their_weights_share_of_pops_within_five_percent() {
    let topology = Topology::parse(LOCAL).unwrap();
    let workload = Workload::parse(SHARES).unwrap();
    let weights = [(0, 8.0), (1, 4.0), (2, 2.0), (3, 1.0), (4, 0.5)];
    let total: f64 = weights.iter().map(|(_, w)| w).sum();
    for seed in 1..=3 {
        let report = run(&topology, &workload, seed).unwrap();
        let text = report.text();
        assert_eq!(report.violations(), Vec::<String>::new(), "{text}");
        let tiers = &report.topics["jobs"].priorities;
        let in_load: u64 = tiers.values().map(|t| t.delivered_in_load).sum();
        assert!(in_load > 1_500, "{text}");
        for (tier, weight) in weights {
            let share = tiers[&tier].delivered_in_load as f64 / in_load as f64;
            let want = weight / total;
            assert!(
                (share / want - 1.0).abs() <= 0.05,
                "seed {seed}: tier {tier} took {:.2} % of the pops, its weight {:.2} %\n{text}",
                100.0 * share,
                100.0 * want
            );
        }
    }
}

/// The p99 wait of each quiet key of `noisy-key.toml` on seed `seed`, with the noisy key
/// (`noisy`) or without it, on a weighted topic or a strict one.
fn quiet_p99s(seed: u64, noisy: bool, weighted: bool) -> Vec<u64> {
    let mut workload = Workload::parse(NOISY).unwrap();
    if !noisy {
        workload
            .producers
            .retain(|p| p.fairness_key.as_deref() != Some("noisy"));
    }
    if !weighted {
        workload.topics.clear();
    }
    let report = run(&Topology::parse(LOCAL).unwrap(), &workload, seed).unwrap();
    let text = report.text();
    assert_eq!(report.violations(), Vec::<String>::new(), "{text}");
    let keys = &report.topics["jobs"].fairness_keys;
    let quiet: Vec<u64> = keys
        .iter()
        .filter(|(key, _)| key.starts_with("quiet"))
        .map(|(_, key)| {
            assert!(key.delivered >= 15, "{text}");
            key.wait_us.p99
        })
        .collect();
    assert_eq!(quiet.len(), 9, "{text}");
    quiet
}

#[test]
fn a_noisy_fairness_key_does_not_make_quiet_keys_wait_longer_than_twice_as_long() {
    for seed in 1..=2 {
        let alone = quiet_p99s(seed, false, true);
        let beside = quiet_p99s(seed, true, true);
        for (at, (alone, beside)) in alone.iter().zip(&beside).enumerate() {
            assert!(
                *beside <= 2 * alone,
                "seed {seed}: quiet-{} p99 {beside} us beside the noisy key, {alone} us alone",
                at + 1
            );
        }
        // The same load on a strict topic: the quiet keys wait behind the noisy backlog.
        let strict = quiet_p99s(seed, true, false);
        let slowest = strict.iter().min().copied().unwrap_or_default();
        assert!(
            slowest > 20 * beside.iter().max().copied().unwrap_or_default(),
            "seed {seed}: strict {strict:?}, weighted {beside:?}"
        );
    }
}
