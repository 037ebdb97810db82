//! Client commands: `crest push`, `crest pop`, `crest ack`, `crest nack`, `crest extend`.

use crate::*;

#[derive(Args)]
pub(crate) struct ClientArgs {
    /// Topology file naming the root and leaves; the embedded default if omitted.
    #[arg(long, env = "CREST_TOPOLOGY")]
    pub(crate) topology: Option<PathBuf>,
    /// CA certificate to trust.
    #[arg(long, env = "CREST_CA", default_value = crest::LOCAL_CA_PATH)]
    pub(crate) ca: PathBuf,
    #[command(flatten)]
    pub(crate) credentials: CredentialArgs,
}

/// How a client proves its principal to a tree with access control.
#[derive(Args)]
pub(crate) struct CredentialArgs {
    /// API token (`crest token create`). With neither this nor --credentials, and the
    /// default --ca, the token `crest local` wrote beside its CA is used.
    #[arg(long, env = "CREST_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// File holding an API token, or a client certificate and its key in PEM
    /// (`crest certs --client NAME`).
    #[arg(long, env = "CREST_CREDENTIALS", conflicts_with = "token")]
    pub(crate) credentials: Option<PathBuf>,
}

impl CredentialArgs {
    /// The credential these arguments name, for a client trusting the CA at `ca`.
    /// An empty `CREST_TOKEN=` or `CREST_CREDENTIALS=` counts as unset, as a shell user
    /// clearing it means.
    pub(crate) fn credential(&self, ca: &Path) -> Result<Credential> {
        if let Some(token) = self.token.as_deref().filter(|t| !t.trim().is_empty()) {
            return Ok(Credential::Token(token.to_string()));
        }
        if let Some(path) = self
            .credentials
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty())
        {
            return Ok(Credential::from_file(path)?);
        }
        let local = Path::new(crest::LOCAL_TOKEN_PATH);
        if ca == Path::new(crest::LOCAL_CA_PATH) && local.exists() {
            return Ok(Credential::from_file(local)?);
        }
        Ok(Credential::None)
    }
}

#[derive(Args)]
pub(crate) struct RootArgs {
    #[command(flatten)]
    pub(crate) client: ClientArgs,
    /// Root address (host:port), repeatable: the root first, then roots standing by for it,
    /// tried in turn when one cannot be reached; default: the topology's roots.
    #[arg(long)]
    pub(crate) root: Vec<String>,
}

#[derive(Args)]
pub(crate) struct PushArgs {
    #[command(flatten)]
    pub(crate) client: ClientArgs,
    /// Leaf addresses (host:port); default: every leaf of the topology.
    #[arg(long)]
    pub(crate) leaf: Vec<String>,
    /// Topic to push to.
    #[arg(long)]
    pub(crate) topic: String,
    /// Priority (0 is the most urgent).
    #[arg(long, default_value_t = crest::core::tier::NORMAL, allow_negative_numbers = true,
          value_parser = parse_priority)]
    pub(crate) priority: u32,
    /// Metadata entries KEY=VALUE.
    #[arg(long, value_parser = parse_key_value)]
    pub(crate) metadata: Vec<(String, String)>,
    /// Push the payload this many times (at least 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) count: u32,
    /// Deliver no sooner than this many milliseconds after the leaf accepts it.
    #[arg(long)]
    pub(crate) delay_ms: Option<u64>,
    /// Deliver no sooner than this time (RFC 3339, e.g. 2026-11-23T08:00:00Z).
    #[arg(long, value_parser = parse_time)]
    pub(crate) deliver_at: Option<std::time::SystemTime>,
    /// Drop the message if not consumed this many milliseconds after it is ready (0: never).
    #[arg(long)]
    pub(crate) ttl_ms: Option<u64>,
    /// Dedup key: a second push with it within the topic's window is not enqueued again.
    #[arg(long)]
    pub(crate) dedup_key: Option<String>,
    /// Fairness key (a tenant): within its tier of a weighted topic, pops rotate among keys.
    #[arg(long)]
    pub(crate) fairness_key: Option<String>,
    /// Read the payload from this file (`-`: standard input), any bytes.
    #[arg(long, conflicts_with = "payload")]
    pub(crate) file: Option<PathBuf>,
    /// The payload (UTF-8 text), unless --file gives it.
    pub(crate) payload: Option<String>,
}

/// A priority from the command line: a whole number from 0, the most urgent.
pub(crate) fn parse_priority(text: &str) -> Result<u32, String> {
    match text.parse::<i64>() {
        Ok(n) if n < 0 => Err(format!(
            "{n} is below 0: priorities are whole numbers from 0 (the most urgent) to {}",
            u32::MAX
        )),
        Ok(n) => u32::try_from(n)
            .map_err(|_| format!("{n} is above {}, the least urgent priority", u32::MAX)),
        Err(_) => Err(format!(
            "{text:?} is not a priority: a whole number from 0 (the most urgent) to {}",
            u32::MAX
        )),
    }
}

/// The payload of a push: the argument, or the bytes of `--file` (`-`: standard input).
fn payload(args: &PushArgs) -> Result<Vec<u8>> {
    match (&args.file, &args.payload) {
        (Some(path), _) if path.as_os_str() == "-" => {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
                .context("reading the payload from standard input")?;
            Ok(bytes)
        }
        (Some(path), _) => std::fs::read(path)
            .with_context(|| format!("reading the payload from {}", path.display())),
        (None, Some(text)) => Ok(text.clone().into_bytes()),
        (None, None) => {
            bail!("no payload: give it as the last argument, or --file PATH (`-`: standard input)")
        }
    }
}

