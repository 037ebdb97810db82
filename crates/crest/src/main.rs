//! The `crest` command: run trees and nodes, make certificates, push and pop from a shell.

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use crest::core::topology::Topology;
use crest::core::wire::Role;
use crest::node::{LocalTree, NodeTls, StartOptions, start_node};
use crest::sdk::{
    Admin, ClientTls, Consumer, ConsumerConfig, Message, MessageId, PopOptions, Producer,
    ProducerConfig, Receipt, Settle,
};
use crest::transport::tls::CertificateAuthority;

/// mimalloc: the nodes allocate and free many small objects per message (decoded frames,
/// deliveries); glibc's allocator spent about a fifth of all CPU time on them (`perf`).
/// Transparent huge pages stay on: building it with `no_thp` took recovery from ~1.2 M to
/// ~0.9 M msgs/s (4 KiB faults for every page of a fresh index) and no longer helped pushes
/// once they stopped churning memory per message (`cargo bench --bench durable`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use crest_storage::wal::RecoveryMode;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "crest",
    version,
    about = "crest: a distributed priority queue over QUIC"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every node of a topology in this process over loopback QUIC (ephemeral certificates).
    Local {
        /// Topology file; the embedded default tree (root, 2 aggregators, 4 leaves) if omitted.
        #[arg(long)]
        topology: Option<PathBuf>,
        /// Where to write the CA certificate clients must trust.
        #[arg(long, default_value = crest::LOCAL_CA_PATH)]
        ca_out: PathBuf,
        /// Where leaves keep their logs (DATA_DIR/NAME); a restart recovers them.
        #[arg(long, default_value = ".crest/local/data")]
        data_dir: PathBuf,
        /// Keep messages in memory only (lost when the process stops).
        #[arg(long)]
        memory: bool,
    },
    /// Run one node of a topology (one command per host), with certificates from `crest certs`.
    Launch {
        /// Topology file (must have a [tls] section).
        #[arg(long)]
        topology: PathBuf,
        /// The node to run.
        #[arg(long)]
        node: String,
        /// A leaf's log directory; default: the node's `data_dir` in the topology, else
        /// `data/NAME` beside the topology file.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// What log recovery does about a bad record that is not a torn tail: refuse to start
        /// (`tolerate-torn-tail`, the default) or cut the log there, losing what follows
        /// (`truncate-corrupt`).
        #[arg(long, value_enum, default_value_t = Recovery::TolerateTornTail)]
        recovery: Recovery,
    },
    /// Make a cluster CA (or reuse the one found) and a certificate for every node of a topology.
    Certs {
        /// Topology file.
        #[arg(long)]
        topology: PathBuf,
        /// Output directory; default: the topology's [tls] cert_dir, else `certs` beside it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Push messages to the leaves.
    Push(PushArgs),
    /// Pop messages from the root (and optionally acknowledge them).
    Pop(PopArgs),
    /// Acknowledge deliveries by receipt: the messages are deleted.
    Ack(AckArgs),
    /// Give deliveries back as failed: delivered again after the delay, or dead-lettered after
    /// the topic's max_attempts.
    Nack(NackArgs),
    /// Extend the visibility timeout of deliveries.
    Extend(ExtendArgs),
    /// Dead-letter queues: list, redrive, purge.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Depths per topic and priority, in flight, delayed, dead letters, oldest message, and
    /// event counters, for the whole tree.
    Stats(StatsArgs),
    /// Load generator: N producers x M consumers against a local tree it starts (default) or a
    /// running one (--connect); reports throughput, latency percentiles and rank error.
    Bench(Box<BenchArgs>),
    /// Deterministic simulation: the real state machines under virtual time with simulated
    /// links and disks; reports rank error, inversion time, bubble-up and pop latency.
    Sim {
        /// Topology (default: the embedded local tree).
        #[arg(long)]
        topology: Option<PathBuf>,
        /// Workload file (see examples/sim/).
        #[arg(long)]
        workload: PathBuf,
        /// Seed: the same seed and files give the same report, byte for byte.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Also write the report (with its time series) as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Override a setting on every node, `name=value` (repeatable): e.g.
        /// `--set offer_swap=false` to measure what a mechanism is worth.
        #[arg(long = "set", value_name = "NAME=VALUE")]
        set: Vec<String>,
    },
    /// Offline tools for a leaf's write-ahead log.
    Wal {
        #[command(subcommand)]
        command: WalCommand,
    },
}

