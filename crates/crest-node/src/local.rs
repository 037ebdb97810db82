//! [`LocalTree`]: a whole topology in this process over loopback QUIC (`crest local`, tests).

use crate::*;

/// A whole topology running in this process over loopback QUIC.
pub struct LocalTree {
    /// The running nodes, in topology order.
    pub nodes: Vec<NodeHandle>,
    /// The running replicas of its replicated leaves (each serves its leaf while it leads).
    pub replicas: Vec<ReplicaHandle>,
    /// The CA that signed every node (clients trust it).
    pub ca_pem: String,
    /// The topology as running: ephemeral ports replaced by the bound addresses.
    pub topology: Topology,
    /// The CA that signs the nodes' certificates (kept to restart nodes).
    ca: CertificateAuthority,
    /// Where leaves keep their logs (`DATA_ROOT/NAME`), if anywhere.
    data_root: Option<PathBuf>,
    /// The tree's access file: one principal, `admin`, with every permission.
    access_file: access::AccessFile,
    /// The API token of the `admin` principal (clients present it: `CREST_TOKEN`).
    pub admin_token: String,
    /// Whether clients must prove a principal ([`LocalTree::start_open`]: not).
    secure: bool,
}

/// The principal a [`LocalTree`] creates, with every permission on every namespace.
pub const LOCAL_ADMIN: &str = "admin";

impl LocalTree {
    /// The tree's access file (to add principals: [`LocalTree::reload_access`]).
    pub fn access_file(&self) -> &access::AccessFile {
        &self.access_file
    }

    /// Replaces the access file of every node (as `SIGHUP` does for `crest launch`).
    pub fn reload_access(&mut self, file: access::AccessFile) {
        let access = access::Access::new(file.clone());
        for node in &self.nodes {
            node.reload_access(Some(access.clone()));
        }
        self.access_file = file;
    }

    /// The CA that signed every node's certificate (to issue more, say for a test's peer).
    pub fn ca(&self) -> &CertificateAuthority {
        &self.ca
    }

    /// Starts every node of `topology` with ephemeral certificates from a fresh CA.
    ///
    /// # Errors
    /// [`NodeError`] from the first node that fails to start (the others are stopped).
    pub async fn start(topology: &Topology) -> Result<LocalTree, NodeError> {
        LocalTree::start_with(topology, None).await
    }

    /// Starts every node; leaves keep durable logs in `data_root/NAME` when it is given
    /// (recovering what a previous run left there), in memory otherwise.
    ///
    /// # Errors
    /// [`NodeError`] from the first node that fails to start (the others are stopped).
    pub async fn start_with(
        topology: &Topology,
        data_root: Option<&Path>,
    ) -> Result<LocalTree, NodeError> {
        LocalTree::start_on(topology, data_root, None).await
    }

    /// As [`LocalTree::start_with`], but the nodes serve clients without credentials (as
    /// `crest launch` without `--access`): to measure what authentication costs.
    ///
    /// # Errors
    /// [`NodeError`] from the first node that fails to start (the others are stopped).
    pub async fn start_open(
        topology: &Topology,
        data_root: Option<&Path>,
    ) -> Result<LocalTree, NodeError> {
        LocalTree::start_all(topology, data_root, None, false).await
    }

    /// As [`LocalTree::start_with`], each node listening on its socket in `sockets` if it has
    /// one there (bound by the caller to the node's `listen` address).
    ///
    /// # Errors
    /// [`NodeError`] from the first node that fails to start (the others are stopped).
    pub async fn start_on(
        topology: &Topology,
        data_root: Option<&Path>,
        sockets: Option<SocketBook>,
    ) -> Result<LocalTree, NodeError> {
        LocalTree::start_all(topology, data_root, sockets, true).await
    }

    /// As [`LocalTree::start_open`], each node listening on its socket in `sockets` (see
    /// [`LocalTree::start_on`]).
    ///
    /// # Errors
    /// [`NodeError`] from the first node that fails to start (the others are stopped).
    pub async fn start_open_on(
        topology: &Topology,
        data_root: Option<&Path>,
        sockets: Option<SocketBook>,
    ) -> Result<LocalTree, NodeError> {
        LocalTree::start_all(topology, data_root, sockets, false).await
    }

