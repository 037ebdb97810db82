//! `crest bench`: a load generator that measures a real tree over real QUIC sockets
//! ([`wal`] is `crest wal bench`, the disk alone).
//!
//! N producers (each its own [`Producer`], connected to every leaf) push messages of a fixed
//! payload size with priorities drawn from a [`PriorityMix`]; M consumers (each its own
//! [`Consumer`] connection to the root) pop in batches and acknowledge. Two phases:
//! [`Phase::FillThenDrain`] (push everything, wait for every acknowledgement, then pop it all)
//! and [`Phase::Mixed`] (push and pop at once, a steady load).
//!
//! Every payload starts with a stamp: the run's nonce, a sequence number and the send time, so
//! the bench knows, for every pop, which message it is (duplicates and losses are counted), how
//! long it took from push to pop, and — since it knows what it pushed and what was already
//! popped — the **rank error** of the pop (ARCHITECTURE.md, "Measuring ordering"): how many messages whose push was
//! acknowledged and which were not yet popped were strictly more urgent than the popped one.
//!
//! Latencies are HDR histograms in microseconds: push-ack (send to the leaf's durable ack),
//! pop (request to answer, for pops asked while a pushed message was known to be waiting),
//! ack (consumer ack round trip), push-to-pop (send to delivery).

mod config;
mod ledger;
mod load;
mod noise;
mod probe;
pub mod redis;
mod report;
pub mod wal;

pub use config::NodeHttp;
pub use config::{BenchConfig, Phase, PriorityMix, Target};
pub use crest_core::metrics::Percentiles;
pub use ledger::LEASE_RANK_MESSAGES_MAX;
pub use noise::{Noise, NoiseReport};
pub use report::{
    BenchComparison, BenchReport, BenchSummary, CpuUse, Latencies, NodeCpu, Spread, Versus,
};

use anyhow::Context;
use anyhow::{Result, bail};
use crest_core::config::Durability;
use crest_core::metrics::Metric;
use crest_node::LocalTree;
use crest_sdk::{ClientTls, Consumer, ConsumerConfig, ProducerConfig};
use hdrhistogram::Histogram;
use ledger::*;
use load::*;
use rand::Rng;
use report::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes of the stamp at the start of every payload: nonce, sequence number, send time.
pub const STAMP_BYTES: usize = 24;

/// Priorities the bench can track (0..=63).
pub const PRIORITY_LEVELS: usize = 64;

/// The header line of a percentile table (`crest bench`, `crest wal bench`).
pub(crate) fn percentile_header() -> String {
    format!(
        "  {:<22} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "", "count", "p50", "p90", "p99", "p99.9", "max"
    )
}

/// One line of a percentile table.
pub(crate) fn percentile_row(name: &str, p: &Percentiles) -> String {
    format!(
        "  {:<22} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        name, p.count, p.p50, p.p90, p.p99, p.p999, p.max
    )
}

/// A latency histogram in microseconds, up to an hour, 3 significant digits.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

/// A started or found tree: where to push and pop, and what to stop afterwards.
struct Running {
    leaves: Vec<String>,
    /// Where consumers settle (see [`Target::Remote`]'s `owners`).
    owners: Vec<crest_sdk::LeafAddresses>,
    /// The root, then those standing by.
    roots: Vec<String>,
    tls: ClientTls,
    local: Option<LocalTree>,
    durable: Option<bool>,
    syncing_leaves: Option<(usize, usize)>,
}

