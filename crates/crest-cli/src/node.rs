//! Commands that run nodes: `crest local` (the whole tree in one process), `crest launch` (one
//! node of a topology), `crest certs` (the cluster CA and node certificates).

use crate::*;

pub(crate) async fn local(
    topology_path: Option<&Path>,
    ca_out: &Path,
    data_dir: Option<&Path>,
    sqs: Option<std::net::SocketAddr>,
) -> Result<()> {
    let topology = load_topology(topology_path)?;
    let tree = LocalTree::start_with(&topology, data_dir).await?;
    if let Some(dir) = ca_out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(ca_out, &tree.ca_pem)
        .with_context(|| format!("writing {}", ca_out.display()))?;
    let token_out = ca_out.with_file_name("admin.token");
    write_private(&token_out, &format!("{}\n", tree.admin_token))?;
    let connected = tree.wait_connected(Duration::from_secs(10)).await;
    println!(
        "crest local tree is up ({} nodes{})",
        tree.nodes.len() + tree.replicas.len(),
        if connected { "" } else { ", still connecting" }
    );
    let row = |name: &str, role: String, listen: String, http: Option<std::net::SocketAddr>| {
        let parent = topology
            .node(name)
            .and_then(|n| n.parent.clone())
            .unwrap_or_default();
        let http = http.map(|addr| format!("http://{addr}/metrics"));
        println!(
            "  {name:<10} {role:<18} {listen:<22} {parent:<10} {}",
            http.unwrap_or_default()
        );
    };
    for node in &tree.nodes {
        let role = node.role().to_string();
        row(
            node.name(),
            role,
            node.local_addr().to_string(),
            node.http_addr(),
        );
    }
    for replica in &tree.replicas {
        let role = format!("replica of {}", replica.group());
        row(
            replica.name(),
            role,
            replica.listen_addr().to_string(),
            replica.http_addr(),
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
        .chain(tree.replicas.iter().map(|r| r.listen_addr().to_string()))
        .collect();
    println!("producers push to the leaves: {}", leaves.join(", "));
    println!("consumers pop from the root:  {}", root.local_addr());
    println!("clients trust the CA in:      {}", ca_out.display());
    println!(
        "and prove principal {:?} with the token in {} (CREST_TOKEN)",
        crest::node::LOCAL_ADMIN,
        token_out.display()
    );
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
    let gateway = match sqs {
        Some(listen) => {
            Some(start_sqs(&tree, listen, &ca_out.with_file_name("sqs.credentials")).await?)
        }
        None => None,
    };
    println!(
        "try:  crest push --topic jobs --priority 1 hello   then   crest pop --topic jobs --ack"
    );
    println!("Ctrl-C stops the tree.");
    tokio::signal::ctrl_c().await?;
    drop(gateway);
    println!("stopping");
    tree.shutdown().await;
    Ok(())
}

/// Starts the SQS-compatible API of a local tree on `listen`, with one access key acting as
/// the tree's admin principal in namespace `default`; writes the key to `credentials` (an
/// AWS shared credentials file, profile `crest`) and prints it.
async fn start_sqs(
    tree: &LocalTree,
    listen: std::net::SocketAddr,
    credentials: &Path,
) -> Result<crest_gateway::Gateway> {
    use rand::Rng;
    let mut rng = rand::rng();
    let id: String = (0..10)
        .map(|_| b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"[rng.random_range(0..32)] as char)
        .collect();
    let id = format!("CRESTLOCAL{id}");
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let secret: String = (0..40)
        .map(|_| alphabet[rng.random_range(0..alphabet.len())] as char)
        .collect();
    let tls = ClientTls::new(tree.ca_pem.clone());
    let key = crest_gateway::AccessKey {
        id: id.clone(),
        secret: secret.clone(),
        namespace: crest::core::access::DEFAULT_NAMESPACE.to_string(),
        credential: Credential::Token(tree.admin_token.clone()),
    };
    let config = crest_gateway::GatewayConfig::new(
        listen,
        ProducerConfig::from_topology(&tree.topology, tls.clone()),
        ConsumerConfig::from_topology(&tree.topology, tls),
        vec![key],
    )
    .with_settings(&tree.topology.root().settings);
    let gateway = crest_gateway::Gateway::start(config)
        .await
        .with_context(|| format!("starting the SQS API on {listen}"))?;
    write_private(
        credentials,
        &format!("[crest]\naws_access_key_id = {id}\naws_secret_access_key = {secret}\n"),
    )?;
    println!(
        "SQS API:                      http://{} (any region; docs/sqs.md)",
        gateway.local_addr()
    );
    println!("  access key {id}  secret {secret}");
    println!(
        "  (AWS_SHARED_CREDENTIALS_FILE={} AWS_PROFILE=crest)",
        credentials.display()
    );
    Ok(gateway)
}

/// How `crest launch` runs its node, besides the topology.
pub(crate) struct Launch {
    pub(crate) data_dir: Option<PathBuf>,
    pub(crate) recovery: RecoveryMode,
    pub(crate) access: Option<PathBuf>,
}

fn load_access(path: Option<&Path>) -> Result<Option<crest::node::access::Access>> {
    path.map(|path| crest::node::access::Access::load(path).map_err(anyhow::Error::from))
        .transpose()
}

pub(crate) async fn launch(
    topology_path: &Path,
    name: &str,
    how: Launch,
    listen_fds: listenfd::ListenFd,
) -> Result<()> {
    let Launch {
        data_dir,
        recovery,
        access: access_path,
    } = how;
    let topology = load_topology(Some(topology_path))?;
    if let Some(gateway) = topology.gateway(name) {
        return launch_gateway(topology_path, &topology, gateway, listen_fds).await;
    }
    let spec = topology.node(name).with_context(|| {
        let names: Vec<&str> = topology
            .nodes
            .iter()
            .map(|n| n.name.as_str())
            .chain(topology.gateways.iter().map(|g| g.name.as_str()))
            .collect();
        format!(
            "node {name:?} is not in {} (its nodes: {})",
            topology_path.display(),
            names.join(", ")
        )
    })?;
    let tls =
        NodeTls::from_files(&topology, name, &base_dir(topology_path))?.with_context(|| {
            format!(
                "{} has no [tls] section: run `crest certs --topology {}` and add it",
                topology_path.display(),
                topology_path.display()
            )
        })?;
    let data_dir = match (data_dir, &spec.data_dir) {
        (Some(dir), _) => dir,
        (None, Some(dir)) => base_dir(topology_path).join(dir),
        (None, None) => base_dir(topology_path).join("data").join(name),
    };
    let durable = spec.role == Role::Leaf;
    let activated = activated_sockets(listen_fds)?;
    let how = if activated.is_some() {
        " (socket activation)"
    } else {
        ""
    };
    let sockets = activated.map(|held| {
        let book = std::collections::HashMap::from([(name.to_string(), held)]);
        SocketBook::new(std::sync::Mutex::new(book))
    });
    let access = load_access(access_path.as_deref())?;
    if access.is_none() && spec.role != Role::Aggregator {
        eprintln!(
            "{name}: no --access file: any client that trusts the CA may push, pop and administer"
        );
    }
    let options = StartOptions {
        data_dir: durable.then(|| data_dir.clone()),
        recovery,
        addresses: None,
        direct_links_start: None,
        sockets,
        access,
    };
    let node = match &spec.replica {
        None => {
            let node = start_node(&topology, name, &tls, &options).await?;
            if durable {
                println!("log directory: {}", data_dir.display());
            }
            println!(
                "crest node {} ({}) listening on {}{how}",
                node.name(),
                node.role(),
                node.local_addr()
            );
            Running::Node(node)
        }
        Some(replica) => {
            let node = crest::node::start_replica(&topology, name, &tls, &options).await?;
            println!(
                "log directory: {}",
                data_dir.join(crest::node::REPLICA_LOG_DIR).display()
            );
            println!(
                "crest replica {name} of leaf {} (member {} of {}), replication on {}; \
                 takes clients on {}{how} while it leads",
                replica.group,
                replica.number,
                topology.members(&replica.group).len(),
                replica.address,
                spec.listen
            );
            Running::Replica(node)
        }
    };
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            result = tokio::signal::ctrl_c() => {
                result?;
                break;
            }
            _ = terminate.recv() => break,
            // A replica whose Raft stopped (its log cannot be written) exits, for its service
            // manager to start it again: it recovers from its disk and catches up.
            reason = node.stopped() => {
                node.shutdown().await;
                anyhow::bail!("{name}: the replica stopped: {reason}; exiting to be started again");
            }
            // SIGHUP: read the certificate, key and CA files again (a rotation), and the
            // access file.
            _ = hangup.recv() => {
                if access_path.is_some() {
                    match load_access(access_path.as_deref()) {
                        Ok(access) => {
                            node.reload_access(access).await;
                            eprintln!("{name}: access file reloaded");
                        }
                        Err(error) => eprintln!(
                            "{name}: access file not reloaded, keeping the one in use: {error:#}"
                        ),
                    }
                }
                let reloaded = async {
                    let tls = NodeTls::from_files(&topology, name, &base_dir(topology_path))?
                        .context("the topology lost its [tls] section")?;
                    node.reload_tls(&tls).await.map_err(anyhow::Error::from)
                }
                .await;
                match reloaded {
                    Ok(()) => eprintln!("{name}: certificates reloaded"),
                    Err(error) => eprintln!(
                        "{name}: certificates not reloaded, keeping those in use: {error:#}"
                    ),
                }
            }
        }
    }
    node.shutdown().await;
    Ok(())
}

/// The node `crest launch` runs: a node of the tree, or a replica of a replicated leaf.
enum Running {
    Node(crest::node::NodeHandle),
    Replica(crest::node::ReplicaHandle),
}

impl Running {
    async fn reload_access(&self, access: Option<crest::node::access::Access>) {
        match self {
            Running::Node(node) => node.reload_access(access),
            Running::Replica(replica) => replica.reload_access(access).await,
        }
    }

    async fn reload_tls(&self, tls: &NodeTls) -> Result<(), crest::node::NodeError> {
        match self {
            Running::Node(node) => node.reload_tls(tls),
            Running::Replica(replica) => replica.reload_tls(tls).await,
        }
    }

    async fn shutdown(self) {
        match self {
            Running::Node(node) => node.shutdown().await,
            Running::Replica(replica) => replica.shutdown().await,
        }
    }

    /// For a replica: once it stopped on its own, why (see `ReplicaHandle::stopped`). Never
    /// for a node.
    async fn stopped(&self) -> String {
        match self {
            Running::Node(_) => std::future::pending().await,
            Running::Replica(replica) => replica.stopped().await,
        }
    }
}

/// Sockets handed over by a service manager (systemd socket activation: `LISTEN_FDS`, the
/// descriptors from 3 on): the first is the node's QUIC socket (UDP), the second, if given,
/// its HTTP listener (TCP). With them a node restarts without ever releasing its ports.
fn activated_sockets(mut fds: listenfd::ListenFd) -> Result<Option<NodeSockets>> {
    if fds.len() == 0 {
        return Ok(None);
    }
    let quic = fds
        .take_udp_socket(0)
        .context("socket activation: descriptor 3 must be the node's QUIC (UDP) socket")?
        .context("socket activation: descriptor 3 was already taken")?;
    let http = match fds.len() {
        1 => None,
        2 | 3 => fds
            .take_tcp_listener(1)
            .context("socket activation: descriptor 4 must be the node's HTTP (TCP) listener")?,
        n => bail!(
            "socket activation: {n} descriptors given; a node takes its QUIC socket, an HTTP \
             listener and, for a replica, its replication (UDP) socket"
        ),
    };
    let replication = match fds.len() {
        3 => Some(
            fds.take_udp_socket(2)
                .context("socket activation: descriptor 5 must be the replica's replication (UDP) socket")?
                .context("socket activation: descriptor 5 was already taken")?,
        ),
        _ => None,
    };
    Ok(Some(NodeSockets {
        quic,
        http,
        replication,
    }))
}

pub(crate) fn certs(
    topology_path: &Path,
    out: Option<PathBuf>,
    valid_for: std::time::Duration,
    clients: &[String],
) -> Result<()> {
    let topology = load_topology(Some(topology_path))?;
    let base = base_dir(topology_path);
    let out = match (out, &topology.tls) {
        (Some(out), _) => out,
        (None, Some(tls)) => base.join(&tls.cert_dir),
        (None, None) => base.join("certs"),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let (ca_cert, ca_key) = (out.join("ca.pem"), out.join("ca.key"));
    if !clients.is_empty() {
        if !(ca_cert.exists() && ca_key.exists()) {
            bail!(
                "no CA in {}: run `crest certs --topology {}` first",
                out.display(),
                topology_path.display()
            );
        }
        let read = |p: &Path| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let ca = CertificateAuthority::load(&read(&ca_cert)?, &read(&ca_key)?)?;
        let dir = out.join("clients");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for name in clients {
            let issued = ca.issue_client(name, valid_for)?;
            let path = dir.join(format!("{name}.pem"));
            write_private(&path, &format!("{}{}", issued.cert_pem, issued.key_pem))?;
            println!(
                "  client {name}: {} (CREST_CREDENTIALS; grant it with `crest token grant {name}`)",
                path.display()
            );
        }
        return Ok(());
    }
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
        let tls = NodeTls::issue(&ca, spec, valid_for)?;
        std::fs::write(out.join(format!("{}.pem", spec.name)), &tls.node.cert_pem)?;
        write_private(&out.join(format!("{}.key", spec.name)), &tls.node.key_pem)?;
        println!("  {}: {}.pem, {}.key", spec.name, spec.name, spec.name);
    }
    Ok(())
}

pub(crate) fn write_private(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::fs::PermissionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    // The mode applies only when the file is created: one that existed keeps its own, which
    // must not stay readable by others now that it holds a secret.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("making {} private", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}
