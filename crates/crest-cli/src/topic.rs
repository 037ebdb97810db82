//! `crest topic set | list | unset`: topic configurations the tree keeps; `crest policy set |
//! list | unset`: a namespace's quotas, kept the same way (as the configuration `NS/`).

use crate::*;
use crest::core::config::{KeyWeights, Scheduling, Weights};
use crest::core::quota::{namespace_scope, principal_scope, scope_namespace, scope_principal};
use crest::sdk::{Limits, Quota, Rate, TopicConfig, TopicSettings};

/// Quotas on the command line.
#[derive(clap::Args, Clone, Copy)]
pub(crate) struct LimitArgs {
    /// Most messages held in the whole tree (ready, delayed, in flight, dead letters).
    #[arg(long)]
    messages_max: Option<u64>,
    /// Most payload bytes held in the whole tree.
    #[arg(long)]
    bytes_max: Option<u64>,
    /// Largest payload of one message, in bytes.
    #[arg(long)]
    message_bytes_max: Option<u64>,
    /// Messages pushed per second, over the whole tree (refused `RateLimited` past it; the
    /// SDK's producer waits and retries).
    #[arg(long)]
    push_rate: Option<u64>,
    /// Most messages pushed at once after a quiet time (default: one second's worth).
    #[arg(long, requires = "push_rate")]
    push_burst: Option<u64>,
    /// Payload bytes pushed per second, over the whole tree.
    #[arg(long)]
    push_bytes_rate: Option<u64>,
    /// Most payload bytes pushed at once (default: one second's worth).
    #[arg(long, requires = "push_bytes_rate")]
    push_bytes_burst: Option<u64>,
    /// Messages popped per second, over the whole tree (a pop past it waits for the rate
    /// within its wait, then is refused `RateLimited`).
    #[arg(long)]
    pop_rate: Option<u64>,
    /// Most messages popped at once after a quiet time (default: one second's worth).
    #[arg(long, requires = "pop_rate")]
    pop_burst: Option<u64>,
    /// Most messages in flight (delivered, not yet settled) in the whole tree: a pop past it
    /// is refused `QuotaExceeded` until consumers settle some.
    #[arg(long)]
    in_flight_max: Option<u64>,
    /// Most topics of the namespace holding messages in the whole tree: a push to another
    /// topic is refused `QuotaExceeded`.
    #[arg(long)]
    topics_max: Option<u64>,
}

/// Whose limits: a namespace's (quotas and rates) or a principal's (rates, over every
/// namespace).
#[derive(clap::Args, Clone)]
#[group(required = true, multiple = false)]
pub(crate) struct ScopeArgs {
    /// The namespace.
    #[arg(long)]
    namespace: Option<String>,
    /// The principal (its rates count what it pushes and pops in every namespace).
    #[arg(long)]
    principal: Option<String>,
}

impl ScopeArgs {
    /// The scope's name in the tree, and how to print it.
    fn scope(&self) -> (String, String) {
        match (&self.namespace, &self.principal) {
            (Some(namespace), _) => (namespace_scope(namespace), format!("namespace {namespace}")),
            (_, Some(principal)) => (principal_scope(principal), format!("principal {principal}")),
            (None, None) => unreachable!("clap requires one"),
        }
    }
}

impl LimitArgs {
    fn limits(self) -> Limits {
        let rate = Rate::of;
        Limits {
            messages_max: self.messages_max,
            bytes_max: self.bytes_max,
            message_bytes_max: self.message_bytes_max,
            push_rate: rate(self.push_rate, self.push_burst),
            push_bytes_rate: rate(self.push_bytes_rate, self.push_bytes_burst),
            pop_rate: rate(self.pop_rate, self.pop_burst),
            in_flight_max: self.in_flight_max,
            topics_max: self.topics_max,
        }
    }
}

