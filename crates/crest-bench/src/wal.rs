//! `crest wal bench`: how long this disk takes to make a leaf's appends durable.
//!
//! It drives the real write-ahead log (`crest-storage`: encoding, group commit, `fdatasync`)
//! the way a leaf does, without the network: each of `logs` logs gets appends of
//! `messages_per_append` messages at `rate` appends per second (open loop: an append is
//! timed from when it was due, so a stalled sync delays every append behind it, as it delays
//! a leaf's pushes), or flat out with `in_flight` appends outstanding. Several logs model
//! leaves that share a disk; `busy_threads` spin on the CPU meanwhile, to show how much the
//! sync latency of a machine depends on how busy its processors are (on a virtual machine the
//! disk is often emulated by a host thread that competes with the guest's processors).
//!
//! The latency reported is from an append's due time to its completion (written and, with
//! `fsync` durability, synced): the floor under a durable push's acknowledgement latency.

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use crest_core::config::{Durability, Settings};
use crest_core::id::{LeafId, MessageId};
use crest_core::metrics::Percentiles;
use crest_core::record::{LogRecord, MessageHead};
use crest_core::time::Time;
use crest_storage::wal::{Completion, GroupTiming, WalOptions, open};
use hdrhistogram::Histogram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Most logs at once.
pub const LOGS_MAX: usize = 64;
/// Most spinning threads.
pub const BUSY_THREADS_MAX: usize = 256;
/// Longest run.
pub const DURATION_MAX: Duration = Duration::from_secs(3600);
/// How long the bench waits for the last appends to complete after submitting stops.
pub const COMPLETION_WAIT: Duration = Duration::from_secs(60);

/// What to run.
#[derive(Clone, Debug)]
pub struct WalBenchConfig {
    /// The directory the logs go in: a fresh `crest-wal-bench-PID` directory is made in it
    /// and removed at the end. Put it on the disk whose latency you want.
    pub dir: PathBuf,
    /// Logs written at once (leaves sharing this disk), each by its own writer thread.
    pub logs: usize,
    /// Appends per second to each log; 0 = flat out, `in_flight` appends outstanding per log.
    pub rate: f64,
    /// Flat out: appends outstanding per log.
    pub in_flight: usize,
    /// Messages per append (a push batch).
    pub messages_per_append: usize,
    /// Payload bytes per message.
    pub payload_bytes: usize,
    /// How long to submit appends.
    pub duration: Duration,
    /// Threads that spin on the CPU meanwhile.
    pub busy_threads: usize,
    /// `fsync` (sync before completion) or `buffered` (written only).
    pub durability: Durability,
}

impl Default for WalBenchConfig {
    fn default() -> Self {
        WalBenchConfig {
            dir: PathBuf::from(".crest"),
            logs: 1,
            rate: 4000.0,
            in_flight: 64,
            messages_per_append: 4,
            payload_bytes: 100,
            duration: Duration::from_secs(10),
            busy_threads: 0,
            durability: Durability::Fsync,
        }
    }
}

/// What was measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct WalBenchReport {
    /// Logs written at once.
    pub logs: usize,
    /// Appends per second asked of each log (0: flat out).
    pub rate: f64,
    /// Flat out: appends outstanding per log.
    pub in_flight: usize,
    /// Messages per append.
    pub messages_per_append: usize,
    /// Payload bytes per message.
    pub payload_bytes: usize,
    /// Spinning threads.
    pub busy_threads: usize,
    /// `fsync` or `buffered`.
    pub durability: String,
    /// Where the logs were written.
    pub dir: String,
    /// From the first append's due time to the last completion.
    pub seconds: f64,
    /// Appends completed (over all logs).
    pub appends: u64,
    /// Appends that failed.
    pub failed: u64,
    /// Messages in the completed appends.
    pub messages: u64,
    /// Groups the writers wrote: one write and (with `fsync`) one `fdatasync` each.
    pub groups: u64,
    /// Completed appends per second (over all logs).
    pub appends_per_s: f64,
    /// Messages per second.
    pub messages_per_s: f64,
    /// Payload megabytes per second.
    pub payload_mb_per_s: f64,
    /// Groups (syncs) per second.
    pub groups_per_s: f64,
    /// From an append's due time (its submission, flat out) to its completion, microseconds.
    pub latency_us: Percentiles,
    /// How long each group's `fdatasync` took, microseconds (none with `buffered`).
    pub sync_us: Percentiles,
}

