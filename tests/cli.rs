//! The `crest` command's client and admin subcommands against a local tree over QUIC: every
//! delivery option is reachable from the shell.

mod common;

use crest::core::topology::Topology;
use crest::node::LocalTree;
use crest_testkit::eventually;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const CREST: &str = env!("CARGO_BIN_EXE_crest");
const DEFAULT: &str = include_str!("../topology/local.toml");

struct Cli {
    ca: PathBuf,
    /// The tree's admin token, given to every command as `CREST_TOKEN`.
    token: String,
    root: String,
    leaves: Vec<String>,
    dir: tempfile::TempDir,
}

impl Cli {
    /// The `crest` command against a tree of `topology` started here, whose CA it trusts.
    async fn start(topology: &Topology) -> (LocalTree, Cli) {
        let tree = LocalTree::start(topology).await.unwrap();
        assert!(tree.wait_connected(Duration::from_secs(10)).await);
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, &tree.ca_pem).unwrap();
        let cli = Cli {
            ca,
            token: tree.admin_token.clone(),
            root: tree.topology.root().address.clone(),
            leaves: tree.topology.leaves().map(|l| l.address.clone()).collect(),
            dir,
        };
        (tree, cli)
    }

    /// Runs `crest ARGS` with the tree's CA and addresses; returns (success, stdout + stderr).
    async fn run(&self, args: &[&str]) -> (bool, String) {
        let mut command = Command::new(CREST);
        command
            .args(args)
            .arg("--ca")
            .arg(&self.ca)
            .env("CREST_TOKEN", &self.token);
        match args[0] {
            "push" => {
                for leaf in &self.leaves {
                    command.arg("--leaf").arg(leaf);
                }
            }
            _ => {
                command.arg("--root").arg(&self.root);
            }
        }
        common::output(command).await
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (success, text) = self.run(args).await;
        assert!(success, "crest {args:?} failed:\n{text}");
        text
    }
}