#[derive(Subcommand)]
enum WalCommand {
    /// List segments and record counts, verify every checksum, say where corruption is.
    /// Reads only; exits non-zero if recovery would refuse to start.
    Inspect {
        /// The leaf's log directory.
        dir: PathBuf,
    },
    /// Measure how long this disk takes to make appends durable, through the real log
    /// (group commit, fdatasync) without the network: the floor under a durable push's
    /// acknowledgement. Several logs model leaves sharing the disk; busy threads show how the
    /// latency depends on how busy the processors are.
    Bench(WalBenchArgs),
}

#[derive(Args)]
struct WalBenchArgs {
    /// Directory on the disk to measure (a fresh subdirectory is made and removed).
    #[arg(long, default_value = ".crest")]
    dir: PathBuf,
    /// Logs written at once, each by its own writer thread (leaves sharing the disk).
    #[arg(long, default_value_t = 1)]
    logs: usize,
    /// Appends per second to each log (open loop: latency counts from when an append was
    /// due); 0 = flat out with --in-flight appends outstanding per log.
    #[arg(long, default_value_t = 4000.0)]
    rate: f64,
    /// Flat out (--rate 0): appends outstanding per log.
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    /// Messages per append (a push batch).
    #[arg(long, default_value_t = 4)]
    messages_per_append: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    payload_bytes: usize,
    /// How long to append (e.g. 10s).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    duration: Duration,
    /// Threads that spin on the CPU meanwhile.
    #[arg(long, default_value_t = 0)]
    busy_threads: usize,
    /// Write without syncing (`buffered`), or sync before completing (`fsync`).
    #[arg(long, value_enum, default_value_t = DurabilityArg::Fsync)]
    durability: DurabilityArg,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum DurabilityArg {
    Fsync,
    Buffered,
}

#[derive(Subcommand)]
enum DlqCommand {
    /// List dead letters of a topic, oldest first, with reasons and attempt counts.
    List {
        #[command(flatten)]
        root: RootArgs,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// Most entries to list.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Print payloads too (UTF-8, lossy).
        #[arg(long)]
        payloads: bool,
    },
    /// Move dead letters back into their topic, attempts reset.
    Redrive {
        #[command(flatten)]
        root: RootArgs,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// Message ids (LEAF.SEQ); none: every dead letter of the topic.
        ids: Vec<MessageId>,
    },
    /// Delete dead letters.
    Purge {
        #[command(flatten)]
        root: RootArgs,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// Purge every dead letter of the topic (required when no ids are given).
        #[arg(long)]
        all: bool,
        /// Message ids (LEAF.SEQ).
        ids: Vec<MessageId>,
    },
}

/// Recovery modes, as the command line spells them.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Recovery {
    /// Cut back a torn tail of the last segment; refuse anything else.
    TolerateTornTail,
    /// Cut the log at the first bad record, discarding what follows.
    TruncateCorrupt,
}

impl From<Recovery> for RecoveryMode {
    fn from(recovery: Recovery) -> RecoveryMode {
        match recovery {
            Recovery::TolerateTornTail => RecoveryMode::TolerateTornTail,
            Recovery::TruncateCorrupt => RecoveryMode::TruncateCorrupt,
        }
    }
}

#[derive(Args)]
struct ClientArgs {
    /// Topology file naming the root and leaves; the embedded default if omitted.
    #[arg(long)]
    topology: Option<PathBuf>,
    /// CA certificate to trust.
    #[arg(long, env = "CREST_CA", default_value = crest::LOCAL_CA_PATH)]
    ca: PathBuf,
}

#[derive(Args)]
struct RootArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Root address (host:port); default: the topology's root.
    #[arg(long)]
    root: Option<String>,
}

#[derive(Args)]
struct PushArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Leaf addresses (host:port); default: every leaf of the topology.
    #[arg(long)]
    leaf: Vec<String>,
    /// Topic to push to.
    #[arg(long)]
    topic: String,
    /// Priority (0 is the most urgent).
    #[arg(long, default_value_t = crest::core::tier::NORMAL)]
    priority: u32,
    /// Metadata entries KEY=VALUE.
    #[arg(long, value_parser = parse_key_value)]
    metadata: Vec<(String, String)>,
    /// Push the payload this many times.
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// Deliver no sooner than this many milliseconds after the leaf accepts it.
    #[arg(long)]
    delay_ms: Option<u64>,
    /// Deliver no sooner than this time (RFC 3339, e.g. 2026-11-23T08:00:00Z).
    #[arg(long, value_parser = parse_time)]
    deliver_at: Option<std::time::SystemTime>,
    /// Drop the message if not consumed this many milliseconds after it is ready (0: never).
    #[arg(long)]
    ttl_ms: Option<u64>,
    /// Dedup key: a second push with it within the topic's window is not enqueued again.
    #[arg(long)]
    dedup_key: Option<String>,
    /// The payload (UTF-8 text).
    payload: String,
}