    async fn start_all(
        topology: &Topology,
        data_root: Option<&Path>,
        sockets: Option<SocketBook>,
        secure: bool,
    ) -> Result<LocalTree, NodeError> {
        let data_root = data_root.map(Path::to_path_buf);
        let ca = CertificateAuthority::generate()?;
        let mut access_file = access::AccessFile::new();
        if let Some(root) = &data_root {
            access_file.receipt_key = access::kept_receipt_key(root, &access_file.receipt_key)?;
        }
        access_file
            .grant(LOCAL_ADMIN, &crest_core::access::Grants::everything())
            .map_err(NodeError::Actor)?;
        let admin_token = access_file
            .create_token(LOCAL_ADMIN, unix_seconds())
            .map_err(NodeError::Actor)?;
        let access = secure.then(|| access::Access::new(access_file.clone()));
        // Parents start before their children, so that a node listening on port 0 (tests)
        // is bound, and its real address known, before anyone dials it.
        let mut topology = topology.clone();
        let mut order: Vec<String> = topology.roots().map(|root| root.name.clone()).collect();
        let mut index = 0;
        while index < order.len() {
            let parent = order[index].clone();
            order.extend(
                topology
                    .nodes
                    .iter()
                    .filter(|n| n.parent.as_deref() == Some(&parent))
                    .map(|n| n.name.clone()),
            );
            index += 1;
        }
        let mut nodes = Vec::new();
        let mut replicas = Vec::new();
        let addresses = AddressBook::default();
        let (direct_links, direct_links_start) = tokio::sync::watch::channel(false);
        for name in order {
            let spec = topology.node(&name).expect("from the topology").clone();
            let mut options = LocalTree::options(data_root.as_deref(), &name, access.clone());
            options.addresses = Some(addresses.clone());
            options.direct_links_start = Some(direct_links_start.clone());
            options.sockets = sockets.clone();
            if spec.replica.is_some() {
                let started = async {
                    if options.data_dir.is_none() || spec.listen.port() == 0 {
                        return Err(NodeError::Replica(format!(
                            "{name:?}: a replicated leaf's replicas keep their logs on disk and \
                             listen on fixed ports (run without --memory)"
                        )));
                    }
                    let tls = NodeTls::issue(&ca, &spec, CERT_VALIDITY_DEFAULT)?;
                    start_replica(&topology, &name, &tls, &options).await
                };
                match started.await {
                    Ok(replica) => replicas.push(replica),
                    Err(error) => {
                        LocalTree::stop_all(nodes, replicas).await;
                        return Err(error);
                    }
                }
                continue;
            }
            let started = async {
                start_node(
                    &topology,
                    &name,
                    &NodeTls::issue(&ca, &spec, CERT_VALIDITY_DEFAULT)?,
                    &options,
                )
                .await
            };
            match started.await {
                Ok(node) => {
                    if spec.listen.port() == 0 {
                        let address = node.local_addr().to_string();
                        let entry = topology
                            .nodes
                            .iter_mut()
                            .find(|n| n.name == name)
                            .expect("present");
                        entry.address = address.clone();
                        entry.listen = node.local_addr();
                        let mut book = addresses.write().unwrap_or_else(|p| p.into_inner());
                        book.insert(name.clone(), address);
                    }
                    nodes.push(node);
                }
                Err(error) => {
                    LocalTree::stop_all(nodes, replicas).await;
                    return Err(error);
                }
            }
        }
        // Every node listens now: the root may dial its leaves.
        direct_links.send_replace(true);
        Ok(LocalTree {
            nodes,
            replicas,
            ca_pem: ca.cert_pem().to_string(),
            topology,
            ca,
            data_root,
            access_file,
            admin_token,
            secure,
        })
    }

