//! What a benchmark run is: the workload (priorities, phases, rates, clients) and the tree it
//! runs on.

use super::*;
use anyhow::{Result, bail};
use crest_core::topology::Topology;
use crest_sdk::ClientTls;
use rand::Rng;
use rand::rngs::SmallRng;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// A node whose processor time the bench reads: its name and HTTP address.
pub type NodeHttp = (String, std::net::SocketAddr);

/// How priorities are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PriorityMix {
    /// Uniform over `0..levels`.
    Uniform {
        /// Number of priorities.
        levels: u32,
    },
    /// Priorities 0–9, 70% in the least urgent tiers (7–9), 20% in 3–6, 10% in the most urgent
    /// (0–2): the reference workload.
    Skewed,
    /// Always this priority.
    Fixed {
        /// The priority.
        priority: u32,
    },
}

impl std::str::FromStr for PriorityMix {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!(
                "{text:?}: expected `skewed`, `uniform`, `uniform:N` (1..=64) or `fixed:P` (0..=63)"
            )
        };
        let (kind, arg) = match text.split_once(':') {
            Some((kind, arg)) => (kind, Some(arg.parse::<u32>().map_err(|_| bad())?)),
            None => (text, None),
        };
        match (kind, arg) {
            ("skewed", None) => Ok(PriorityMix::Skewed),
            ("uniform", None) => Ok(PriorityMix::Uniform { levels: 10 }),
            ("uniform", Some(levels)) if (1..=PRIORITY_LEVELS as u32).contains(&levels) => {
                Ok(PriorityMix::Uniform { levels })
            }
            ("fixed", Some(priority)) if (priority as usize) < PRIORITY_LEVELS => {
                Ok(PriorityMix::Fixed { priority })
            }
            _ => Err(bad()),
        }
    }
}

impl PriorityMix {
    pub(super) fn draw(self, rng: &mut SmallRng) -> u32 {
        match self {
            PriorityMix::Uniform { levels } => rng.random_range(0..levels),
            PriorityMix::Fixed { priority } => priority,
            PriorityMix::Skewed => {
                let roll = rng.random_range(0..100u32);
                if roll < 10 {
                    rng.random_range(0..3)
                } else if roll < 30 {
                    rng.random_range(3..7)
                } else {
                    rng.random_range(7..10)
                }
            }
        }
    }
}

/// The bench's phases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Push every message and wait for every acknowledgement, then pop them all.
    FillThenDrain,
    /// Producers and consumers run at once.
    Mixed,
}

/// Which tree the bench drives.
#[derive(Clone, Debug)]
pub enum Target {
    /// A tree the bench starts in this process from a topology (ephemeral ports), its leaves
    /// logging to `data_dir` (fsync before ack) or keeping messages in memory (`None`).
    Local {
        /// The tree.
        topology: Topology,
        /// Where leaves log; removed afterwards.
        data_dir: Option<PathBuf>,
        /// Serve clients without credentials (no access file), instead of through the
        /// tree's `admin` token.
        open: bool,
    },
    /// A running tree.
    Remote {
        /// Leaf addresses producers push to.
        leaves: Vec<String>,
        /// Root address consumers pop from, then those of roots standing by.
        roots: Vec<String>,
        /// Trust.
        tls: ClientTls,
        /// Nodes whose processor time the bench reads from their `/metrics` as it runs
        /// (name, HTTP address): reported per message, per node.
        nodes: Vec<NodeHttp>,
        /// The leaves' addresses by id, where consumers settle what they were delivered
        /// (empty: through the root).
        owners: Vec<crest_sdk::LeafAddresses>,
    },
}

/// Everything a run needs.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The tree.
    pub target: Target,
    /// Producer connections.
    pub producers: usize,
    /// Consumer connections.
    pub consumers: usize,
    /// Messages to push (the run stops at this count or at `duration`, whichever is first).
    pub messages: u64,
    /// How long producers push (`None`: until `messages`).
    pub duration: Option<Duration>,
    /// Payload bytes per message (at least [`STAMP_BYTES`]).
    pub payload_bytes: usize,
    /// Priority distribution.
    pub priorities: PriorityMix,
    /// Fairness keys drawn uniformly for each message (0: messages have none).
    pub fairness_keys: u32,
    /// Most deliveries per pop.
    pub pop_batch: u32,
    /// Acknowledge deliveries (otherwise they stay leased until their visibility timeout).
    pub ack: bool,
    /// Total target push rate in messages/s (`None`: open loop, as fast as acknowledged).
    pub rate: Option<f64>,
    /// The phases.
    pub phase: Phase,
    /// The topic.
    pub topic: String,
    /// Messages each producer may have sent but not yet seen acknowledged.
    pub producer_window: usize,
    /// Most messages a producer hands the SDK at once (`Producer::send_batch`). A paced
    /// producer sends only the messages already due, so at low rates batches are single
    /// messages and push latency is not inflated by waiting for company.
    pub push_batch: usize,
    /// Ack requests each consumer may have in flight while it pops on.
    pub acks_in_flight: usize,
    /// Consumers settle through the root even where they could reach the owning leaf (as
    /// consumers without the leaves' addresses do).
    pub acks_through_root: bool,
    /// How long the drain may go without popping anything before the bench gives up and
    /// reports the messages it never saw as missing.
    pub drain_idle_timeout: Duration,
    /// Print a progress line every this often on stderr (`None`: quiet).
    pub progress: Option<Duration>,
    /// Seed of the priority draws.
    pub seed: u64,
    /// Quotas and rates set on the topic's namespace before the workload (`crest bench
    /// --against-limits`: what enforcing limits that are not hit costs).
    pub limits: Option<crest_core::quota::Limits>,
    /// Limits set on other scopes before the workload (a noisy neighbour's namespace).
    pub other_limits: Vec<(String, crest_core::quota::Limits)>,
    /// A noisy neighbour running alongside the workload.
    pub noise: Option<crate::noise::Noise>,
}

impl BenchConfig {
    /// The reference workload (docs/performance.md) against `target`.
    pub fn reference(target: Target) -> BenchConfig {
        BenchConfig {
            target,
            producers: 4,
            consumers: 4,
            messages: 200_000,
            duration: None,
            payload_bytes: 100,
            priorities: PriorityMix::Skewed,
            fairness_keys: 0,
            pop_batch: 256,
            ack: true,
            rate: None,
            phase: Phase::FillThenDrain,
            topic: "bench".into(),
            producer_window: 4096,
            push_batch: 256,
            acks_in_flight: 4,
            acks_through_root: false,
            drain_idle_timeout: Duration::from_secs(10),
            progress: Some(Duration::from_secs(1)),
            seed: 1,
            limits: None,
            other_limits: Vec::new(),
            noise: None,
        }
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.payload_bytes < STAMP_BYTES {
            bail!(
                "payload bytes must be at least {STAMP_BYTES}: every payload carries the bench's \
                 stamp (run nonce, sequence number, send time)"
            );
        }
        if self.producers == 0 || self.consumers == 0 || self.pop_batch == 0 {
            bail!("producers, consumers and pop batch must be at least 1");
        }
        if self.producer_window == 0 || self.push_batch == 0 {
            bail!("the producer window and the push batch must be at least 1");
        }
        if self
            .rate
            .is_some_and(|rate| !(rate > 0.0 && rate.is_finite()))
        {
            bail!("the target rate must be a positive number of messages per second");
        }
        if self.duration.is_none() && self.messages == 0 {
            bail!("give a message count or a duration");
        }
        Ok(())
    }
}