#[derive(Args)]
struct PopArgs {
    #[command(flatten)]
    root: RootArgs,
    /// Topic to pop from.
    #[arg(long)]
    topic: String,
    /// Most messages to pop.
    #[arg(long, default_value_t = 1)]
    max: u32,
    /// How long to wait for a first message, in milliseconds.
    #[arg(long, default_value_t = 0)]
    wait_ms: u64,
    /// Visibility timeout of the deliveries, in milliseconds (default: the topic's).
    #[arg(long)]
    visibility_ms: Option<u64>,
    /// Only messages with a priority at most this (0 is the most urgent).
    #[arg(long)]
    max_priority: Option<u32>,
    /// Acknowledge each delivery right away.
    #[arg(long)]
    ack: bool,
}

#[derive(Args)]
struct AckArgs {
    #[command(flatten)]
    root: RootArgs,
    /// Receipts as printed by `crest pop` (LEAF.SEQ:TOKEN).
    #[arg(required = true)]
    receipts: Vec<Receipt>,
}

#[derive(Args)]
struct NackArgs {
    #[command(flatten)]
    root: RootArgs,
    /// Delay before the messages are delivered again, in milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Why they failed (kept with the message; shown in the dead-letter queue).
    #[arg(long)]
    reason: Option<String>,
    /// Receipts as printed by `crest pop` (LEAF.SEQ:TOKEN).
    #[arg(required = true)]
    receipts: Vec<Receipt>,
}

#[derive(Args)]
struct ExtendArgs {
    #[command(flatten)]
    root: RootArgs,
    /// The new visibility timeout from now, in milliseconds.
    #[arg(long)]
    visibility_ms: u64,
    /// Receipts as printed by `crest pop` (LEAF.SEQ:TOKEN).
    #[arg(required = true)]
    receipts: Vec<Receipt>,
}

#[derive(Args)]
struct BenchArgs {
    /// Drive a running tree (its topology or --root/--leaf, and --ca) instead of starting one.
    #[arg(long)]
    connect: bool,
    /// Topology: the tree to start (default: the embedded root + 2 aggregators + 4 leaves),
    /// or with --connect, the running tree's addresses.
    #[arg(long)]
    topology: Option<PathBuf>,
    /// With --connect: CA certificate to trust.
    #[arg(long, env = "CREST_CA", default_value = crest::LOCAL_CA_PATH)]
    ca: PathBuf,
    /// With --connect: root address (default: the topology's).
    #[arg(long)]
    root: Option<String>,
    /// With --connect: leaf addresses (default: the topology's).
    #[arg(long)]
    leaf: Vec<String>,
    /// Without --connect: keep messages in memory (no write-ahead log, no fsync).
    #[arg(long)]
    memory: bool,
    /// Producer connections (each connected to every leaf).
    #[arg(long, default_value_t = 4)]
    producers: usize,
    /// Consumer connections to the root.
    #[arg(long, default_value_t = 4)]
    consumers: usize,
    /// Messages to push [default: 200000, or no limit with --duration].
    #[arg(long)]
    messages: Option<u64>,
    /// Push for this long instead (e.g. 30s); --messages still caps the count.
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Payload bytes per message (at least 24: the bench stamps each payload).
    #[arg(long, default_value_t = 100)]
    payload_bytes: usize,
    /// Priority distribution: skewed (0-9, 70/20/10 toward the least urgent), uniform[:N],
    /// fixed:P.
    #[arg(long, default_value = "skewed")]
    priorities: crest::bench::PriorityMix,
    /// Most deliveries per pop.
    #[arg(long, default_value_t = 256)]
    pop_batch: u32,
    /// Do not acknowledge deliveries.
    #[arg(long)]
    no_ack: bool,
    /// Total target push rate (messages/s); default: open loop, as fast as acknowledged.
    #[arg(long)]
    rate: Option<f64>,
    /// fill-then-drain: push all, then pop all; mixed: push and pop at once.
    #[arg(long, value_enum, default_value_t = crest::bench::Phase::FillThenDrain)]
    phase: crest::bench::Phase,
    /// Topic (default: bench on a local tree, bench-RANDOM on a running one).
    #[arg(long)]
    topic: Option<String>,
    /// Unacknowledged pushes each producer may have in flight.
    #[arg(long, default_value_t = 4096)]
    producer_window: usize,
    /// Most messages a producer hands the SDK at once (paced producers send only those due).
    #[arg(long, default_value_t = 256)]
    push_batch: usize,
    /// Ack requests each consumer keeps in flight while it pops on (pipelining).
    #[arg(long, default_value_t = 4)]
    acks_in_flight: usize,
    /// Seed of the priority draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Give up draining after this long without a pop (missing messages are reported).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    drain_idle_timeout: Duration,
    /// No progress lines.
    #[arg(long)]
    quiet: bool,
    /// Run the same benchmark this many times (each on a fresh local tree), print a line per
    /// run and the median and range of each figure (at most 100).
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// Compare with the tree of this topology (not with --connect): runs of the first tree
    /// (--topology, or the default: A) and of this tree (B) alternate in pairs, A B then B A,
    /// and the command prints each one's medians, B/A and in how many pairs B did better.
    #[arg(long)]
    against: Option<PathBuf>,
    /// Also write the report as JSON to this file (with --runs above 1: the summary, every
    /// run's report under `runs`; with --against: the comparison, each tree's summary under
    /// `a` and `b`).
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Most repetitions of `crest bench --runs`.
const BENCH_RUNS_MAX: u32 = 100;

#[derive(Args)]
struct StatsArgs {
    #[command(flatten)]
    root: RootArgs,
    /// One topic only.
    #[arg(long)]
    topic: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn parse_time(text: &str) -> Result<std::time::SystemTime, String> {
    humantime::parse_rfc3339_weak(text).map_err(|e| format!("{text:?}: {e} (want RFC 3339)"))
}

fn parse_key_value(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))
}

