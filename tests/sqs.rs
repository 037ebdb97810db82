//! The SQS-compatible API of `crest local` through real AWS clients: the boto3 suite in
//! `tests/sqs/boto3_suite.py` (it also drives the AWS CLI) against a `crest local` process
//! started here. `scripts/test` installs boto3 and the AWS CLI in `target/sqs-venv`
//! (`CREST_PYTHON` names another Python that has them). Gateways as processes of their own:
//! `crest gateway`, and a `role = "gateway"` node run by `crest launch`.

#[path = "common/cluster.rs"]
mod cluster;
mod common;
#[path = "common/printing.rs"]
mod printing;

use cluster::Cluster;
use crest_testkit::eventually;
use printing::start_local_sqs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crest::core::topology::Topology;
use crest::node::LocalTree;

use cluster::CREST;
const DEFAULT: &str = include_str!("../topology/local.toml");

/// The Python that has boto3 and the AWS CLI.
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CREST_PYTHON") {
        return python.into();
    }
    let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/target/sqs-venv/bin/python");
    let venv = PathBuf::from(venv);
    assert!(
        venv.exists(),
        "{} is missing: scripts/test installs boto3 and the AWS CLI there (or set CREST_PYTHON)",
        venv.display()
    );
    venv
}

/// Starts `crest local` with its SQS API and the suite's fair queue: message groups are
/// fairness keys of a weighted topic (one tier: every priority shares it).
fn start_local(dir: &std::path::Path) -> printing::LocalSqs {
    let fair = "[settings.topics.boto-fair]\nscheduling = \"weighted\"\nweights = { 0 = 1 }\n";
    start_local_sqs(dir, "", fair)
}

/// The directory whose `node_modules` has the AWS SDK for JavaScript.
fn node_modules_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CREST_NODE_PACKAGES") {
        return dir.into();
    }
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/sqs-node"));
    assert!(
        dir.join("node_modules/@aws-sdk/client-sqs").exists(),
        "{} has no @aws-sdk/client-sqs: scripts/test installs it there (or set \
         CREST_NODE_PACKAGES)",
        dir.display()
    );
    dir
}

/// Runs the docs' Node example (`examples/sqs/priority.mjs`, the AWS SDK for JavaScript)
/// against `endpoint`; asserts it popped its jobs most urgent first.
async fn node_example(endpoint: &str, key: (&str, &str)) {
    let dir = node_modules_dir();
    // Node resolves an ES module's imports from its own directory up: the example runs
    // from beside the packages.
    let script = dir.join("priority.mjs");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/sqs/priority.mjs");
    std::fs::copy(example, &script).unwrap();
    let mut command = Command::new("node");
    command
        .arg(&script)
        .env("SQS_ENDPOINT", endpoint)
        .env("AWS_ACCESS_KEY_ID", key.0)
        .env("AWS_SECRET_ACCESS_KEY", key.1)
        .env_remove("AWS_PROFILE");
    let (success, text) = common::output(command).await;
    assert!(success, "the Node example failed:\n{text}");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(
        lines,
        ["0 charge card", "5 resize thumbnails", "9 send newsletter"],
        "{text}"
    );
}

/// Runs the boto3 suite (`checks`: those only) against `endpoint` signing with `key`;
/// `env` adds variables. Asserts that it passed every check it ran.
async fn suite(endpoint: &str, key: (&str, &str), checks: &[&str], env: &[(&str, &str)]) {
    let suite = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sqs/boto3_suite.py");
    let mut command = Command::new(python());
    command
        .arg(suite)
        .args(checks)
        .env("SQS_ENDPOINT", endpoint)
        .env("AWS_ACCESS_KEY_ID", key.0)
        .env("AWS_SECRET_ACCESS_KEY", key.1)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env_remove("AWS_PROFILE")
        .envs(env.iter().copied());
    let (success, text) = common::output(command).await;
    assert!(success, "the boto3 suite failed:\n{text}");
    // Every check asked for ran and passed, by name: those given, else the suite's `CHECKS`
    // as its source lists them (not as its runner counts them).
    let source = std::fs::read_to_string(suite).unwrap();
    let expected: Vec<String> = if checks.is_empty() {
        default_checks(&source)
    } else {
        checks.iter().map(|c| c.to_string()).collect()
    };
    assert!(!expected.is_empty(), "no checks found in {suite}");
    let passed: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("ok  "))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    assert_eq!(passed, expected, "{text}");
}