/// The value of `key=` in a line of `crest pop` output.
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    let start = text.find(&format!("{key}=")).expect(key) + key.len() + 1;
    text[start..].split_whitespace().next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_pop_nack_extend_dlq_and_stats_from_the_command_line() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/topology/local.toml"))
        .unwrap();
    let settings = "\n[settings.topics.flaky]\nmax_attempts = 2\n";
    let topology = Topology::parse(&format!("{text}{settings}"))
        .unwrap()
        .with_ephemeral_ports();
    let (tree, cli) = Cli::start(&topology).await;

    // Dedup: the same key twice prints the same id.
    let push = [
        "push",
        "--topic",
        "flaky",
        "--priority",
        "1",
        "--dedup-key",
        "k1",
    ];
    let first = cli
        .ok(&[&push[..], &["--ttl-ms", "60000", "poison"]].concat())
        .await;
    let second = cli.ok(&[&push[..], &["poison again"]].concat()).await;
    assert_eq!(first.trim(), second.trim());
    // A delayed message and a less urgent one the filter must skip.
    cli.ok(&["push", "--topic", "flaky", "--delay-ms", "60000", "later"])
        .await;
    cli.ok(&["push", "--topic", "flaky", "--priority", "5", "slow"])
        .await;

    // Pop with the filter, extend, then nack twice: the second failure dead-letters it.
    for attempt in 1..=2 {
        let popped = cli
            .ok(&[
                "pop",
                "--topic",
                "flaky",
                "--max-priority",
                "1",
                "--wait-ms",
                "5000",
                "--visibility-ms",
                "2000",
            ])
            .await;
        assert_eq!(field(&popped, "payload"), "poison", "{popped}");
        assert_eq!(field(&popped, "attempt"), attempt.to_string());
        let receipt = field(&popped, "receipt").to_string();
        cli.ok(&["extend", "--visibility-ms", "5000", &receipt])
            .await;
        cli.ok(&["nack", "--reason", "bad-input", &receipt]).await;
        let (success, text) = cli.run(&["ack", &receipt]).await;
        assert!(!success && text.contains("stale"), "{text}");
    }
    let empty = cli
        .ok(&["pop", "--topic", "flaky", "--max-priority", "1"])
        .await;
    assert!(empty.contains("no message ready"), "{empty}");

    let listed = cli
        .ok(&["dlq", "list", "--topic", "flaky", "--payloads"])
        .await;
    assert!(listed.contains("attempts=2"), "{listed}");
    assert!(listed.contains("\"bad-input\""), "{listed}");
    assert!(listed.contains("payload=poison"), "{listed}");

    let json = cli.ok(&["stats", "--topic", "flaky", "--json"]).await;
    let stats: serde_json::Value = serde_json::from_str(&json).unwrap();
    let topic = &stats["topics"][0];
    assert_eq!(topic["topic"], "flaky");
    assert_eq!(topic["dead"], 1);
    assert_eq!(topic["delayed"], 1);
    assert_eq!(stats["deduplicated"], 1);
    let table = cli.ok(&["stats"]).await;
    assert!(table.contains("flaky"), "{table}");
    // A topic that holds nothing is shown with zeros.
    let empty = cli.ok(&["stats", "--topic", "never-pushed"]).await;
    let row = empty
        .lines()
        .find(|l| l.starts_with("never-pushed "))
        .unwrap_or_default();
    let row: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        row,
        [
            "never-pushed",
            "0",
            "0",
            "0",
            "0",
            "-",
            "(holds",
            "nothing)"
        ],
        "{empty}"
    );
    // Three messages of `flaky` wait (dead, delayed, slow): 6 + 5 + 4 payload bytes in namespace
    // `default`.
    let default = table
        .lines()
        .find(|l| l.starts_with("default "))
        .unwrap_or_default();
    let sums: Vec<&str> = default.split_whitespace().collect();
    assert_eq!(sums, ["default", "3", "15", "0"], "{table}");
    assert_eq!(topic["bytes"], 15, "{json}");

    let (success, text) = cli.run(&["dlq", "purge", "--topic", "flaky"]).await;
    assert!(!success && text.contains("--all"), "{text}");
    let redriven = cli.ok(&["dlq", "redrive", "--topic", "flaky"]).await;
    assert!(redriven.contains("redrove 1"), "{redriven}");
    let back = cli
        .ok(&["pop", "--topic", "flaky", "--wait-ms", "5000", "--ack"])
        .await;
    assert_eq!(field(&back, "attempt"), "1", "{back}");
    assert!(back.contains("acked"), "{back}");

    // An admin settles a lease by message id: released, delivered again, then acked.
    let pop_slow = ["pop", "--topic", "flaky", "--wait-ms", "5000"];
    let slow = cli
        .ok(&[&pop_slow[..], &["--visibility-ms", "600000"]].concat())
        .await;
    assert_eq!(field(&slow, "payload"), "slow", "{slow}");
    let id = field(&slow, "id").to_string();
    let released = cli
        .ok(&["lease", "nack", "--topic", "flaky", "--reason", "hung", &id])
        .await;
    assert!(released.contains("nack: settled 1 of 1"), "{released}");
    let again = cli.ok(&pop_slow).await;
    assert_eq!(
        (field(&again, "id"), field(&again, "attempt")),
        (id.as_str(), "2")
    );
    let acked = cli.ok(&["lease", "ack", "--topic", "flaky", &id]).await;
    assert!(acked.contains("ack: settled 1 of 1"), "{acked}");
    let (success, text) = cli.run(&["ack", field(&again, "receipt")]).await;
    assert!(!success && text.contains("already settled"), "{text}");

    // A configuration set at run time: one attempt, then the dead-letter topic.
    let set = [
        "topic",
        "set",
        "--topic",
        "flaky",
        "--max-attempts",
        "1",
        "--dead-letter-topic",
        "flaky-dlq",
        "--attribute",
        "owner=ops",
    ];
    let configured = cli.ok(&set).await;
    assert!(
        configured.contains("configured at 4 leaves"),
        "every leaf: {configured}"
    );
    let listed = cli.ok(&["topic", "list", "--prefix", "fla"]).await;
    for part in [
        "flaky ",
        "max_attempts=1",
        "dead_letter_topic=flaky-dlq",
        "owner=\"ops\"",
    ] {
        assert!(listed.contains(part), "{part} in {listed}");
    }
    cli.ok(&["push", "--topic", "flaky", "doomed"]).await;
    let doomed = cli
        .ok(&["pop", "--topic", "flaky", "--wait-ms", "5000"])
        .await;
    assert_eq!(field(&doomed, "payload"), "doomed", "{doomed}");
    cli.ok(&["nack", field(&doomed, "receipt")]).await;
    let moved = cli
        .ok(&["pop", "--topic", "flaky-dlq", "--wait-ms", "5000", "--ack"])
        .await;
    assert_eq!(field(&moved, "payload"), "doomed", "{moved}");
    cli.ok(&["topic", "unset", "--topic", "flaky"]).await;
    let listed = cli.ok(&["topic", "list"]).await;
    assert!(!listed.contains("flaky"), "{listed}");

    // A purge asks for confirmation, then deletes what waits (the delayed message).
    let (success, text) = cli.run(&["purge", "--topic", "flaky"]).await;
    assert!(!success && text.contains("--yes"), "{text}");
    let purged = cli.ok(&["purge", "--topic", "flaky", "--yes"]).await;
    assert!(purged.contains("purged 1 messages of flaky"), "{purged}");

    // A namespace's quota: set, listed with what the namespace holds, a push past it refused
    // by name, and gone once unset.
    let capped = [
        "policy",
        "set",
        "--namespace",
        "capped",
        "--messages-max",
        "2",
    ];
    let set = cli.ok(&capped).await;
    assert!(set.contains("messages_max=2 at 4 leaves"), "{set}");
    cli.ok(&["push", "--topic", "capped/a", "--count", "2", "one"])
        .await;
    let (success, text) = cli.run(&["push", "--topic", "capped/a", "three"]).await;
    let why = "namespace capped would hold more messages than its messages_max 2";
    assert!(!success && text.contains(why), "{text}");
    let listed = cli.ok(&["policy", "list"]).await;
    assert!(
        listed.contains("capped messages_max=2 messages=2"),
        "{listed}"
    );
    // `crest stats` shows the scope's usage against its quota and the refused message, once
    // the leaves reported them to the root (every `quota_report_ms`).
    let what = "a limits row for capped/ with 2/2 held and 1 refused over its quota";
    eventually(Duration::from_secs(10), what, async || {
        let stats = cli.ok(&["stats"]).await;
        let row = stats.lines().find(|l| l.starts_with("capped/ "));
        let fields: Vec<&str> = row.map_or(Vec::new(), |r| r.split_whitespace().collect());
        // The last five: pushes over quota, over rate, for now (a batch may have waited past
        // `quota_hold_ms` while another leaf held the quota's allowance: not asserted), pops
        // over rate and in flight.
        let refused = fields.len().checked_sub(5).map(|at| &fields[at..at + 2]);
        if fields.get(1) == Some(&"2/2") && refused == Some(&["1,", "0,"][..]) {
            Ok(())
        } else {
            Err(stats)
        }
    })
    .await;
    cli.ok(&["policy", "unset", "--namespace", "capped"]).await;
    cli.ok(&["push", "--topic", "capped/a", "three"]).await;

    // A principal's rates: set, listed, refused as a quota, and unset.
    let principal = ["policy", "set", "--principal", "robot"];
    let set = cli
        .ok(&[&principal[..], &["--pop-rate", "5"]].concat())
        .await;
    assert!(
        set.contains("principal robot: pop_rate=5/s,burst=5 at 4 leaves"),
        "{set}"
    );
    let listed = cli.ok(&["policy", "list"]).await;
    assert!(
        listed.contains("principal robot pop_rate=5/s,burst=5"),
        "{listed}"
    );
    let (success, text) = cli
        .run(&[&principal[..], &["--messages-max", "5"]].concat())
        .await;
    assert!(!success && text.contains("takes rates"), "{text}");
    cli.ok(&["policy", "unset", "--principal", "robot"]).await;
    let listed = cli.ok(&["policy", "list"]).await;
    assert!(!listed.contains("robot"), "{listed}");

    // A namespace's number of topics, over the leaves the pushes go to.
    cli.ok(&["policy", "set", "--namespace", "few", "--topics-max", "1"])
        .await;
    cli.ok(&["push", "--topic", "few/a", "--count", "4", "one"])
        .await;
    let (success, text) = cli.run(&["push", "--topic", "few/b", "two"]).await;
    let why = "namespace few would hold more topics than its topics_max 1";
    assert!(!success && text.contains(why), "{text}");
    tree.shutdown().await;
}

