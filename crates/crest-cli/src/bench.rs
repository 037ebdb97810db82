//! `crest bench`: the load generator on a tree it starts or a running one, repeated runs and
//! interleaved comparisons.

use crate::*;

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Drive a running tree (its topology or --root/--leaf, and --ca) instead of starting one.
    #[arg(long)]
    pub(crate) connect: bool,
    /// Topology: the tree to start (default: the embedded root + 2 aggregators + 4 leaves),
    /// or with --connect, the running tree's addresses.
    #[arg(long, env = "CREST_TOPOLOGY")]
    pub(crate) topology: Option<PathBuf>,
    /// With --connect: CA certificate to trust.
    #[arg(long, env = "CREST_CA", default_value = crest::LOCAL_CA_PATH)]
    pub(crate) ca: PathBuf,
    /// With --connect: the client's credential.
    #[command(flatten)]
    pub(crate) credentials: CredentialArgs,
    /// With --connect: root address, then those of roots standing by (default: the
    /// topology's roots).
    #[arg(long)]
    pub(crate) root: Vec<String>,
    /// With --connect: leaf addresses (default: the topology's).
    #[arg(long)]
    pub(crate) leaf: Vec<String>,
    /// Without --connect: keep messages in memory (no write-ahead log, no fsync).
    #[arg(long)]
    pub(crate) memory: bool,
    /// Producer connections (each connected to every leaf).
    #[arg(long, default_value_t = 4)]
    pub(crate) producers: usize,
    /// Consumer connections to the root.
    #[arg(long, default_value_t = 4)]
    pub(crate) consumers: usize,
    /// Messages to push [default: 200000, or no limit with --duration].
    #[arg(long)]
    pub(crate) messages: Option<u64>,
    /// Push for this long instead (e.g. 30s); --messages still caps the count.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) duration: Option<Duration>,
    /// Payload bytes per message (at least 24: the bench stamps each payload).
    #[arg(long, default_value_t = 100)]
    pub(crate) payload_bytes: usize,
    /// Priority distribution: skewed (0-9, 70/20/10 toward the least urgent), uniform[:N],
    /// fixed:P.
    #[arg(long, default_value = "skewed")]
    pub(crate) priorities: crest::bench::PriorityMix,
    /// Give each message one of this many fairness keys, drawn uniformly (0: none); they
    /// share pops on a `weighted` topic.
    #[arg(long, default_value_t = 0)]
    pub(crate) fairness_keys: u32,
    /// Most deliveries per pop.
    #[arg(long, default_value_t = 256)]
    pub(crate) pop_batch: u32,
    /// Do not acknowledge deliveries.
    #[arg(long)]
    pub(crate) no_ack: bool,
    /// Total target push rate (messages/s); default: open loop, as fast as acknowledged.
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// fill-then-drain: push all, then pop all; mixed: push and pop at once.
    #[arg(long, value_enum, default_value_t = crest::bench::Phase::FillThenDrain)]
    pub(crate) phase: crest::bench::Phase,
    /// Topic (default: bench on a local tree, bench-RANDOM on a running one).
    #[arg(long)]
    pub(crate) topic: Option<String>,
    /// Unacknowledged pushes each producer may have in flight.
    #[arg(long, default_value_t = 4096)]
    pub(crate) producer_window: usize,
    /// Most messages a producer hands the SDK at once (paced producers send only those due).
    #[arg(long, default_value_t = 256)]
    pub(crate) push_batch: usize,
    /// Ack requests each consumer keeps in flight while it pops on (pipelining).
    #[arg(long, default_value_t = 4)]
    pub(crate) acks_in_flight: usize,
    /// Settle through the root, not at the owning leaves (as consumers that know only the
    /// root do): to measure what the root's share of acknowledgements costs.
    #[arg(long)]
    pub(crate) acks_through_root: bool,
    /// Seed of the priority draws.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Give up draining after this long without a pop (missing messages are reported).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub(crate) drain_idle_timeout: Duration,
    /// No progress lines.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Run the same benchmark this many times (each on a fresh local tree), print a line per
    /// run and the median and range of each figure (at most 100).
    #[arg(long, default_value_t = 1)]
    pub(crate) runs: u32,
    /// Compare with the tree of this topology (not with --connect): runs of the first tree
    /// (--topology, or the default: A) and of this tree (B) alternate in pairs, A B then B A,
    /// and the command prints each one's medians, B/A and in how many pairs B did better.
    #[arg(long, conflicts_with = "against_open")]
    pub(crate) against: Option<PathBuf>,
    /// Compare with the same tree serving clients without credentials (as nodes launched
    /// without --access), as --against does: what authentication costs.
    #[arg(long)]
    pub(crate) against_open: bool,
    /// Compare with the same tree whose bench namespace has quotas, push and pop rates and an
    /// in-flight quota so large the workload never reaches them (every check made, none
    /// refusing), as --against does: what enforcing limits costs.
    #[arg(long, conflicts_with_all = ["against", "against_open"])]
    pub(crate) against_limits: bool,
    /// Compare with the same tree and workload next to a noisy neighbour: a producer of
    /// namespace `noisy` offering 20 times that namespace's push rate (--noisy-rate), open
    /// loop, while the workload runs; both trees have the rate set. What the noise costs the
    /// well-behaved workload.
    #[arg(long, conflicts_with_all = ["against", "against_open", "against_limits"])]
    pub(crate) against_noisy: bool,
    /// The noisy namespace's push rate for --against-noisy, messages per second (it offers
    /// 20 times this).
    #[arg(long, default_value_t = 1000)]
    pub(crate) noisy_rate: u64,
    /// The tree the bench starts serves clients without credentials (no access file).
    #[arg(long)]
    pub(crate) open: bool,
    /// Also write the report as JSON to this file (with --runs above 1: the summary, every
    /// run's report under `runs`; with --against: the comparison, each tree's summary under
    /// `a` and `b`).
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Run the workload against the Redis server at this URL (`redis://HOST:PORT`,
    /// `unix:///PATH`) used as a reliable priority queue — a sorted set, a Lua claim into an
    /// in-flight set, a ZREM ack — instead of a crest tree: the peer comparison of
    /// `scripts/bench-redis`. Fill then drain, one run.
    #[arg(long, conflicts_with_all = ["connect", "against", "against_open", "open"])]
    pub(crate) redis: Option<String>,
}