impl WalBenchConfig {
    /// Refuses settings out of their bounds, and appends the log would refuse.
    ///
    /// # Errors
    /// Which setting is out of bounds.
    pub fn validate(&self, settings: &Settings) -> Result<()> {
        if !(1..=LOGS_MAX).contains(&self.logs) {
            bail!("--logs must be 1..={LOGS_MAX}");
        }
        if !(self.rate.is_finite() && self.rate >= 0.0 && self.rate <= 10_000_000.0) {
            bail!("--rate must be 0 (flat out) to 10000000 appends/s");
        }
        if !(1..=65_536).contains(&self.in_flight) {
            bail!("--in-flight must be 1..=65536");
        }
        if !(1..=65_536).contains(&self.messages_per_append) {
            bail!("--messages-per-append must be 1..=65536");
        }
        if self.duration.is_zero() || self.duration > DURATION_MAX {
            bail!("--duration must be above 0 and at most an hour");
        }
        if self.busy_threads > BUSY_THREADS_MAX {
            bail!("--busy-threads must be at most {BUSY_THREADS_MAX}");
        }
        // An append is one log record: its bodies must fit the record limit, as a push batch
        // must fit a frame (the encoding adds a few dozen bytes per message).
        let approximate = self.messages_per_append as u64 * (self.payload_bytes as u64 + 64);
        if approximate > u64::from(settings.frame_bytes_max) {
            bail!(
                "an append of {} messages of {} bytes exceeds frame_bytes_max ({} bytes), the \
                 largest log record",
                self.messages_per_append,
                self.payload_bytes,
                settings.frame_bytes_max
            );
        }
        Ok(())
    }
}

/// Removes the run directory however the run ends.
struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Threads that spin on the CPU until dropped.
struct Spinners {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Spinners {
    fn start(count: usize) -> Spinners {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..count)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 1u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..1024 {
                            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005) + 1);
                        }
                    }
                })
            })
            .collect();
        Spinners { stop, threads }
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// What the completion callbacks of one log share with its submitter.
struct LogState {
    latency: Mutex<Histogram<u64>>,
    /// How long each group's `fdatasync` took, µs.
    syncs: Mutex<Histogram<u64>>,
    /// Appends submitted and not yet completed, with a condition to wait on.
    outstanding: Mutex<usize>,
    changed: Condvar,
    groups: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
}