fn load_topology(path: Option<&Path>) -> Result<Topology> {
    match path {
        None => Ok(Topology::parse(crest::DEFAULT_TOPOLOGY).context("embedded default topology")?),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Topology::parse(&text).with_context(|| format!("in {}", path.display()))
        }
    }
}

fn base_dir(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Local {
            topology,
            ca_out,
            data_dir,
            memory,
        } => {
            init_tracing("info");
            let data_dir = (!memory).then_some(data_dir);
            local(topology.as_deref(), &ca_out, data_dir.as_deref()).await
        }
        Command::Launch {
            topology,
            node,
            data_dir,
            recovery,
        } => {
            init_tracing("info");
            launch(&topology, &node, data_dir, recovery.into()).await
        }
        Command::Certs { topology, out } => certs(&topology, out),
        Command::Push(args) => {
            init_tracing("warn");
            push(args).await
        }
        Command::Pop(args) => {
            init_tracing("warn");
            pop(args).await
        }
        Command::Ack(args) => {
            init_tracing("warn");
            settle(&args.root, Settle::Ack, &args.receipts).await
        }
        Command::Nack(args) => {
            init_tracing("warn");
            let op = Settle::Nack {
                delay_ms: args.delay_ms,
                reason: args.reason,
            };
            settle(&args.root, op, &args.receipts).await
        }
        Command::Extend(args) => {
            init_tracing("warn");
            let op = Settle::Extend {
                lease_ms: args.visibility_ms,
            };
            settle(&args.root, op, &args.receipts).await
        }
        Command::Dlq { command } => {
            init_tracing("warn");
            dlq(command).await
        }
        Command::Stats(args) => {
            init_tracing("warn");
            stats(args).await
        }
        Command::Sim {
            topology,
            workload,
            seed,
            json,
            set,
        } => sim(topology.as_deref(), &workload, seed, json.as_deref(), &set),
        Command::Bench(args) => {
            init_tracing("warn");
            bench(*args).await
        }
        Command::Wal {
            command: WalCommand::Inspect { dir },
        } => wal_inspect(&dir),
        Command::Wal {
            command: WalCommand::Bench(args),
        } => wal_bench(args).await,
    }
}