/// The names the suite's `CHECKS = [...]` list holds, in order.
fn default_checks(source: &str) -> Vec<String> {
    let list = source
        .split_once("\nCHECKS = [\n")
        .and_then(|(_, rest)| rest.split_once("\n]"))
        .map_or("", |(list, _)| list);
    list.lines()
        .map(|line| line.trim().trim_end_matches(','))
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn boto3_and_the_aws_cli_use_crest_local_s_sqs_api() {
    let dir = tempfile::tempdir().unwrap();
    let printing::LocalSqs {
        process: _local,
        endpoint,
        id,
        secret,
        root_http,
    } = start_local(dir.path());
    suite(&endpoint, (&id, &secret), &[], &[("ROOT_HTTP", &root_http)]).await;
    node_example(&endpoint, (&id, &secret)).await;

    // The load generator: every message sent comes back.
    let mut bench = Command::new(CREST);
    bench
        .args([
            "sqs-bench",
            "--messages",
            "500",
            "--clients",
            "4",
            "--endpoint",
        ])
        .arg(&endpoint)
        .args(["--key", &id, "--secret", &secret]);
    let (success, text) = common::output(bench).await;
    assert!(success, "{text}");
    for phase in ["send ", "receive + delete "] {
        let line = text
            .lines()
            .find(|l| l.starts_with(phase))
            .unwrap_or_default();
        assert!(line.contains(" 500 messages in "), "{phase}: {text}");
    }
}

/// `crest gateway` as processes of their own in front of a tree, with a keys file of two
/// keys: the tree's admin in `default`, and a principal that may produce and manage queues
/// but not consume, in `orders`. Two gateways see the same queues (the tree keeps them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_process_serves_each_key_in_its_namespace_as_its_principal() {
    use crest::core::access::Grants;
    let topology = Topology::parse(DEFAULT).unwrap().with_ephemeral_ports();
    let mut tree = LocalTree::start(&topology).await.unwrap();
    assert!(tree.wait_connected(Duration::from_secs(10)).await);
    let mut file = tree.access_file().clone();
    let mut grants = Grants::default();
    let (namespace, permissions) = Grants::parse_one("orders:produce,admin").unwrap();
    grants.add(&namespace, &permissions);
    file.grant("writer", &grants).unwrap();
    let writer = file.create_token("writer", 0).unwrap();
    let mut grants = Grants::default();
    let (namespace, permissions) = Grants::parse_one("orders:consume").unwrap();
    grants.add(&namespace, &permissions);
    file.grant("reader", &grants).unwrap();
    let reader = file.create_token("reader", 0).unwrap();
    tree.reload_access(file);

    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &tree.ca_pem).unwrap();
    let keys = dir.path().join("keys.toml");
    let text = format!(
        "[[key]]\nid = \"ADMINKEY\"\nsecret = \"admin-secret\"\ntoken = \"{}\"\n\n\
         [[key]]\nid = \"WRITERKEY\"\nsecret = \"writer-secret\"\nnamespace = \"orders\"\n\
         token = \"{writer}\"\n\n\
         [[key]]\nid = \"READERKEY\"\nsecret = \"reader-secret\"\nnamespace = \"orders\"\n\
         token = \"{reader}\"\n",
        tree.admin_token
    );
    std::fs::write(&keys, text).unwrap();
    let gateway = || printing::start_gateway(CREST, &tree, &ca, &keys);
    let (_first, endpoint) = gateway();
    let (_second, second) = gateway();
    let checks = [
        "messages_come_out_most_urgent_first_with_their_digests",
        "a_batch_answers_each_entry_and_refuses_only_the_bad_one",
        "bad_signatures_and_unknown_keys_are_refused",
        "keys_act_in_their_namespace_with_their_principal_s_permissions",
        "queues_are_the_tree_s_and_every_gateway_sees_them",
    ];
    let env = [
        ("OTHER_KEY", "WRITERKEY"),
        ("OTHER_SECRET", "writer-secret"),
        ("READER_KEY", "READERKEY"),
        ("READER_SECRET", "reader-secret"),
        ("SECOND_ENDPOINT", second.as_str()),
    ];
    suite(&endpoint, ("ADMINKEY", "admin-secret"), &checks, &env).await;
    tree.shutdown().await;
}

/// Calls `action` until it answers (the gateway and the tree come up), within 60 s (a loaded
/// machine starts eight processes slowly).
async fn call_until_answered(
    client: &crest_gateway::client::SqsClient,
    action: &str,
    input: &serde_json::Value,
) -> serde_json::Value {
    eventually(
        Duration::from_secs(60),
        format!("{action} answered"),
        async || client.call(action, input).await,
    )
    .await
}

