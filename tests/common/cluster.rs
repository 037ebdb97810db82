//! A tree of `topology/local.toml` as seven `crest launch` processes, for the process tests
//! and the failover bench (each uses part of it).
#![allow(dead_code)]

use command_fds::{CommandFdExt, FdMapping};
use crest::core::topology::Topology;
use crest::sdk::{ClientTls, Consumer, ConsumerConfig, Producer, ProducerConfig};
use crest_testkit::{eventually, eventually_blocking};
use std::collections::HashMap;
use std::net::{TcpListener, UdpSocket};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub(crate) const CREST: &str = env!("CARGO_BIN_EXE_crest");

/// Node processes, killed when the test ends however it ends.
pub(crate) struct Cluster {
    pub(crate) dir: PathBuf,
    pub(crate) topology_path: PathBuf,
    pub(crate) topology: Topology,
    /// Each node's QUIC socket and HTTP listener, by name.
    pub(crate) sockets: HashMap<String, (UdpSocket, TcpListener)>,
    pub(crate) children: Vec<(String, Child)>,
    /// The access file every node is launched with, if any ([`Cluster::start_secure`]).
    pub(crate) access: Option<PathBuf>,
    /// The token of a principal with every permission, when there is an access file.
    pub(crate) token: Option<String>,
    /// Each replica's socket for its group's RPCs, by name.
    pub(crate) replication: HashMap<String, UdpSocket>,
    /// Each SQS gateway's HTTP listener, by name.
    pub(crate) gateways: HashMap<String, TcpListener>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A failing test leaves the nodes' logs behind for whoever reads the failure.
        if std::thread::panicking() {
            eprintln!("the nodes' logs are kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Cluster {
    /// Writes `topology/local.toml` with free loopback ports and frequent checkpoints, makes
    /// certificates with `crest certs`, and launches every node.
    pub(crate) fn start(name: &str) -> Cluster {
        Cluster::start_with(name, "")
    }

    /// As [`Cluster::start`], with `settings` (TOML lines) added to every node's.
    pub(crate) fn start_with(name: &str, settings: &str) -> Cluster {
        let checkpoints = "checkpoint_log_bytes = 65536\ncheckpoint_interval_ms = 500\n";
        Cluster::start_exactly(name, &format!("{checkpoints}{settings}"))
    }

    /// `topology/local.toml` on free ports with `settings` (TOML lines) added or replacing the
    /// topology's own, and nothing else changed.
    pub(crate) fn start_exactly(name: &str, settings: &str) -> Cluster {
        let mut cluster = Cluster::prepare(name, settings);
        for node in cluster.topology.nodes.clone() {
            cluster.launch(&node.name);
        }
        cluster
    }

    /// As [`Cluster::start`], secured as the README says: `crest certs`, then `crest token
    /// create` for an `ops` principal with every permission, then every node launched with
    /// `--access`.
    pub(crate) fn start_secure(name: &str) -> Cluster {
        let mut cluster = Cluster::prepare(name, "");
        cluster.secure_and_launch();
        cluster
    }

    /// As [`Cluster::start_secure`], with an SQS gateway `gateway` in the topology (keys file
    /// `sqs-keys.toml`: key `AKIACRESTTEST` with secret `test-secret`, acting as `ops`),
    /// launched after the nodes.
    pub(crate) fn start_secure_with_gateway(name: &str, gateway: &str) -> Cluster {
        let mut cluster = Cluster::prepare_nodes(name, "", &[]);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut text = std::fs::read_to_string(&cluster.topology_path).unwrap();
        text.push_str(&format!(
            "\n[[node]]\nname = \"{gateway}\"\nrole = \"gateway\"\nlisten = \"{}\"\n\
             keys = \"sqs-keys.toml\"\n",
            listener.local_addr().unwrap()
        ));
        std::fs::write(&cluster.topology_path, &text).unwrap();
        cluster.topology = Topology::parse(&text).unwrap();
        cluster.gateways.insert(gateway.to_string(), listener);
        cluster.secure_and_launch();
        let keys = format!(
            "[[key]]\nid = \"AKIACRESTTEST\"\nsecret = \"test-secret\"\ntoken = \"{}\"\n",
            cluster.token.as_ref().unwrap()
        );
        std::fs::write(cluster.dir.join("sqs-keys.toml"), keys).unwrap();
        cluster.launch(gateway);
        cluster
    }

    /// Where gateway `name` serves.
    pub(crate) fn gateway_endpoint(&self, name: &str) -> String {
        format!("http://{}", self.gateways[name].local_addr().unwrap())
    }

    /// Makes an access file with an `ops` principal of every permission and launches every
    /// node with it.
    fn secure_and_launch(&mut self) {
        let cluster = self;
        let access = cluster.dir.join("access.toml");
        let output = Command::new(CREST)
            .args([
                "token",
                "create",
                "ops",
                "--grant",
                "*:produce,consume,admin",
            ])
            .arg("--access")
            .arg(&access)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let token = String::from_utf8(output.stdout).unwrap().trim().to_string();
        cluster.access = Some(access);
        cluster.token = Some(token);
        for node in cluster.topology.nodes.clone() {
            cluster.launch(&node.name);
        }
    }

    /// Sends SIGHUP to every node: each re-reads its certificates and access file.
    pub(crate) fn hang_up(&self) {
        for node in &self.topology.nodes {
            let pid = rustix::process::Pid::from_raw(self.pid(&node.name) as i32).unwrap();
            rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
        }
    }

    /// As [`Cluster::start`], with a second root, `root-b`, standing by.
    pub(crate) fn start_with_standby_root(name: &str) -> Cluster {
        let mut cluster = Cluster::prepare_nodes(name, "", &["root-b"]);
        for node in cluster.topology.nodes.clone() {
            cluster.launch(&node.name);
        }
        cluster
    }

    /// The topology on free ports, its certificates made, no node launched yet.
    fn prepare(name: &str, settings: &str) -> Cluster {
        Cluster::prepare_nodes(name, settings, &[])
    }

    /// As [`Cluster::prepare`], with roots `standby` standing by after the topology's.
    fn prepare_nodes(name: &str, settings: &str, standby: &[&str]) -> Cluster {
        let dir = std::env::temp_dir().join(format!("crest-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let local =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/topology/local.toml"))
                .unwrap();
        // Every node's sockets are bound here and held for the whole test: each launch (and
        // relaunch after a SIGKILL) gets them by socket activation, so no other process can
        // take a port between runs of its node.
        let names = [
            "root", "agg-1", "agg-2", "leaf-1", "leaf-2", "leaf-3", "leaf-4",
        ];
        let quic_ports = ["7400", "7401", "7402", "7411", "7412", "7413", "7414"];
        let http_ports = ["7480", "7481", "7482", "7491", "7492", "7493", "7494"];
        let mut text = local;
        let mut sockets = HashMap::new();
        for ((name, quic_port), http_port) in names.iter().zip(quic_ports).zip(http_ports) {
            let quic = UdpSocket::bind("127.0.0.1:0").unwrap();
            let http = TcpListener::bind("127.0.0.1:0").unwrap();
            for (old, new) in [
                (quic_port, quic.local_addr().unwrap().port()),
                (http_port, http.local_addr().unwrap().port()),
            ] {
                text = text.replace(&format!("127.0.0.1:{old}"), &format!("127.0.0.1:{new}"));
            }
            sockets.insert(name.to_string(), (quic, http));
        }
        // A setting given here replaces the topology's own.
        for line in settings.lines() {
            if let Some((name, _)) = line.split_once('=') {
                let name = name.trim();
                text = text
                    .lines()
                    .filter(|old| {
                        old.split_once('=')
                            .is_none_or(|(key, _)| key.trim() != name)
                    })
                    .map(|old| format!("{old}\n"))
                    .collect();
            }
        }
        text = text.replace("[settings]\n", &format!("[settings]\n{settings}"));
        for root in standby {
            let quic = UdpSocket::bind("127.0.0.1:0").unwrap();
            let http = TcpListener::bind("127.0.0.1:0").unwrap();
            text.push_str(&format!(
                "\n[[node]]\nname = \"{root}\"\nrole = \"root\"\nlisten = \"{}\"\nhttp = \"{}\"\n",
                quic.local_addr().unwrap(),
                http.local_addr().unwrap()
            ));
            sockets.insert(root.to_string(), (quic, http));
        }
        text.push_str("\n[tls]\nca = \"certs/ca.pem\"\ncert_dir = \"certs\"\n");
        let topology_path = dir.join("topology.toml");
        std::fs::write(&topology_path, &text).unwrap();
        let topology = Topology::parse(&text).unwrap();
        certs(&topology_path);
        Cluster {
            dir,
            topology_path,
            topology,
            sockets,
            children: Vec::new(),
            access: None,
            token: None,
            replication: HashMap::new(),
            gateways: HashMap::new(),
        }
    }

    /// The topology `template` with its placeholders `{quic:NAME}`, `{http:NAME}` and
    /// `{replication:NAME}` replaced by loopback addresses of sockets bound and held here, its
    /// certificates made, no node launched yet.
    pub(crate) fn from_template(name: &str, template: &str) -> Cluster {
        let dir = std::env::temp_dir().join(format!("crest-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut text = template.to_string();
        let mut sockets = HashMap::new();
        let mut replication = HashMap::new();
        while let Some(start) = text.find("{quic:") {
            let end = start + text[start..].find('}').unwrap();
            let node = text[start + "{quic:".len()..end].to_string();
            let quic = UdpSocket::bind("127.0.0.1:0").unwrap();
            let http = TcpListener::bind("127.0.0.1:0").unwrap();
            text = text
                .replace(
                    &format!("{{quic:{node}}}"),
                    &quic.local_addr().unwrap().to_string(),
                )
                .replace(
                    &format!("{{http:{node}}}"),
                    &http.local_addr().unwrap().to_string(),
                );
            let marker = format!("{{replication:{node}}}");
            if text.contains(&marker) {
                let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
                text = text.replace(&marker, &socket.local_addr().unwrap().to_string());
                replication.insert(node.clone(), socket);
            }
            sockets.insert(node, (quic, http));
        }
        text.push_str("\n[tls]\nca = \"certs/ca.pem\"\ncert_dir = \"certs\"\n");
        let topology_path = dir.join("topology.toml");
        std::fs::write(&topology_path, &text).unwrap();
        let topology = Topology::parse(&text).unwrap();
        certs(&topology_path);
        Cluster {
            dir,
            topology_path,
            topology,
            sockets,
            children: Vec::new(),
            access: None,
            token: None,
            replication,
            gateways: HashMap::new(),
        }
    }

    pub(crate) fn launch(&mut self, node: &str) {
        // Appended to, so a node launched again keeps what it logged before it was killed.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{node}.log")))
            .unwrap();
        if let Some(listener) = self.gateways.get(node) {
            let fds = vec![FdMapping {
                parent_fd: OwnedFd::from(listener.try_clone().unwrap()),
                child_fd: 3,
            }];
            let mut command = Command::new(CREST);
            command.fd_mappings(fds).unwrap();
            let child = command
                .args(["launch", "--node", node, "--topology"])
                .arg(&self.topology_path)
                .env("LISTEN_FDS", "1")
                .env("RUST_LOG", "info")
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            self.children.push((node.to_string(), child));
            return;
        }
        let (quic, http) = &self.sockets[node];
        let mut fds = vec![
            FdMapping {
                parent_fd: OwnedFd::from(quic.try_clone().unwrap()),
                child_fd: 3,
            },
            FdMapping {
                parent_fd: OwnedFd::from(http.try_clone().unwrap()),
                child_fd: 4,
            },
        ];
        if let Some(socket) = self.replication.get(node) {
            fds.push(FdMapping {
                parent_fd: OwnedFd::from(socket.try_clone().unwrap()),
                child_fd: 5,
            });
        }
        let count = fds.len().to_string();
        let mut command = Command::new(CREST);
        command.fd_mappings(fds).unwrap();
        command
            .args(["launch", "--node", node, "--topology"])
            .arg(&self.topology_path);
        if let Some(access) = &self.access {
            command.arg("--access").arg(access);
        }
        let child = command
            .env("LISTEN_FDS", count)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.push((node.to_string(), child));
    }

    /// SIGTERM, as a service manager stops a node; answers whether it exited within `within`
    /// (if not, it is killed).
    pub(crate) fn terminate(&mut self, node: &str, within: Duration) -> bool {
        let mut child = self.take_child(node);
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let exited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            eventually_blocking(within, format!("{node} to exit"), || {
                child.try_wait().unwrap().is_some()
            })
        }))
        .is_ok();
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
        }
        exited
    }

