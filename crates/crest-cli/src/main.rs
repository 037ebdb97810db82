//! The `crest` command: run trees and nodes, make certificates, push and pop from a shell.

mod admin;
mod bench;
mod client;
mod gateway;
mod node;
mod otlp;
mod sim;
mod sqs_bench;
mod status;
mod token;
mod topic;
mod wal;

use admin::*;
use bench::*;
use client::*;
use gateway::*;
use node::*;
use sim::*;
use sqs_bench::*;
use token::*;
use topic::*;
use wal::*;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use crest::core::topology::Topology;
use crest::core::wire::Role;
use crest::node::{LocalTree, NodeSockets, NodeTls, SocketBook, StartOptions, start_node};
use crest::sdk::{
    Admin, ClientTls, Consumer, ConsumerConfig, Credential, Message, MessageId, PopOptions,
    Producer, ProducerConfig, Receipt, Settle,
};
use crest::transport::tls::CertificateAuthority;

/// mimalloc: the nodes allocate and free many small objects per message (decoded frames,
/// deliveries); glibc's allocator spent about a fifth of all CPU time on them (`perf`).
/// Transparent huge pages are off (see [`no_huge_pages`]).
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
    /// How log lines are written to stderr: `text` for people, `json` (one JSON object per
    /// line: time, level, target, the event's fields and its spans') for log pipelines.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "CREST_LOG_FORMAT"
    )]
    log_format: LogFormat,
}

/// Where the nodes a command runs export their spans.
#[derive(clap::Args, Debug)]
struct Export {
    /// Export each message's spans (push, offer, reserve, delivery, ack) to this OpenTelemetry
    /// collector over OTLP/HTTP (its base URL, e.g. `http://127.0.0.1:4318`; spans go to its
    /// `/v1/traces`). A message whose metadata holds a W3C `traceparent` joins that trace.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
}