    fn options(
        data_root: Option<&Path>,
        name: &str,
        access: Option<access::Access>,
    ) -> StartOptions {
        StartOptions {
            data_dir: data_root.map(|root| root.join(name)),
            recovery: RecoveryMode::default(),
            addresses: None,
            direct_links_start: None,
            sockets: None,
            access,
        }
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> Option<&NodeHandle> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Waits until every non-root node has a parent session, or the timeout passes.
    /// Returns whether the tree is connected.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let mut connected = true;
            // A replicated leaf is connected once a replica serves it under its parent.
            for leaf in self.topology.leaves() {
                let Some(replica) = &leaf.replica else {
                    continue;
                };
                if replica.number != 1 {
                    continue;
                }
                let mut served = false;
                for member in self.replicas.iter().filter(|r| r.group() == replica.group) {
                    served |= member.stats().await.is_ok_and(|s| s.parent_connected);
                }
                connected &= served;
            }
            for node in &self.nodes {
                let stats = node.stats().await;
                let linked = if node.role == Role::Root {
                    // With the direct pop path, every leaf has welcomed the root's link.
                    let wanted = self.topology.direct_leaves().count() as u64;
                    stats.is_ok_and(|s| s.direct_links >= wanted)
                } else {
                    stats.is_ok_and(|s| s.parent_connected)
                };
                connected &= linked;
            }
            if connected {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops one node or replica (its peers see its connections close).
    pub async fn stop_node(&mut self, name: &str) {
        if let Some(index) = self.nodes.iter().position(|n| n.name == name) {
            self.nodes.remove(index).shutdown().await;
        }
        if let Some(index) = self.replicas.iter().position(|r| r.name() == name) {
            self.replicas.remove(index).shutdown().await;
        }
    }

    /// The running replica named `name`.
    pub fn replica(&self, name: &str) -> Option<&ReplicaHandle> {
        self.replicas.iter().find(|r| r.name() == name)
    }

    async fn stop_all(nodes: Vec<NodeHandle>, replicas: Vec<ReplicaHandle>) {
        for replica in replicas {
            replica.shutdown().await;
        }
        for node in nodes {
            node.shutdown().await;
        }
    }

    /// Stops a node if it runs and starts it again on the same address. State above the leaves
    /// is soft and starts fresh; a leaf recovers its log (or starts empty in memory mode).
    ///
    /// # Errors
    /// [`NodeError`] if it cannot start.
    pub async fn restart_node(&mut self, name: &str) -> Result<(), NodeError> {
        // A stopped root's address stays taken for up to about two seconds (its endpoint is
        // released once the tasks that dialled the leaves with it have ended).
        const REBIND_ATTEMPTS: u32 = 250;
        self.stop_node(name).await;
        let spec = self
            .topology
            .node(name)
            .ok_or_else(|| NodeError::UnknownNode(name.to_string()))?;
        let tls = NodeTls::issue(&self.ca, spec, CERT_VALIDITY_DEFAULT)?;
        // The old socket may take a moment to be released.
        let mut attempts = 0;
        let node = loop {
            let access = self
                .secure
                .then(|| access::Access::new(self.access_file.clone()));
            let options = LocalTree::options(self.data_root.as_deref(), name, access);
            if spec.replica.is_some() {
                match start_replica(&self.topology, name, &tls, &options).await {
                    Ok(replica) => {
                        self.replicas.push(replica);
                        return Ok(());
                    }
                    // Its old sockets (the group's among them) may take a moment to be released.
                    Err(_) if attempts < REBIND_ATTEMPTS => {
                        attempts += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    Err(error) => return Err(error),
                }
            }
            match start_node(&self.topology, name, &tls, &options).await {
                Ok(node) => break node,
                Err(NodeError::Transport(error)) if attempts < REBIND_ATTEMPTS => {
                    tracing::debug!(%error, "rebinding");
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(error) => return Err(error),
            }
        };
        self.nodes.push(node);
        Ok(())
    }

    /// Stops every node: first every node stops dialing, so that no link closing during the
    /// stop is reported as lost (the root's direct links to the leaves, for one); then the
    /// leaves, then each level above, so that no node sees its parent vanish.
    pub async fn shutdown(self) {
        for replica in self.replicas {
            replica.shutdown().await;
        }
        let mut nodes = self.nodes;
        // Every node stops dialing first: a link that closes while the tree shuts down is not
        // a lost connection to warn about.
        for node in &nodes {
            node.shutdown.cancel();
        }
        for role in [Role::Leaf, Role::Aggregator, Role::Root] {
            let (level, rest): (Vec<_>, Vec<_>) =
                nodes.into_iter().partition(|node| node.role == role);
            nodes = rest;
            let stopping: Vec<_> = level
                .into_iter()
                .map(|node| tokio::spawn(node.shutdown()))
                .collect();
            for task in stopping {
                let _ = task.await;
            }
        }
    }
}
