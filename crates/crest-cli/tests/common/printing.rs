//! Processes whose printed lines a test reads: `crest local`, `crest gateway`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The default tree's topology text with every port ephemeral (tests run side by side), for
/// a test to append settings to.
pub(crate) fn ephemeral_default_topology() -> String {
    let mut topology = String::new();
    for line in include_str!("../../../../topology/local.toml").lines() {
        match line.split_once("\"127.0.0.1:") {
            Some((start, _)) => topology.push_str(&format!("{start}\"127.0.0.1:0\"")),
            None => topology.push_str(line),
        }
        topology.push('\n');
    }
    topology
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
