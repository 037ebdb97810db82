//! `crest wal inspect` and `crest wal bench`: a leaf's log verified, and a disk measured as a log.

use crate::*;

#[derive(Subcommand)]
pub(crate) enum WalCommand {
    /// List segments and record counts, verify every checksum, say where corruption is.
    /// Reads only; exits non-zero if recovery would refuse to start.
    Inspect {
        /// The leaf's log directory.
        dir: PathBuf,
    },
    /// Measure how long this disk takes to make appends durable, through the real log
    /// (group commit, fdatasync) without the network: the floor under a durable push's
    /// acknowledgement. Several logs model leaves sharing the disk; busy threads show how the
    /// latency depends on how busy the processors are.
    Bench(WalBenchArgs),
}

#[derive(Args)]
pub(crate) struct WalBenchArgs {
    /// Directory on the disk to measure (a fresh subdirectory is made and removed).
    #[arg(long, default_value = ".crest")]
    pub(crate) dir: PathBuf,
    /// Logs written at once, each by its own writer thread (leaves sharing the disk).
    #[arg(long, default_value_t = 1)]
    pub(crate) logs: usize,
    /// Appends per second to each log (open loop: latency counts from when an append was
    /// due); 0 = flat out with --in-flight appends outstanding per log.
    #[arg(long, default_value_t = 4000.0)]
    pub(crate) rate: f64,
    /// Flat out (--rate 0): appends outstanding per log.
    #[arg(long, default_value_t = 64)]
    pub(crate) in_flight: usize,
    /// Messages per append (a push batch).
    #[arg(long, default_value_t = 4)]
    pub(crate) messages_per_append: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    pub(crate) payload_bytes: usize,
    /// How long to append (e.g. 10s).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub(crate) duration: Duration,
    /// Threads that spin on the CPU meanwhile.
    #[arg(long, default_value_t = 0)]
    pub(crate) busy_threads: usize,
    /// Write without syncing (`buffered`), or sync before completing (`fsync`).
    #[arg(long, value_enum, default_value_t = DurabilityArg::Fsync)]
    pub(crate) durability: DurabilityArg,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum DurabilityArg {
    Fsync,
    Buffered,
}

/// Recovery modes, as the command line spells them.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum Recovery {
    /// Cut back a torn tail of the last segment; refuse anything else.
    TolerateTornTail,
    /// Cut the log at the first bad record, discarding what follows.
    TruncateCorrupt,
}

impl From<Recovery> for RecoveryMode {
    fn from(recovery: Recovery) -> RecoveryMode {
        match recovery {
            Recovery::TolerateTornTail => RecoveryMode::TolerateTornTail,
            Recovery::TruncateCorrupt => RecoveryMode::TruncateCorrupt,
        }
    }
}

pub(crate) async fn wal_bench(args: WalBenchArgs) -> Result<()> {
    let config = crest::bench::wal::WalBenchConfig {
        dir: args.dir,
        logs: args.logs,
        rate: args.rate,
        in_flight: args.in_flight,
        messages_per_append: args.messages_per_append,
        payload_bytes: args.payload_bytes,
        duration: args.duration,
        busy_threads: args.busy_threads,
        durability: match args.durability {
            DurabilityArg::Fsync => crest::core::config::Durability::Fsync,
            DurabilityArg::Buffered => crest::core::config::Durability::Buffered,
        },
    };
    // The writers and submitters are threads; keep the runtime's workers out of their way.
    let report = tokio::task::spawn_blocking(move || crest::bench::wal::run(&config)).await??;
    print!("{}", report.table());
    write_json(args.json.as_deref(), &report)?;
    Ok(())
}

pub(crate) fn wal_inspect(dir: &Path) -> Result<()> {
    let max = crest::core::config::Settings::default().frame_bytes_max;
    let report = crest::storage::inspect::inspect(dir, max)?;
    if report.segments.is_empty() {
        println!("{}: no log segments", dir.display());
    }
    for segment in &report.segments {
        let preallocated = if segment.bytes > segment.written {
            format!(" (file {} bytes, preallocated)", segment.bytes)
        } else {
            String::new()
        };
        println!(
            "{}  {:>12} bytes  {:>9} records  {}{preallocated}",
            segment.name,
            segment.written,
            segment.records,
            segment.problem.as_deref().unwrap_or("ok")
        );
    }
    let entries: Vec<String> = crest::storage::inspect::ENTRY_KINDS
        .iter()
        .zip(report.entries)
        .map(|(kind, count)| format!("{count} {kind}"))
        .collect();
    println!(
        "{} segments; entries: {}; {} messages live",
        report.segments.len(),
        entries.join(", "),
        report.live_messages
    );
    if report.is_fatal() {
        bail!("the log is corrupt: recovery would refuse to start (see `crest launch --recovery`)");
    }
    Ok(())
}