async fn local(topology_path: Option<&Path>, ca_out: &Path, data_dir: Option<&Path>) -> Result<()> {
    let topology = load_topology(topology_path)?;
    let tree = LocalTree::start_with(&topology, data_dir).await?;
    if let Some(dir) = ca_out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(ca_out, &tree.ca_pem)
        .with_context(|| format!("writing {}", ca_out.display()))?;
    let connected = tree.wait_connected(Duration::from_secs(10)).await;
    println!(
        "crest local tree is up ({} nodes{})",
        tree.nodes.len(),
        if connected { "" } else { ", still connecting" }
    );
    for node in &tree.nodes {
        let parent = topology
            .node(node.name())
            .and_then(|n| n.parent.clone())
            .unwrap_or_default();
        println!(
            "  {:<10} {:<10} {:<22} {:<10} {}",
            node.name(),
            node.role().to_string(),
            node.local_addr(),
            parent,
            node.http_addr()
                .map(|addr| format!("http://{addr}/metrics"))
                .unwrap_or_default()
        );
    }
    let root = tree
        .nodes
        .iter()
        .find(|n| n.role() == Role::Root)
        .expect("a root");
    let leaves: Vec<String> = tree
        .nodes
        .iter()
        .filter(|n| n.role() == Role::Leaf)
        .map(|n| n.local_addr().to_string())
        .collect();
    println!("producers push to the leaves: {}", leaves.join(", "));
    println!("consumers pop from the root:  {}", root.local_addr());
    println!("clients trust the CA in:      {}", ca_out.display());
    if let Some(http) = root.http_addr() {
        println!("dashboard:                    http://{http}/");
    }
    match data_dir {
        Some(dir) => println!(
            "leaves keep their logs in:    {} (fsync before ack)",
            dir.display()
        ),
        None => println!("leaves keep messages in memory only (--memory)"),
    }
    println!(
        "try:  crest push --topic jobs --priority 1 hello   then   crest pop --topic jobs --ack"
    );
    println!("Ctrl-C stops the tree.");
    tokio::signal::ctrl_c().await?;
    println!("stopping");
    tree.shutdown().await;
    Ok(())
}

async fn launch(
    topology_path: &Path,
    name: &str,
    data_dir: Option<PathBuf>,
    recovery: RecoveryMode,
) -> Result<()> {
    let topology = load_topology(Some(topology_path))?;
    let tls =
        NodeTls::from_files(&topology, name, &base_dir(topology_path))?.with_context(|| {
            format!(
                "{} has no [tls] section: run `crest certs --topology {}` and add it",
                topology_path.display(),
                topology_path.display()
            )
        })?;
    let spec = topology
        .node(name)
        .with_context(|| format!("node {name:?} is not in the topology"))?;
    let data_dir = match (data_dir, &spec.data_dir) {
        (Some(dir), _) => dir,
        (None, Some(dir)) => base_dir(topology_path).join(dir),
        (None, None) => base_dir(topology_path).join("data").join(name),
    };
    let durable = spec.role == Role::Leaf;
    let options = StartOptions {
        data_dir: durable.then(|| data_dir.clone()),
        recovery,
        addresses: None,
        direct_links_start: None,
    };
    let node = start_node(&topology, name, &tls, &options).await?;
    if durable {
        println!("log directory: {}", data_dir.display());
    }
    println!(
        "crest node {} ({}) listening on {}",
        node.name(),
        node.role(),
        node.local_addr()
    );
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = terminate.recv() => {}
    }
    node.shutdown().await;
    Ok(())
}