async fn start(target: &Target) -> Result<Running> {
    match target {
        Target::Remote {
            leaves,
            roots,
            tls,
            owners,
            ..
        } => Ok(Running {
            leaves: leaves.clone(),
            owners: owners.clone(),
            roots: roots.clone(),
            tls: tls.clone(),
            local: None,
            durable: None,
            syncing_leaves: None,
        }),
        Target::Local {
            topology,
            data_dir,
            open,
        } => {
            if let Some(dir) = data_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
            // Ports held for the tree, not port 0: a group's replicas must know each other's
            // addresses before they start.
            let (topology, sockets) =
                crest_node::on_held_ports(topology).context("binding the local tree's ports")?;
            let started = if *open {
                LocalTree::start_open_on(&topology, data_dir.as_deref(), Some(sockets)).await
            } else {
                LocalTree::start_on(&topology, data_dir.as_deref(), Some(sockets)).await
            };
            let tree = started.context("starting the local tree")?;
            if !tree.wait_connected(Duration::from_secs(10)).await {
                tree.shutdown().await;
                bail!("the local tree did not connect within 10 s");
            }
            let tls = ClientTls::new(tree.ca_pem.clone()).with_token(tree.admin_token.clone());
            Ok(Running {
                leaves: tree.topology.leaves().map(|l| l.dial_address()).collect(),
                owners: ConsumerConfig::from_topology(&tree.topology, tls).leaves,
                roots: tree.topology.roots().map(|r| r.dial_address()).collect(),
                tls: ClientTls::new(tree.ca_pem.clone()).with_token(tree.admin_token.clone()),
                durable: Some(data_dir.is_some()),
                syncing_leaves: data_dir.is_some().then(|| {
                    let leaves: Vec<_> = tree.topology.leaves().collect();
                    let syncing = leaves
                        .iter()
                        .filter(|leaf| leaf.settings.durability == Durability::Fsync)
                        .count();
                    (syncing, leaves.len())
                }),
                local: Some(tree),
            })
        }
    }
}

/// Runs the bench and returns its report.
///
/// # Errors
/// A bad configuration, a tree that cannot be started or reached, a pop or ack that fails.
pub async fn run(config: BenchConfig) -> Result<BenchReport> {
    config.validate()?;
    let running = start(&config.target).await?;
    if let Some(limits) = config.limits {
        let scope =
            crest_core::quota::namespace_scope(crest_core::access::namespace(&config.topic));
        set_limits(&running, &scope, limits).await?;
    }
    for (scope, limits) in &config.other_limits {
        set_limits(&running, scope, *limits).await?;
    }
    let result = drive(&config, &running).await;
    let includes_tree = running.local.is_some();
    let mut violations = None;
    let mut lost = None;
    let mut held = None;
    let mut log_sync = None;
    let mut log_sync_by_leaf = BTreeMap::new();
    if let Some(tree) = &running.local {
        let (mut violations_sum, mut lost_sum, mut held_sum) = (0, 0, (0, 0));
        let mut syncs = crest_core::metrics::Hist::default();
        for node in &tree.nodes {
            if node.role() == crest_core::wire::Role::Leaf
                && let Ok(report) = node.report().await
            {
                if let Some(hist) = report.histograms.get(&Metric::LogSync)
                    && hist.count() > 0
                {
                    syncs.merge(hist);
                    log_sync_by_leaf.insert(node.name().to_string(), hist.percentiles());
                }
                if let Some(own) = report.nodes.first() {
                    let counter = |name: &str| own.counters.get(name).copied().unwrap_or(0);
                    held_sum.0 += counter("pushes_held");
                    held_sum.1 += counter("pushes_awaiting_allowance");
                }
            }
            if let Ok(stats) = node.stats().await {
                violations_sum += stats.violations;
            }
            if let Ok(links) = node.links().await {
                lost_sum += links.totals.iter().map(|t| t.lost_packets).sum::<u64>();
            }
        }
        violations = Some(violations_sum);
        lost = Some(lost_sum);
        held = Some(held_sum);
        log_sync = (syncs.count() > 0).then(|| syncs.percentiles());
    }
    if let Some(tree) = running.local {
        tree.shutdown().await;
    }
    if let Target::Local {
        data_dir: Some(dir),
        ..
    } = &config.target
    {
        let _ = std::fs::remove_dir_all(dir);
    }
    let mut report = result?;
    report.durable = running.durable;
    report.acks_through_root |= running.owners.is_empty();
    report.syncing_leaves = running.syncing_leaves;
    report.protocol_violations = violations;
    report.quic_lost_packets = lost;
    report.pushes_held = held;
    report.log_sync_us = log_sync;
    report.log_sync_by_leaf_us = log_sync_by_leaf;
    report.cpu.includes_tree = includes_tree;
    Ok(report)
}

/// Sets `limits` on `scope` (a topic, or a namespace's `NS/`) at every leaf of the tree.
async fn set_limits(
    running: &Running,
    scope: &str,
    limits: crest_core::quota::Limits,
) -> Result<()> {
    let admin = crest_sdk::Admin::connect(ConsumerConfig {
        roots: running.roots.clone(),
        ..ConsumerConfig::new(String::new(), running.tls.clone())
    })
    .await?;
    let config = crest_sdk::TopicConfig {
        limits,
        ..crest_sdk::TopicConfig::default()
    };
    let answer = admin.configure(scope, config).await?;
    if !answer.unreachable.is_empty() {
        bail!("limits not set at leaves {:?}", answer.unreachable);
    }
    Ok(())
}