/// See [`Cli::log_format`].
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Whether logs are JSON lines (set once from the command line, before any logging starts).
static LOG_JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[derive(Subcommand)]
enum Command {
    /// Run every node of a topology in this process over loopback QUIC (ephemeral certificates).
    Local {
        /// Topology file; the embedded default tree (root, 2 aggregators, 4 leaves) if omitted.
        #[arg(long, env = "CREST_TOPOLOGY")]
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
        /// Where the Amazon SQS-compatible API listens (docs/sqs.md).
        #[arg(long, default_value = "127.0.0.1:9324")]
        sqs: std::net::SocketAddr,
        /// Run without the SQS-compatible API.
        #[arg(long)]
        no_sqs: bool,
        #[command(flatten)]
        export: Export,
    },
    /// Serve the Amazon SQS-compatible API in front of a running tree (docs/sqs.md).
    Gateway(GatewayArgs),
    /// Load the SQS-compatible API: batched sends, then receives and deletes, with
    /// throughput and call latency (docs/sqs.md).
    SqsBench(SqsBenchArgs),
    /// Run one node of a topology (one command per host), with certificates from `crest certs`.
    Launch {
        /// Topology file (must have a [tls] section).
        #[arg(long, env = "CREST_TOPOLOGY")]
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
        /// Access file (`crest token create`): producers and consumers must prove one of its
        /// principals, and may do what it grants. Without it, any client trusting the CA may
        /// do anything.
        #[arg(long, env = "CREST_ACCESS")]
        access: Option<PathBuf>,
        #[command(flatten)]
        export: Export,
    },
    /// Make a cluster CA (or reuse the one found) and a certificate for every node of a topology.
    Certs {
        /// Topology file.
        #[arg(long, env = "CREST_TOPOLOGY")]
        topology: PathBuf,
        /// Output directory; default: the topology's [tls] cert_dir, else `certs` beside it.
        #[arg(long)]
        out: Option<PathBuf>,
        /// How long the certificates are valid (e.g. `365d`, `12h`).
        #[arg(long, default_value = "365d", value_parser = humantime::parse_duration)]
        valid_for: std::time::Duration,
        /// Issue a client certificate for this principal instead (repeatable), from the CA
        /// already in the output directory: `clients/NAME.pem` holds the certificate and key.
        #[arg(long, value_name = "NAME")]
        client: Vec<String>,
    },
    /// API tokens and grants of an access file: create, list, revoke, grant.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
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
    /// Settle leases by message id, whoever they were delivered to (needs `admin`): release
    /// the lease of a consumer that hangs, ack for one that is gone.
    Lease {
        #[command(subcommand)]
        command: LeaseCommand,
    },
    /// Topic configurations the tree keeps: delivery policy set at run time, attributes,
    /// quotas.
    Topic {
        #[command(subcommand)]
        command: TopicCommand,
    },
    /// Namespaces' quotas, enforced over the whole tree (needs `admin` on the namespace).
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Delete every ready and delayed message of a topic (leased messages and dead letters
    /// stay; needs `admin`).
    Purge(PurgeArgs),
    /// Change the priority of a waiting message (an escalation, logged with who, when and why;
    /// needs `admin`): it moves in the tree at once.
    Reprioritize(ReprioritizeArgs),
    /// Replace the metadata of a waiting message (needs `admin`): its deliveries carry the new
    /// pairs from now on.
    SetMetadata(SetMetadataArgs),
    /// Depths per topic and priority, in flight, delayed, dead letters, oldest message, and
    /// event counters, for the whole tree.
    Stats(StatsArgs),
    /// Every node of a topology as its HTTP /healthz says: up or down, the root in charge, and
    /// each replicated leaf's leader, followers and their lag.
    Status {
        /// Topology file (the nodes' `http` addresses are read); the embedded default (the
        /// tree `crest local` runs) if omitted.
        #[arg(long, env = "CREST_TOPOLOGY")]
        topology: Option<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
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
        /// Run this many seeds from --seed on, one line each, and fail naming every seed
        /// that broke an invariant (a swarm: e.g. `--seeds 1000` overnight).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        seeds: u64,
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
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::{FilterExt, filter_fn};
    use tracing_subscriber::fmt::format::FmtSpan;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
            // Raft's own logs (every vote, every start) are for debugging a group, not for
            // running one: the replica logs what an operator needs.
            tracing_subscriber::EnvFilter::new(format!("{default},openraft=warn,chunked_wal=warn"))
        })
    };
    let message = |m: &tracing::Metadata<'_>| m.target() == crest::core::trace::TARGET;
    // Events as lines; and the message spans, which have no events of their own, as a line
    // each when they close (`RUST_LOG=crest::message=trace`), other crates' spans not.
    let lines = |spans: FmtSpan| {
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_span_events(spans);
        if LOG_JSON.load(std::sync::atomic::Ordering::Relaxed) {
            layer
                .json()
                .with_current_span(true)
                .with_span_list(true)
                .boxed()
        } else {
            layer.boxed()
        }
    };
    // By target alone: `crest::trace::enabled` asks with a hint, neither span nor event.
    let spans = filter().and(filter_fn(message));
    let mut layers = vec![
        lines(FmtSpan::NONE).with_filter(filter()).boxed(),
        lines(FmtSpan::CLOSE).with_filter(spans).boxed(),
    ];
    if let Some(exporter) = otlp::layer() {
        let exported = tracing_subscriber::filter::Targets::new()
            .with_target(crest::core::trace::TARGET, tracing::Level::TRACE);
        layers.push(exporter.with_filter(exported).boxed());
    }
    tracing_subscriber::registry().with(layers).init();
}