fn certs(topology_path: &Path, out: Option<PathBuf>) -> Result<()> {
    let topology = load_topology(Some(topology_path))?;
    let base = base_dir(topology_path);
    let out = match (out, &topology.tls) {
        (Some(out), _) => out,
        (None, Some(tls)) => base.join(&tls.cert_dir),
        (None, None) => base.join("certs"),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let (ca_cert, ca_key) = (out.join("ca.pem"), out.join("ca.key"));
    let ca = if ca_cert.exists() && ca_key.exists() {
        println!("reusing the CA in {}", out.display());
        {
            let read = |p: &Path| {
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
            };
            CertificateAuthority::load(&read(&ca_cert)?, &read(&ca_key)?)?
        }
    } else {
        let ca = CertificateAuthority::generate()?;
        std::fs::write(&ca_cert, ca.cert_pem())?;
        write_private(&ca_key, ca.key_pem())?;
        println!(
            "made a new CA: {} (keep {} off the nodes)",
            ca_cert.display(),
            ca_key.display()
        );
        ca
    };
    for spec in &topology.nodes {
        let tls = NodeTls::issue(&ca, spec)?;
        std::fs::write(out.join(format!("{}.pem", spec.name)), &tls.node.cert_pem)?;
        write_private(&out.join(format!("{}.key", spec.name)), &tls.node.key_pem)?;
        println!("  {}: {}.pem, {}.key", spec.name, spec.name, spec.name);
    }
    Ok(())
}

fn write_private(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}

fn client_tls(args: &ClientArgs) -> Result<ClientTls> {
    ClientTls::from_file(&args.ca).with_context(|| {
        format!(
            "no CA certificate at {}: start `crest local` here, or pass --ca",
            args.ca.display()
        )
    })
}

async fn push(args: PushArgs) -> Result<()> {
    let tls = client_tls(&args.client)?;
    let leaves = if args.leaf.is_empty() {
        load_topology(args.client.topology.as_deref())?
            .leaves()
            .map(|l| l.address.clone())
            .collect()
    } else {
        args.leaf.clone()
    };
    let producer = Producer::connect(ProducerConfig::new(leaves, tls)).await?;
    let mut handles = Vec::with_capacity(args.count as usize);
    for _ in 0..args.count {
        let mut message = Message::new(args.topic.clone(), args.payload.clone().into_bytes())
            .priority(args.priority);
        if let Some(delay) = args.delay_ms {
            message = message.deliver_after(Duration::from_millis(delay));
        }
        if let Some(at) = args.deliver_at {
            message = message.deliver_at(at);
        }
        if let Some(ttl) = args.ttl_ms {
            message = message.ttl(Duration::from_millis(ttl));
        }
        if let Some(key) = &args.dedup_key {
            message = message.dedup_key(key.clone());
        }
        for (key, value) in &args.metadata {
            message = message.metadata(key.clone(), value.clone());
        }
        handles.push(producer.send(message).await?);
    }
    for handle in handles {
        println!("{}", handle.acked().await?);
    }
    Ok(())
}

fn root_address(args: &RootArgs) -> Result<String> {
    match &args.root {
        Some(root) => Ok(root.clone()),
        None => Ok(load_topology(args.client.topology.as_deref())?
            .root()
            .address
            .clone()),
    }
}

fn root_config(args: &RootArgs) -> Result<ConsumerConfig> {
    Ok(ConsumerConfig::new(
        root_address(args)?,
        client_tls(&args.client)?,
    ))
}

async fn pop(args: PopArgs) -> Result<()> {
    let consumer = Consumer::connect(root_config(&args.root)?).await?;
    let options = PopOptions {
        max: args.max,
        wait: Duration::from_millis(args.wait_ms),
        visibility: args.visibility_ms.map(Duration::from_millis),
        max_priority: args.max_priority,
    };
    let deliveries = consumer.pop_with(&args.topic, options).await?;
    if deliveries.is_empty() {
        println!("(no message ready)");
    }
    for delivery in &deliveries {
        println!(
            "id={} priority={} attempt={} receipt={} payload={}",
            delivery.id,
            delivery.priority,
            delivery.attempt,
            delivery.receipt(),
            String::from_utf8_lossy(&delivery.payload)
        );
    }
    if args.ack && !deliveries.is_empty() {
        let receipts: Vec<Receipt> = deliveries.iter().map(|d| d.receipt()).collect();
        for (receipt, result) in receipts.iter().zip(consumer.ack_many(&receipts).await?) {
            match result {
                Ok(()) => println!("acked {}", receipt.id),
                Err(error) => println!("ack {} failed: {error}", receipt.id),
            }
        }
    }
    Ok(())
}

/// Acks, nacks or extends deliveries by receipt; fails if any receipt was refused.
async fn settle(root: &RootArgs, op: Settle, receipts: &[Receipt]) -> Result<()> {
    let consumer = Consumer::connect(root_config(root)?).await?;
    let verb = op.name();
    let mut failed = 0;
    for (receipt, result) in receipts.iter().zip(consumer.settle(op, receipts).await?) {
        match result {
            Ok(()) => println!("{verb} {}: ok", receipt.id),
            Err(error) => {
                failed += 1;
                println!("{verb} {} failed: {error}", receipt.id);
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} receipts were refused", receipts.len());
    }
    Ok(())
}

fn warn_unreachable(unreachable: &[crest::sdk::LeafId]) {
    if !unreachable.is_empty() {
        let list: Vec<String> = unreachable.iter().map(|l| l.to_string()).collect();
        eprintln!(
            "warning: leaves {} could not be reached; the answer leaves them out",
            list.join(", ")
        );
    }
}

async fn dlq(command: DlqCommand) -> Result<()> {
    match command {
        DlqCommand::List {
            root,
            topic,
            limit,
            payloads,
        } => {
            let admin = Admin::connect(root_config(&root)?).await?;
            let answer = admin.dead_letters(&topic, limit).await?;
            warn_unreachable(&answer.unreachable);
            if answer.value.is_empty() {
                println!("(no dead letters in {topic})");
            }
            for dead in &answer.value {
                print!(
                    "id={} priority={} attempts={} enqueued={} died={} reason={:?}",
                    dead.id,
                    dead.priority,
                    dead.attempts,
                    format_time(dead.enqueued_at),
                    format_time(dead.dead_at),
                    dead.reason
                );
                if payloads {
                    print!(" payload={}", String::from_utf8_lossy(&dead.payload));
                }
                println!();
            }
        }
        DlqCommand::Redrive { root, topic, ids } => {
            let admin = Admin::connect(root_config(&root)?).await?;
            let answer = admin.redrive(&topic, &ids).await?;
            warn_unreachable(&answer.unreachable);
            println!("redrove {} dead letters into {topic}", answer.value);
        }
        DlqCommand::Purge {
            root,
            topic,
            all,
            ids,
        } => {
            if ids.is_empty() && !all {
                bail!(
                    "name the dead letters to purge, or pass --all to purge every one of {topic}"
                );
            }
            let admin = Admin::connect(root_config(&root)?).await?;
            let answer = admin.purge(&topic, &ids).await?;
            warn_unreachable(&answer.unreachable);
            println!("purged {} dead letters of {topic}", answer.value);
        }
    }
    Ok(())
}

fn format_time(time: crest::sdk::Time) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_micros(time.as_micros());
    humantime::format_rfc3339_millis(at).to_string()
}

async fn stats(args: StatsArgs) -> Result<()> {
    let admin = Admin::connect(root_config(&args.root)?).await?;
    let answer = admin.stats(args.topic.as_deref()).await?;
    warn_unreachable(&answer.unreachable);
    let stats = answer.value;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
        return Ok(());
    }
    let now = std::time::SystemTime::now();
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>8} {:>12}  ready by priority",
        "topic", "ready", "delayed", "in flight", "dead", "oldest"
    );
    for topic in &stats.topics {
        let oldest = topic.oldest_enqueued_at.map_or("-".into(), |at| {
            let at = std::time::UNIX_EPOCH + Duration::from_micros(at.as_micros());
            let age = now.duration_since(at).unwrap_or_default();
            humantime::format_duration(Duration::from_secs(age.as_secs())).to_string()
        });
        let by_priority: Vec<String> = topic
            .ready
            .iter()
            .map(|(priority, count)| format!("{priority}:{count}"))
            .collect();
        println!(
            "{:<24} {:>10} {:>10} {:>10} {:>8} {:>12}  {}",
            topic.topic,
            topic.ready_total(),
            topic.delayed,
            topic.in_flight,
            topic.dead,
            oldest,
            by_priority.join(" ")
        );
    }
    println!(
        "expired {}, dead-lettered {}, deduplicated {} (since each leaf started)",
        stats.expired, stats.dead_lettered, stats.deduplicated
    );
    Ok(())
}