/// What a new user runs into: wrong numbers explained, payloads from files and standard
/// input, an unknown node named, a second ack told it came too late, failed acks failing the
/// command, the topology from `CREST_TOPOLOGY`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rough_edges_a_new_user_meets_are_explained() {
    let bare = |args: &[&str]| {
        let mut command = Command::new(CREST);
        command.args(args);
        common::output(command)
    };
    let (ok, text) = bare(&["push", "--topic", "t", "--priority", "-1", "x"]).await;
    assert!(!ok && text.contains("-1 is below 0"), "{text}");
    assert!(text.contains("0 (the most urgent)"), "{text}");
    let (ok, text) = bare(&["push", "--topic", "t", "--count", "0", "x"]).await;
    assert!(!ok && text.contains("--count"), "{text}");
    let (ok, text) = bare(&["push", "--topic", "t"]).await;
    assert!(
        !ok && text.contains("--file"),
        "a payload or a file: {text}"
    );
    // Only the commands that run nodes export spans, so only they take a collector.
    let (ok, text) = bare(&["status", "--otlp-endpoint", "http://127.0.0.1:4318"]).await;
    assert!(
        !ok && text.contains("unexpected argument '--otlp-endpoint'"),
        "{text}"
    );
    for command in ["local", "launch"] {
        let (ok, text) = bare(&[command, "--help"]).await;
        assert!(ok && text.contains("--otlp-endpoint"), "{command}: {text}");
    }
    let local = concat!(env!("CARGO_MANIFEST_DIR"), "/topology/local.toml");
    let (ok, text) = bare(&["launch", "--node", "nosuch", "--topology", local]).await;
    assert!(
        !ok && text.contains("\"nosuch\" is not in") && text.contains("leaf-4"),
        "{text}"
    );
    let mut command = Command::new(CREST);
    command
        .args(["stats"])
        .env("CREST_TOPOLOGY", "/nonexistent/topology.toml");
    let (ok, text) = common::output(command).await;
    assert!(!ok && text.contains("/nonexistent/topology.toml"), "{text}");

    let topology = Topology::parse(DEFAULT).unwrap().with_ephemeral_ports();
    let (tree, cli) = Cli::start(&topology).await;
    let file = cli.dir.path().join("payload");

    // A payload too large for an argument, from a file and from standard input.
    let big = "p".repeat(200 * 1024);
    std::fs::write(&file, &big).unwrap();
    cli.ok(&["push", "--topic", "big", "--file", file.to_str().unwrap()])
        .await;
    let popped = cli
        .ok(&["pop", "--topic", "big", "--wait-ms", "5000", "--ack"])
        .await;
    assert_eq!(field(&popped, "payload").len(), big.len());
    let mut command = Command::new(CREST);
    command
        .args(["push", "--topic", "big", "--file", "-", "--ca"])
        .arg(&cli.ca)
        .env("CREST_TOKEN", &cli.token)
        .args(cli.leaves.iter().flat_map(|leaf| ["--leaf", leaf.as_str()]))
        .stdin(std::fs::File::open(&file).unwrap());
    let (ok, text) = common::output(command).await;
    assert!(ok, "{text}");
    let popped = cli
        .ok(&["pop", "--topic", "big", "--wait-ms", "5000"])
        .await;
    assert_eq!(field(&popped, "payload"), big);

    // A second ack of one receipt: the message is already settled.
    let receipt = field(&popped, "receipt").to_string();
    cli.ok(&["ack", &receipt]).await;
    let (ok, text) = cli.run(&["ack", &receipt]).await;
    assert!(!ok && text.contains("already settled"), "{text}");

    // `pop --ack` fails when an ack fails: leases of 1 ms end before the ack reaches the leaf
    // (a big payload crosses the tree and the terminal first). Whatever the timing, the exit
    // status must agree with what the command printed.
    let mut failures = 0;
    for _ in 0..5 {
        cli.ok(&["push", "--topic", "short", "--file", file.to_str().unwrap()])
            .await;
        let (ok, text) = cli
            .run(&[
                "pop",
                "--topic",
                "short",
                "--wait-ms",
                "5000",
                "--visibility-ms",
                "1",
                "--ack",
            ])
            .await;
        let refused = text.contains("failed: stale");
        assert_eq!(ok, !refused, "exit status and output disagree:\n{text}");
        if refused {
            failures += 1;
            assert!(text.contains("1 of 1 acks were refused"), "{text}");
            // The message is back after its lease: take it for good.
            cli.ok(&["pop", "--topic", "short", "--wait-ms", "5000", "--ack"])
                .await;
            break;
        }
    }
    assert_eq!(failures, 1, "an ack after a 1 ms lease was refused");
    tree.shutdown().await;
}

#[test]
fn crest_certs_makes_each_node_a_certificate_of_its_own_name_for_the_time_asked() {
    use x509_parser::extensions::GeneralName;
    let dir = tempfile::tempdir().unwrap();
    let topology = dir.path().join("topology.toml");
    std::fs::write(&topology, DEFAULT).unwrap();
    let status = Command::new(CREST)
        .args(["certs", "--valid-for", "30days", "--topology"])
        .arg(&topology)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    for node in Topology::parse(DEFAULT).unwrap().nodes {
        let pem = std::fs::read(dir.path().join(format!("certs/{}.pem", node.name))).unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let cert = pem.parse_x509().unwrap();
        let alternative = cert.subject_alternative_name().unwrap().expect("names");
        let dns: Vec<String> = alternative
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::DNSName(dns) => Some(dns.to_string()),
                _ => None,
            })
            .collect();
        // Its own name only: no name shared by every node (its addresses are IPs).
        assert_eq!(dns, vec![node.name.clone()]);
        let left = cert.validity().time_to_expiration().expect("valid now");
        let day = 24 * 3600;
        assert!(
            left.whole_seconds() > 29 * day && left.whole_seconds() <= 30 * day,
            "{} expires in {left}",
            node.name
        );
    }
}
