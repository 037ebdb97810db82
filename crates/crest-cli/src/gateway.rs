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
    let keys = crest_gateway::keys::load(&args.keys)?;
    let count = keys.len();
    let config = crest_gateway::GatewayConfig::new(args.listen, producer, consumer, keys);
    let gateway = crest_gateway::Gateway::start(config)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    println!(
        "SQS API: http://{} ({count} access keys from {})",
        gateway.local_addr(),
        args.keys.display()
    );
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    gateway.stop();
    Ok(())
}
