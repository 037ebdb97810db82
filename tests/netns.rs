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
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[path = "common/tmpfs.rs"]
mod tmpfs;

use tmpfs::as_root;

const WAIT: Duration = Duration::from_secs(30);

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
    hosts: Vec<String>,
    nodes: Vec<(String, Child)>,
}

impl Hosts {
    fn new(hosts: &[&str]) -> Hosts {
        // Tests of one process run at once: each set of hosts has its own names and subnet.
        static SETS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let set = SETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let prefix = format!("cr{}{set}", pid % 10_000);
        let subnet = format!("10.{}.{}", 231 - set % 16, pid % 250);
        let dir = std::env::temp_dir().join(format!("crest-netns-{pid}-{set}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let hosts_ = Hosts {
            prefix: prefix.clone(),
            subnet: subnet.clone(),
            dir,
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
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

    /// A producer and a consumer for `topology`, from the client host, once they connect.
    async fn clients(&self, topology: &Topology) -> (Producer, Consumer) {
        let tls = ClientTls::from_file(self.dir.join("certs/ca.pem")).unwrap();
        let producer =
            retry(|| Producer::connect(ProducerConfig::from_topology(topology, tls.clone()))).await;
        let consumer =
            retry(|| Consumer::connect(ConsumerConfig::from_topology(topology, tls.clone()))).await;
        (producer, consumer)
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

    /// Drops every packet between `host` and the hosts at `others` (addresses), in its
    /// namespace: the rest of the network still reaches it.
    fn part(&self, host: &str, others: &[String]) {
        let ns = self.ns(host);
        must(&[
            "ip", "netns", "exec", &ns, "nft", "add", "table", "inet", "cut",
        ]);
        let set = format!("{{ {} }}", others.join(", "));
        for (hook, side) in [("input", "saddr"), ("output", "daddr")] {
            let chain = format!("{{ type filter hook {hook} priority 0; }}");
            must(&[
                "ip", "netns", "exec", &ns, "nft", "add", "chain", "inet", "cut", hook, &chain,
            ]);
            must(&[
                "ip", "netns", "exec", &ns, "nft", "add", "rule", "inet", "cut", hook, "ip", side,
                &set, "drop",
            ]);
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for (_, child) in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
        for ns in self.hosts.iter().map(|host| self.ns(host)) {
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
    let text = include_str!("../topology/three-hosts.toml")
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
    let (producer, consumer) = hosts.clients(&topology).await;

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
    drain(&consumer, |ids| ids.len() >= warm).await;

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
    let popped = drain(&consumer, |ids| ids.len() >= during.len()).await;
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

/// A root on host r, and a leaf kept by three replicas on hosts a, b and c.
const REPLICATED: &str = r#"
[tls]
ca = "certs/ca.pem"
cert_dir = "certs"

[[node]]
name = "root"
role = "root"
listen = "SUBNET.1:7400"
http = "SUBNET.1:7480"

[[node]]
name = "leaf-1a"
role = "leaf"
group = "leaf-1"
listen = "SUBNET.2:7411"
http = "SUBNET.2:7491"
replication = "SUBNET.2:7421"
parent = "root"

[[node]]
name = "leaf-1b"
role = "leaf"
group = "leaf-1"
listen = "SUBNET.3:7411"
http = "SUBNET.3:7491"
replication = "SUBNET.3:7421"
parent = "root"

[[node]]
name = "leaf-1c"
role = "leaf"
group = "leaf-1"
listen = "SUBNET.4:7411"
http = "SUBNET.4:7491"
replication = "SUBNET.4:7421"
parent = "root"
"#;

/// Which host each replica of `REPLICATED` runs on.
const HOST_OF: [(&str, &str); 3] = [("leaf-1a", "a"), ("leaf-1b", "b"), ("leaf-1c", "c")];

/// `REPLICATED` running on its hosts, with a producer and a consumer on the client host, 100
/// pushes acknowledged, and its group's status once a replica leads.
struct Replicated {
    hosts: Hosts,
    topology_path: PathBuf,
    topology: Topology,
    producer: Producer,
    consumer: Consumer,
    acked: HashSet<crest::sdk::MessageId>,
    group: serde_json::Value,
    /// The replica that leads, and its term.
    leader: String,
    term: u64,
}

async fn replicated() -> Replicated {
    let mut hosts = Hosts::new(&["r", "a", "b", "c"]);
    let text = REPLICATED.replace("SUBNET", &hosts.subnet);
    let topology_path = hosts.dir.join("replicated.toml");
    std::fs::write(&topology_path, &text).unwrap();
    let topology = Topology::parse(&text).unwrap();
    cluster::certs(&topology_path);
    hosts.launch("r", "root", &topology_path);
    for (node, host) in HOST_OF {
        hosts.launch(host, node, &topology_path);
    }
    let (producer, consumer) = hosts.clients(&topology).await;
    let acked = push(&producer, "before", 100).await;
    let serving = |g: &serde_json::Value| g["leader"].is_string();
    let group = group_status(&topology_path, "no replica leads", serving).await;
    let leader = group["leader"].as_str().unwrap().to_string();
    let term = group["term"].as_u64().unwrap();
    Replicated {
        hosts,
        topology_path,
        topology,
        producer,
        consumer,
        acked,
        group,
        leader,
        term,
    }
}

/// `crest status --json`'s entry for group leaf-1 once `done` holds of it (within `WAIT`).
async fn group_status(
    topology: &std::path::Path,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let status = cluster::crest_status(topology).await;
        let group = &status["groups"][0];
        if done(group) {
            return group.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}, not within {WAIT:?}: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The entry of `node` among a group status's replicas.
fn replica<'a>(group: &'a serde_json::Value, node: &str) -> &'a serde_json::Value {
    group["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["node"] == node)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_its_group_stops_serving_and_a_follower_takes_its_writes() {
    // Goal: the leader of a three-replica leaf, each replica on its own host, is parted from
    // the other two replicas while producers, consumers and the root still reach it: it stops
    // serving (fenced: it cannot commit), a follower is elected and takes the pushes, nothing
    // acknowledged is lost or delivered twice, and once healed the old leader follows.
    let Replicated {
        hosts,
        topology_path,
        topology,
        producer,
        consumer,
        mut acked,
        leader,
        term,
        ..
    } = replicated().await;
    let (_, host) = HOST_OF.iter().find(|(node, _)| *node == leader).unwrap();
    let others: Vec<String> = HOST_OF
        .iter()
        .filter(|(node, _)| *node != leader)
        .map(|(node, _)| topology.node(node).unwrap().listen.ip().to_string())
        .collect();
    hosts.part(host, &others);
    let parted = tokio::time::Instant::now();
    // Pushes sent now may reach the parted leader first: they are acknowledged by the next.
    let (during, group) = tokio::join!(push(&producer, "during", 200), async {
        let newer = |g: &serde_json::Value| {
            g["term"].as_u64().is_some_and(|t| t > term)
                && g["leader"] != leader.as_str()
                && replica(g, &leader)["serving"].is_null()
        };
        let group = group_status(&topology_path, "no follower took over", newer).await;
        eprintln!(
            "{leader} parted from its group: {} leads in term {} and {leader} serves no more, {:?} later",
            group["leader"],
            group["term"],
            parted.elapsed()
        );
        group
    });
    acked.extend(during);
    // The old leader, still reachable, says it serves nothing: it is fenced.
    assert_ne!(replica(&group, &leader)["state"], "leader", "{group:#}");
    assert!(replica(&group, &leader)["serving"].is_null(), "{group:#}");
    hosts.heal(host);
    let rejoined = |g: &serde_json::Value| {
        let old = replica(g, &leader);
        old["state"] == "follower" && old["lag_entries"] == 0 && g["leader"].is_string()
    };
    group_status(&topology_path, "the old leader does not follow", rejoined).await;
    acked.extend(push(&producer, "after", 50).await);
    // Every acknowledged push is delivered (`drain` fails after `WAIT` otherwise).
    drain(&consumer, |ids| acked.is_subset(ids)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_from_its_group_does_not_depose_the_leader_when_it_returns() {
    // Goal: a follower whose host is cut off for 10 s hears no leader and asks, round after
    // round, whether the others would elect it; no answer comes, so it never raises its term.
    // Healed, it follows the leader it left: the group keeps its leader and term throughout,
    // and nothing acknowledged is lost.
    let setup = replicated().await;
    let (hosts, topology_path) = (&setup.hosts, &setup.topology_path);
    let (leader, term, mut acked) = (setup.leader.clone(), setup.term, setup.acked.clone());
    let (follower, host) = *HOST_OF.iter().find(|(node, _)| *node != leader).unwrap();
    let asked_before = replica(&setup.group, follower)["pre_votes"]
        .as_u64()
        .unwrap();
    hosts.cut(host);
    let cut = tokio::time::Instant::now();
    // For the 10 s of the cut, every look finds the same leader serving in the same term.
    acked.extend(push(&setup.producer, "during", 100).await);
    let mut looks = 0;
    while cut.elapsed() < Duration::from_secs(10) {
        let status = cluster::crest_status(topology_path).await;
        let group = &status["groups"][0];
        assert_eq!(group["leader"], leader.as_str(), "{status:#}");
        assert_eq!(group["term"], term, "{status:#}");
        looks += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(looks >= 3, "{looks} looks at the group in 10 s");
    hosts.heal(host);
    let rejoined = |g: &serde_json::Value| {
        let back = replica(g, follower);
        back["state"] == "follower" && back["lag_entries"] == 0 && back["applied"].is_u64()
    };
    let group = group_status(topology_path, "the follower does not follow", rejoined).await;
    assert_eq!(
        group["leader"],
        leader.as_str(),
        "the leader was deposed: {group:#}"
    );
    assert_eq!(group["term"], term, "an election was held: {group:#}");
    // It did ask while cut off (no leader heard for 1.2 to 2.2 election timeouts each time),
    // without ever raising its term.
    let back = replica(&group, follower);
    assert!(
        back["pre_votes"].as_u64().unwrap() >= asked_before + 3,
        "{group:#}"
    );
    assert_eq!(back["term"], term, "{group:#}");
    acked.extend(push(&setup.producer, "after", 50).await);
    drain(&setup.consumer, |ids| acked.is_subset(ids)).await;
}

/// Pushes `count` messages, all of which must be acknowledged; answers their ids.
async fn push(producer: &Producer, tag: &str, count: usize) -> HashSet<crest::sdk::MessageId> {
    let messages = (0..count).map(|n| Message::new("jobs", format!("{tag} {n}")));
    let batch = producer.send_batch(messages).await.unwrap();
    let ids = batch.acked().await.expect("every push acknowledged");
    ids.into_iter().collect()
}

/// Pops and acks until `done` holds of the distinct messages that came; returns their ids.
async fn drain(
    consumer: &Consumer,
    done: impl Fn(&HashSet<crest::sdk::MessageId>) -> bool,
) -> HashSet<crest::sdk::MessageId> {
    let mut ids = HashSet::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done(&ids) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "popped {} and not all expected",
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
