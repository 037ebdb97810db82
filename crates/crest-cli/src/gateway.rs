//! `crest gateway`: the SQS-compatible API as a process of its own, in front of a running
//! tree; any number of them may serve one tree (they keep no messages).

use crate::*;

#[derive(Args)]
pub(crate) struct GatewayArgs {
    /// Topology file naming the root and leaves; the embedded default if omitted.
    #[arg(long, env = "CREST_TOPOLOGY")]
    topology: Option<PathBuf>,
    /// CA certificate to trust.
    #[arg(long, env = "CREST_CA", default_value = crest::LOCAL_CA_PATH)]
    ca: PathBuf,
    /// Root address (host:port), repeatable, instead of the topology's (with --leaf).
    #[arg(long, requires = "leaf")]
    root: Vec<String>,
    /// Leaf address, repeatable, instead of the topology's (with --root).
    #[arg(long, requires = "root")]
    leaf: Vec<String>,
    /// Where the API listens.
    #[arg(long, default_value = "127.0.0.1:9324")]
    listen: std::net::SocketAddr,
    /// The access keys it accepts and the crest credential each acts with (docs/sqs.md).
    #[arg(long, env = "CREST_SQS_KEYS")]
    keys: PathBuf,
}

pub(crate) async fn gateway(args: GatewayArgs) -> Result<()> {
    let tls = ClientTls::from_file(&args.ca)
        .with_context(|| format!("no CA certificate at {}: pass --ca", args.ca.display()))?;
    let (producer, consumer) = if args.root.is_empty() {
        let topology = load_topology(args.topology.as_deref())?;
        (
            ProducerConfig::from_topology(&topology, tls.clone()),
            ConsumerConfig::from_topology(&topology, tls),
        )
    } else {
        let consumer = ConsumerConfig {
            roots: args.root.clone(),
            ..ConsumerConfig::new(String::new(), tls.clone())
        };
        (ProducerConfig::new(args.leaf.clone(), tls), consumer)
    };
    // The cluster-wide settings bound it (`gateway_*`), the defaults without a topology.
    let settings = match &args.topology {
        Some(path) => load_topology(Some(path))?.root().settings.clone(),
        None => crest::core::config::Settings::default(),
    };
    let keys = crest_gateway::keys::load(&args.keys)?;
    let count = keys.len();
    let config = crest_gateway::GatewayConfig::new(args.listen, producer, consumer, keys)
        .with_settings(&settings);
    let gateway = crest_gateway::Gateway::start(config)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    println!(
        "SQS API: http://{} ({count} access keys from {})",
        gateway.local_addr(),
        args.keys.display()
    );
    serve_until_stopped(gateway).await
}

/// Runs until SIGINT or SIGTERM.
async fn serve_until_stopped(gateway: crest_gateway::Gateway) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    gateway.stop();
    Ok(())
}

/// `crest launch --node NAME` of a `role = "gateway"` node: the topology's CA, root and
/// leaves, the gateway's keys file and settings; its HTTP socket by socket activation
/// (descriptor 3, a TCP listener) or bound to its `listen`.
pub(crate) async fn launch_gateway(
    topology_path: &Path,
    topology: &Topology,
    spec: &crest::core::topology::GatewaySpec,
    mut fds: listenfd::ListenFd,
) -> Result<()> {
    let base = base_dir(topology_path);
    let files = topology.tls.as_ref().with_context(|| {
        format!(
            "{} has no [tls] section: run `crest certs --topology {}` and add it",
            topology_path.display(),
            topology_path.display()
        )
    })?;
    let tls = ClientTls::from_file(base.join(&files.ca))?;
    let producer = ProducerConfig::from_topology(topology, tls.clone());
    let consumer = ConsumerConfig::from_topology(topology, tls);
    let keys_path = base.join(&spec.keys);
    let keys = crest_gateway::keys::load(&keys_path)?;
    let count = keys.len();
    let config = crest_gateway::GatewayConfig::new(spec.listen, producer, consumer, keys)
        .with_settings(&spec.settings);
    let gateway = if fds.len() == 0 {
        crest_gateway::Gateway::start(config)
            .await
            .with_context(|| format!("listening on {}", spec.listen))?
    } else {
        let listener = fds
            .take_tcp_listener(0)
            .context("socket activation: descriptor 3 must be the gateway's HTTP (TCP) listener")?
            .context("socket activation: descriptor 3 was already taken")?;
        crest_gateway::Gateway::start_on(config, listener)?
    };
    println!(
        "crest gateway {}: SQS API on http://{} ({count} access keys from {})",
        spec.name,
        gateway.local_addr(),
        keys_path.display()
    );
    serve_until_stopped(gateway).await
}
