//! The SQS-compatible API of `crest local` through real AWS clients: the boto3 suite in
//! `tests/sqs/boto3_suite.py` (it also drives the AWS CLI) against a `crest local` process
//! started here. `scripts/test` installs boto3 and the AWS CLI in `target/sqs-venv`
//! (`CREST_PYTHON` names another Python that has them).

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CREST: &str = env!("CARGO_BIN_EXE_crest");
const DEFAULT: &str = include_str!("../../../topology/local.toml");

/// A `crest local` process, killed when dropped.
struct Local(Child);

impl Drop for Local {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The Python that has boto3 and the AWS CLI.
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CREST_PYTHON") {
        return python.into();
    }
    let venv = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../target/sqs-venv/bin/python"
    );
    let venv = PathBuf::from(venv);
    assert!(
        venv.exists(),
        "{} is missing: scripts/test installs boto3 and the AWS CLI there (or set CREST_PYTHON)",
        venv.display()
    );
    venv
}

/// Starts `crest local` on ephemeral ports with its SQS API; returns the process, the API's
/// endpoint and its access key pair, as the process printed them.
fn start_local(dir: &std::path::Path) -> (Local, String, String, String) {
    // The default tree, every port ephemeral (tests run side by side).
    let mut topology = String::new();
    for line in DEFAULT.lines() {
        match line.split_once("\"127.0.0.1:") {
            Some((start, _)) => topology.push_str(&format!("{start}\"127.0.0.1:0\"")),
            None => topology.push_str(line),
        }
        topology.push('\n');
    }
    let path = dir.join("topology.toml");
    std::fs::write(&path, topology).unwrap();
    let mut child = Command::new(CREST)
        .args(["local", "--memory", "--sqs", "127.0.0.1:0", "--topology"])
        .arg(&path)
        .arg("--ca-out")
        .arg(dir.join("ca.pem"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let local = Local(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut endpoint, mut key) = (None, None);
    let mut seen = String::new();
    while endpoint.is_none() || key.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("crest local printed no SQS API within 30 s:\n{seen}"));
        seen.push_str(&line);
        seen.push('\n');
        if let Some(rest) = line.strip_prefix("SQS API:") {
            endpoint = rest.split_whitespace().next().map(str::to_string);
        }
        if let Some(rest) = line.trim().strip_prefix("access key ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            if let [id, "secret", secret] = words[..] {
                key = Some((id.to_string(), secret.to_string()));
            }
        }
    }
    let (id, secret) = key.unwrap();
    (local, endpoint.unwrap(), id, secret)
}

#[tokio::test]
async fn boto3_and_the_aws_cli_use_crest_local_s_sqs_api() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let (_local, endpoint, id, secret) = start_local(dir.path());
    let suite = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sqs/boto3_suite.py");
    let mut command = Command::new(&python);
    command
        .arg(suite)
        .env("SQS_ENDPOINT", &endpoint)
        .env("AWS_ACCESS_KEY_ID", &id)
        .env("AWS_SECRET_ACCESS_KEY", &secret)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env_remove("AWS_PROFILE");
    let (success, text) = common::output(command).await;
    assert!(success, "the boto3 suite failed:\n{text}");
    // Every check ran.
    assert_eq!(
        text.lines()
            .filter(|line| line.starts_with("ok  "))
            .count()
            .to_string(),
        text.lines()
            .find_map(|line| line.strip_prefix("passed all "))
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_default(),
        "{text}"
    );
}
