//! Admin commands: `crest dlq list | redrive | purge`, `crest purge`, `crest lease`,
//! `crest reprioritize` and `crest stats`.

use crate::*;

#[derive(Subcommand)]
pub(crate) enum DlqCommand {
    /// List dead letters of a topic, oldest first, with reasons and attempt counts.
    List {
        #[command(flatten)]
        root: RootArgs,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// Most entries to list.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Print payloads too (UTF-8, lossy).
        #[arg(long)]
        payloads: bool,
    },
    /// Move dead letters back into their topic, attempts reset.
    Redrive {
        #[command(flatten)]
        root: RootArgs,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// Message ids (LEAF.SEQ); none: every dead letter of the topic.
        ids: Vec<MessageId>,
    },
    /// Delete dead letters.
    Purge {
        #[command(flatten)]
        root: RootArgs,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// Purge every dead letter of the topic (required when no ids are given).
        #[arg(long)]
        all: bool,
        /// Message ids (LEAF.SEQ).
        ids: Vec<MessageId>,
    },
}

/// Settles leases by message id, whoever holds them.
#[derive(Subcommand)]
pub(crate) enum LeaseCommand {
    /// Acknowledge: the messages are deleted.
    Ack {
        #[command(flatten)]
        target: LeaseTarget,
    },
    /// Give the messages back as failed: delivered again after the delay, or dead-lettered
    /// after the topic's max_attempts.
    Nack {
        #[command(flatten)]
        target: LeaseTarget,
        /// Delay before the messages are delivered again, in milliseconds.
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
        /// Why (kept with the message; shown in the dead-letter queue).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Extend the visibility timeout of the leases.
    Extend {
        #[command(flatten)]
        target: LeaseTarget,
        /// The new visibility timeout from now, in milliseconds.
        #[arg(long)]
        visibility_ms: u64,
    },
}

#[derive(Args)]
pub(crate) struct LeaseTarget {
    #[command(flatten)]
    root: RootArgs,
    /// The topic of the messages.
    #[arg(long)]
    topic: String,
    /// Message ids (LEAF.SEQ).
    #[arg(required = true)]
    ids: Vec<MessageId>,
}

pub(crate) async fn lease(command: LeaseCommand) -> Result<()> {
    let (target, op) = match command {
        LeaseCommand::Ack { target } => (target, Settle::Ack),
        LeaseCommand::Nack {
            target,
            delay_ms,
            reason,
        } => (target, Settle::Nack { delay_ms, reason }),
        LeaseCommand::Extend {
            target,
            visibility_ms,
        } => (
            target,
            Settle::Extend {
                lease_ms: visibility_ms,
            },
        ),
    };
    let name = op.name();
    let admin = Admin::connect(root_config(&target.root)?).await?;
    let answer = admin.settle(&target.topic, op, &target.ids).await?;
    warn_unreachable(&answer.unreachable);
    println!(
        "{name}: settled {} of {} leases in {}",
        answer.value,
        target.ids.len(),
        target.topic
    );
    Ok(())
}

#[derive(Args)]
pub(crate) struct StatsArgs {
    #[command(flatten)]
    pub(crate) root: RootArgs,
    /// One topic only.
    #[arg(long)]
    pub(crate) topic: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `crest purge`: deletes a topic's ready and delayed messages.
#[derive(Args)]
pub(crate) struct PurgeArgs {
    #[command(flatten)]
    pub(crate) root: RootArgs,
    /// The topic.
    #[arg(long)]
    pub(crate) topic: String,
    /// Confirms: every ready and delayed message of the topic is deleted, for good.
    #[arg(long)]
    pub(crate) yes: bool,
}

pub(crate) async fn purge(args: PurgeArgs) -> Result<()> {
    if !args.yes {
        bail!(
            "purging deletes every ready and delayed message of {}; pass --yes to confirm",
            args.topic
        );
    }
    let admin = Admin::connect(root_config(&args.root)?).await?;
    let answer = admin.purge_topic(&args.topic).await?;
    warn_unreachable(&answer.unreachable);
    println!("purged {} messages of {}", answer.value, args.topic);
    Ok(())
}

/// `crest reprioritize`: an admin's escalation of one waiting message.
#[derive(Args)]
pub(crate) struct ReprioritizeArgs {
    #[command(flatten)]
    pub(crate) root: RootArgs,
    /// The message id (LEAF.SEQ).
    pub(crate) id: MessageId,
    /// Its topic.
    #[arg(long)]
    pub(crate) topic: String,
    /// Its priority from now on (0 is the most urgent).
    #[arg(long, value_parser = parse_priority)]
    pub(crate) priority: u32,
    /// Why (logged with the change; shown with its deliveries and dead letters).
    #[arg(long, default_value = "")]
    pub(crate) reason: String,
}

pub(crate) async fn reprioritize(args: ReprioritizeArgs) -> Result<()> {
    let admin = Admin::connect(root_config(&args.root)?).await?;
    let escalation = admin
        .reprioritize(&args.topic, args.id, args.priority, &args.reason)
        .await
        .with_context(|| format!("reprioritize {} of {}", args.id, args.topic))?;
    println!(
        "{}: priority {} (pushed with {}) at {} by {}",
        args.id,
        args.priority,
        escalation.original_priority,
        format_time(escalation.escalated_at),
        escalation.escalated_by.as_deref().unwrap_or("-")
    );
    Ok(())
}

/// `crest set-metadata`: replaces a waiting message's metadata.
#[derive(Args)]
pub(crate) struct SetMetadataArgs {
    #[command(flatten)]
    pub(crate) root: RootArgs,
    /// The message id (LEAF.SEQ).
    pub(crate) id: MessageId,
    /// Its topic.
    #[arg(long)]
    pub(crate) topic: String,
    /// Its metadata from now on, KEY=VALUE (repeatable; none: no metadata).
    #[arg(long = "metadata", value_parser = parse_key_value)]
    pub(crate) metadata: Vec<(String, String)>,
}

pub(crate) async fn set_metadata(args: SetMetadataArgs) -> Result<()> {
    let admin = Admin::connect(root_config(&args.root)?).await?;
    admin
        .set_metadata(&args.topic, args.id, &args.metadata)
        .await
        .with_context(|| format!("set the metadata of {} of {}", args.id, args.topic))?;
    println!("{}: {} metadata pairs set", args.id, args.metadata.len());
    Ok(())
}

/// How a delivery's or dead letter's priority changed, for a listing (empty: it did not).
pub(crate) fn escalation_text(escalation: Option<&crest::sdk::Escalation>) -> String {
    let Some(e) = escalation else {
        return String::new();
    };
    format!(
        " original_priority={} escalated_at={} escalated_by={} escalation_reason={:?}",
        e.original_priority,
        format_time(e.escalated_at),
        e.escalated_by
            .as_deref()
            .unwrap_or(if e.aged { "aging" } else { "-" }),
        e.reason
    )
}

pub(crate) fn warn_unreachable(unreachable: &[crest::sdk::LeafId]) {
    if !unreachable.is_empty() {
        let list: Vec<String> = unreachable.iter().map(|l| l.to_string()).collect();
        eprintln!(
            "warning: leaves {} could not be reached; the answer leaves them out",
            list.join(", ")
        );
    }
}

pub(crate) async fn dlq(command: DlqCommand) -> Result<()> {
    match command {
        DlqCommand::List {
            root,
            topic,
            limit,
            payloads,
        } => {
            let admin = Admin::connect(root_config(&root)?).await?;
            let answer = admin.dead_letters(&topic, limit).await?;
            warn_unreachable(&answer.unreachable);
            if answer.value.is_empty() {
                println!("(no dead letters in {topic})");
            }
            for dead in &answer.value {
                print!(
                    "id={} priority={} attempts={} enqueued={} died={} reason={:?}",
                    dead.id,
                    dead.priority,
                    dead.attempts,
                    format_time(dead.enqueued_at),
                    format_time(dead.dead_at),
                    dead.reason
                );
                print!("{}", escalation_text(dead.escalation.as_ref()));
                if payloads {
                    print!(" payload={}", String::from_utf8_lossy(&dead.payload));
                }
                println!();
            }
        }
        DlqCommand::Redrive { root, topic, ids } => {
            let admin = Admin::connect(root_config(&root)?).await?;
            let answer = admin.redrive(&topic, &ids).await?;
            warn_unreachable(&answer.unreachable);
            println!("redrove {} dead letters into {topic}", answer.value);
        }
        DlqCommand::Purge {
            root,
            topic,
            all,
            ids,
        } => {
            if ids.is_empty() && !all {
                bail!(
                    "name the dead letters to purge, or pass --all to purge every one of {topic}"
                );
            }
            let admin = Admin::connect(root_config(&root)?).await?;
            let answer = admin.purge(&topic, &ids).await?;
            warn_unreachable(&answer.unreachable);
            println!("purged {} dead letters of {topic}", answer.value);
        }
    }
    Ok(())
}

pub(crate) fn format_time(time: crest::sdk::Time) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_micros(time.as_micros());
    humantime::format_rfc3339_millis(at).to_string()
}

pub(crate) async fn stats(args: StatsArgs) -> Result<()> {
    let admin = Admin::connect(root_config(&args.root)?).await?;
    let answer = admin.stats(args.topic.as_deref()).await?;
    warn_unreachable(&answer.unreachable);
    let stats = answer.value;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
        return Ok(());
    }
    let now = std::time::SystemTime::now();
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>8} {:>12}  ready by priority",
        "topic", "ready", "delayed", "in flight", "dead", "oldest"
    );
    for topic in &stats.topics {
        let oldest = topic.oldest_enqueued_at.map_or("-".into(), |at| {
            let at = std::time::UNIX_EPOCH + Duration::from_micros(at.as_micros());
            let age = now.duration_since(at).unwrap_or_default();
            humantime::format_duration(Duration::from_secs(age.as_secs())).to_string()
        });
        let by_priority: Vec<String> = topic
            .ready
            .iter()
            .map(|(priority, count)| format!("{priority}:{count}"))
            .collect();
        println!(
            "{:<24} {:>10} {:>10} {:>10} {:>8} {:>12}  {}",
            topic.topic,
            topic.ready_total(),
            topic.delayed,
            topic.in_flight,
            topic.dead,
            oldest,
            by_priority.join(" ")
        );
    }
    // A topic asked for that holds nothing (every message acknowledged, or none pushed) is
    // shown with its zeros, not left out.
    if let Some(asked) = args.topic.as_deref()
        && !asked.ends_with('/')
        && !stats.topics.iter().any(|t| t.topic == asked)
    {
        println!(
            "{asked:<24} {:>10} {:>10} {:>10} {:>8} {:>12}  (holds nothing)",
            0, 0, 0, 0, "-"
        );
    }
    println!(
        "expired {}, dead-lettered {}, deduplicated {} (since each leaf started)",
        stats.expired, stats.dead_lettered, stats.deduplicated
    );
    // Per namespace: what its topics hold together.
    let mut namespaces: std::collections::BTreeMap<&str, (u64, u64, u64)> = Default::default();
    for topic in &stats.topics {
        let sum = namespaces
            .entry(crest::sdk::namespace(&topic.topic))
            .or_default();
        sum.0 = sum.0.saturating_add(topic.messages());
        sum.1 = sum.1.saturating_add(topic.bytes);
        sum.2 = sum.2.saturating_add(topic.in_flight);
    }
    println!(
        "{:<24} {:>10} {:>14} {:>10}",
        "namespace", "messages", "bytes", "in flight"
    );
    for (namespace, (messages, bytes, in_flight)) in namespaces {
        println!("{namespace:<24} {messages:>10} {bytes:>14} {in_flight:>10}");
    }
    print_limits(&stats.limits);
    Ok(())
}

