//! crest in the operators' own tools: a real Prometheus (Debian's `prometheus`, which
//! `scripts/test` installs) scrapes every node of a `crest local` process and its HTTP query
//! API shows the values the test caused; `promtool check metrics` passes on every node's
//! `/metrics`; the alert rules shipped in `deploy/` load into that Prometheus, pass `promtool
//! check rules` and their unit tests (`promtool test rules`); the Grafana dashboard and the
//! rules name only series the nodes export.

#[path = "common/printing.rs"]
mod printing;

use crest::sdk::{ClientTls, Consumer, ConsumerConfig, Message, Producer, ProducerConfig};
use crest_testkit::eventually_blocking;
use printing::{Node, Process, ephemeral_default_topology, node_table, spawn_printing};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const CREST: &str = env!("CARGO_BIN_EXE_crest");
const DEFAULT: &str = include_str!("../topology/local.toml");
/// Each node of the default tree with a parent, and its parent.
const DEFAULT_PARENTS: [(&str, &str); 6] = [
    ("agg-1", "root"),
    ("agg-2", "root"),
    ("leaf-1", "agg-1"),
    ("leaf-2", "agg-1"),
    ("leaf-3", "agg-2"),
    ("leaf-4", "agg-2"),
];
/// How long Prometheus has to show a value (it scrapes every second here).
const WAIT: Duration = Duration::from_secs(60);

fn deploy(file: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy")).join(file)
}

/// Starts `crest local` on ephemeral ports, its leaves logging under `dir`, its own logs as
/// JSON lines in `dir/local.log`, topic `ops-jobs` dead-lettering at the first failed
/// delivery; returns the process and its nodes as it printed them.
fn start_local(dir: &Path) -> (Process, Vec<Node>) {
    let mut topology = ephemeral_default_topology();
    topology.push_str("[settings.topics.ops-jobs]\nmax_attempts = 1\n");
    let path = dir.join("topology.toml");
    std::fs::write(&path, topology).unwrap();
    let mut command = Command::new(CREST);
    command
        .args(["--log-format", "json", "local", "--no-sqs", "--topology"])
        .arg(&path)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--ca-out")
        .arg(dir.join("ca.pem"))
        .stderr(std::fs::File::create(dir.join("local.log")).unwrap());
    let (process, lines) = spawn_printing(command);
    let nodes = node_table(&lines);
    assert_eq!(nodes.len(), 7, "{nodes:?}");
    (process, nodes)
}

/// `GET path` from `addr` (HTTP/1.0, plain): the status and the body.
fn get(addr: &str, path: &str, accept: Option<&str>) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{accept}\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

/// `text` percent-encoded for a query string.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A private Prometheus scraping `nodes` every second, with the shipped rules loaded.
struct Prometheus {
    _process: Process,
    addr: String,
    log: PathBuf,
}

impl Prometheus {
    fn start(dir: &Path, nodes: &[Node]) -> Prometheus {
        let mut config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: crest\n    honor_labels: true\n    static_configs:\n",
            deploy("crest.rules.yml").display()
        );
        for node in nodes {
            config.push_str(&format!(
                "      - targets: [\"{}\"]\n        labels: {{node: \"{}\", role: \"{}\"}}\n",
                node.http, node.name, node.role
            ));
        }
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).unwrap();
        let log = dir.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg("--web.listen-address=127.0.0.1:0")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("prometheus is needed: scripts/test installs it (Debian: apt-get install prometheus)");
        let pid = child.id();
        let process = Process(child);
        // It was given port 0: the port it bound is the one `ss` lists for its PID.
        let addr = eventually_blocking(Duration::from_secs(30), "Prometheus to listen", || {
            let out = Command::new("ss").args(["-Htlnp"]).output().unwrap();
            let listing = String::from_utf8_lossy(&out.stdout);
            let found = listing
                .lines()
                .filter(|l| l.contains(&format!("pid={pid},")))
                .find_map(|l| {
                    l.split_whitespace()
                        .find(|w| w.starts_with("127.0.0.1:"))
                        .map(str::to_string)
                });
            found.ok_or_else(|| std::fs::read_to_string(&log).unwrap_or_default())
        });
        // Listening is not serving: queries answer 503 until its storage is up, which its
        // readiness endpoint says.
        eventually_blocking(Duration::from_secs(30), "Prometheus to be ready", || {
            get(&addr, "/-/ready", None).0 == 200
        });
        Prometheus {
            _process: process,
            addr,
            log,
        }
    }

    /// `query`'s result vector, evaluated now.
    fn query(&self, query: &str) -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", encode(query));
        let (status, body) = get(&self.addr, &path, None);
        assert_eq!(status, 200, "{query}: {body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until `query` evaluates to the single value `want`.
    fn wait_for(&self, query: &str, want: f64) {
        eventually_blocking(WAIT, format!("{query} = {want}"), || {
            let result = self.query(query);
            let value = result
                .first()
                .and_then(|r| r["value"][1].as_str())
                .and_then(|v| v.parse::<f64>().ok());
            if result.len() == 1 && value == Some(want) {
                Ok(())
            } else {
                let said = std::fs::read_to_string(&self.log).unwrap_or_default();
                Err(format!("{result:?}; Prometheus said:\n{said}"))
            }
        })
    }
}