impl LogState {
    fn complete(&self, epoch: Instant, done: &[Completion], timing: GroupTiming) {
        let now = epoch.elapsed().as_nanos() as u64;
        if let Some(sync) = timing.sync {
            let micros = u64::try_from(sync.as_micros()).unwrap_or(u64::MAX);
            let mut syncs = self.syncs.lock().unwrap_or_else(|e| e.into_inner());
            syncs.saturating_record(micros.max(1));
        }
        {
            let mut latency = self.latency.lock().unwrap_or_else(|e| e.into_inner());
            for (due_ns, result) in done {
                if result.is_err() {
                    self.failed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let micros = now.saturating_sub(*due_ns) / 1000;
                latency.saturating_record(micros.max(1));
                self.completed.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.groups.fetch_add(1, Ordering::Relaxed);
        let mut outstanding = self.outstanding.lock().unwrap_or_else(|e| e.into_inner());
        *outstanding = outstanding.saturating_sub(done.len());
        self.changed.notify_all();
    }
}

/// An append of `count` messages for log `log`, as a leaf logs a push batch.
fn append_records(log: usize, first_seq: u64, count: usize, payload: &Bytes) -> Vec<LogRecord> {
    let leaf = LeafId(u16::try_from(log + 1).unwrap_or(u16::MAX));
    (0..count as u64)
        .map(|i| {
            let accepted = Time::from_millis(first_seq);
            LogRecord::Enqueue {
                head: MessageHead {
                    id: MessageId::new(leaf, first_seq + i),
                    topic: "wal-bench".into(),
                    priority: ((first_seq + i) % 10) as u32,
                    ready_at: accepted,
                    enqueued_at: accepted,
                    expires_at: None,
                    dedup_key: None,
                    fairness_key: None,
                },
                metadata: Vec::new(),
                payload: payload.clone(),
            }
        })
        .collect()
}

/// Runs the bench; blocks until it is over.
///
/// # Errors
/// Bad settings, or a log that cannot be created or written.
pub fn run(config: &WalBenchConfig) -> Result<WalBenchReport> {
    let settings = Settings {
        durability: config.durability,
        ..Settings::default()
    };
    config.validate(&settings)?;
    let run_dir = RunDir(run_dir(&config.dir));
    let _ = std::fs::remove_dir_all(&run_dir.0);
    std::fs::create_dir_all(&run_dir.0)
        .with_context(|| format!("creating {}", run_dir.0.display()))?;

    // Logs are created (and their first segments synced) and the spinners started before the
    // clock starts: the run measures appends only.
    let mut wals = Vec::with_capacity(config.logs);
    for log in 0..config.logs {
        let dir = run_dir.0.join(format!("log-{}", log + 1));
        let (wal, _) = open(WalOptions::new(dir.clone(), &settings))
            .with_context(|| format!("opening a log in {}", dir.display()))?;
        wals.push((wal, dir));
    }
    let spinners = Spinners::start(config.busy_threads);

    let epoch = Instant::now();
    let mut handles = Vec::with_capacity(config.logs);
    let mut states = Vec::with_capacity(config.logs);
    for (wal, dir) in wals {
        let state = Arc::new(LogState {
            latency: Mutex::new(crate::histogram()),
            syncs: Mutex::new(crate::histogram()),
            outstanding: Mutex::new(0),
            changed: Condvar::new(),
            groups: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        });
        let callback_state = state.clone();
        let handle = wal
            .start_timed(move |done, timing| callback_state.complete(epoch, &done, timing))
            .with_context(|| format!("starting the writer of {}", dir.display()))?;
        handles.push(handle);
        states.push(state);
    }

    let payload = Bytes::from(vec![0x5a; config.payload_bytes]);
    let submitters: Vec<_> = handles
        .into_iter()
        .zip(&states)
        .enumerate()
        .map(|(log, (handle, state))| {
            let (state, payload, config) = (state.clone(), payload.clone(), config.clone());
            std::thread::spawn(move || submit(log, &handle, &state, &payload, &config, epoch))
        })
        .collect();
    let mut submit_error = None;
    for submitter in submitters {
        match submitter.join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => submit_error = Some(error),
            Err(_) => submit_error = Some(anyhow::anyhow!("a submitter thread panicked")),
        }
    }
    // Every append submitted completes (or fails) unless the writer is gone.
    let deadline = Instant::now() + COMPLETION_WAIT;
    for state in &states {
        let mut outstanding = state.outstanding.lock().unwrap_or_else(|e| e.into_inner());
        while *outstanding > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "{} appends did not complete within {COMPLETION_WAIT:?}",
                    *outstanding
                );
            }
            outstanding = state
                .changed
                .wait_timeout(outstanding, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
    let seconds = epoch.elapsed().as_secs_f64();
    drop(spinners);
    if let Some(error) = submit_error {
        return Err(error);
    }

    let (mut latency, mut syncs) = (crate::histogram(), crate::histogram());
    let (mut appends, mut failed, mut groups) = (0, 0, 0);
    for state in &states {
        for (into, from) in [(&mut latency, &state.latency), (&mut syncs, &state.syncs)] {
            let from = from.lock().unwrap_or_else(|e| e.into_inner());
            into.add(&*from).context("merging histograms")?;
        }
        appends += state.completed.load(Ordering::Relaxed);
        failed += state.failed.load(Ordering::Relaxed);
        groups += state.groups.load(Ordering::Relaxed);
    }
    let messages = appends * config.messages_per_append as u64;
    Ok(WalBenchReport {
        logs: config.logs,
        rate: config.rate,
        in_flight: config.in_flight,
        messages_per_append: config.messages_per_append,
        payload_bytes: config.payload_bytes,
        busy_threads: config.busy_threads,
        durability: format!("{:?}", config.durability).to_lowercase(),
        dir: config.dir.display().to_string(),
        seconds,
        appends,
        failed,
        messages,
        groups,
        appends_per_s: appends as f64 / seconds,
        messages_per_s: messages as f64 / seconds,
        payload_mb_per_s: (messages * config.payload_bytes as u64) as f64 / seconds / 1e6,
        groups_per_s: groups as f64 / seconds,
        latency_us: Percentiles::of(&latency),
        sync_us: Percentiles::of(&syncs),
    })
}

/// Submits one log's appends until the duration is over. Each append's token is its due time
/// in nanoseconds since `epoch` (kept strictly increasing, as tokens should be distinct).
fn submit(
    log: usize,
    handle: &crest_storage::wal::WalHandle,
    state: &LogState,
    payload: &Bytes,
    config: &WalBenchConfig,
    epoch: Instant,
) -> Result<()> {
    let interval = (config.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / config.rate));
    let end = config.duration;
    let (mut index, mut last_token, mut seq) = (0u64, 0u64, 1u64);
    loop {
        let due = match interval {
            Some(interval) => {
                let due = interval.mul_f64(index as f64);
                if due >= end {
                    break;
                }
                let now = epoch.elapsed();
                if due > now {
                    std::thread::sleep(due - now);
                }
                due
            }
            None => {
                let mut outstanding = state.outstanding.lock().unwrap_or_else(|e| e.into_inner());
                while *outstanding >= config.in_flight {
                    outstanding = state
                        .changed
                        .wait(outstanding)
                        .unwrap_or_else(|e| e.into_inner());
                }
                drop(outstanding);
                let now = epoch.elapsed();
                if now >= end {
                    break;
                }
                now
            }
        };
        let token = (due.as_nanos() as u64).max(last_token + 1);
        last_token = token;
        let records = append_records(log, seq, config.messages_per_append, payload);
        seq += config.messages_per_append as u64;
        *state.outstanding.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        if let Err(error) = handle.submit(records, Some(token)) {
            *state.outstanding.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
            return Err(error).context("submitting an append");
        }
        index += 1;
    }
    Ok(())
}

impl WalBenchReport {
    /// The final table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let load = if self.rate > 0.0 {
            format!("{:.0} appends/s each", self.rate)
        } else {
            format!("flat out, {} appends in flight each", self.in_flight)
        };
        out.push_str(&format!(
            "crest wal bench: {} log{} in {}, {}, {} x {} B messages per append, {}, {} busy thread{}\n",
            self.logs,
            if self.logs == 1 { "" } else { "s" },
            self.dir,
            load,
            self.messages_per_append,
            self.payload_bytes,
            self.durability,
            self.busy_threads,
            if self.busy_threads == 1 { "" } else { "s" },
        ));
        out.push_str(&format!(
            "  appends  {:>10}  in {:>7.3} s  = {:>10.0} /s  ({:.0} msgs/s, {:.1} MB/s of payload)  failed {}\n",
            self.appends,
            self.seconds,
            self.appends_per_s,
            self.messages_per_s,
            self.payload_mb_per_s,
            self.failed
        ));
        out.push_str(&format!(
            "  groups   {:>10}  = {:>10.0} /s  (one write{} each; {:.1} appends per group)\n",
            self.groups,
            self.groups_per_s,
            if self.durability == "fsync" {
                " and one fdatasync"
            } else {
                ""
            },
            if self.groups > 0 {
                self.appends as f64 / self.groups as f64
            } else {
                0.0
            }
        ));
        out.push_str(&crate::percentile_header());
        let mut row = |name: &str, p: &Percentiles| out.push_str(&crate::percentile_row(name, p));
        row("append latency (us)", &self.latency_us);
        if self.sync_us.count > 0 {
            row("fdatasync (us)", &self.sync_us);
        }
        out
    }
}

