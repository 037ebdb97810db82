//! The `crest` command: run trees and nodes, make certificates, push and pop from a shell.

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use crest::core::topology::Topology;
use crest::core::wire::Role;
use crest::node::{LocalTree, NodeTls, StartOptions, start_node};
use crest::sdk::{
    ClientTls, Consumer, ConsumerConfig, Message, PopOptions, Producer, ProducerConfig, Receipt,
};
use crest::transport::tls::CertificateAuthority;
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
    /// Acknowledge deliveries by receipt.
    Ack(AckArgs),
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
    /// The payload (UTF-8 text).
    payload: String,
}

#[derive(Args)]
struct PopArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Root address (host:port); default: the topology's root.
    #[arg(long)]
    root: Option<String>,
    /// Topic to pop from.
    #[arg(long)]
    topic: String,
    /// Most messages to pop.
    #[arg(long, default_value_t = 1)]
    max: u32,
    /// How long to wait for a first message, in milliseconds.
    #[arg(long, default_value_t = 0)]
    wait_ms: u64,
    /// Visibility timeout of the deliveries, in milliseconds (default: the root's).
    #[arg(long)]
    visibility_ms: Option<u64>,
    /// Acknowledge each delivery right away.
    #[arg(long)]
    ack: bool,
}

#[derive(Args)]
struct AckArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Root address (host:port); default: the topology's root.
    #[arg(long)]
    root: Option<String>,
    /// Receipts as printed by `crest pop` (LEAF.SEQ:TOKEN).
    #[arg(required = true)]
    receipts: Vec<Receipt>,
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
            ack(args).await
        }
        Command::Wal {
            command: WalCommand::Inspect { dir },
        } => wal_inspect(&dir),
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
            "  {:<10} {:<10} {:<22} {}",
            node.name(),
            node.role().to_string(),
            node.local_addr(),
            parent
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

fn root_address(client: &ClientArgs, root: &Option<String>) -> Result<String> {
    match root {
        Some(root) => Ok(root.clone()),
        None => Ok(load_topology(client.topology.as_deref())?
            .root()
            .address
            .clone()),
    }
}

async fn pop(args: PopArgs) -> Result<()> {
    let tls = client_tls(&args.client)?;
    let consumer = Consumer::connect(ConsumerConfig::new(
        root_address(&args.client, &args.root)?,
        tls,
    ))
    .await?;
    let options = PopOptions {
        max: args.max,
        wait: Duration::from_millis(args.wait_ms),
        visibility: args.visibility_ms.map(Duration::from_millis),
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

async fn ack(args: AckArgs) -> Result<()> {
    let tls = client_tls(&args.client)?;
    let consumer = Consumer::connect(ConsumerConfig::new(
        root_address(&args.client, &args.root)?,
        tls,
    ))
    .await?;
    let mut failed = 0;
    for (receipt, result) in args
        .receipts
        .iter()
        .zip(consumer.ack_many(&args.receipts).await?)
    {
        match result {
            Ok(()) => println!("acked {}", receipt.id),
            Err(error) => {
                failed += 1;
                println!("ack {} failed: {error}", receipt.id);
            }
        }
    }
    if failed > 0 {
        bail!(
            "{failed} of {} acknowledgements failed",
            args.receipts.len()
        );
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
        println!(
            "{}  {:>12} bytes  {:>9} records  {}",
            segment.name,
            segment.bytes,
            segment.records,
            segment.problem.as_deref().unwrap_or("ok")
        );
    }
    let [enqueue, lease, delete, release] = report.entries;
    println!(
        "{} segments; entries: {enqueue} enqueue, {lease} lease, {delete} delete, {release} release; \
         {} messages live",
        report.segments.len(),
        report.live_messages
    );
    if report.is_fatal() {
        bail!("the log is corrupt: recovery would refuse to start (see `crest launch --recovery`)");
    }
    Ok(())
}