/// Each limited scope: what it holds against its quotas, its push rate against its rate
/// limits, and what was refused (since the root started).
fn print_limits(limits: &[crest::sdk::ScopeStats]) {
    if limits.is_empty() {
        return;
    }
    let of = |used: u64, max: Option<u64>| match max {
        Some(max) => format!("{used}/{max}"),
        None => used.to_string(),
    };
    let rate = |now: u64, limit: Option<crest::sdk::Rate>| match limit {
        Some(limit) => format!("{now}/{}", limit.per_second),
        None => now.to_string(),
    };
    println!(
        "{:<24} {:>21} {:>25} {:>13} {:>17} {:>21} {:>15} {:>15}  refused pushes: quota, \
         rate, for now; pops: rate, in flight",
        "limited scope",
        "messages",
        "bytes",
        "topics",
        "pushes/s",
        "bytes/s",
        "pops/s",
        "in flight"
    );
    for s in limits {
        let l = &s.limits;
        let r = &s.refused;
        println!(
            "{:<24} {:>21} {:>25} {:>13} {:>17} {:>21} {:>15} {:>15}  {}, {}, {}; {}, {}",
            s.scope,
            of(s.used.messages, l.messages_max),
            of(s.used.bytes, l.bytes_max),
            of(s.topics, l.topics_max),
            rate(s.pushed_per_second.messages, l.push_rate),
            rate(s.pushed_per_second.bytes, l.push_bytes_rate),
            rate(s.popped_per_second, l.pop_rate),
            of(s.in_flight, l.in_flight_max),
            r.over_quota,
            r.rate_limited,
            r.awaiting_allowance,
            r.pops_rate_limited,
            r.pops_over_in_flight,
        );
    }
}
