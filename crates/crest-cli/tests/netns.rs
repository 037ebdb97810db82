//! Hosts as network namespaces. Each node of `topology/three-hosts.toml` runs as its own
//! `crest launch` process inside the namespace of its host, on an address that exists only
//! there; the hosts and this test (the client host) are joined by a bridge. A host is cut off
//! with nftables in its namespace (every packet in and out dropped) and healed again.
//!
//! Needs root, or `sudo` that asks no password (as `scripts/test` does to install what the
//! suite needs); `scripts/test` installs `nftables` and `iproute2` when missing.

#[path = "common/cluster.rs"]
mod cluster;

use cluster::{CREST, retry};
use crest::core::topology::Topology;
use crest::sdk::{ClientTls, Consumer, ConsumerConfig, LeafId, Message, Producer, ProducerConfig};
use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// Runs a command as root: directly, or through password-less sudo.
fn as_root(args: &[&str]) -> Output {
    let root = rustix::process::geteuid().is_root();
    let mut command = if root {
        Command::new(args[0])
    } else {
        let mut sudo = Command::new("sudo");
        sudo.arg("-n").arg(args[0]);
        sudo
    };
    command
        .args(&args[1..])
        .output()
        .expect("run a command as root")
}

fn must(args: &[&str]) {
    let output = as_root(args);
    assert!(
        output.status.success(),
        "{}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Namespaces `<prefix>-a`, `-b`, `-c` (hosts 10.231.N.1–3) on a bridge `<prefix>br` that
/// holds 10.231.N.254, the client host. Everything is removed when dropped, processes first.
struct Hosts {
    prefix: String,
    subnet: String,
    dir: PathBuf,
    nodes: Vec<(String, Child)>,
}

impl Hosts {
    fn new(hosts: &[&str]) -> Hosts {
        let pid = std::process::id();
        let prefix = format!("cr{}", pid % 100_000);
        let subnet = format!("10.231.{}", pid % 250);
        let dir = std::env::temp_dir().join(format!("crest-netns-{pid}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let hosts_ = Hosts {
            prefix: prefix.clone(),
            subnet: subnet.clone(),
            dir,
            nodes: Vec::new(),
        };
        let bridge = format!("{prefix}br");
        must(&["ip", "link", "add", &bridge, "type", "bridge"]);
        must(&[
            "ip",
            "addr",
            "add",
            &format!("{subnet}.254/24"),
            "dev",
            &bridge,
        ]);
        must(&["ip", "link", "set", &bridge, "up"]);
        for (i, host) in hosts.iter().enumerate() {
            let ns = format!("{prefix}-{host}");
            let outside = format!("{prefix}{host}0");
            let inside = format!("{prefix}{host}1");
            must(&["ip", "netns", "add", &ns]);
            must(&[
                "ip", "link", "add", &outside, "type", "veth", "peer", "name", &inside,
            ]);
            must(&["ip", "link", "set", &outside, "master", &bridge, "up"]);
            must(&["ip", "link", "set", &inside, "netns", &ns]);
            let address = format!("{subnet}.{}/24", i + 1);
            must(&["ip", "-n", &ns, "addr", "add", &address, "dev", &inside]);
            must(&["ip", "-n", &ns, "link", "set", &inside, "up"]);
            must(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        }
        hosts_
    }

    fn ns(&self, host: &str) -> String {
        format!("{}-{host}", self.prefix)
    }

    /// Starts `node` of the topology at `topology` in `host`'s namespace.
    fn launch(&mut self, host: &str, node: &str, topology: &std::path::Path) {
        let log = std::fs::File::create(self.dir.join(format!("{node}.log"))).unwrap();
        let ns = self.ns(host);
        let root = rustix::process::geteuid().is_root();
        let mut command = if root {
            Command::new("ip")
        } else {
            let mut sudo = Command::new("sudo");
            sudo.args(["-n", "ip"]);
            sudo
        };
        let child = command
            .args([
                "netns",
                "exec",
                &ns,
                CREST,
                "launch",
                "--node",
                node,
                "--topology",
            ])
            .arg(topology)
            .current_dir(&self.dir)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.nodes.push((node.to_string(), child));
    }

    /// Drops every packet into and out of `host`.
    fn cut(&self, host: &str) {
        let ns = self.ns(host);
        must(&[
            "ip", "netns", "exec", &ns, "nft", "add", "table", "inet", "cut",
        ]);
        for hook in ["input", "output"] {
            let chain = format!("{{ type filter hook {hook} priority 0; policy drop; }}");
            must(&[
                "ip", "netns", "exec", &ns, "nft", "add", "chain", "inet", "cut", hook, &chain,
            ]);
        }
    }

    fn heal(&self, host: &str) {
        let ns = self.ns(host);
        must(&[
            "ip", "netns", "exec", &ns, "nft", "delete", "table", "inet", "cut",
        ]);
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for (_, child) in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
        for ns in ["a", "b", "c"].map(|host| self.ns(host)) {
            // The nodes run under `ip netns exec` (and perhaps sudo): kill what is left inside.
            let pids = as_root(&["ip", "netns", "pids", &ns]);
            for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                let _ = as_root(&["kill", "-9", pid]);
            }
            let _ = as_root(&["ip", "netns", "delete", &ns]);
        }
        let _ = as_root(&["ip", "link", "delete", &format!("{}br", self.prefix)]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaf_whose_host_is_cut_off_is_routed_around_and_found_again_once_healed() {
    let mut hosts = Hosts::new(&["a", "b", "c"]);
    let text = include_str!("../../../topology/three-hosts.toml")
        .replace("10.0.0.", &format!("{}.", hosts.subnet));
    let topology_path = hosts.dir.join("three-hosts.toml");
    std::fs::write(&topology_path, &text).unwrap();
    let topology = Topology::parse(&text).unwrap();
    cluster::certs(&topology_path);
    for (host, node) in [
        ("a", "root"),
        ("a", "leaf-a"),
        ("b", "agg-b"),
        ("b", "leaf-b1"),
        ("c", "leaf-c1"),
    ] {
        hosts.launch(host, node, &topology_path);
    }
    let tls = ClientTls::from_file(hosts.dir.join("certs/ca.pem")).unwrap();
    let producer =
        retry(|| Producer::connect(ProducerConfig::from_topology(&topology, tls.clone()))).await;
    let consumer =
        retry(|| Consumer::connect(ConsumerConfig::from_topology(&topology, tls.clone()))).await;

    // The whole tree answers: pushes land on every leaf, and the root pops them all.
    let mut leaves = HashSet::new();
    let mut warm = 0;
    let deadline = tokio::time::Instant::now() + WAIT;
    while leaves.len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "leaves {leaves:?}");
        let handle = producer.send(Message::new("jobs", "warm")).await.unwrap();
        if let Ok(id) = handle.acked().await {
            leaves.insert(id.leaf());
            warm += 1;
        }
    }
    drain(&consumer, warm).await;

    // Host c is cut off: every push is acknowledged, by the leaves of a and b, and none
    // fails — batches on their way to leaf-c1 go to the others once its link is found dead.
    hosts.cut("c");
    let mut handles = Vec::new();
    for n in 0..300 {
        let message = Message::new("jobs", format!("cut {n}"));
        handles.push(producer.send(message).await.unwrap());
    }
    let mut during = Vec::new();
    for handle in handles {
        during.push(
            handle
                .acked()
                .await
                .expect("acknowledged while c is cut off"),
        );
    }
    assert!(
        during.iter().all(|id| id.leaf() != LeafId(3)),
        "nothing acknowledged by the leaf that is cut off"
    );
    // And consumers are served the messages of the hosts that answer.
    let popped = drain(&consumer, during.len()).await;
    assert!(during.iter().all(|id| popped.contains(id)));

    // Healed: host c's leaf is tried again and takes pushes once more.
    hosts.heal("c");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "leaf-c1 takes no push after the heal"
        );
        let handle = producer.send(Message::new("jobs", "healed")).await.unwrap();
        if handle.acked().await.is_ok_and(|id| id.leaf() == LeafId(3)) {
            break;
        }
    }
}

/// Pops and acks until `count` distinct messages came; returns their ids.
async fn drain(consumer: &Consumer, count: usize) -> HashSet<crest::sdk::MessageId> {
    let mut ids = HashSet::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while ids.len() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "popped {} of {count}",
            ids.len()
        );
        let batch = consumer
            .pop("jobs", 256, Duration::from_millis(200))
            .await
            .unwrap();
        let receipts: Vec<_> = batch.iter().map(|d| d.receipt()).collect();
        ids.extend(batch.iter().map(|d| d.id));
        consumer.ack_many(&receipts).await.unwrap();
    }
    ids
}