#[derive(Subcommand)]
pub(crate) enum PolicyCommand {
    /// Set a namespace's quotas and rates, or a principal's rates (replaces those it had),
    /// kept by every leaf and enforced over the whole tree.
    Set {
        #[command(flatten)]
        root: RootArgs,
        #[command(flatten)]
        scope: ScopeArgs,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// List the namespaces' and principals' limits, and what each namespace holds now.
    List {
        #[command(flatten)]
        root: RootArgs,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Remove a namespace's or a principal's limits.
    Unset {
        #[command(flatten)]
        root: RootArgs,
        #[command(flatten)]
        scope: ScopeArgs,
    },
}

/// The limits set, as `name=value` words.
pub(crate) fn limit_words(limits: &Limits) -> Vec<String> {
    Quota::ALL
        .into_iter()
        .filter_map(|which| match limits.rate(which) {
            Some(r) => Some(format!("{which}={}/s,burst={}", r.per_second, r.burst)),
            None => limits.of(which).map(|value| format!("{which}={value}")),
        })
        .collect()
}

pub(crate) async fn policy(command: PolicyCommand) -> Result<()> {
    match command {
        PolicyCommand::Set {
            root,
            scope,
            limits,
        } => {
            let limits = limits.limits();
            if limits.is_empty() {
                bail!(
                    "no limit given (--messages-max, --bytes-max, --message-bytes-max, \
                     --push-rate, --push-bytes-rate, --pop-rate, --in-flight-max, --topics-max)"
                );
            }
            let (scope, named) = scope.scope();
            let config = TopicConfig {
                limits,
                ..TopicConfig::default()
            };
            let admin = Admin::connect(root_config(&root)?).await?;
            let answer = admin.configure(&scope, config).await?;
            warn_unreachable(&answer.unreachable);
            if answer.value == 0 {
                bail!("{named}: no leaf kept the limits (quota_scopes_max?)");
            }
            println!(
                "{named}: {} at {} leaves",
                limit_words(&limits).join(" "),
                answer.value
            );
        }
        PolicyCommand::List { root, json } => {
            let admin = Admin::connect(root_config(&root)?).await?;
            let configs = admin.configs("").await?;
            warn_unreachable(&configs.unreachable);
            let stats = admin.stats(None).await?;
            let mut held: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
            for topic in &stats.value.topics {
                let sum = held.entry(crest::sdk::namespace(&topic.topic)).or_default();
                sum.0 = sum.0.saturating_add(topic.messages());
                sum.1 = sum.1.saturating_add(topic.bytes);
            }
            let policies: Vec<(&str, &TopicConfig)> = configs
                .value
                .iter()
                .filter_map(|(scope, c)| Some((scope_namespace(scope)?, c)))
                .filter(|(_, c)| !c.deleted && !c.limits.is_empty())
                .collect();
            let principals: Vec<(&str, &TopicConfig)> = configs
                .value
                .iter()
                .filter_map(|(scope, c)| Some((scope_principal(scope)?, c)))
                .filter(|(_, c)| !c.deleted && !c.limits.is_empty())
                .collect();
            if json {
                let listed: Vec<serde_json::Value> = policies
                    .iter()
                    .map(|(namespace, c)| {
                        let (messages, bytes) = held.get(namespace).copied().unwrap_or_default();
                        serde_json::json!({
                            "namespace": namespace,
                            "limits": c.limits,
                            "messages": messages,
                            "bytes": bytes,
                            "version": format_time(c.version),
                        })
                    })
                    .chain(principals.iter().map(|(principal, c)| {
                        serde_json::json!({
                            "principal": principal,
                            "limits": c.limits,
                            "version": format_time(c.version),
                        })
                    }))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&listed)?);
                return Ok(());
            }
            for (namespace, c) in policies {
                let (messages, bytes) = held.get(namespace).copied().unwrap_or_default();
                println!(
                    "{namespace} {} messages={messages} bytes={bytes} set={}",
                    limit_words(&c.limits).join(" "),
                    format_time(c.version)
                );
            }
            for (principal, c) in principals {
                println!(
                    "principal {principal} {} set={}",
                    limit_words(&c.limits).join(" "),
                    format_time(c.version)
                );
            }
        }
        PolicyCommand::Unset { root, scope } => {
            let (scope, named) = scope.scope();
            let admin = Admin::connect(root_config(&root)?).await?;
            let answer = admin.unconfigure(&scope).await?;
            warn_unreachable(&answer.unreachable);
            println!("{named}: limits removed at {} leaves", answer.value);
        }
    }
    Ok(())
}

// Parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub(crate) enum TopicCommand {
    /// Set a topic's configuration (replaces the one it had): delivery policy overrides and
    /// attributes, kept by every leaf.
    Set {
        #[command(flatten)]
        root: RootArgs,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// Deliveries before a message is dead.
        #[arg(long)]
        max_attempts: Option<u32>,
        /// Where dead messages go, ready again (a topic of the same namespace); unset: the
        /// topic's own dead-letter queue.
        #[arg(long)]
        dead_letter_topic: Option<String>,
        /// Dedup window, in milliseconds.
        #[arg(long)]
        dedup_window_ms: Option<u64>,
        /// Default time to live, in milliseconds (0: forever).
        #[arg(long)]
        ttl_ms: Option<u64>,
        /// Default visibility timeout, in milliseconds.
        #[arg(long)]
        lease_timeout_ms: Option<u64>,
        /// Aging: a message ready longer than DURATION at PRIORITY moves one priority up,
        /// PRIORITY=DURATION (repeatable; e.g. `--aging 3=30m --aging 4=1h`).
        #[arg(long = "aging", value_parser = parse_aging)]
        aging: Vec<(u32, Duration)>,
        /// The most urgent priority aging promotes to (default 0).
        #[arg(long, requires = "aging")]
        aging_floor: Option<u32>,
        /// How pops share the topic among priorities: `strict` (the most urgent first,
        /// always) or `weighted` (tiers share pops by weight).
        #[arg(long, value_parser = parse_scheduling)]
        scheduling: Option<Scheduling>,
        /// A tier of a weighted topic and its weight, PRIORITY=WEIGHT (repeatable; default
        /// `0=8 1=4 2=2 3=1 4=0.5`); a tier holds its priority and those after it up to the
        /// next tier's.
        #[arg(long = "weight", value_parser = parse_weight)]
        weights: Vec<(u32, f64)>,
        /// A fairness key of a weighted topic and its weight within its tier, KEY=WEIGHT
        /// (repeatable; keys not named weigh 1).
        #[arg(long = "fairness-weight", value_parser = parse_fairness_weight)]
        fairness_weights: Vec<(String, f64)>,
        /// Deliver the topic's message groups in order (`true`) or not (`false`): a message's
        /// group is its fairness key; none of a group is delivered while one of it is leased.
        #[arg(long)]
        fifo: Option<bool>,
        /// An attribute kept with the topic, NAME=VALUE (repeatable).
        #[arg(long = "attribute", value_parser = parse_attribute)]
        attributes: Vec<(String, String)>,
        /// The topic's own quotas (its namespace's apply too).
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// List topic configurations.
    List {
        #[command(flatten)]
        root: RootArgs,
        /// Only topics whose names start with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Remove a topic's configuration (the topology's settings apply again).
    Unset {
        #[command(flatten)]
        root: RootArgs,
        /// The topic.
        #[arg(long)]
        topic: String,
    },
}

fn parse_aging(text: &str) -> Result<(u32, Duration), String> {
    let (priority, threshold) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected PRIORITY=DURATION (e.g. 3=30m)"))?;
    let priority = crate::client::parse_priority(priority.trim())?;
    let threshold = humantime::parse_duration(threshold.trim())
        .map_err(|e| format!("{threshold:?}: {e} (e.g. 30m, 1h)"))?;
    Ok((priority, threshold))
}

fn parse_scheduling(text: &str) -> Result<Scheduling, String> {
    match text {
        "strict" => Ok(Scheduling::Strict),
        "weighted" => Ok(Scheduling::Weighted),
        _ => Err(format!("{text:?}: expected strict or weighted")),
    }
}

fn parse_weight(text: &str) -> Result<(u32, f64), String> {
    let (priority, weight) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected PRIORITY=WEIGHT (e.g. 0=8)"))?;
    let priority = crate::client::parse_priority(priority.trim())?;
    Ok((priority, parse_weight_value(weight)?))
}

fn parse_fairness_weight(text: &str) -> Result<(String, f64), String> {
    let (key, weight) = text
        .rsplit_once('=')
        .ok_or_else(|| format!("{text:?}: expected KEY=WEIGHT (e.g. tenant-42=2)"))?;
    if key.is_empty() {
        return Err(format!("{text:?}: the fairness key is empty"));
    }
    Ok((key.to_string(), parse_weight_value(weight)?))
}

fn parse_weight_value(weight: &str) -> Result<f64, String> {
    let weight: f64 = weight
        .trim()
        .parse()
        .map_err(|_| format!("{weight:?}: not a number (e.g. 8, 0.5)"))?;
    if !(0.001..=crest::core::config::WEIGHT_MAX).contains(&weight) {
        return Err(format!(
            "{weight}: a weight is 0.001..={}",
            crest::core::config::WEIGHT_MAX
        ));
    }
    Ok(weight)
}

fn parse_attribute(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected NAME=VALUE"))?;
    Ok((name.to_string(), value.to_string()))
}

pub(crate) async fn topic(command: TopicCommand) -> Result<()> {
    match command {
        TopicCommand::Set {
            root,
            topic,
            max_attempts,
            dead_letter_topic,
            dedup_window_ms,
            ttl_ms,
            lease_timeout_ms,
            aging,
            aging_floor,
            scheduling,
            weights,
            fairness_weights,
            fifo,
            attributes,
            limits,
        } => {
            let aging = (!aging.is_empty()).then(|| crest::core::config::Aging {
                thresholds: aging.into_iter().collect(),
            });
            let weights = (!weights.is_empty()).then(|| Weights {
                milli: weights
                    .into_iter()
                    .map(|(tier, weight)| (tier, (weight * 1000.0).round() as u32))
                    .collect(),
            });
            let config = TopicConfig {
                settings: TopicSettings {
                    lease_timeout_ms,
                    max_attempts,
                    dedup_window_ms,
                    message_ttl_ms: ttl_ms,
                    dead_letter_topic,
                    aging,
                    aging_floor,
                    scheduling,
                    weights,
                    fairness_weights: (!fairness_weights.is_empty()).then(|| KeyWeights {
                        milli: fairness_weights
                            .into_iter()
                            .map(|(key, weight)| (key, (weight * 1000.0).round() as u32))
                            .collect(),
                    }),
                    fifo,
                },
                attributes: attributes.into_iter().collect(),
                limits: limits.limits(),
                ..TopicConfig::default()
            };
            let admin = Admin::connect(root_config(&root)?).await?;
            let answer = admin.configure(&topic, config).await?;
            warn_unreachable(&answer.unreachable);
            println!("{topic}: configured at {} leaves", answer.value);
        }
        TopicCommand::List { root, prefix, json } => {
            let admin = Admin::connect(root_config(&root)?).await?;
            let answer = admin.configs(&prefix).await?;
            warn_unreachable(&answer.unreachable);
            if json {
                let listed: Vec<serde_json::Value> = answer
                    .value
                    .iter()
                    .map(|(topic, c)| {
                        serde_json::json!({
                            "topic": topic,
                            "settings": c.settings,
                            "attributes": c.attributes,
                            "limits": c.limits,
                            "version": format_time(c.version),
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&listed)?);
                return Ok(());
            }
            for (topic, c) in &answer.value {
                let s = &c.settings;
                let mut line = format!("{topic} set={}", format_time(c.version));
                let fields = [
                    ("max_attempts", s.max_attempts.map(u64::from)),
                    ("dedup_window_ms", s.dedup_window_ms),
                    ("ttl_ms", s.message_ttl_ms),
                    ("lease_timeout_ms", s.lease_timeout_ms),
                ];
                for (name, value) in fields {
                    if let Some(value) = value {
                        line.push_str(&format!(" {name}={value}"));
                    }
                }
                if let Some(dead) = &s.dead_letter_topic {
                    line.push_str(&format!(" dead_letter_topic={dead}"));
                }
                for (priority, threshold) in s.aging.iter().flat_map(|a| &a.thresholds) {
                    let threshold = humantime::format_duration(*threshold);
                    line.push_str(&format!(" aging={priority}={threshold}"));
                }
                if let Some(floor) = s.aging_floor {
                    line.push_str(&format!(" aging_floor={floor}"));
                }
                if let Some(scheduling) = s.scheduling {
                    let name = match scheduling {
                        Scheduling::Strict => "strict",
                        Scheduling::Weighted => "weighted",
                    };
                    line.push_str(&format!(" scheduling={name}"));
                }
                for (tier, milli) in s.weights.iter().flat_map(|w| &w.milli) {
                    let weight = f64::from(*milli) / 1000.0;
                    line.push_str(&format!(" weight={tier}={weight}"));
                }
                for (key, milli) in s.fairness_weights.iter().flat_map(|w| &w.milli) {
                    let weight = f64::from(*milli) / 1000.0;
                    line.push_str(&format!(" fairness_weight={key}={weight}"));
                }
                if let Some(fifo) = s.fifo {
                    line.push_str(&format!(" fifo={fifo}"));
                }
                for word in limit_words(&c.limits) {
                    line.push_str(&format!(" {word}"));
                }
                for (name, value) in &c.attributes {
                    line.push_str(&format!(" {name}={value:?}"));
                }
                println!("{line}");
            }
        }
        TopicCommand::Unset { root, topic } => {
            let admin = Admin::connect(root_config(&root)?).await?;
            let answer = admin.unconfigure(&topic).await?;
            warn_unreachable(&answer.unreachable);
            println!("{topic}: configuration removed at {} leaves", answer.value);
        }
    }
    Ok(())
}
