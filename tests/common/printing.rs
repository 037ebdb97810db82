//! Processes whose printed lines a test reads: `crest local`, `crest gateway`.

// Each test crate that includes this file uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The default tree's topology text with every port ephemeral (tests run side by side), for
/// a test to append settings to.
pub(crate) fn ephemeral_default_topology() -> String {
    let mut topology = String::new();
    for line in crest::DEFAULT_TOPOLOGY.lines() {
        match line.split_once("\"127.0.0.1:") {
            Some((start, _)) => topology.push_str(&format!("{start}\"127.0.0.1:0\"")),
            None => topology.push_str(line),
        }
        topology.push('\n');
    }
    topology
}

/// What [`start_local_sqs`] started: the process, the API's endpoint, its access key pair and
/// the root's HTTP address, as the process printed them.
pub(crate) struct LocalSqs {
    pub(crate) process: Process,
    pub(crate) endpoint: String,
    pub(crate) id: String,
    pub(crate) secret: String,
    pub(crate) root_http: String,
}

/// Starts `crest local --memory` on ephemeral ports with its SQS API, `settings` (TOML
/// lines) added to the topology's `[settings]` and `tables` after it.
pub(crate) fn start_local_sqs(dir: &std::path::Path, settings: &str, tables: &str) -> LocalSqs {
    let topology = ephemeral_default_topology().replacen(
        "[settings]\n",
        &format!("[settings]\n{settings}"),
        1,
    ) + tables;
    let path = dir.join("topology.toml");
    std::fs::write(&path, topology).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_crest"));
    command
        .args(["local", "--memory", "--sqs", "127.0.0.1:0", "--topology"])
        .arg(&path)
        .arg("--ca-out")
        .arg(dir.join("ca.pem"));
    command.stderr(Stdio::null());
    let (local, lines) = spawn_printing(command);
    // Printed before the SQS API's lines.
    let root_http = wait_for(&lines, |line| {
        let url = line.strip_prefix("dashboard:")?.trim();
        url.strip_prefix("http://")
            .map(|rest| rest.trim_end_matches('/').to_string())
    });
    let endpoint = wait_for(&lines, |line| {
        let rest = line.strip_prefix("SQS API:")?;
        rest.split_whitespace().next().map(str::to_string)
    });
    let (id, secret) = wait_for(&lines, |line| {
        let rest = line.trim().strip_prefix("access key ")?;
        match rest.split_whitespace().collect::<Vec<_>>()[..] {
            [id, "secret", secret] => Some((id.to_string(), secret.to_string())),
            _ => None,
        }
    });
    LocalSqs {
        process: local,
        endpoint,
        id,
        secret,
        root_http,
    }
}

/// A `crest` process, killed when dropped.
pub(crate) struct Process(pub(crate) Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `command` with its stdout read line by line on a thread of its own (its stderr as
/// the caller set it).
pub(crate) fn spawn_printing(mut command: Command) -> (Process, mpsc::Receiver<String>) {
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    // Reads to the end even once nobody waits for lines: a closed pipe would fail the
    // process's next print (EPIPE) and end it while the test still talks to it.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (Process(child), rx)
}

/// The first value `find` gets from a printed line, within 30 s.
pub(crate) fn wait_for<T>(
    lines: &mpsc::Receiver<String>,
    mut find: impl FnMut(&str) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("not printed within 30 s; printed:\n{seen}"));
        if let Some(found) = find(&line) {
            return found;
        }
        seen.push_str(&line);
        seen.push('\n');
    }
}

/// One node as `crest local` printed it.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) role: String,
    pub(crate) quic: String,
    /// `host:port` of its HTTP.
    pub(crate) http: String,
}

/// The table of nodes `crest local` prints, read up to the line after it.
pub(crate) fn node_table(lines: &mpsc::Receiver<String>) -> Vec<Node> {
    let mut nodes = Vec::new();
    wait_for(lines, |line| {
        if line.starts_with("producers push to") {
            return Some(());
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if line.starts_with("  ")
            && let (Some(name), Some(role), Some(quic), Some(url)) =
                (words.first(), words.get(1), words.get(2), words.last())
            && let Some(http) = url
                .strip_prefix("http://")
                .and_then(|u| u.strip_suffix("/metrics"))
        {
            nodes.push(Node {
                name: name.to_string(),
                role: role.to_string(),
                quic: quic.to_string(),
                http: http.to_string(),
            });
        }
        None
    });
    nodes
}

/// Starts `crest gateway` (`binary`) on an ephemeral port in front of `tree`, trusting `ca`,
/// with the keys file `keys`; answers the process and the API's endpoint as it printed it.
pub(crate) fn start_gateway(
    binary: &str,
    tree: &crest::node::LocalTree,
    ca: &std::path::Path,
    keys: &std::path::Path,
) -> (Process, String) {
    let mut command = Command::new(binary);
    command
        .args(["gateway", "--listen", "127.0.0.1:0", "--root"])
        .arg(&tree.topology.root().address)
        .arg("--ca")
        .arg(ca)
        .arg("--keys")
        .arg(keys);
    for leaf in tree.topology.leaves() {
        command.arg("--leaf").arg(&leaf.address);
    }
    command.stderr(Stdio::null());
    let (gateway, lines) = spawn_printing(command);
    let endpoint = wait_for(&lines, |line| {
        line.strip_prefix("SQS API: ")?
            .split_whitespace()
            .next()
            .map(str::to_string)
    });
    (gateway, endpoint)
}