/// Turns transparent huge pages off for this process, unless `MIMALLOC_ALLOW_THP` in the
/// environment decides. A fresh process on a machine whose free memory went back to its host
/// (a virtual machine left idle a while) pays for each fresh 2 MiB page as the kernel zeroes
/// it on first touch: with huge pages a cold node pushed at half the rate of a warm one, and
/// held twice the memory (docs/performance.md, **Fresh memory**). Rebuilding a leaf from its
/// log is as fast without; from a checkpoint about a tenth slower.
fn no_huge_pages() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none()
        && let Err(error) = rustix::thread::disable_transparent_huge_pages(true)
    {
        eprintln!("warning: transparent huge pages stay on: {error}");
    }
}

fn main() -> std::process::ExitCode {
    no_huge_pages();
    // Every file and directory crest makes (logs, Raft logs, snapshots, keys, tokens) is
    // its owner's alone: payloads and secrets are not for other local users. The mask
    // reaches what the libraries crest runs create too (the Raft log's files).
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let cli = Cli::parse();
    let export = match &cli.command {
        Command::Local { export, .. } | Command::Launch { export, .. } => Some(export),
        _ => None,
    };
    if let Some(endpoint) = export.and_then(|e| e.otlp_endpoint.as_ref())
        && let Err(error) = otlp::start(endpoint)
    {
        eprintln!("error: cannot export traces to {endpoint}: {error:#}");
        return std::process::ExitCode::FAILURE;
    }
    LOG_JSON.store(
        cli.log_format == LogFormat::Json,
        std::sync::atomic::Ordering::Relaxed,
    );
    // Read (and unset) the socket-activation variables while this is the only thread.
    let listen_fds = listenfd::ListenFd::from_env();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(run(cli, listen_fds));
    drop(runtime);
    otlp::shutdown();
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli, listen_fds: listenfd::ListenFd) -> Result<()> {
    match cli.command {
        Command::Local {
            topology,
            ca_out,
            data_dir,
            memory,
            sqs,
            no_sqs,
            export: _,
        } => {
            init_tracing("info");
            let data_dir = (!memory).then_some(data_dir);
            let sqs = (!no_sqs).then_some(sqs);
            local(topology.as_deref(), &ca_out, data_dir.as_deref(), sqs).await
        }
        Command::Launch {
            topology,
            node,
            data_dir,
            recovery,
            access,
            export: _,
        } => {
            init_tracing("info");
            let how = Launch {
                data_dir,
                recovery: recovery.into(),
                access,
            };
            launch(&topology, &node, how, listen_fds).await
        }
        Command::Certs {
            topology,
            out,
            valid_for,
            client,
        } => certs(&topology, out, valid_for, &client),
        Command::Token { command } => token(command),
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
        Command::Lease { command } => {
            init_tracing("warn");
            lease(command).await
        }
        Command::Topic { command } => {
            init_tracing("warn");
            topic(command).await
        }
        Command::Policy { command } => {
            init_tracing("warn");
            policy(command).await
        }
        Command::Purge(args) => {
            init_tracing("warn");
            admin::purge(args).await
        }
        Command::Reprioritize(args) => {
            init_tracing("warn");
            admin::reprioritize(args).await
        }
        Command::SetMetadata(args) => {
            init_tracing("warn");
            admin::set_metadata(args).await
        }
        Command::Stats(args) => {
            init_tracing("warn");
            stats(args).await
        }
        Command::Status { topology, json } => {
            status::status(load_topology(topology.as_deref())?, json).await
        }
        Command::Sim {
            topology,
            workload,
            seed,
            seeds,
            json,
            set,
        } => sim(
            topology.as_deref(),
            &workload,
            seed..seed.saturating_add(seeds),
            json.as_deref(),
            &set,
        ),
        Command::Gateway(args) => {
            init_tracing("info");
            gateway(args).await
        }
        Command::SqsBench(args) => {
            init_tracing("warn");
            sqs_bench(args).await
        }
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

/// Writes `value` as pretty JSON to `path`, if one was given (the `--json FILE` of the
/// benchmark and simulation commands).
fn write_json(path: Option<&Path>, value: &impl serde::Serialize) -> Result<()> {
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_string_pretty(value)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