#[derive(Args)]
pub(crate) struct PopArgs {
    #[command(flatten)]
    pub(crate) root: RootArgs,
    /// Topic to pop from.
    #[arg(long)]
    pub(crate) topic: String,
    /// Most messages to pop.
    #[arg(long, default_value_t = 1)]
    pub(crate) max: u32,
    /// How long to wait for a first message, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub(crate) wait_ms: u64,
    /// Visibility timeout of the deliveries, in milliseconds (default: the topic's).
    #[arg(long)]
    pub(crate) visibility_ms: Option<u64>,
    /// Only messages with a priority at most this (0 is the most urgent).
    #[arg(long)]
    pub(crate) max_priority: Option<u32>,
    /// Acknowledge each delivery right away.
    #[arg(long)]
    pub(crate) ack: bool,
}

#[derive(Args)]
pub(crate) struct AckArgs {
    #[command(flatten)]
    pub(crate) root: RootArgs,
    /// Receipts as printed by `crest pop` (LEAF.SEQ:TOKEN).
    #[arg(required = true)]
    pub(crate) receipts: Vec<Receipt>,
}

#[derive(Args)]
pub(crate) struct NackArgs {
    #[command(flatten)]
    pub(crate) root: RootArgs,
    /// Delay before the messages are delivered again, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub(crate) delay_ms: u64,
    /// Why they failed (kept with the message; shown in the dead-letter queue).
    #[arg(long)]
    pub(crate) reason: Option<String>,
    /// Receipts as printed by `crest pop` (LEAF.SEQ:TOKEN).
    #[arg(required = true)]
    pub(crate) receipts: Vec<Receipt>,
}

#[derive(Args)]
pub(crate) struct ExtendArgs {
    #[command(flatten)]
    pub(crate) root: RootArgs,
    /// The new visibility timeout from now, in milliseconds.
    #[arg(long)]
    pub(crate) visibility_ms: u64,
    /// Receipts as printed by `crest pop` (LEAF.SEQ:TOKEN).
    #[arg(required = true)]
    pub(crate) receipts: Vec<Receipt>,
}

pub(crate) fn client_tls(args: &ClientArgs) -> Result<ClientTls> {
    let tls = ClientTls::from_file(&args.ca).with_context(|| {
        format!(
            "no CA certificate at {}: start `crest local` here, or pass --ca",
            args.ca.display()
        )
    })?;
    Ok(tls.with_credential(args.credentials.credential(&args.ca)?))
}

pub(crate) async fn push(args: PushArgs) -> Result<()> {
    let payload = bytes::Bytes::from(payload(&args)?);
    let tls = client_tls(&args.client)?;
    // From the topology, the producer also knows which leaves are one replicated leaf.
    let config = if args.leaf.is_empty() {
        ProducerConfig::from_topology(&load_topology(args.client.topology.as_deref())?, tls)
    } else {
        ProducerConfig::new(args.leaf.clone(), tls)
    };
    let producer = Producer::connect(config).await?;
    let mut handles = Vec::with_capacity(args.count as usize);
    for _ in 0..args.count {
        let mut message = Message::new(args.topic.clone(), payload.clone()).priority(args.priority);
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
        if let Some(key) = &args.fairness_key {
            message = message.fairness_key(key.clone());
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

/// The roots to try, and, when they are the topology's, its leaves: acks, nacks and extends
/// go to the leaf that owns the message.
pub(crate) fn root_config(args: &RootArgs) -> Result<ConsumerConfig> {
    if !args.root.is_empty() {
        return Ok(ConsumerConfig {
            roots: args.root.clone(),
            ..ConsumerConfig::new(String::new(), client_tls(&args.client)?)
        });
    }
    let topology = load_topology(args.client.topology.as_deref())?;
    Ok(ConsumerConfig::from_topology(
        &topology,
        client_tls(&args.client)?,
    ))
}

pub(crate) async fn pop(args: PopArgs) -> Result<()> {
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
            "id={} priority={} attempt={} receipt={}{}{} payload={}",
            delivery.id,
            delivery.priority,
            delivery.attempt,
            delivery.receipt(),
            delivery
                .fairness_key
                .as_ref()
                .map(|key| format!(" fairness_key={key}"))
                .unwrap_or_default(),
            escalation_text(delivery.escalation.as_ref()),
            String::from_utf8_lossy(&delivery.payload)
        );
    }
    if args.ack && !deliveries.is_empty() {
        let receipts: Vec<Receipt> = deliveries.iter().map(|d| d.receipt()).collect();
        let mut failed = 0;
        for (receipt, result) in receipts.iter().zip(consumer.ack_many(&receipts).await?) {
            match result {
                Ok(()) => println!("acked {}", receipt.id),
                Err(error) => {
                    failed += 1;
                    println!("ack {} failed: {error}", receipt.id);
                }
            }
        }
        if failed > 0 {
            bail!("{failed} of {} acks were refused", receipts.len());
        }
    }
    Ok(())
}

/// Acks, nacks or extends deliveries by receipt; fails if any receipt was refused.
pub(crate) async fn settle(root: &RootArgs, op: Settle, receipts: &[Receipt]) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_token_or_credentials_variable_counts_as_unset() {
        let ca = Path::new("elsewhere/ca.pem");
        let empty = CredentialArgs {
            token: Some(" ".into()),
            credentials: Some(PathBuf::new()),
        };
        assert!(matches!(empty.credential(ca).unwrap(), Credential::None));
        let token = CredentialArgs {
            token: Some("crest_a_b".into()),
            credentials: None,
        };
        assert!(matches!(token.credential(ca).unwrap(), Credential::Token(t) if t == "crest_a_b"));
    }
}