async fn drive(config: &BenchConfig, running: &Running) -> Result<BenchReport> {
    let config = Arc::new(config.clone());
    let nodes = match &config.target {
        Target::Remote { nodes, .. } => nodes.clone(),
        Target::Local { .. } => Vec::new(),
    };
    let processes = probe::processes(&nodes).await;
    let nodes_start = probe::cpu_seconds(&nodes).await;
    let cpu_start = process_cpu();
    let shared = Arc::new(Shared {
        started: Instant::now(),
        nonce: rand::rng().random(),
        next_seq: AtomicU64::new(0),
        pushed: AtomicU64::new(0),
        push_errors: AtomicU64::new(0),
        popped: AtomicU64::new(0),
        producers_done: AtomicBool::new(false),
        present: Present::new(),
        ledger: Ledger::new(config.messages),
        seen: Mutex::new(Seen::default()),
        last_push_ack_ns: AtomicU64::new(0),
        first_pop_ns: AtomicU64::new(u64::MAX),
        last_pop_ns: AtomicU64::new(0),
    });
    let mut consumers = Vec::new();
    for _ in 0..config.consumers {
        let consumer_config = ConsumerConfig {
            leaves: if config.acks_through_root {
                Vec::new()
            } else {
                running.owners.clone()
            },
            roots: running.roots.clone(),
            ..ConsumerConfig::new(String::new(), running.tls.clone())
        };
        consumers.push(
            Consumer::connect(consumer_config)
                .await
                .context("consumer connecting to the root")?,
        );
    }
    let progress = config
        .progress
        .map(|every| spawn_progress(shared.clone(), every));
    let producer_config = ProducerConfig::new(running.leaves.clone(), running.tls.clone());
    let stop_noise = Arc::new(AtomicBool::new(false));
    let noise = config.noise.clone().map(|noise| {
        tokio::spawn(noise::run(
            noise,
            producer_config.clone(),
            stop_noise.clone(),
        ))
    });
    let producers: Vec<_> = (0..config.producers)
        .map(|index| {
            tokio::spawn(run_producer(
                config.clone(),
                producer_config.clone(),
                shared.clone(),
                index,
            ))
        })
        .collect();
    let start_consumers = |consumers: Vec<Consumer>| -> Vec<_> {
        consumers
            .into_iter()
            .map(|consumer| tokio::spawn(run_consumer(config.clone(), consumer, shared.clone())))
            .collect()
    };
    let mut consumer_tasks = match config.phase {
        Phase::Mixed => start_consumers(std::mem::take(&mut consumers)),
        Phase::FillThenDrain => Vec::new(),
    };
    let mut push_ack = PushAcks::new();
    let mut failure = None;
    for task in producers {
        match task.await.context("producer task")? {
            Ok(result) => push_ack.merge(result.push_ack),
            Err(error) => failure = Some(error),
        }
    }
    shared.producers_done.store(true, Ordering::Release);
    let cpu_producers_done = process_cpu();
    let nodes_done = probe::cpu_seconds(&nodes).await;
    if let Some(error) = failure {
        shared.popped.store(u64::MAX, Ordering::Release);
        for task in consumer_tasks {
            let _ = task.await;
        }
        return Err(error);
    }
    if config.phase == Phase::FillThenDrain {
        consumer_tasks = start_consumers(consumers);
    }
    let mut results = Vec::new();
    for task in consumer_tasks {
        results.push(task.await.context("consumer task")??);
    }
    stop_noise.store(true, Ordering::Release);
    let noise = match noise {
        Some(task) => Some(task.await.context("noisy producer")??),
        None => None,
    };
    let cpu = CpuMarks {
        start: cpu_start,
        producers_done: cpu_producers_done,
        end: process_cpu(),
    };
    let nodes_end = probe::cpu_seconds(&nodes).await;
    if let Some(progress) = progress {
        progress.abort();
    }
    let mut report = report(&config, &shared, push_ack, results, cpu);
    report.noise = noise;
    report.nodes_cpu = probe::usage(
        &nodes,
        &processes,
        [&nodes_start, &nodes_done, &nodes_end],
        config.phase,
        report.pushed,
        report.popped,
    );
    Ok(report)
}

#[cfg(test)]
mod tests;
