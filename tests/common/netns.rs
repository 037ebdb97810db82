//! Hosts as network namespaces, for the tests and benchmarks of multi-host behaviour: each
//! host is a namespace joined to a bridge that holds the client host (this process); a host
//! is cut off with nftables in its namespace (every packet in and out dropped) and healed.
//!
//! Needs root, or `sudo` that asks no password (as `scripts/test` does to install what the
//! suite needs); `scripts/test` installs `nftables` and `iproute2` when missing.
// Each test binary uses a part of these helpers.
#![allow(dead_code)]

use crate::cluster::{CREST, retry};
use crate::tmpfs::as_root;
use crest::core::topology::Topology;
use crest::sdk::{ClientTls, Consumer, ConsumerConfig, Message, Producer, ProducerConfig};
use crest_testkit::eventually;
use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub(crate) const WAIT: Duration = Duration::from_secs(30);

pub(crate) fn must(args: &[&str]) {
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
pub(crate) struct Hosts {
    pub(crate) prefix: String,
    pub(crate) subnet: String,
    pub(crate) dir: PathBuf,
    pub(crate) hosts: Vec<String>,
    pub(crate) nodes: Vec<(String, Child)>,
}

impl Hosts {
    pub(crate) fn new(hosts: &[&str]) -> Hosts {
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
    pub(crate) async fn clients(&self, topology: &Topology) -> (Producer, Consumer) {
        let tls = ClientTls::from_file(self.dir.join("certs/ca.pem")).unwrap();
        let producer =
            retry(|| Producer::connect(ProducerConfig::from_topology(topology, tls.clone()))).await;
        let consumer =
            retry(|| Consumer::connect(ConsumerConfig::from_topology(topology, tls.clone()))).await;
        (producer, consumer)
    }

    pub(crate) fn ns(&self, host: &str) -> String {
        format!("{}-{host}", self.prefix)
    }

    /// Starts `node` of the topology at `topology` in `host`'s namespace.
    pub(crate) fn launch(&mut self, host: &str, node: &str, topology: &std::path::Path) {
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
    pub(crate) fn cut(&self, host: &str) {
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

    pub(crate) fn heal(&self, host: &str) {
        let ns = self.ns(host);
        must(&[
            "ip", "netns", "exec", &ns, "nft", "delete", "table", "inet", "cut",
        ]);
    }

    /// Drops every packet between `host` and the hosts at `others` (addresses), in its
    /// namespace: the rest of the network still reaches it.
    pub(crate) fn part(&self, host: &str, others: &[String]) {
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
        // A failing test leaves the nodes' logs behind for whoever reads the failure.
        if std::thread::panicking() {
            eprintln!("the nodes' logs are kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Pushes `count` messages, all of which must be acknowledged; answers their ids.
pub(crate) async fn push(
    producer: &Producer,
    tag: &str,
    count: usize,
) -> HashSet<crest::sdk::MessageId> {
    let messages = (0..count).map(|n| Message::new("jobs", format!("{tag} {n}")));
    let batch = producer.send_batch(messages).await.unwrap();
    let ids = batch.acked().await.expect("every push acknowledged");
    ids.into_iter().collect()
}

/// Pops and acks until `done` holds of the distinct messages that came; returns their ids.
pub(crate) async fn drain(
    consumer: &Consumer,
    done: impl Fn(&HashSet<crest::sdk::MessageId>) -> bool,
) -> HashSet<crest::sdk::MessageId> {
    let mut ids = HashSet::new();
    eventually(WAIT, "every expected message popped", async || {
        if done(&ids) {
            return Ok(());
        }
        let batch = consumer
            .pop("jobs", 256, Duration::from_millis(200))
            .await
            .unwrap();
        let receipts: Vec<_> = batch.iter().map(|d| d.receipt()).collect();
        ids.extend(batch.iter().map(|d| d.id));
        consumer.ack_many(&receipts).await.unwrap();
        Err(format!("{} popped", ids.len()))
    })
    .await;
    ids
}

/// What [`cut_under_load`] saw.
pub(crate) struct Cut {
    /// The longest time without a delivery, from a second before the cut on.
    pub(crate) gap: Duration,
    /// The same for the messages of the leaf with the id given, if any.
    pub(crate) gap_of_leaf: Duration,
    /// The longest an `ack_many` call took, from a second before the cut on.
    pub(crate) ack_max: Duration,
    /// Pops that failed (each after the SDK's own tries).
    pub(crate) pop_errors: usize,
    /// Messages acknowledged to the producer and never delivered, once the host was back
    /// and the tree drained.
    pub(crate) lost: usize,
}

/// Pushes and pops about 1,000 messages a second (20 every 20 ms; pops of up to 64, each
/// batch acknowledged before the next pop, as an application would), cuts `host` off for
/// `cut_for` a second into that load, then heals it, stops the load and drains every
/// acknowledged message. `watch_leaf`: the leaf whose deliveries [`Cut::gap_of_leaf`] is of.
pub(crate) async fn cut_under_load(
    hosts: &Hosts,
    producer: Producer,
    consumer: &Consumer,
    host: &str,
    cut_for: Duration,
    watch_leaf: crest::sdk::LeafId,
) -> Cut {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use tokio::time::Instant;
    #[derive(Default)]
    struct Seen {
        /// When each pop delivered, and whether any of it was `watch_leaf`'s.
        deliveries: Vec<(Instant, bool)>,
        ids: HashSet<crest::sdk::MessageId>,
        /// When each `ack_many` began and how long it took.
        acks: Vec<(Instant, Duration)>,
        pop_errors: usize,
    }
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(HashSet::new()));
    let pushing = tokio::spawn({
        let (stop, acked) = (stop.clone(), acked.clone());
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let round = n;
                n += 1;
                let messages = (0..20).map(|i| Message::new("jobs", format!("load {round} {i}")));
                let batch = producer.send_batch(messages).await.unwrap();
                let acked = acked.clone();
                tokio::spawn(async move {
                    if let Ok(ids) = batch.acked().await {
                        acked.lock().unwrap().extend(ids);
                    }
                });
            }
        }
    });
    let seen = Arc::new(Mutex::new(Seen::default()));
    let popping = tokio::spawn({
        let (consumer, stop, seen) = (consumer.clone(), stop.clone(), seen.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                match consumer.pop("jobs", 64, Duration::from_millis(200)).await {
                    Ok(batch) if !batch.is_empty() => {
                        let receipts: Vec<_> = batch.iter().map(|d| d.receipt()).collect();
                        {
                            let mut seen = seen.lock().unwrap();
                            let watched = batch.iter().any(|d| d.id.leaf() == watch_leaf);
                            seen.deliveries.push((Instant::now(), watched));
                            seen.ids.extend(batch.iter().map(|d| d.id));
                        }
                        // A refused ack leaves its message to be delivered again: counted
                        // as delivered once all the same.
                        let began = Instant::now();
                        let _ = consumer.ack_many(&receipts).await;
                        seen.lock().unwrap().acks.push((began, began.elapsed()));
                    }
                    Ok(_) => {}
                    Err(_) => seen.lock().unwrap().pop_errors += 1,
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cut = Instant::now();
    hosts.cut(host);
    tokio::time::sleep(cut_for).await;
    let observed = {
        let seen = seen.lock().unwrap();
        let from = cut - Duration::from_secs(1);
        let longest_gap = |times: Vec<Instant>| {
            let mut gap = Duration::ZERO;
            let mut last = from;
            for t in times.into_iter().chain([Instant::now()]) {
                gap = gap.max(t - last);
                last = t;
            }
            gap
        };
        let recent = seen.deliveries.iter().filter(|(t, _)| *t >= from);
        let all = recent.clone().map(|(t, _)| *t).collect();
        let watched = recent.filter(|(_, w)| *w).map(|(t, _)| *t).collect();
        let ack_max = seen
            .acks
            .iter()
            .filter(|(began, _)| *began >= from)
            .map(|(_, took)| *took)
            .max()
            .unwrap_or_default();
        (
            longest_gap(all),
            longest_gap(watched),
            ack_max,
            seen.pop_errors,
        )
    };
    hosts.heal(host);
    stop.store(true, Ordering::Relaxed);
    pushing.await.unwrap();
    popping.await.unwrap();
    // Whatever was acknowledged comes out, however the tree is now arranged.
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    let mut ids = std::mem::take(&mut seen.lock().unwrap().ids);
    let deadline = Instant::now() + WAIT;
    while !acked.is_subset(&ids) && Instant::now() < deadline {
        if let Ok(batch) = consumer.pop("jobs", 256, Duration::from_millis(200)).await {
            let receipts: Vec<_> = batch.iter().map(|d| d.receipt()).collect();
            ids.extend(batch.iter().map(|d| d.id));
            let _ = consumer.ack_many(&receipts).await;
        }
    }
    let (gap, gap_of_leaf, ack_max, pop_errors) = observed;
    Cut {
        gap,
        gap_of_leaf,
        ack_max,
        pop_errors,
        lost: acked.difference(&ids).count(),
    }
}

/// Launches `nodes` (host, node) of the topology `text` (with `SUBNET` for the hosts'
/// subnet) on `hosts`, and connects a producer and a consumer of the SDK's defaults once
/// pushes reach each of `leaves` and the root pops what they hold.
pub(crate) async fn launch_all(
    hosts: &mut Hosts,
    text: &str,
    nodes: &[(&str, &str)],
    leaves: usize,
) -> (PathBuf, Producer, Consumer) {
    let text = text.replace("SUBNET", &hosts.subnet);
    let topology_path = hosts.dir.join("topology.toml");
    std::fs::write(&topology_path, &text).unwrap();
    let topology = Topology::parse(&text).unwrap();
    crate::cluster::certs(&topology_path);
    for (host, node) in nodes {
        hosts.launch(host, node, &topology_path);
    }
    let (producer, consumer) = hosts.clients(&topology).await;
    let mut seen = HashSet::new();
    let mut warm = HashSet::new();
    eventually(WAIT, "a push acknowledged by every leaf", async || {
        let handle = producer.send(Message::new("jobs", "warm")).await.unwrap();
        if let Ok(id) = handle.acked().await {
            seen.insert(id.leaf());
            warm.insert(id);
        }
        if seen.len() < leaves {
            Err(seen.clone())
        } else {
            Ok(())
        }
    })
    .await;
    drain(&consumer, |ids| warm.is_subset(ids)).await;
    (topology_path, producer, consumer)
}

/// Roots on hosts r and s (the one on s stands by), a leaf on each of hosts a and b.
const STANDBY: &str = r#"
[tls]
ca = "certs/ca.pem"
cert_dir = "certs"

[[node]]
name = "root"
role = "root"
listen = "SUBNET.1:7400"

[[node]]
name = "root-standby"
role = "root"
listen = "SUBNET.2:7400"

[[node]]
name = "leaf-a"
role = "leaf"
id = 1
listen = "SUBNET.3:7411"
parent = "root"

[[node]]
name = "leaf-b"
role = "leaf"
id = 2
listen = "SUBNET.4:7411"
parent = "root"
"#;

/// `STANDBY` on its hosts under [`cut_under_load`], the root's host cut off for 10 s.
pub(crate) async fn standby_takeover() -> Cut {
    let mut hosts = Hosts::new(&["r", "s", "a", "b"]);
    let nodes = [
        ("r", "root"),
        ("s", "root-standby"),
        ("a", "leaf-a"),
        ("b", "leaf-b"),
    ];
    let (_, producer, consumer) = launch_all(&mut hosts, STANDBY, &nodes, 2).await;
    let ten = Duration::from_secs(10);
    cut_under_load(&hosts, producer, &consumer, "r", ten, crest::sdk::LeafId(1)).await
}

/// A root on host r, and a leaf kept by three replicas on hosts a, b and c.
pub(crate) const REPLICATED: &str = r#"
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

/// Beside `REPLICATED`, a leaf of its own on host d.
const LEAF_ON_D: &str = r#"
[[node]]
name = "leaf-2"
role = "leaf"
listen = "SUBNET.5:7412"
http = "SUBNET.5:7492"
parent = "root"
"#;

/// `REPLICATED` and `LEAF_ON_D` on their hosts under [`cut_under_load`], the host of
/// leaf-1's leader cut off for 10 s; the gap of leaf-2's deliveries is watched.
pub(crate) async fn leader_cut() -> Cut {
    let mut hosts = Hosts::new(&["r", "a", "b", "c", "d"]);
    let nodes = [
        ("r", "root"),
        ("a", "leaf-1a"),
        ("b", "leaf-1b"),
        ("c", "leaf-1c"),
        ("d", "leaf-2"),
    ];
    let text = format!("{REPLICATED}{LEAF_ON_D}");
    let (topology, producer, consumer) = launch_all(&mut hosts, &text, &nodes, 2).await;
    let status = crate::cluster::crest_status(&topology).await;
    let leader = status["groups"][0]["leader"].as_str().unwrap().to_string();
    let host = ["a", "b", "c"][usize::from(leader.as_bytes()[6] - b'a')];
    let ten = Duration::from_secs(10);
    let cut = cut_under_load(
        &hosts,
        producer,
        &consumer,
        host,
        ten,
        crest::sdk::LeafId(2),
    )
    .await;
    // The cut was felt: another replica leads now.
    let status = crate::cluster::crest_status(&topology).await;
    let now = status["groups"][0]["leader"].as_str().unwrap_or("none");
    assert_ne!(
        now, leader,
        "{leader} still leads after its host was cut off: {status:#}"
    );
    cut
}
