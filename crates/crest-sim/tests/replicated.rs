//! Replicated leaves in the simulator: swarms of seeds, each drawing its own crashes (of any
//! replica: a leader's is a failover), partitions cutting a leader off past the election
//! timeout, a failing and tearing disk, a slow follower and logs that read back corrupt. On
//! every seed: every election's leader holds every committed entry, nothing acknowledged is
//! lost, no message is leased twice, duplicates only of what a crash left unconfirmed.

use crest_core::topology::Topology;
use crest_sim::{SimReport, Workload, run};

const LOCAL: &str = include_str!("../../../topology/local.toml");
const REPLICATED: &str = include_str!("../../../examples/sim/replicated.toml");

/// Runs `seeds`, failing on the first that breaks an invariant (naming it); returns the
/// reports.
fn swarm(workload: &Workload, seeds: std::ops::RangeInclusive<u64>) -> Vec<SimReport> {
    let topology = Topology::parse(LOCAL).unwrap();
    seeds
        .map(|seed| {
            let report = run(&topology, workload, seed).unwrap();
            assert!(
                report.violations().is_empty(),
                "reproduce with `crest sim --workload examples/sim/replicated.toml --seed {seed}`: \
                 {:?}\n{}",
                report.violations(),
                report.text()
            );
            assert_eq!(report.undelivered, 0, "seed {seed}");
            report
        })
        .collect()
}

fn replicated() -> Workload {
    Workload::parse(REPLICATED).unwrap()
}

/// What a swarm's seeds drew, summed: that the faults happened.
fn assert_faults_drawn(reports: &[SimReport]) {
    let sum = |f: fn(&SimReport) -> u64| reports.iter().map(f).sum::<u64>();
    let failovers = sum(|r| r.failovers);
    let corrupt = sum(|r| r.corrupt_logs);
    let partitions = sum(|r| r.partitions);
    let disk = sum(|r| r.disk_failures);
    let seeds = reports.len() as u64;
    assert!(failovers >= seeds, "failovers: {failovers}");
    assert!(corrupt >= seeds / 4, "corrupt logs: {corrupt}");
    assert!(partitions >= seeds, "partitions: {partitions}");
    assert!(disk >= seeds, "disk failures: {disk}");
}

#[test]
fn replica_groups_keep_every_invariant_on_a_hundred_seeds() {
    assert_faults_drawn(&swarm(&replicated(), 1..=100));
}

#[test]
fn replica_groups_keep_every_invariant_on_a_hundred_more_seeds() {
    assert_faults_drawn(&swarm(&replicated(), 101..=200));
}

/// Leaf-1's group (the first replica leads): the third replica stops (and so misses what
/// follows), the second commits with the leader, then crashes and comes back with its log
/// read corrupt, the leader crashes, and the third comes back: a majority is up, one of
/// them empty, the other stale. The leader comes back a second later.
const WIPED_AND_STALE: &str = r#"
duration_ms = 1500
drain_ms = 35000
[replication]
replicas = 3
[[fault]]
node = "leaf-1"
replica = 2
at_ms = 100
restart_after_ms = 300
[[fault]]
node = "leaf-1"
replica = 1
at_ms = 200
restart_after_ms = 100
corrupt = true
[[fault]]
node = "leaf-1"
replica = 0
at_ms = 250
restart_after_ms = 1000
[[producer]]
rate = 20000
[[consumer]]
max = 64
"#;

#[test]
fn a_wiped_replica_s_vote_would_elect_a_stale_leader_and_the_rejoin_rule_keeps_it_out() {
    // Goal: the checker catches what crest's rejoin rule prevents. With the replica back from
    // a corrupt log voting at once (Raft's assumption that a voter never forgets), the stale
    // replica leads without the entries the wiped one had committed with the leader, and the
    // acknowledged messages in them are lost; with the rule, the group waits for the old
    // leader, which leads with every entry, and nothing is lost.
    let topology = Topology::parse(LOCAL).unwrap();
    let mut forgetful = Workload::parse(WIPED_AND_STALE).unwrap();
    forgetful.replication.votes_when_empty = true;
    let lost = run(&topology, &forgetful, 1).unwrap();
    assert_eq!(lost.group_violations, 1, "{}", lost.text());
    assert!(lost.undelivered > 0, "{}", lost.text());
    let kept = run(&topology, &Workload::parse(WIPED_AND_STALE).unwrap(), 1).unwrap();
    assert!(
        kept.violations().is_empty(),
        "{:?}\n{}",
        kept.violations(),
        kept.text()
    );
    assert_eq!(
        (kept.corrupt_logs, kept.failovers),
        (1, 1),
        "{}",
        kept.text()
    );
    assert!(
        Workload::parse(&WIPED_AND_STALE.replace("replica = 2", "replica = 3"))
            .unwrap_err()
            .contains("replica 3 of 3")
    );
}

#[test]
fn a_group_s_run_is_as_reproducible_as_the_rest() {
    let topology = Topology::parse(LOCAL).unwrap();
    let a = run(&topology, &replicated(), 7).unwrap();
    let b = run(&topology, &replicated(), 7).unwrap();
    assert_eq!(a.text(), b.text());
    assert!(a.failovers > 0, "{}", a.text());
}