    /// SIGKILL: no chance to close connections or say goodbye.
    pub(crate) fn kill(&mut self, node: &str) {
        let mut child = self.take_child(node);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// How `node`'s process ended, once it has (it is then no longer the cluster's).
    pub(crate) fn exited(&mut self, node: &str) -> Option<std::process::ExitStatus> {
        let index = self.children.iter().position(|(name, _)| name == node)?;
        let status = self.children[index].1.try_wait().unwrap()?;
        self.children.remove(index);
        Some(status)
    }

    /// The running process of `node`, no longer the cluster's to kill at the end.
    fn take_child(&mut self, node: &str) -> Child {
        let index = self
            .children
            .iter()
            .position(|(name, _)| name == node)
            .unwrap();
        self.children.remove(index).1
    }

    pub(crate) fn tls(&self) -> ClientTls {
        let tls = ClientTls::from_file(self.dir.join("certs/ca.pem")).unwrap();
        match &self.token {
            Some(token) => tls.with_token(token.clone()),
            None => tls,
        }
    }

    pub(crate) async fn producer(&self) -> Producer {
        retry(|| Producer::connect(ProducerConfig::from_topology(&self.topology, self.tls()))).await
    }

    /// The process id of a running node.
    pub(crate) fn pid(&self, node: &str) -> u32 {
        let (_, child) = self.children.iter().find(|(name, _)| name == node).unwrap();
        child.id()
    }

    /// A node's log with the terminal's colour codes taken out.
    pub(crate) fn plain_log(&self, node: &str) -> String {
        let raw = std::fs::read_to_string(self.dir.join(format!("{node}.log"))).unwrap_or_default();
        let mut plain = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                plain.push(c);
            }
        }
        plain
    }

    /// The highest term in which `node` said it leads its group.
    pub(crate) fn led_in(&self, node: &str) -> Option<u64> {
        self.plain_log(node)
            .lines()
            .filter(|line| line.contains("leads its group"))
            .filter_map(|line| {
                let rest = &line[line.find(" term=")? + " term=".len()..];
                rest.split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            })
            .max()
    }

    /// Waits until `node`'s log has applied what `other`'s has (both record the same position
    /// once the group is idle and the one has caught up).
    pub(crate) async fn caught_up(&self, node: &str, other: &str) {
        let position = |name: &str| {
            std::fs::read(
                self.dir
                    .join("data")
                    .join(name)
                    .join(crest::node::REPLICA_LOG_DIR)
                    .join("replica-position"),
            )
            .ok()
        };
        let what = format!("{node} to catch up with {other}");
        eventually(Duration::from_secs(30), what, async || {
            position(node).is_some() && position(node) == position(other)
        })
        .await;
    }

    /// The running replica of `replicas` that leads in the newest term, once one does (within
    /// 30 s).
    pub(crate) async fn leader_among(&self, replicas: &[&str]) -> String {
        eventually(Duration::from_secs(30), "a replica to lead", async || {
            let running = replicas
                .iter()
                .filter(|name| self.children.iter().any(|(child, _)| child == *name));
            let newest = running
                .filter_map(|name| Some((self.led_in(name)?, name.to_string())))
                .max();
            newest.map(|(_, name)| name)
        })
        .await
    }

    /// A node's answer to `GET path` on its HTTP address: the status code and the body.
    pub(crate) async fn http_get(&self, node: &str, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = self.topology.node(node).unwrap().http.unwrap();
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        let code = answer[9..12].parse().unwrap();
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (code, body.to_string())
    }

    /// `crest ARGS` against this cluster: its topology and CA, no client credentials from
    /// the test's environment.
    pub(crate) fn crest_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(CREST);
        command
            .args(args)
            .env("CREST_TOPOLOGY", &self.topology_path)
            .env("CREST_CA", self.dir.join("certs/ca.pem"))
            .env_remove("CREST_TOKEN")
            .env_remove("CREST_CREDENTIALS");
        command
    }

    /// Runs `crest ARGS` against this cluster; returns (success, stdout + stderr).
    pub(crate) async fn crest(&self, args: &[&str]) -> (bool, String) {
        let mut command = self.crest_command(args);
        let output = tokio::task::spawn_blocking(move || command.output())
            .await
            .unwrap()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.success(), text)
    }

    /// Runs `crest ARGS` until it succeeds saying `want`, for up to 20 s (e.g. a `crest topic
    /// set` until every leaf keeps it: they connect a moment after they start).
    pub(crate) async fn crest_until(&self, args: &[&str], want: &str) -> String {
        let what = format!("crest {args:?} to say {want:?}");
        eventually(Duration::from_secs(20), what, async || {
            let (ok, text) = self.crest(args).await;
            if ok && text.contains(want) {
                Ok(text)
            } else {
                Err(text)
            }
        })
        .await
    }

    pub(crate) async fn consumer(&self) -> Consumer {
        retry(|| Consumer::connect(ConsumerConfig::from_topology(&self.topology, self.tls()))).await
    }
}