/// A `role = "gateway"` node of the topology, run by `crest launch` with its HTTP socket by
/// socket activation in front of a secured tree of seven processes: it serves the SQS API with
/// the keys file the topology names, and, killed with SIGKILL and launched again, finds the
/// queue it created (the tree keeps it) and delivers what was sent before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_node_of_the_topology_serves_sqs_and_loses_nothing_when_killed() {
    use serde_json::json;
    let mut cluster = Cluster::start_secure_with_gateway("gateway-node", "sqs-1");
    let endpoint = cluster.gateway_endpoint("sqs-1");
    let client =
        crest_gateway::client::SqsClient::new(&endpoint, "AKIACRESTTEST", "test-secret", 4)
            .unwrap();
    let created = call_until_answered(&client, "CreateQueue", &json!({"QueueName": "jobs"})).await;
    let url = created["QueueUrl"].as_str().unwrap().to_string();
    assert!(url.ends_with("/default/jobs"), "{url}");
    let entries: Vec<serde_json::Value> = (0..10)
        .map(|i| {
            json!({
                "Id": format!("m{i}"),
                "MessageBody": format!("body {i}"),
                "MessageAttributes": {
                    "Priority": {"DataType": "Number", "StringValue": (9 - i).to_string()}
                },
            })
        })
        .collect();
    let sent = client
        .call(
            "SendMessageBatch",
            &json!({"QueueUrl": url, "Entries": entries}),
        )
        .await
        .unwrap();
    assert_eq!(sent["Successful"].as_array().unwrap().len(), 10, "{sent}");

    cluster.kill("sqs-1");
    cluster.launch("sqs-1");
    let found = call_until_answered(&client, "GetQueueUrl", &json!({"QueueName": "jobs"})).await;
    assert_eq!(found["QueueUrl"].as_str(), Some(url.as_str()));
    let mut bodies = Vec::new();
    eventually(
        Duration::from_secs(20),
        "10 messages received",
        async || {
            let received = client
                .call(
                    "ReceiveMessage",
                    &json!({"QueueUrl": url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1}),
                )
                .await
                .unwrap();
            let messages = received["Messages"].as_array().cloned().unwrap_or_default();
            let deletes: Vec<serde_json::Value> = messages
                .iter()
                .enumerate()
                .map(|(i, m)| json!({"Id": format!("d{i}"), "ReceiptHandle": m["ReceiptHandle"]}))
                .collect();
            bodies.extend(
                messages
                    .iter()
                    .map(|m| m["Body"].as_str().unwrap().to_string()),
            );
            if !deletes.is_empty() {
                let deleted = client
                    .call(
                        "DeleteMessageBatch",
                        &json!({"QueueUrl": url, "Entries": deletes}),
                    )
                    .await
                    .unwrap();
                assert!(
                    deleted["Failed"].as_array().is_none_or(Vec::is_empty),
                    "{deleted}"
                );
            }
            if bodies.len() < 10 {
                Err(bodies.len())
            } else {
                Ok(())
            }
        },
    )
    .await;
    let expected: Vec<String> = (0..10).rev().map(|i| format!("body {i}")).collect();
    assert_eq!(bodies, expected, "every message, the most urgent first");

    // A native producer may set any metadata, the gateway's sender among it: a message it
    // says the key sent (as the gateway once wrote it, or with a made-up stamp) has no
    // SenderId; one the key sent through the gateway has the key's.
    let producer = cluster.producer().await;
    for (priority, forged) in [(0, "AKIACRESTTEST"), (1, "AKIACRESTTEST 00ff")] {
        let message = crest::sdk::Message::new("jobs", b"forged".to_vec())
            .priority(priority)
            .metadata("sqs.sender", forged);
        producer.send(message).await.unwrap().acked().await.unwrap();
    }
    let sent = json!({"QueueUrl": url, "MessageBody": "genuine", "MessageAttributes": {
        "Priority": {"DataType": "Number", "StringValue": "2"}}});
    client.call("SendMessage", &sent).await.unwrap();
    let mut senders = Vec::new();
    eventually(Duration::from_secs(20), "3 messages received", async || {
        let received = client
            .call(
                "ReceiveMessage",
                &json!({"QueueUrl": url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1,
                        "AttributeNames": ["SenderId"]}),
            )
            .await
            .unwrap();
        for m in received["Messages"].as_array().cloned().unwrap_or_default() {
            senders.push((
                m["Body"].as_str().unwrap().to_string(),
                m["Attributes"]["SenderId"].as_str().map(str::to_string),
            ));
            let delete = json!({"QueueUrl": url, "ReceiptHandle": m["ReceiptHandle"]});
            client.call("DeleteMessage", &delete).await.unwrap();
        }
        if senders.len() < 3 {
            Err(senders.len())
        } else {
            Ok(())
        }
    })
    .await;
    assert_eq!(
        senders,
        [
            ("forged".to_string(), None),
            ("forged".to_string(), None),
            ("genuine".to_string(), Some("AKIACRESTTEST".to_string())),
        ]
    );
}
