//! LocalStack's own SQS tests, validated by their authors against AWS, run against crest:
//! `tests/localstack/tests/aws/services/sqs` holds `test_sqs.py` and `test_sqs_move_task.py`
//! of localstack/localstack at v4.14.0 unchanged (with their AWS snapshots; Apache-2.0,
//! `tests/localstack/LICENSE.txt`), `tests/localstack/conftest.py` is crest's harness. This
//! test starts a tree and an SQS gateway with two keys, one per account (a crest namespace
//! each), runs the whole suite with pytest in the Python that `scripts/test` prepares
//! (`CREST_LOCALSTACK_PYTHON` names another), and holds its outcome to docs/sqs.md: every
//! test that fails must be listed there with its reason, and every test listed must fail.
//! Tests LocalStack marks as its own (run in its process, or only against LocalStack) skip
//! themselves.

#[path = "common/cluster.rs"]
mod cluster;
mod common;
#[path = "common/printing.rs"]
mod printing;

use cluster::CREST;
use crest::core::access::Grants;
use crest::core::topology::Topology;
use crest::node::LocalTree;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const DEFAULT: &str = include_str!("../topology/local.toml");
const SUITE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/localstack");
const DOCS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/sqs.md");
/// Where docs/sqs.md's list of expected failures starts and ends.
const LIST_START: &str = "<!-- localstack-expected-failures -->";
const LIST_END: &str = "<!-- /localstack-expected-failures -->";
/// The tests' ids start with their file's path under the suite's root.
const ID_PREFIX: &str = "tests/aws/services/sqs/";
/// The suite's two accounts (crest namespaces here). Its snapshots replace an account's
/// number wherever it appears, so the numbers are ones no MessageId contains: LocalStack's
/// defaults, twelve zeros, also match the tail of a crest MessageId of a low sequence.
const ACCOUNT: &str = "417263580914";
const SECOND_ACCOUNT: &str = "528374691025";

/// The Python with localstack-core and pytest.
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CREST_LOCALSTACK_PYTHON") {
        return python.into();
    }
    let venv = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/target/localstack-venv/bin/python"
    ));
    assert!(
        venv.exists(),
        "{} is missing: scripts/test installs localstack-core and pytest there (or set \
         CREST_LOCALSTACK_PYTHON)",
        venv.display()
    );
    venv
}

/// docs/sqs.md's expected failures: test id (a file, class and test name, with the
/// protocol's parameter where only one fails) → reason.
fn expected_failures() -> BTreeMap<String, String> {
    let docs = std::fs::read_to_string(DOCS).unwrap();
    let list = docs
        .split_once(LIST_START)
        .and_then(|(_, rest)| rest.split_once(LIST_END))
        .map(|(list, _)| list)
        .unwrap_or_else(|| panic!("{DOCS} has no {LIST_START} … {LIST_END} section"));
    let mut expected = BTreeMap::new();
    for line in list.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        let id = cells[0].trim_start_matches("| ").trim_matches('`');
        let reason = cells.get(1).map_or("", |r| r.trim_end_matches(" |").trim());
        assert!(!reason.is_empty(), "{DOCS}: {id} has no reason");
        assert!(
            expected
                .insert(id.to_string(), reason.to_string())
                .is_none(),
            "{DOCS}: {id} is listed twice"
        );
    }
    assert!(
        !expected.is_empty(),
        "{DOCS}: the list of expected failures is empty"
    );
    expected
}

/// Whether `test` (an id without the path prefix) is what `entry` names: the same id, or
/// the same without the protocol parameter.
fn names(entry: &str, test: &str) -> bool {
    entry == test || test.split_once('[').is_some_and(|(name, _)| name == entry)
}