/// `crest status --json` of the topology at `path`.
pub(crate) async fn crest_status(path: &std::path::Path) -> serde_json::Value {
    let path = path.to_path_buf();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(CREST)
            .args(["status", "--json", "--topology"])
            .arg(path)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    // 0: every node up; 2: some down (what these tests look at); anything else an error.
    assert!(
        matches!(output.status.code(), Some(0 | 2)),
        "crest status: {output:?}"
    );
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let down = status["down"].as_array().map_or(0, Vec::len);
    assert_eq!(output.status.code() == Some(2), down > 0, "{status:#}");
    status
}

/// Makes the certificates of the topology at `path` with `crest certs`.
pub(crate) fn certs(path: &std::path::Path) {
    let status = Command::new(CREST)
        .args(["certs", "--topology"])
        .arg(path)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "crest certs");
}

/// Retries a connection for up to 20 seconds: processes take a moment to bind.
pub(crate) async fn retry<T, F, Fut>(connect: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, crest::sdk::ClientError>>,
{
    eventually(Duration::from_secs(20), "a connection", async || {
        connect().await.map_err(|error| error.to_string())
    })
    .await
}

/// For the benchmarks of processes: the first argument that reads as a number (rounds,
/// runs, seconds), else `default`.
pub(crate) fn count_argument<T: std::str::FromStr>(default: T) -> T {
    std::env::args()
        .skip(1)
        .find_map(|arg| arg.parse().ok())
        .unwrap_or(default)
}

/// For the benchmarks of processes: a runtime of two workers, as the tests use.
pub(crate) fn bench_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
