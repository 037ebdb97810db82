//! `crest topic set | list | unset`: topic configurations the tree keeps.

use crate::*;
use crest::sdk::{TopicConfig, TopicSettings};

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
        /// An attribute kept with the topic, NAME=VALUE (repeatable).
        #[arg(long = "attribute", value_parser = parse_attribute)]
        attributes: Vec<(String, String)>,
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
            attributes,
        } => {
            let config = TopicConfig {
                settings: TopicSettings {
                    lease_timeout_ms,
                    max_attempts,
                    dedup_window_ms,
                    message_ttl_ms: ttl_ms,
                    dead_letter_topic,
                },
                attributes: attributes.into_iter().collect(),
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
