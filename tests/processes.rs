//! End-to-end tests with one real process per node (`crest launch`), as on separate hosts.
//!
//! The tree of `topology/local.toml` runs as seven processes with certificates from
//! `crest certs`; nodes above the leaves are killed with SIGKILL and started again, and every
//! message the leaves hold must still be delivered exactly once.

use crest::core::topology::Topology;
use crest::sdk::{
    ClientTls, Consumer, ConsumerConfig, Delivery, MessageId, Producer, ProducerConfig, Receipt,
};
use std::collections::HashSet;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const CREST: &str = env!("CARGO_BIN_EXE_crest");

/// Node processes, killed when the test ends however it ends.
struct Cluster {
    dir: PathBuf,
    topology_path: PathBuf,
    topology: Topology,
    children: Vec<(String, Child)>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Cluster {
    /// Writes `topology/local.toml` with free loopback ports and fast failure detection,
    /// makes certificates with `crest certs`, and launches every node.
    fn start(name: &str) -> Cluster {
        let dir = std::env::temp_dir().join(format!("crest-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let local =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/topology/local.toml"))
                .unwrap();
        // Hold every socket until all ports are chosen, so no two nodes get the same one.
        let sockets: Vec<UdpSocket> = (0..7)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let mut text = local.clone();
        for (old, socket) in ["7400", "7401", "7402", "7411", "7412", "7413", "7414"]
            .iter()
            .zip(&sockets)
        {
            let port = socket.local_addr().unwrap().port().to_string();
            text = text.replace(&format!("127.0.0.1:{old}"), &format!("127.0.0.1:{port}"));
        }
        drop(sockets);
        text = text.replace(
            "[settings]\n",
            "[settings]\nidle_timeout_ms = 1500\nkeep_alive_ms = 300\nreconnect_backoff_max_ms = 300\n",
        );
        text.push_str("\n[tls]\nca = \"certs/ca.pem\"\ncert_dir = \"certs\"\n");
        let topology_path = dir.join("topology.toml");
        std::fs::write(&topology_path, &text).unwrap();
        let topology = Topology::parse(&text).unwrap();
        let status = Command::new(CREST)
            .args(["certs", "--topology"])
            .arg(&topology_path)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "crest certs");
        let mut cluster = Cluster {
            dir,
            topology_path,
            topology,
            children: Vec::new(),
        };
        for node in cluster.topology.nodes.clone() {
            cluster.launch(&node.name);
        }
        cluster
    }

    fn launch(&mut self, node: &str) {
        let log = std::fs::File::create(self.dir.join(format!("{node}.log"))).unwrap();
        let child = Command::new(CREST)
            .args(["launch", "--node", node, "--topology"])
            .arg(&self.topology_path)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.push((node.to_string(), child));
    }

    /// SIGKILL: no chance to close connections or say goodbye.
    fn kill(&mut self, node: &str) {
        let index = self
            .children
            .iter()
            .position(|(name, _)| name == node)
            .unwrap();
        let (_, mut child) = self.children.remove(index);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    fn tls(&self) -> ClientTls {
        ClientTls::from_file(self.dir.join("certs/ca.pem")).unwrap()
    }

    async fn producer(&self) -> Producer {
        retry(|| Producer::connect(ProducerConfig::from_topology(&self.topology, self.tls()))).await
    }

    async fn consumer(&self) -> Consumer {
        retry(|| Consumer::connect(ConsumerConfig::from_topology(&self.topology, self.tls()))).await
    }
}

/// Retries a connection for up to 20 seconds: processes take a moment to bind.
async fn retry<T, F, Fut>(connect: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, crest::sdk::ClientError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match connect().await {
            Ok(value) => return value,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("could not connect: {error}"),
        }
    }
}

/// Pops and acks until `expected` distinct messages were seen in total, or 30 s pass.
async fn drain(consumer: &Consumer, seen: &mut HashSet<MessageId>, expected: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < expected && tokio::time::Instant::now() < deadline {
        let batch = match consumer.pop("jobs", 32, Duration::from_millis(500)).await {
            Ok(batch) => batch,
            Err(error) => panic!("pop failed: {error}"),
        };
        let receipts: Vec<Receipt> = batch.iter().map(Delivery::receipt).collect();
        if !receipts.is_empty() {
            let results = consumer.ack_many(&receipts).await.unwrap();
            assert!(results.iter().all(Result::is_ok), "{results:?}");
        }
        for delivery in batch {
            assert!(
                seen.insert(delivery.id),
                "{} delivered again after its ack",
                delivery.id
            );
        }
    }
}

async fn push(producer: &Producer, count: usize) -> Vec<MessageId> {
    let mut handles = Vec::new();
    for i in 0..count {
        let message = crest::sdk::Message::new("jobs", format!("m{i}")).priority((i % 7) as u32);
        handles.push(producer.send(message).await.unwrap());
    }
    let mut ids = Vec::new();
    for handle in handles {
        ids.push(handle.acked().await.unwrap());
    }
    ids
}

fn assert_logs_clean(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "log") {
            let log = std::fs::read_to_string(&path).unwrap();
            assert!(
                !log.contains("panicked"),
                "{} shows a panic:\n{log}",
                path.display()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_root_or_an_aggregator_loses_nothing_the_leaves_hold() {
    let mut cluster = Cluster::start("restart");
    let producer = cluster.producer().await;
    let pushed: HashSet<MessageId> = push(&producer, 400).await.into_iter().collect();

    // Take some before the crash; they are acknowledged and must never come back.
    let consumer = cluster.consumer().await;
    let mut seen = HashSet::new();
    drain(&consumer, &mut seen, 100).await;
    assert!(seen.len() >= 100);

    cluster.kill("root");
    cluster.launch("root");
    let consumer = cluster.consumer().await;
    drain(&consumer, &mut seen, 250).await;
    assert!(
        seen.len() >= 250,
        "delivery resumed after the root restart: {} seen",
        seen.len()
    );

    cluster.kill("agg-1");
    cluster.launch("agg-1");
    let more: HashSet<MessageId> = push(&producer, 100).await.into_iter().collect();
    drain(&consumer, &mut seen, pushed.len() + more.len()).await;

    let all: HashSet<MessageId> = pushed.union(&more).copied().collect();
    assert_eq!(
        seen, all,
        "every message delivered exactly once across both restarts"
    );
    assert_logs_clean(&cluster.dir);
}
