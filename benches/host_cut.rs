//! What a host cut off under load costs clients: `cargo bench --bench host_cut [-- RUNS]`
//! (default 10 of each). Needs root (network namespaces and nftables, as `tests/netns.rs`).
//!
//! Each run starts a fresh tree as `crest launch` processes in network namespaces, one
//! host each, with a producer and a consumer of the SDK's default settings on the client
//! host moving about 1,000 messages a second (the consumer acknowledges each batch before
//! its next pop), cuts one host off for 10 s, heals it, and checks that every acknowledged
//! message was delivered (`tests/common/netns.rs`, `cut_under_load`). Two cases, run in
//! turn:
//!
//! - **root**: a root, a root standing by and two leaves; the root's host is cut off. The
//!   figure is the longest time without a delivery.
//! - **replica leader**: a root, a leaf of three replicas and a leaf of its own; the
//!   replicated leaf's leader's host is cut off. The figures are the longest `ack_many` and
//!   the longest time without a delivery of the other leaf's messages.
//!
//! Reports each figure's median, p90 and worst.

#[path = "../tests/common/cluster.rs"]
mod cluster;
#[path = "../tests/common/netns.rs"]
mod netns;
#[path = "../tests/common/tmpfs.rs"]
mod tmpfs;

use std::time::Duration;

fn main() {
    let runs: usize = cluster::count_argument(10);
    let runtime = cluster::bench_runtime();
    let (mut root_gaps, mut acks, mut other_gaps) = (Vec::new(), Vec::new(), Vec::new());
    let mut errors = 0;
    for run in 0..runs {
        let root = runtime.block_on(netns::standby_takeover());
        assert_eq!(root.lost, 0, "run {run}: acknowledged messages lost");
        let leader = runtime.block_on(netns::leader_cut());
        assert_eq!(leader.lost, 0, "run {run}: acknowledged messages lost");
        println!(
            "run {run}: root cut: pops paused {} ms; leader cut: acks took {} ms at most, \
             the other leaf's pops paused {} ms",
            root.gap.as_millis(),
            leader.ack_max.as_millis(),
            leader.gap_of_leaf.as_millis()
        );
        root_gaps.push(root.gap);
        acks.push(leader.ack_max);
        other_gaps.push(leader.gap_of_leaf);
        errors += root.pop_errors + leader.pop_errors;
    }
    for (what, mut figures) in [
        ("root's host cut off: pops paused", root_gaps),
        ("replica leader's host cut off: longest ack", acks),
        (
            "replica leader's host cut off: the other leaf's pops paused",
            other_gaps,
        ),
    ] {
        figures.sort();
        let at = |q: f64| figures[((figures.len() as f64 - 1.0) * q).round() as usize];
        let ms = |d: Duration| d.as_millis();
        println!(
            "{what}, {runs} runs: p50 {} ms, p90 {} ms, max {} ms",
            ms(at(0.5)),
            ms(at(0.9)),
            ms(at(1.0))
        );
    }
    println!("pops that failed, in all: {errors}");
}