/// The directory a run uses inside `dir`, removed when it ends.
pub fn run_dir(dir: &Path) -> PathBuf {
    dir.join(format!("crest-wal-bench-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> WalBenchConfig {
        WalBenchConfig {
            dir: dir.to_path_buf(),
            duration: Duration::from_millis(400),
            ..WalBenchConfig::default()
        }
    }

    #[test]
    fn open_loop_appends_complete_durably_on_several_logs_while_threads_spin() {
        let dir = tempfile::tempdir().unwrap();
        let report = run(&WalBenchConfig {
            logs: 2,
            rate: 500.0,
            messages_per_append: 3,
            busy_threads: 1,
            ..config(dir.path())
        })
        .unwrap();
        // 0.4 s at 500/s: 200 appends due per log, each completed exactly once.
        assert_eq!(report.appends, 2 * 200);
        assert_eq!(report.failed, 0);
        assert_eq!(report.messages, report.appends * 3);
        assert_eq!(report.latency_us.count, report.appends);
        assert!(report.groups >= 2 && report.groups <= report.appends);
        // Every group was synced, and an append waits at least for its group's sync.
        assert_eq!(report.sync_us.count, report.groups);
        assert!(report.sync_us.p50 <= report.latency_us.max);
        let p = &report.latency_us;
        assert!(p.p50 >= 1 && p.p50 <= p.p99 && p.p99 <= p.max);
        assert!(report.seconds >= 0.39);
        assert!(
            !run_dir(dir.path()).exists(),
            "the run directory is removed"
        );
        assert!(report.table().contains("append latency (us)"));
    }

    #[test]
    fn flat_out_keeps_the_window_and_buffered_writes_complete() {
        let dir = tempfile::tempdir().unwrap();
        let report = run(&WalBenchConfig {
            rate: 0.0,
            in_flight: 4,
            durability: Durability::Buffered,
            ..config(dir.path())
        })
        .unwrap();
        assert!(report.appends > 0);
        assert_eq!(report.failed, 0);
        assert_eq!(report.latency_us.count, report.appends);
        assert_eq!(report.durability, "buffered");
        assert_eq!(report.sync_us.count, 0, "nothing synced");
        assert!(report.table().contains("flat out, 4 appends in flight"));
    }

    #[test]
    fn settings_out_of_bounds_are_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let base = config(dir.path());
        let too_big = WalBenchConfig {
            messages_per_append: 65_536,
            payload_bytes: 1024,
            ..base.clone()
        };
        let error = run(&too_big).unwrap_err().to_string();
        assert!(error.contains("frame_bytes_max"), "{error}");
        for bad in [
            WalBenchConfig {
                logs: 0,
                ..base.clone()
            },
            WalBenchConfig {
                rate: f64::NAN,
                ..base.clone()
            },
            WalBenchConfig {
                duration: Duration::ZERO,
                ..base.clone()
            },
            WalBenchConfig {
                busy_threads: BUSY_THREADS_MAX + 1,
                ..base.clone()
            },
        ] {
            assert!(run(&bad).is_err());
        }
        assert!(!run_dir(dir.path()).exists());
    }
}