/// Most repetitions of `crest bench --runs`.
pub(crate) const BENCH_RUNS_MAX: u32 = 100;

pub(crate) async fn bench(args: BenchArgs) -> Result<()> {
    use crest::bench::{BenchConfig, Target};
    if !(1..=BENCH_RUNS_MAX).contains(&args.runs) {
        anyhow::bail!("--runs must be 1 to {BENCH_RUNS_MAX}, not {}", args.runs);
    }
    if args.connect
        && (args.against.is_some()
            || args.against_open
            || args.against_limits
            || args.against_noisy
            || args.open)
    {
        anyhow::bail!(
            "--against, --against-open, --against-limits, --against-noisy and --open are about \
             trees the bench starts: not with --connect"
        );
    }
    let topology = load_topology(args.topology.as_deref())?;
    let target = if args.connect {
        let leaves = if args.leaf.is_empty() {
            topology.leaves().map(|l| l.dial_address()).collect()
        } else {
            args.leaf.clone()
        };
        let roots = if args.root.is_empty() {
            topology.roots().map(|r| r.dial_address()).collect()
        } else {
            args.root.clone()
        };
        let tls = ClientTls::from_file(&args.ca)
            .with_context(|| format!("no CA certificate at {}: pass --ca", args.ca.display()))?
            .with_credential(args.credentials.credential(&args.ca)?);
        // Every node that serves HTTP reports its process's processor time on /metrics; read
        // when the tree is the topology's (addresses given by hand may be another tree's).
        let from_topology = args.root.is_empty() && args.leaf.is_empty();
        let nodes = topology
            .nodes
            .iter()
            .filter(|_| from_topology)
            .filter_map(|node| Some((node.name.clone(), node.http?)))
            .collect();
        // Consumers settle at the leaves when the tree is the topology's.
        let owners = if from_topology {
            ConsumerConfig::from_topology(&topology, tls.clone()).leaves
        } else {
            Vec::new()
        };
        Target::Remote {
            leaves,
            roots,
            tls,
            nodes,
            owners,
        }
    } else {
        let data_dir = (!args.memory)
            .then(|| std::env::temp_dir().join(format!("crest-bench-{}", std::process::id())));
        Target::Local {
            topology,
            data_dir,
            open: args.open,
        }
    };
    let topic = args.topic.clone().unwrap_or_else(|| {
        if args.connect || args.redis.is_some() {
            format!("bench-{:08x}", rand::random::<u32>())
        } else {
            "bench".into()
        }
    });
    let config = BenchConfig {
        producers: args.producers,
        consumers: args.consumers,
        messages: args.messages.unwrap_or(if args.duration.is_some() {
            u64::MAX
        } else {
            200_000
        }),
        duration: args.duration,
        payload_bytes: args.payload_bytes,
        priorities: args.priorities,
        fairness_keys: args.fairness_keys,
        pop_batch: args.pop_batch,
        ack: !args.no_ack,
        rate: args.rate,
        phase: args.phase,
        topic,
        producer_window: args.producer_window,
        push_batch: args.push_batch,
        acks_in_flight: args.acks_in_flight,
        acks_through_root: args.acks_through_root,
        drain_idle_timeout: args.drain_idle_timeout,
        progress: (!args.quiet).then_some(Duration::from_secs(1)),
        seed: args.seed,
        ..BenchConfig::reference(target)
    };
    if let Some(url) = &args.redis {
        if args.runs != 1 {
            anyhow::bail!("--redis runs once: run the command again for more");
        }
        let report = crest::bench::redis::run(url, &config).await?;
        print!("{}", report.render());
        write_json(args.json.as_deref(), &report)?;
        if report.missing > 0 || report.duplicates > 0 || report.left != (0, 0) {
            anyhow::bail!(
                "redis lost or repeated messages: {} missing, {} duplicates, {:?} left",
                report.missing,
                report.duplicates,
                report.left
            );
        }
        return Ok(());
    }
    if args.against.is_some() || args.against_open || args.against_limits || args.against_noisy {
        return bench_against(&args, config).await;
    }
    if args.runs == 1 {
        let report = crest::bench::run(config).await?;
        print!("{}", report.table());
        write_json(args.json.as_deref(), &report)?;
        if report.missing > 0 {
            anyhow::bail!("{} acknowledged messages were never popped", report.missing);
        }
        return Ok(());
    }
    let mut reports = Vec::new();
    for run in 1..=args.runs {
        let report = crest::bench::run(config.clone()).await?;
        print!("run {run}/{}: {}", args.runs, report.line());
        reports.push(report);
    }
    let summary = crest::bench::BenchSummary::of(reports);
    print!("{}", summary.table());
    write_json(args.json.as_deref(), &summary)?;
    if summary.missing > 0 {
        anyhow::bail!(
            "{} acknowledged messages were never popped (over {} runs)",
            summary.missing,
            args.runs
        );
    }
    Ok(())
}