/// One test's outcome as the harness wrote it.
#[derive(serde::Deserialize)]
struct Outcome {
    test: String,
    when: String,
    outcome: String,
    summary: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localstack_s_sqs_tests_pass_but_for_those_docs_sqs_md_lists() {
    let expected = expected_failures();
    let topology = Topology::parse(DEFAULT).unwrap().with_ephemeral_ports();
    let mut tree = LocalTree::start(&topology).await.unwrap();
    assert!(tree.wait_connected(Duration::from_secs(10)).await);
    let mut file = tree.access_file().clone();
    let mut tokens = Vec::new();
    for (principal, account) in [
        ("localstack", ACCOUNT),
        ("localstack-second", SECOND_ACCOUNT),
    ] {
        let mut grants = Grants::default();
        let (namespace, permissions) =
            Grants::parse_one(&format!("{account}:produce,consume,admin")).unwrap();
        grants.add(&namespace, &permissions);
        file.grant(principal, &grants).unwrap();
        tokens.push(file.create_token(principal, 0).unwrap());
    }
    tree.reload_access(file);

    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &tree.ca_pem).unwrap();
    let keys = dir.path().join("keys.toml");
    let text = format!(
        "[[key]]\nid = \"LOCALSTACKKEY\"\nsecret = \"localstack-secret\"\nnamespace = \"{ACCOUNT}\"\n\
         token = \"{}\"\n\n\
         [[key]]\nid = \"SECONDKEY\"\nsecret = \"second-secret\"\nnamespace = \"{SECOND_ACCOUNT}\"\n\
         token = \"{}\"\n",
        tokens[0], tokens[1]
    );
    std::fs::write(&keys, text).unwrap();
    let (_gateway, endpoint) = printing::start_gateway(CREST, &tree, &ca, &keys);

    let results = dir.path().join("results.jsonl");
    let mut pytest = Command::new(python());
    pytest
        .current_dir(SUITE)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no"])
        .arg("tests/aws/services/sqs")
        .env("CREST_LOCALSTACK_RESULTS", &results)
        .env("TEST_AWS_ENDPOINT_URL", &endpoint)
        // Where tests that build URLs of their own look for LocalStack.
        .env("GATEWAY_LISTEN", endpoint.trim_start_matches("http://"))
        .env("TEST_AWS_ACCESS_KEY_ID", "LOCALSTACKKEY")
        .env("TEST_AWS_SECRET_ACCESS_KEY", "localstack-secret")
        .env("TEST_AWS_ACCOUNT_ID", ACCOUNT)
        .env("TEST_AWS_REGION_NAME", "us-east-1")
        .env("SECONDARY_TEST_AWS_ACCESS_KEY_ID", "SECONDKEY")
        .env("SECONDARY_TEST_AWS_SECRET_ACCESS_KEY", "second-secret")
        .env("SECONDARY_TEST_AWS_ACCOUNT_ID", SECOND_ACCOUNT)
        .env("TEST_SKIP_LOCALSTACK_START", "1")
        .env_remove("AWS_PROFILE")
        .env_remove("TEST_TARGET");
    let (_, text) = common::output(pytest).await;
    let summary = text.lines().last().unwrap_or_default().to_string();

    let outcomes: Vec<Outcome> = std::fs::read_to_string(&results)
        .unwrap_or_else(|e| panic!("pytest wrote no results ({e}):\n{text}"))
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    // A test fails if any of its phases failed; it passed if its call did and nothing failed.
    let mut tests: BTreeMap<String, (&str, String)> = BTreeMap::new();
    for o in &outcomes {
        let id = o
            .test
            .strip_prefix(ID_PREFIX)
            .unwrap_or(&o.test)
            .to_string();
        let entry = tests.entry(id).or_insert(("passed", String::new()));
        match o.outcome.as_str() {
            "failed" => *entry = ("failed", format!("{} ({})", o.summary, o.when)),
            "skipped" if entry.0 != "failed" => *entry = ("skipped", o.summary.clone()),
            _ => {}
        }
    }
    assert!(
        tests.len() > 300,
        "pytest ran {} tests:\n{text}",
        tests.len()
    );
    let listed = |test: &str| expected.keys().find(|entry| names(entry, test));
    let mut unexpected = Vec::new();
    let mut passing_listed = Vec::new();
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for (test, (outcome, why)) in &tests {
        match *outcome {
            "passed" => {
                passed += 1;
                if let Some(entry) = listed(test) {
                    passing_listed.push(format!("{test} (listed as {entry})"));
                }
            }
            "failed" => {
                failed += 1;
                if listed(test).is_none() {
                    unexpected.push(format!("{test}: {why}"));
                }
            }
            _ => skipped += 1,
        }
    }
    let unused: Vec<&String> = expected
        .keys()
        .filter(|entry| !tests.keys().any(|test| names(entry, test)))
        .collect();
    println!(
        "LocalStack's SQS tests: {passed} passed, {failed} failed as docs/sqs.md lists, \
         {skipped} LocalStack's own skipped; pytest: {summary}"
    );
    assert!(
        unexpected.is_empty() && passing_listed.is_empty() && unused.is_empty(),
        "failing but not in docs/sqs.md:\n  {}\npassing but listed as failing (take them off \
         the list):\n  {}\nlisted but no such test:\n  {unused:?}",
        unexpected.join("\n  "),
        passing_listed.join("\n  ")
    );
    tree.shutdown().await;
}