/// Runs `promtool` with `args`, `input` on its stdin; its success and what it printed.
fn promtool(args: &[&str], input: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(
            "promtool is needed: scripts/test installs it (Debian: apt-get install prometheus)",
        );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// The metric names a PromQL expression refers to: its identifiers that start as crest's,
/// Prometheus's own and the process's series do.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut word = String::new();
    for c in expr.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        let w = std::mem::take(&mut word);
        if w.starts_with("crest_") || w.starts_with("process_") || w == "up" {
            names.insert(w);
        }
    }
    names
}

/// Every `expr` in a Grafana dashboard's JSON.
fn dashboard_exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                match (key.as_str(), inner) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    _ => dashboard_exprs(inner, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| dashboard_exprs(i, out)),
        _ => {}
    }
}

/// Every `expr:` of a rules file.
fn rule_exprs(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .map(|e| e.trim().to_string())
        .collect()
}

/// `crest status` over the running tree and one more leaf that does not answer (its HTTP port
/// held, never served): every node of the tree up with its version, its link's round trip
/// and a leaf's log disk, the slowest leaf's sync named, the silent one down, exit code 2.
fn crest_status_shows_the_tree(dir: &Path, nodes: &[Node]) {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_quic = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut topology = String::new();
    let mut current: Option<&Node> = None;
    for line in DEFAULT.lines() {
        if let Some(name) = line.strip_prefix("name = ") {
            current = nodes.iter().find(|n| format!("\"{}\"", n.name) == name);
        }
        match (current, line.split_once(" = ")) {
            (Some(node), Some(("listen", _))) => {
                topology.push_str(&format!("listen = \"{}\"", node.quic))
            }
            (Some(node), Some(("http", _))) => {
                topology.push_str(&format!("http = \"{}\"", node.http))
            }
            _ => topology.push_str(line),
        }
        topology.push('\n');
    }
    topology.push_str(&format!(
        "\n[[node]]\nname = \"leaf-5\"\nrole = \"leaf\"\nid = 5\nlisten = \"{}\"\nhttp = \"{}\"\nparent = \"agg-2\"\n",
        silent_quic.local_addr().unwrap(),
        silent.local_addr().unwrap()
    ));
    let path = dir.join("status.toml");
    std::fs::write(&path, topology).unwrap();
    let json = Command::new(CREST)
        .args(["status", "--json", "--topology"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(json.status.code(), Some(2), "{json:?}");
    let status: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(status["down"], serde_json::json!(["leaf-5"]), "{status:#}");
    assert_eq!(status["root_in_charge"], "root");
    let listed = status["nodes"].as_array().unwrap();
    assert_eq!(listed.len(), 8);
    for node in listed.iter().filter(|n| n["node"] != "leaf-5") {
        assert_eq!(node["up"], true, "{node}");
        let parent = DEFAULT_PARENTS
            .iter()
            .find(|(child, _)| node["node"] == *child)
            .map(|(_, parent)| *parent);
        assert_eq!(node["parent"].as_str(), parent, "{node}");
        assert_eq!(node["version"], env!("CARGO_PKG_VERSION"), "{node}");
        assert!(node["rtt_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{node}");
        if node["role"] == "leaf" {
            assert!(
                node["disk_used_bytes"].as_u64().is_some_and(|b| b > 0),
                "{node}"
            );
            assert!(node["disk_free_bytes"].as_u64().is_some(), "{node}");
        }
    }
    // leaf-1 took every push: its syncs are the slowest there are.
    assert_eq!(status["slowest_sync"]["node"], "leaf-1", "{status:#}");
    assert!(
        status["slowest_sync"]["sync_p99_us"]
            .as_u64()
            .is_some_and(|us| us > 0)
    );
    let table = Command::new(CREST)
        .args(["status", "--topology"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(table.status.code(), Some(2));
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("down: leaf-5"), "{table}");
    assert!(table.contains("slowest log sync: leaf-1"), "{table}");
    drop(silent);
}

/// What `crest local` writes is its owner's alone: the log's directories 0700, its segments
/// and checkpoints 0600, and the admin token 0600 even where a token file readable by others
/// was there before (it kept its old mode when rewritten).
#[test]
fn the_files_a_tree_writes_are_private() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin.token");
    std::fs::write(&token, "old\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (process, _nodes) = start_local(dir.path());
    let mode = |path: &Path| std::fs::metadata(path).unwrap().mode() & 0o777;
    assert_eq!(mode(&token), 0o600);
    assert_ne!(std::fs::read_to_string(&token).unwrap(), "old\n");
    let mut seen = (0, 0);
    let mut stack = vec![dir.path().join("data")];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            assert_eq!(mode(&path), 0o700, "{}", path.display());
            seen.0 += 1;
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else {
            assert_eq!(mode(&path), 0o600, "{}", path.display());
            seen.1 += 1;
        }
    }
    // A directory and at least a segment and a lock file for each of the four leaves.
    assert!(seen.0 >= 5 && seen.1 >= 8, "{seen:?} directories and files");
    drop(process);
}

/// `crest status` without `--topology` reads the tree `crest local` runs by default (as every
/// other client command does), naming each of its nodes (down, unless a `crest local` of the
/// defaults runs on this machine).
#[test]
fn crest_status_without_a_topology_describes_the_default_tree() {
    let dir = tempfile::tempdir().unwrap();
    let table = Command::new(CREST)
        .arg("status")
        .current_dir(dir.path())
        .env_remove("CREST_TOPOLOGY")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(matches!(table.status.code(), Some(0 | 2)), "{text}");
    for node in ["root", "agg-1", "agg-2", "leaf-1", "leaf-4"] {
        assert!(text.contains(node), "{node}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_every_node_and_shows_what_the_tree_holds() {
    // Goal: an operator's Prometheus, pointed at every node, sees the values the test caused
    // — depths per topic and priority, dead letters, deliveries, pushes, every node up — and
    // the shipped rules load; every node's /metrics passes `promtool check metrics`; the
    // dashboard and the rules name only series the nodes export.
    let dir = tempfile::tempdir().unwrap();
    let (_local, nodes) = start_local(dir.path());
    // Its logs are JSON lines, one per event, with its fields: each node said it started.
    let log = std::fs::read_to_string(dir.path().join("local.log")).unwrap();
    let events: Vec<Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    for node in &nodes {
        let started = events.iter().any(|e| {
            e["fields"]["message"] == "node started"
                && e["fields"]["node"] == node.name.as_str()
                && e["level"] == "INFO"
                && e["timestamp"].is_string()
        });
        assert!(started, "no JSON line says {} started:\n{log}", node.name);
    }
    let leaf = nodes.iter().find(|n| n.name == "leaf-1").unwrap();
    let root = nodes.iter().find(|n| n.role == "root").unwrap();
    let ca = std::fs::read_to_string(dir.path().join("ca.pem")).unwrap();
    // `crest local` writes its admin's token beside the CA.
    let token = std::fs::read_to_string(dir.path().join("admin.token")).unwrap();
    let tls = ClientTls::new(ca).with_token(token.trim());
    let producer = Producer::connect(ProducerConfig::new(vec![leaf.quic.clone()], tls.clone()))
        .await
        .unwrap();
    let consumer = Consumer::connect(ConsumerConfig::new(root.quic.clone(), tls))
        .await
        .unwrap();
    // 20 at priority 3 and 10 at priority 1.
    let batch: Vec<Message> = (0..30)
        .map(|n| Message::new("ops-jobs", format!("m{n}")).priority(if n < 20 { 3 } else { 1 }))
        .collect();
    let ids = producer
        .send_batch(batch)
        .await
        .unwrap()
        .acked()
        .await
        .unwrap();
    assert_eq!(ids.len(), 30);
    // 4 fail their one attempt (dead letters), 6 stay in flight.
    let mut popped = Vec::new();
    while popped.len() < 10 {
        let got = consumer
            .pop("ops-jobs", 10 - popped.len() as u32, Duration::from_secs(5))
            .await
            .unwrap();
        popped.extend(got);
    }
    for delivery in &popped[..4] {
        consumer
            .nack(&delivery.receipt(), Duration::ZERO, Some("bad input"))
            .await
            .unwrap();
    }

    crest_status_shows_the_tree(dir.path(), &nodes);

    let prometheus = Prometheus::start(dir.path(), &nodes);
    prometheus.wait_for("count(up{job=\"crest\"} == 1)", 7.0);
    prometheus.wait_for("count(up{job=\"crest\",role=\"leaf\"} == 1)", 4.0);
    // The 10 most urgent went first: what is ready is the 20 at priority 3.
    prometheus.wait_for("crest_topic_ready{topic=\"ops-jobs\",priority=\"3\"}", 20.0);
    prometheus.wait_for("sum(crest_topic_ready{topic=\"ops-jobs\"})", 20.0);
    // Only priority 3 has a message waiting (those of priority 1 are leased or dead), and it
    // has waited since the push.
    prometheus.wait_for(
        "count(crest_topic_oldest_ready_age_seconds{topic=\"ops-jobs\",priority=\"3\"} > 0)",
        1.0,
    );
    prometheus.wait_for(
        "count(crest_topic_oldest_ready_age_seconds{topic=\"ops-jobs\"})",
        1.0,
    );
    prometheus.wait_for("crest_topic_dead{topic=\"ops-jobs\"}", 4.0);
    prometheus.wait_for("crest_topic_in_flight{topic=\"ops-jobs\"}", 6.0);
    prometheus.wait_for("crest_messages_dead_lettered_total", 4.0);
    prometheus.wait_for("sum(crest_pushed_total)", 30.0);
    prometheus.wait_for("sum(crest_pushed_total{node=\"leaf-1\"})", 30.0);
    prometheus.wait_for("crest_deliveries_total", 10.0);
    prometheus.wait_for("sum(crest_pop_batch_messages_sum)", 10.0);
    prometheus.wait_for(
        "crest_consumer_lag_seconds_count{topic=\"ops-jobs\",priority=\"1\"}",
        10.0,
    );
    let none_delivered = "crest_consumer_lag_seconds_count{topic=\"ops-jobs\",priority=\"3\"}";
    assert_eq!(prometheus.query(none_delivered), Vec::<Value>::new());
    prometheus.wait_for("count(crest_log_disk_used_bytes > 0)", 4.0);
    prometheus.wait_for(
        "count(crest_log_disk_free_bytes <= crest_log_disk_size_bytes)",
        4.0,
    );
    prometheus.wait_for("count(crest_node_connected == 1)", 7.0);
    prometheus.wait_for("count(crest_parent_connected == 1)", 6.0);
    prometheus.wait_for(
        "count(crest_quic_rtt_max_seconds{node=\"root\",kind=\"leaf\"} > 0)",
        1.0,
    );

    // The shipped rules loaded, every one healthy.
    let (status, body) = get(&prometheus.addr, "/api/v1/rules", None);
    assert_eq!(status, 200, "{body}");
    let rules: Value = serde_json::from_str(&body).unwrap();
    let groups = rules["data"]["groups"].as_array().unwrap();
    assert!(!groups.is_empty(), "{body}");
    for group in groups {
        for rule in group["rules"].as_array().unwrap() {
            assert_eq!(rule["health"], "ok", "{rule}");
        }
    }

    // Every node's answer passes promtool's lint; OpenMetrics when asked for.
    let mut exported = BTreeSet::new();
    for node in &nodes {
        let (status, text) = get(&node.http, "/metrics", None);
        assert_eq!(status, 200, "{}: {text}", node.name);
        let (ok, said) = promtool(&["check", "metrics"], &text);
        assert!(ok, "{}: promtool check metrics: {said}\n{text}", node.name);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            exported.insert(name.to_string());
        }
        let (status, open) = get(&node.http, "/metrics", Some("application/openmetrics-text"));
        assert_eq!(status, 200);
        assert!(open.ends_with("# EOF\n"), "{}: {open}", node.name);
    }
    exported.insert("up".to_string());

    // The dashboard and the rules ask only for what the nodes export.
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(deploy("grafana-crest.json")).unwrap())
            .unwrap();
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 8, "{exprs:?}");
    exprs.extend(rule_exprs(
        &std::fs::read_to_string(deploy("crest.rules.yml")).unwrap(),
    ));
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{expr} names no series");
        for name in names {
            // Replication's series are served by replicas only (not in crest local).
            if name.starts_with("crest_replica_") {
                continue;
            }
            assert!(exported.contains(&name), "{expr}: {name} is not exported");
        }
    }
    let prefix = "crest_replica_follower_lag_entries";
    assert!(
        exprs.iter().any(|e| e.contains(prefix)),
        "a replica lag rule"
    );
}

#[test]
fn the_shipped_alert_rules_pass_promtool_and_their_unit_tests() {
    let rules = deploy("crest.rules.yml");
    let (ok, said) = promtool(&["check", "rules", rules.to_str().unwrap()], "");
    assert!(ok, "promtool check rules: {said}");
    let tests = deploy("crest.rules.test.yml");
    let (ok, said) = promtool(&["test", "rules", tests.to_str().unwrap()], "");
    assert!(ok, "promtool test rules: {said}");
    assert!(said.contains("SUCCESS"), "{said}");
    // Every alert has a unit test that makes it fire.
    let text = std::fs::read_to_string(&rules).unwrap();
    let tested = std::fs::read_to_string(&tests).unwrap();
    for alert in text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(str::trim)
    {
        assert!(
            tested.contains(&format!("alertname: {alert}")),
            "{alert} has no unit test"
        );
    }
}