fn sim(
    topology: Option<&Path>,
    workload_path: &Path,
    seed: u64,
    json: Option<&Path>,
    set: &[String],
) -> Result<()> {
    let mut topology = load_topology(topology)?;
    for assignment in set {
        topology
            .set_setting(assignment)
            .with_context(|| format!("--set {assignment}"))?;
    }
    let text = std::fs::read_to_string(workload_path)
        .with_context(|| format!("reading {}", workload_path.display()))?;
    let workload = crest::sim::Workload::parse(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", workload_path.display()))?;
    let report = crest::sim::run(&topology, &workload, seed)?;
    print!("{}", report.text());
    write_json(json, &report)?;
    let violations = report.violations();
    if !violations.is_empty() {
        bail!(
            "invariants violated: {}; reproduce with --seed {seed} and the same files",
            violations.join("; ")
        );
    }
    Ok(())
}

async fn bench(args: BenchArgs) -> Result<()> {
    use crest::bench::{BenchConfig, Target};
    if !(1..=BENCH_RUNS_MAX).contains(&args.runs) {
        anyhow::bail!("--runs must be 1 to {BENCH_RUNS_MAX}, not {}", args.runs);
    }
    if args.connect && args.against.is_some() {
        anyhow::bail!("--against compares trees the bench starts: not with --connect");
    }
    let topology = load_topology(args.topology.as_deref())?;
    let target = if args.connect {
        let leaves = if args.leaf.is_empty() {
            topology.leaves().map(|l| l.address.clone()).collect()
        } else {
            args.leaf.clone()
        };
        let root = args
            .root
            .clone()
            .unwrap_or_else(|| topology.root().address.clone());
        let tls = ClientTls::from_file(&args.ca)
            .with_context(|| format!("no CA certificate at {}: pass --ca", args.ca.display()))?;
        Target::Remote { leaves, root, tls }
    } else {
        let data_dir = (!args.memory)
            .then(|| std::env::temp_dir().join(format!("crest-bench-{}", std::process::id())));
        Target::Local { topology, data_dir }
    };
    let topic = args.topic.clone().unwrap_or_else(|| {
        if args.connect {
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
        pop_batch: args.pop_batch,
        ack: !args.no_ack,
        rate: args.rate,
        phase: args.phase,
        topic,
        producer_window: args.producer_window,
        push_batch: args.push_batch,
        acks_in_flight: args.acks_in_flight,
        drain_idle_timeout: args.drain_idle_timeout,
        progress: (!args.quiet).then_some(Duration::from_secs(1)),
        seed: args.seed,
        ..BenchConfig::reference(target)
    };
    if let Some(against) = &args.against {
        return bench_against(&args, config, against).await;
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
async fn bench_against(
    args: &BenchArgs,
    config: crest::bench::BenchConfig,
    against: &Path,
) -> Result<()> {
    use crest::bench::{BenchComparison, BenchSummary, Target};
    let Target::Local { data_dir, .. } = &config.target else {
        anyhow::bail!("--against compares trees the bench starts: not with --connect");
    };
    let b_config = crest::bench::BenchConfig {
        target: Target::Local {
            topology: load_topology(Some(against))?,
            data_dir: data_dir.clone(),
        },
        ..config.clone()
    };
    let (mut a_runs, mut b_runs) = (Vec::new(), Vec::new());
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
            runs.push(report);
        }
    }
    let comparison = BenchComparison::of(BenchSummary::of(a_runs), BenchSummary::of(b_runs));
    print!("A: {}", comparison.a.table());
    print!("B ({}): {}", against.display(), comparison.b.table());
    print!("{}", comparison.table());
    write_json(args.json.as_deref(), &comparison)?;
    let missing = comparison.a.missing + comparison.b.missing;
    if missing > 0 {
        anyhow::bail!("{missing} acknowledged messages were never popped (A and B together)");
    }
    Ok(())
}

async fn wal_bench(args: WalBenchArgs) -> Result<()> {
    let config = crest::wal_bench::WalBenchConfig {
        dir: args.dir,
        logs: args.logs,
        rate: args.rate,
        in_flight: args.in_flight,
        messages_per_append: args.messages_per_append,
        payload_bytes: args.payload_bytes,
        duration: args.duration,
        busy_threads: args.busy_threads,
        durability: match args.durability {
            DurabilityArg::Fsync => crest::core::config::Durability::Fsync,
            DurabilityArg::Buffered => crest::core::config::Durability::Buffered,
        },
    };
    // The writers and submitters are threads; keep the runtime's workers out of their way.
    let report = tokio::task::spawn_blocking(move || crest::wal_bench::run(&config)).await??;
    print!("{}", report.table());
    write_json(args.json.as_deref(), &report)?;
    Ok(())
}

/// Writes `value` as pretty JSON to `path`, if one was given (the `--json FILE` of the
/// benchmark and simulation commands).
fn write_json(path: Option<&Path>, value: &impl serde::Serialize) -> Result<()> {
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_string_pretty(value)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn wal_inspect(dir: &Path) -> Result<()> {
    let max = crest::core::config::Settings::default().frame_bytes_max;
    let report = crest::storage::inspect::inspect(dir, max)?;
    if report.segments.is_empty() {
        println!("{}: no log segments", dir.display());
    }
    for segment in &report.segments {
        let preallocated = if segment.bytes > segment.written {
            format!(" (file {} bytes, preallocated)", segment.bytes)
        } else {
            String::new()
        };
        println!(
            "{}  {:>12} bytes  {:>9} records  {}{preallocated}",
            segment.name,
            segment.written,
            segment.records,
            segment.problem.as_deref().unwrap_or("ok")
        );
    }
    let entries: Vec<String> = crest::storage::inspect::ENTRY_KINDS
        .iter()
        .zip(report.entries)
        .map(|(kind, count)| format!("{count} {kind}"))
        .collect();
    println!(
        "{} segments; entries: {}; {} messages live",
        report.segments.len(),
        entries.join(", "),
        report.live_messages
    );
    if report.is_fatal() {
        bail!("the log is corrupt: recovery would refuse to start (see `crest launch --recovery`)");
    }
    Ok(())
}