/// `crest bench --against`: the configured tree (A) and the `against` topology's (B) in
/// interleaved runs.
pub(crate) async fn bench_against(
    args: &BenchArgs,
    config: crest::bench::BenchConfig,
) -> Result<()> {
    use crest::bench::{BenchComparison, BenchSummary, Target};
    let Target::Local {
        topology, data_dir, ..
    } = &config.target
    else {
        anyhow::bail!("--against compares trees the bench starts: not with --connect");
    };
    let (b_topology, b_open, b_name) = match &args.against {
        Some(against) => (
            load_topology(Some(against))?,
            args.open,
            against.display().to_string(),
        ),
        None if args.against_limits => (topology.clone(), args.open, "limits".to_string()),
        None if args.against_noisy => (topology.clone(), args.open, "noisy".to_string()),
        None => (topology.clone(), true, "no credentials".to_string()),
    };
    // Limits no workload reaches: each push is checked against all of them.
    let never = |per_second: u64| crest::sdk::Rate::of(Some(per_second), None);
    let limits = args.against_limits.then_some(crest::sdk::Limits {
        messages_max: Some(1 << 40),
        bytes_max: Some(1 << 50),
        message_bytes_max: Some(1 << 30),
        push_rate: never(1 << 30),
        push_bytes_rate: never(1 << 50),
        pop_rate: never(1 << 30),
        in_flight_max: Some(1 << 40),
        topics_max: Some(1 << 16),
    });
    let mut config = config.clone();
    if args.against_noisy {
        // Both trees rate-limit the noisy namespace; only B has its producer.
        let rate = crest::sdk::Rate {
            per_second: args.noisy_rate,
            burst: args.noisy_rate,
        };
        let limits = crest::sdk::Limits {
            push_rate: Some(rate),
            ..crest::sdk::Limits::default()
        };
        config.other_limits = vec![("noisy/".to_string(), limits)];
    }
    let noise = args.against_noisy.then(|| crest::bench::Noise {
        topic: "noisy/bench".into(),
        offered: 20.0 * args.noisy_rate as f64,
    });
    let b_config = crest::bench::BenchConfig {
        target: Target::Local {
            topology: b_topology,
            data_dir: data_dir.clone(),
            open: b_open,
        },
        limits,
        noise,
        ..config.clone()
    };
    let (mut a_runs, mut b_runs) = (Vec::new(), Vec::new());
    let mut b_runs_noise = Vec::new();
    for run in 1..=args.runs {
        // A then B, then B then A: the second run of a pair is faster (it gets memory the
        // first one gave back, which a virtual machine need not fault in again from its host), so
        // neither side may always go second.
        let mut pair = [("A", &config, &mut a_runs), ("B", &b_config, &mut b_runs)];
        if run % 2 == 0 {
            pair.reverse();
        }
        for (name, config, runs) in pair {
            let report = crest::bench::run(config.clone()).await?;
            print!("{name} run {run}/{}: {}", args.runs, report.line());
            if name == "B" {
                b_runs_noise.push(report.noise);
            }
            runs.push(report);
        }
    }
    let comparison = BenchComparison::of(BenchSummary::of(a_runs), BenchSummary::of(b_runs));
    print!("A: {}", comparison.a.table());
    print!("B ({b_name}): {}", comparison.b.table());
    print!("{}", comparison.table());
    let noise: Vec<_> = b_runs_noise.iter().flatten().collect();
    if !noise.is_empty() {
        for (run, n) in noise.iter().enumerate() {
            println!(
                "noisy neighbour, B run {}: offered {}, admitted {}, refused {}",
                run + 1,
                n.offered,
                n.admitted,
                n.refused
            );
        }
    }
    write_json(args.json.as_deref(), &comparison)?;
    let missing = comparison.a.missing + comparison.b.missing;
    if missing > 0 {
        anyhow::bail!("{missing} acknowledged messages were never popped (A and B together)");
    }
    Ok(())
}
