//! `crest bench` end to end, through the binary: against a tree it starts itself (durable
//! leaves, fill then drain) and against a running tree (`--connect`, steady mixed load at a
//! target rate). The report must account for every message: pushed = popped, nothing missing,
//! no duplicates, no protocol violations. Throughput figures are printed, never asserted.

mod common;

use crest::core::topology::Topology;
use crest::node::LocalTree;
use crest_testkit::eventually;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

const CREST: &str = env!("CARGO_BIN_EXE_crest");

async fn crest(args: Vec<String>) -> (bool, String) {
    let mut command = Command::new(CREST);
    command.args(args);
    common::output(command).await
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn report(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Runs `crest bench ARGS --quiet --json FILE` and asserts it succeeded; its output and the
/// JSON it wrote.
async fn bench_ok(list: &[&str]) -> (String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let mut list = args(list);
    list.insert(0, "bench".into());
    list.extend(args(&["--quiet", "--json", json.to_str().unwrap()]));
    let (ok, text) = crest(list).await;
    assert!(ok, "{text}");
    println!("{text}");
    (text, report(&json))
}

/// A small fill-then-drain: 2 producers, 1 consumer popping 64 at a time.
const SMALL_FILL: &[&str] = &["--producers", "2", "--consumers", "1", "--pop-batch", "64"];

/// The leaves whose log syncs a report gives one by one (node names), and the sum of their
/// counts.
fn syncs_by_leaf(report: &Value) -> (Vec<String>, u64) {
    let by_leaf = report["log_sync_by_leaf_us"].as_object().unwrap();
    let names = by_leaf.keys().cloned().collect();
    let count = by_leaf.values().map(|p| p["count"].as_u64().unwrap()).sum();
    (names, count)
}

fn assert_accounted(report: &Value, messages: u64, text: &str) {
    assert_run_accounted(report, messages, text);
    assert!(text.contains("pop wait (us)"), "{text}");
}

/// What [`assert_accounted`] checks of one run's JSON report.
fn assert_run_accounted(report: &Value, messages: u64, text: &str) {
    assert_eq!(report["pushed"], messages, "{text}");
    assert_eq!(report["popped"], messages, "{text}");
    assert_eq!(report["missing"], 0, "{text}");
    assert_eq!(report["duplicates"], 0, "{text}");
    assert_eq!(report["push_errors"], 0, "{text}");
    assert_eq!(report["foreign"], 0, "{text}");
    assert_eq!(report["acked"], messages, "{text}");
    assert_eq!(
        report["latency"]["push_ack_us"]["count"], messages,
        "{text}"
    );
    assert_eq!(
        report["latency"]["push_to_pop_us"]["count"], messages,
        "{text}"
    );
    assert_eq!(report["rank_error"]["count"], messages, "{text}");
    // Push-ack latency per leaf: every message counted once, at one of the tree's leaves
    // (the default tree's ids 1-4), by the id its leaf gave it.
    let by_leaf = report["latency"]["push_ack_by_leaf_us"]
        .as_object()
        .unwrap();
    let per_leaf: u64 = by_leaf.values().map(|p| p["count"].as_u64().unwrap()).sum();
    assert_eq!(per_leaf, messages, "{text}");
    assert!(
        !by_leaf.is_empty()
            && by_leaf
                .keys()
                .all(|id| ["1", "2", "3", "4"].contains(&id.as_str())),
        "{text}"
    );
    // No more than 1 % of any leaf's pushes are slower than its p99, so no more than 1 % of
    // all: the whole's p99 is never above the slowest leaf's.
    let slowest = by_leaf.values().map(|p| p["p99"].as_u64().unwrap()).max();
    assert!(
        slowest >= report["latency"]["push_ack_us"]["p99"].as_u64(),
        "{text}"
    );
    // Every pop that delivered counts in pop wait; pop latency counts only those asked while
    // a pushed message was known to be waiting.
    let waits = report["latency"]["pop_wait_us"]["count"].as_u64().unwrap();
    let pops = report["latency"]["pop_us"]["count"].as_u64().unwrap();
    assert!(
        waits > 0 && waits >= pops,
        "pop waits {waits}, pops {pops}: {text}"
    );
    assert!(report["push_rate"].as_f64().unwrap() > 0.0, "{text}");
    assert!(report["pop_rate"].as_f64().unwrap() > 0.0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_on_its_own_durable_tree_accounts_for_every_message() {
    let (text, report) = bench_ok(&[&["--messages", "4000"], SMALL_FILL].concat()).await;
    assert!(text.contains("durable leaves"), "{text}");
    assert!(text.contains("rank error"), "{text}");
    assert_accounted(&report, 4000, &text);
    assert_eq!(report["durable"], true);
    assert_eq!(report["phase"], "fill-then-drain");
    assert_eq!(report["protocol_violations"], 0, "{text}");
    // Counted, not asserted zero: a loss is legal; its count must be reported.
    assert!(report["quic_lost_packets"].is_u64(), "{text}");
    assert!(
        text.contains("QUIC packets lost on the tree's links"),
        "{text}"
    );
    // Durable leaves synced their logs for the pushes and acks; the bench reports the syncs.
    let syncs = report["log_sync_us"]["count"].as_u64().unwrap_or(0);
    assert!(syncs >= 4, "at least one sync per leaf: {text}");
    assert!(text.contains("leaves' log syncs (us)"), "{text}");
    // ... and each leaf's: all four synced, and together they are the whole.
    assert_eq!(
        report["syncing_leaves"],
        serde_json::json!([4, 4]),
        "{text}"
    );
    let (names, per_leaf) = syncs_by_leaf(&report);
    assert_eq!(names, ["leaf-1", "leaf-2", "leaf-3", "leaf-4"], "{text}");
    assert_eq!(per_leaf, syncs, "{text}");
    assert!(
        text.contains("at leaf-4") && text.contains("at leaf 4"),
        "{text}"
    );
    // The process's CPU, tree included, split between the fill and the drain.
    let cpu = &report["cpu"];
    assert_eq!(cpu["includes_tree"], true, "{text}");
    let seconds = cpu["seconds"].as_f64().unwrap();
    let fill = cpu["fill_seconds"].as_f64().unwrap();
    let drain = cpu["drain_seconds"].as_f64().unwrap();
    assert!(fill > 0.0 && drain > 0.0, "{text}");
    assert!((fill + drain - seconds).abs() < 1e-6, "{text}");
    assert!(
        cpu["drain_us_per_message"].as_f64().unwrap() > 0.0,
        "{text}"
    );
    assert!(text.contains("CPU (tree + load generator)"), "{text}");
    // Everything is present before the drain starts and one consumer pops: the tree serves in
    // key order, so the typical pop has no more urgent message left behind.
    assert_eq!(report["rank_error"]["p50"], 0, "{text}");
    // The lease-time rank error covers every delivery and, with one consumer (nothing in
    // flight to another), never exceeds the live one.
    let lease = &report["lease_rank_error"];
    assert_eq!(lease["count"], 4000, "{text}");
    assert!(
        lease["max"].as_u64() <= report["rank_error"]["max"].as_u64(),
        "{text}"
    );
    assert!(
        report["lease_inverted_pops"].as_u64() <= report["inverted_pops"].as_u64(),
        "{text}"
    );
    assert!(text.contains("at lease time (msgs)"), "{text}");
}

/// `topology/one-syncing-leaf.toml`: the default tree whose leaves 2-4 write their logs
/// without syncing. Only leaf-1's syncs are reported, the table says how many leaves sync,
/// and every message is still accounted for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_reports_which_leaves_sync_when_a_topology_makes_some_buffered() {
    let topology = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/topology/one-syncing-leaf.toml"
    );
    let (text, report) =
        bench_ok(&[&["--topology", topology, "--messages", "3000"], SMALL_FILL].concat()).await;
    assert_accounted(&report, 3000, &text);
    assert_eq!(report["durable"], true, "{text}");
    assert_eq!(
        report["syncing_leaves"],
        serde_json::json!([1, 4]),
        "{text}"
    );
    assert!(text.contains("1 of 4 fsync before ack"), "{text}");
    let (names, per_leaf) = syncs_by_leaf(&report);
    assert_eq!(names, ["leaf-1"], "only leaf-1 syncs: {text}");
    assert_eq!(per_leaf, report["log_sync_us"]["count"], "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_drives_a_running_tree_with_a_steady_mixed_load_at_a_target_rate() {
    let topology = Topology::parse(crest::DEFAULT_TOPOLOGY)
        .unwrap()
        .with_ephemeral_ports();
    let tree = LocalTree::start(&topology).await.unwrap();
    assert!(tree.wait_connected(Duration::from_secs(10)).await);
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &tree.ca_pem).unwrap();
    let json = dir.path().join("report.json");
    let mut list = args(&[
        "bench",
        "--connect",
        "--ca",
        ca.to_str().unwrap(),
        "--token",
        &tree.admin_token,
        "--root",
        &tree.topology.root().address,
        "--messages",
        "3000",
        "--rate",
        "10000",
        "--phase",
        "mixed",
        "--producers",
        "2",
        "--consumers",
        "3",
        "--priorities",
        "uniform:4",
        "--pop-batch",
        "16",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    for leaf in tree.topology.leaves() {
        list.push("--leaf".into());
        list.push(leaf.address.clone());
    }
    let (ok, text) = crest(list).await;
    assert!(ok, "{text}");
    println!("{text}");
    assert!(text.contains("remote tree"), "{text}");
    let report = report(&json);
    assert_accounted(&report, 3000, &text);
    assert_eq!(report["phase"], "mixed");
    assert_eq!(report["durable"], Value::Null);
    // Only the load generator's CPU, and no fill / drain split in a mixed run.
    assert_eq!(report["cpu"]["includes_tree"], false, "{text}");
    assert!(
        report["cpu"]["us_per_message"].as_f64().unwrap() > 0.0,
        "{text}"
    );
    assert_eq!(report["cpu"]["fill_seconds"], Value::Null, "{text}");
    assert!(text.contains("CPU (load generator)"), "{text}");
    // The pacer never sends faster than asked: 3000 messages at 10,000/s take at least 0.3 s
    // (a lower bound, whatever the machine's load).
    assert!(
        report["push_seconds"].as_f64().unwrap() >= 0.27,
        "{}",
        report["push_seconds"]
    );
    // The bench used a topic of its own and acknowledged everything: the tree is empty.
    let (ok, stats) = crest(args(&[
        "stats",
        "--ca",
        ca.to_str().unwrap(),
        "--token",
        &tree.admin_token,
        "--root",
        &tree.topology.root().address,
        "--json",
    ]))
    .await;
    assert!(ok, "{stats}");
    let stats: Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(stats["topics"], Value::Array(vec![]), "{stats}");
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_refuses_bad_arguments_with_a_clear_error() {
    let (ok, text) = crest(args(&["bench", "--payload-bytes", "10", "--memory"])).await;
    assert!(!ok);
    assert!(text.contains("at least 24"), "{text}");
    for runs in ["0", "101"] {
        let (ok, text) = crest(args(&["bench", "--runs", runs, "--memory"])).await;
        assert!(!ok);
        assert!(text.contains("--runs must be 1 to 100"), "{text}");
    }
    let (ok, text) = crest(args(&["bench", "--priorities", "zipf"])).await;
    assert!(!ok);
    assert!(text.contains("expected `skewed`"), "{text}");
    let (ok, text) = crest(args(&["bench", "--consumers", "0", "--memory"])).await;
    assert!(!ok);
    assert!(text.contains("at least 1"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_for_a_duration_at_a_rate_without_acks() {
    let (text, report) = bench_ok(&[
        "--memory",
        "--duration",
        "1s",
        "--rate",
        "2000",
        "--phase",
        "mixed",
        "--no-ack",
        "--priorities",
        "fixed:3",
    ])
    .await;
    let pushed = report["pushed"].as_u64().unwrap();
    // The pacer never runs ahead of the rate: at most 2000/s for 1 s (a message or two of
    // slack per producer for rounding).
    assert!(pushed > 0 && pushed <= 2008, "{text}");
    assert_eq!(report["popped"], pushed, "{text}");
    assert_eq!(report["missing"], 0, "{text}");
    assert_eq!(report["acked"], 0, "no acks were sent: {text}");
    // One priority only: nothing can be more urgent than what is popped.
    assert_eq!(report["rank_error"]["max"], 0, "{text}");
    assert_eq!(report["ack"], false);
    // Leaves in memory have no log to sync.
    assert!(report["log_sync_us"].is_null(), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crest_sim_is_reproducible_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let workload = dir.path().join("w.toml");
    std::fs::write(
        &workload,
        "duration_ms = 200\n[link]\njitter_us = 300\n[[producer]]\nrate = 20000\n\
         [[consumer]]\nmax = 32\n[[consumer]]\nmax = 32\n",
    )
    .unwrap();
    let run = |seed: &str, json: &std::path::Path| {
        args(&[
            "sim",
            "--workload",
            workload.to_str().unwrap(),
            "--seed",
            seed,
            "--json",
            json.to_str().unwrap(),
        ])
    };
    let (a_json, b_json) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let (ok, a) = crest(run("5", &a_json)).await;
    assert!(ok, "{a}");
    let (ok, b) = crest(run("5", &b_json)).await;
    assert!(ok, "{b}");
    assert_eq!(a, b, "same seed, same report");
    assert_eq!(
        std::fs::read(&a_json).unwrap(),
        std::fs::read(&b_json).unwrap(),
        "same JSON, byte for byte"
    );
    let report = report(&a_json);
    assert_eq!(report["seed"], 5);
    assert_eq!(report["delivered"], report["pushed"]);
    assert!(report["series"].as_array().is_some_and(|s| !s.is_empty()));
    assert!(
        a.contains("inversion time") && a.contains("bubble-up to root"),
        "{a}"
    );
    let (ok, text) = crest(args(&["sim", "--workload", "/nonexistent.toml"])).await;
    assert!(!ok && text.contains("nonexistent"), "{text}");
    // An invariant violated: the command fails and names the seed that reproduces it (here a
    // drain of 1 ms: the run ends with the last acknowledged messages still on their way).
    let short = dir.path().join("short.toml");
    let scenario = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/sim/leaf-crash.toml"
    ))
    .unwrap();
    let scenario: String = scenario
        .lines()
        .map(|l| {
            if l.starts_with("drain_ms") {
                "drain_ms = 1"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&short, scenario).unwrap();
    let (ok, text) = crest(args(&[
        "sim",
        "--workload",
        short.to_str().unwrap(),
        "--seed",
        "1",
    ]))
    .await;
    assert!(!ok, "{text}");
    assert!(
        text.contains("invariants violated") && text.contains("reproduce with --seed 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_bench_measures_durable_appends_on_the_given_disk_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("wal.json");
    let (ok, text) = crest(args(&[
        "wal",
        "bench",
        "--dir",
        dir.path().to_str().unwrap(),
        "--logs",
        "2",
        "--rate",
        "1000",
        "--duration",
        "300ms",
        "--busy-threads",
        "1",
        "--json",
        json.to_str().unwrap(),
    ]))
    .await;
    assert!(ok, "{text}");
    assert!(text.contains("append latency (us)"), "{text}");
    let report = report(&json);
    // 0.3 s at 1000 appends/s on each of 2 logs, every one synced and timed.
    assert_eq!(report["appends"], 600, "{text}");
    assert_eq!(report["failed"], 0, "{text}");
    assert_eq!(report["messages"], 600 * 4, "{text}");
    assert_eq!(report["latency_us"]["count"], 600, "{text}");
    assert_eq!(report["durability"], "fsync", "{text}");
    assert!(report["groups"].as_u64().unwrap() >= 2, "{text}");
    // Only the report is left behind: the logs' run directory is gone.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "{text}");

    let (ok, text) = crest(args(&["wal", "bench", "--logs", "0"])).await;
    assert!(!ok && text.contains("--logs must be"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_repeats_a_run_and_reports_medians_and_every_run() {
    let (text, summary) = bench_ok(&["--memory", "--runs", "3", "--messages", "2000"]).await;
    for run in 1..=3 {
        assert!(text.contains(&format!("run {run}/3: pushes")), "{text}");
    }
    assert!(text.contains("median (min - max) of 3 runs"), "{text}");
    // Three trees started and stopped: an orderly stop reports no lost connection.
    assert!(!text.contains("connection lost"), "{text}");
    assert!(text.contains("CPU per message, drain"), "{text}");
    let runs = summary["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{text}");
    for run in runs {
        assert_run_accounted(run, 2000, &text);
    }
    assert_eq!(summary["missing"], 0, "{text}");
    assert_eq!(summary["protocol_violations"], 0, "{text}");
    // Each run's slowest leaf is at least the whole, so the medians are too.
    assert!(text.contains("push-ack p99, slowest leaf"), "{text}");
    let median = |name: &str| summary[name]["median"].as_f64().unwrap();
    assert!(
        median("push_ack_p99_slowest_leaf_us") >= median("push_ack_p99_us"),
        "{text}"
    );
    // The median is the middle run's figure, within the range.
    let mut rates: Vec<f64> = runs
        .iter()
        .map(|run| run["push_rate"].as_f64().unwrap())
        .collect();
    rates.sort_by(f64::total_cmp);
    assert_eq!(summary["push_rate"]["median"].as_f64().unwrap(), rates[1]);
    assert_eq!(summary["push_rate"]["min"].as_f64().unwrap(), rates[0]);
    assert_eq!(summary["push_rate"]["max"].as_f64().unwrap(), rates[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_compares_two_trees_in_interleaved_pairs() {
    let dir = tempfile::tempdir().unwrap();
    // B: the default tree with half the credits.
    let b_topology = dir.path().join("b.toml");
    let text =
        crest::DEFAULT_TOPOLOGY.replace("credits_per_topic = 256", "credits_per_topic = 128");
    assert_ne!(text, crest::DEFAULT_TOPOLOGY);
    std::fs::write(&b_topology, text).unwrap();
    let (text, comparison) = bench_ok(&[
        "--memory",
        "--runs",
        "2",
        "--messages",
        "2000",
        "--against",
        b_topology.to_str().unwrap(),
    ])
    .await;
    // A and B alternate, run by run, and take turns going first: A B, B A.
    let a1 = text.find("A run 1/2:").expect("A 1");
    let b1 = text.find("B run 1/2:").expect("B 1");
    let a2 = text.find("A run 2/2:").expect("A 2");
    let b2 = text.find("B run 2/2:").expect("B 2");
    assert!(a1 < b1 && b1 < b2 && b2 < a2, "{text}");
    assert!(text.contains("A against B, 2 interleaved pairs"), "{text}");
    for side in ["a", "b"] {
        let runs = comparison[side]["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 2, "{text}");
        for run in runs {
            assert_run_accounted(run, 2000, &text);
        }
    }
    let pushes = &comparison["push_rate"];
    assert_eq!(pushes["pairs"], 2, "{text}");
    assert_eq!(
        comparison["push_ack_p99_slowest_leaf_us"]["pairs"], 2,
        "{text}"
    );
    assert!(text.contains("slowest leaf (us)"), "{text}");
    assert!(pushes["b_better"].as_u64().unwrap() <= 2, "{text}");
    let (a, b) = (pushes["a"].as_f64().unwrap(), pushes["b"].as_f64().unwrap());
    assert_eq!(a, comparison["a"]["push_rate"]["median"].as_f64().unwrap());
    assert!(
        (pushes["ratio"].as_f64().unwrap() - b / a).abs() < 1e-9,
        "{text}"
    );

    // Only trees the bench starts can be compared.
    let (ok, text) = crest(args(&[
        "bench",
        "--connect",
        "--against",
        b_topology.to_str().unwrap(),
        "--ca",
        b_topology.to_str().unwrap(),
    ]))
    .await;
    assert!(!ok);
    assert!(text.contains("not with --connect"), "{text}");
}

/// `topology/replicated.toml` (a leaf of three replicas, on fixed ports in the file) started by
/// the bench itself, against one leaf: the bench holds free ports for every node and each
/// replica's group RPCs (it used to put every node on port 0, which a group refuses), and
/// every message of both trees is accounted for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_compares_a_replicated_leaf_it_starts_with_one_leaf() {
    let topology = |name: &str| format!("{}/topology/{name}", env!("CARGO_MANIFEST_DIR"));
    let (text, comparison) = bench_ok(
        &[
            &[
                "--topology",
                &topology("replicated.toml"),
                "--against",
                &topology("one-leaf.toml"),
                "--messages",
                "2000",
            ],
            SMALL_FILL,
        ]
        .concat(),
    )
    .await;
    assert!(text.contains("A against B, 1 interleaved pairs"), "{text}");
    for side in ["a", "b"] {
        let runs = comparison[side]["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 1, "{text}");
        assert_run_accounted(&runs[0], 2000, &text);
        assert_eq!(runs[0]["durable"], true, "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_measures_what_authentication_costs_against_an_open_tree() {
    // Goal: `--against-open` compares the tree serving clients through its admin token (A)
    // with the same tree taking clients without credentials (B), every message accounted
    // for on both sides.
    let (text, comparison) = bench_ok(&["--memory", "--messages", "2000", "--against-open"]).await;
    assert!(text.contains("B (no credentials)"), "{text}");
    for side in ["a", "b"] {
        let runs = comparison[side]["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 1, "{text}");
        assert_run_accounted(&runs[0], 2000, &text);
    }
    let (ok, text) = crest(args(&["bench", "--connect", "--open"])).await;
    assert!(!ok && text.contains("not with --connect"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_measures_what_limits_cost_when_none_is_reached() {
    // Goal: `--against-limits` runs the workload on a tree without limits (A) and with the
    // bench namespace limited far beyond the workload (B): every message accounted for on
    // both sides, B's leaves refuse none (they may hold a batch while they ask the root for
    // an allowance), A's hold none.
    let (text, comparison) =
        bench_ok(&["--memory", "--messages", "2000", "--against-limits"]).await;
    assert!(text.contains("B (limits)"), "{text}");
    for side in ["a", "b"] {
        let runs = comparison[side]["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 1, "{text}");
        assert_run_accounted(&runs[0], 2000, &text);
    }
    let held = |side: &str| -> (u64, u64) {
        let held = &comparison[side]["runs"][0]["pushes_held"];
        (held[0].as_u64().unwrap(), held[1].as_u64().unwrap())
    };
    assert_eq!(held("a"), (0, 0), "{text}");
    assert_eq!(held("b").1, 0, "refused for want of an allowance: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_the_workload_next_to_a_noisy_neighbour_held_to_its_rate() {
    // Goal: `--against-noisy` runs the workload (A) and the workload next to a producer of
    // namespace `noisy` offering 20 times its push rate (B); every message of the workload is
    // accounted for on both sides, and the noisy producer is admitted about its rate, the
    // rest refused.
    let (text, comparison) = bench_ok(&[
        "--memory",
        "--messages",
        "20000",
        "--rate",
        "10000",
        "--against-noisy",
        "--noisy-rate",
        "200",
    ])
    .await;
    assert!(text.contains("B (noisy)"), "{text}");
    for side in ["a", "b"] {
        let runs = comparison[side]["runs"].as_array().unwrap();
        assert_run_accounted(&runs[0], 20000, &text);
    }
    let run = &comparison["b"]["runs"][0];
    let noise = &run["noise"];
    let (offered, admitted, refused) = (
        noise["offered"].as_u64().unwrap(),
        noise["admitted"].as_u64().unwrap(),
        noise["refused"].as_u64().unwrap(),
    );
    assert_eq!(offered, admitted + refused, "{noise}");
    // No more than the rate over the time it offered, plus the burst (a bound the tree
    // cannot beat, however the machine schedules the producer), and the rest refused.
    let seconds = noise["millis"].as_u64().unwrap() as f64 / 1000.0;
    assert!(
        (admitted as f64) <= 200.0 * seconds + 200.0,
        "admitted {admitted} in {seconds:.1} s at 200/s: {noise}"
    );
    assert!(admitted > 0 && refused > 0, "{noise}");
    assert!(text.contains("noisy neighbour, B run 1: offered"), "{text}");
}

/// A redis-server of its own, on a Unix socket in a temporary directory (no port to pick),
/// syncing its append-only file on every write; killed when dropped.
struct RedisServer {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl RedisServer {
    async fn start() -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("redis.sock");
        let child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(&socket)
            .arg("--dir")
            .arg(dir.path())
            .args(["--save", "", "--appendonly", "yes", "--appendfsync", "always"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is needed (Debian: apt-get install redis-server); scripts/test installs it");
        let what = format!("redis-server to listen on {}", socket.display());
        eventually(Duration::from_secs(10), what, async || {
            tokio::net::UnixStream::connect(&socket).await.map(drop)
        })
        .await;
        RedisServer { child, dir }
    }

    fn url(&self) -> String {
        format!("unix://{}", self.dir.path().join("redis.sock").display())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crest_bench_redis_runs_the_workload_against_a_real_redis_server() {
    // Goal: the peer comparison's Redis side claims and acknowledges every message it pushed
    // through a real redis-server (nothing missing, repeated or left in either set), and
    // reports both rates in the lines `crest bench` prints.
    let server = RedisServer::start().await;
    let url = server.url();
    let (text, report) = bench_ok(&["--redis", &url, "--messages", "5000"]).await;
    assert_eq!(report["pushed"], 5000, "{text}");
    assert_eq!(report["popped"], 5000, "{text}");
    assert_eq!(report["missing"], 0, "{text}");
    assert_eq!(report["duplicates"], 0, "{text}");
    assert_eq!(report["left"], serde_json::json!([0, 0]), "{text}");
    assert!(text.contains("msgs/s (pop + ack)"), "{text}");
    // A shape it does not compare is refused by name.
    let (ok, text) = crest(args(&["bench", "--redis", &url, "--phase", "mixed"])).await;
    assert!(!ok && text.contains("fill then drain"), "{text}");
}
