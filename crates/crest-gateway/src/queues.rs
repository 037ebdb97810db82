//! SQS queues as crest keeps them: a queue `NAME` of namespace `NS` is topic `NS/NAME`
//! (`NAME` in namespace `default`), its URL `http://HOST/NS/NAME`, and its attributes are
//! kept by the tree in the topic's configuration (`Admin::configure`), so that every gateway
//! in front of a tree sees the same queues and a restart loses none.

use crate::error::SqsError;
use crest_sdk::{TopicConfig, TopicSettings};
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// Longest queue name SQS allows.
const NAME_BYTES_MAX: usize = 80;

/// 1–80 of `[A-Za-z0-9_-]`: a queue name (and a namespace in a queue URL).
fn is_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= NAME_BYTES_MAX
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A queue's dead-letter queue and how many receives send a message there (SQS's
/// `RedrivePolicy`): crest's `dead_letter_topic` and `max_attempts`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redrive {
    /// The dead-letter queue (of the same namespace).
    pub dead_letter: QueueName,
    /// `maxReceiveCount`: 1–1,000.
    pub max_receive_count: u32,
}

/// A queue's attributes (seconds and bytes, as SQS gives them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueAttributes {
    /// `VisibilityTimeout`: a received message's lease, 0–43,200 s (default 30).
    pub visibility_timeout: u32,
    /// `DelaySeconds`: every message's delay, 0–900 s (default 0).
    pub delay_seconds: u32,
    /// `MessageRetentionPeriod`: every message's time to live, 60–1,209,600 s (default 4 days).
    pub retention_seconds: u32,
    /// `ReceiveMessageWaitTimeSeconds`: a receive's long poll, 0–20 s (default 0).
    pub receive_wait_seconds: u32,
    /// `MaximumMessageSize`: 1,024–1,048,576 bytes (default 1,048,576, as SQS's since 2025),
    /// counting the body and the message attributes.
    pub maximum_message_size: u32,
    /// `RedrivePolicy`, if set.
    pub redrive: Option<Redrive>,
    /// `Policy`, an IAM policy document kept and answered as given: crest's grants, not the
    /// policy, decide what a key may do (docs/sqs.md).
    pub policy: Option<String>,
    /// FIFO settings (`FifoQueue`, given at creation only), if a FIFO queue.
    pub fifo: Option<Fifo>,
}

/// A FIFO queue's settings (docs/sqs.md, "FIFO queues").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fifo {
    /// `ContentBasedDeduplication`: a message without a `MessageDeduplicationId` is
    /// deduplicated by its body's SHA-256.
    pub content_based: bool,
    /// `DeduplicationScope` `messageGroup` (else `queue`): a deduplication id is one group's,
    /// and the groups spread over the leaves (else the whole queue is one leaf's).
    pub dedup_per_group: bool,
    /// `FifoThroughputLimit` `perMessageGroupId` (else `perQueue`): kept and answered; what
    /// spreads a queue over leaves is `DeduplicationScope`.
    pub throughput_per_group: bool,
}

/// How long a FIFO queue remembers a deduplication id: SQS's five minutes.
pub const FIFO_DEDUP_WINDOW_MS: u64 = 300_000;

/// A two-valued attribute: whether `value` is the second of `values`.
fn either(name: &str, value: &str, values: [&str; 2]) -> Result<bool, SqsError> {
    match values.iter().position(|v| *v == value) {
        Some(at) => Ok(at == 1),
        None => Err(SqsError::bad_attribute_value(
            name,
            &format!("not {} or {}", values[0], values[1]),
        )),
    }
}

/// A boolean attribute's text as SQS takes it (`true`/`false`, any case).
fn boolean(name: &str, value: &str) -> Result<bool, SqsError> {
    match value.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(SqsError::bad_attribute_value(name, "not true or false")),
    }
}

/// The attribute that says whether SQS encrypts a queue's messages at rest: always `false`
/// for crest.
pub const SSE_ATTRIBUTE: &str = "SqsManagedSseEnabled";

/// The longest `Policy` a queue keeps, in bytes (SQS's bound: 20 KiB).
pub const POLICY_BYTES_MAX: usize = 20_480;

impl Default for QueueAttributes {
    fn default() -> Self {
        QueueAttributes {
            visibility_timeout: 30,
            delay_seconds: 0,
            retention_seconds: 345_600,
            receive_wait_seconds: 0,
            maximum_message_size: MESSAGE_BYTES_MAX,
            redrive: None,
            policy: None,
            fifo: None,
        }
    }
}

/// SQS's largest message (body and attributes), in bytes: 1 MiB.
pub const MESSAGE_BYTES_MAX: u32 = 1_048_576;

/// The attributes kept as numbers, by SQS name: where each is in [`QueueAttributes`] and
/// its range.
type NumberField = fn(&mut QueueAttributes) -> &mut u32;
const NUMBERS: [(&str, NumberField, u32, u32); 5] = [
    (
        "VisibilityTimeout",
        |a| &mut a.visibility_timeout,
        0,
        43_200,
    ),
    ("DelaySeconds", |a| &mut a.delay_seconds, 0, 900),
    (
        "MessageRetentionPeriod",
        |a| &mut a.retention_seconds,
        60,
        1_209_600,
    ),
    (
        "ReceiveMessageWaitTimeSeconds",
        |a| &mut a.receive_wait_seconds,
        0,
        20,
    ),
    (
        "MaximumMessageSize",
        |a| &mut a.maximum_message_size,
        1_024,
        MESSAGE_BYTES_MAX,
    ),
];

/// Attribute-map keys the gateway keeps in a topic's configuration: `sqs.` and the SQS
/// name (`sqs.created` and `sqs.modified` for the timestamps; their presence marks a topic
/// as an SQS queue).
const KEY_PREFIX: &str = "sqs.";
const CREATED: &str = "sqs.created";
const MODIFIED: &str = "sqs.modified";
const PURGED: &str = "sqs.purged";
/// Where a queue's `Policy` is kept (as every attribute, `sqs.` and its SQS name).
const POLICY_KEY: &str = "sqs.Policy";
/// A tag `KEY` is kept as `sqs.tag.KEY`.
const TAG_PREFIX: &str = "sqs.tag.";

impl QueueAttributes {
    /// Sets the attribute `name` of `queue` from its text, checking its range (`home`: the
    /// gateway's region, for ARNs).
    pub fn set(
        &mut self,
        queue: &QueueName,
        home: &str,
        name: &str,
        value: &str,
    ) -> Result<(), SqsError> {
        if name == "RedrivePolicy" {
            self.redrive = Redrive::parse(queue, home, value)?;
            return Ok(());
        }
        if name == "Policy" {
            self.policy = policy(value)?;
            return Ok(());
        }
        match (name, &mut self.fifo) {
            ("FifoQueue", Some(_)) => {
                return match boolean(name, value)? {
                    true => Ok(()),
                    false => Err(SqsError::bad_attribute_value(
                        name,
                        "Modifying queue type is not supported",
                    )),
                };
            }
            ("ContentBasedDeduplication", Some(fifo)) => {
                fifo.content_based = boolean(name, value)?;
                return Ok(());
            }
            ("DeduplicationScope", Some(fifo)) => {
                fifo.dedup_per_group = either(name, value, ["queue", "messageGroup"])?;
                return Ok(());
            }
            ("FifoThroughputLimit", Some(fifo)) => {
                fifo.throughput_per_group = either(name, value, ["perQueue", "perMessageGroupId"])?;
                return Ok(());
            }
            ("DeduplicationScope" | "FifoThroughputLimit", None) => {
                return Err(SqsError::named_attribute(format!(
                    "You can specify the {name} only when FifoQueue is set to true."
                )));
            }
            _ => {}
        }
        if name == SSE_ATTRIBUTE {
            // Only the truth is taken: crest does not encrypt messages at rest.
            return match value {
                "false" => Ok(()),
                _ => Err(SqsError::bad_attribute_value(
                    SSE_ATTRIBUTE,
                    "crest keeps messages unencrypted in its logs (encrypt the disk instead; \
                     docs/sqs.md)",
                )),
            };
        }
        let Some((_, field, low, high)) = NUMBERS.iter().find(|(n, ..)| *n == name) else {
            return Err(match name {
                "RedriveAllowPolicy" | "KmsMasterKeyId" | "KmsDataKeyReusePeriodSeconds" => {
                    SqsError::unsupported(&format!("the attribute {name}"))
                }
                _ => SqsError::bad_attribute(name),
            });
        };
        *field(self) = parse_within(name, value, *low, *high)?;
        Ok(())
    }

    /// Every attribute as SQS names it, with its text (`region` for ARNs).
    pub fn listed(&self, region: &str) -> Vec<(&'static str, String)> {
        let mut copy = self.clone();
        let mut out: Vec<(&'static str, String)> = NUMBERS
            .iter()
            .map(|(name, field, ..)| (*name, field(&mut copy).to_string()))
            .collect();
        if let Some(redrive) = &self.redrive {
            out.push(("RedrivePolicy", redrive.json(region)));
        }
        if let Some(policy) = &self.policy {
            out.push(("Policy", policy.clone()));
        }
        if let Some(fifo) = &self.fifo {
            out.push(("FifoQueue", "true".into()));
            out.push(("ContentBasedDeduplication", fifo.content_based.to_string()));
            let scope = if fifo.dedup_per_group {
                "messageGroup"
            } else {
                "queue"
            };
            out.push(("DeduplicationScope", scope.into()));
            let limit = if fifo.throughput_per_group {
                "perMessageGroupId"
            } else {
                "perQueue"
            };
            out.push(("FifoThroughputLimit", limit.into()));
        }
        out
    }
}

impl Redrive {
    /// From `RedrivePolicy`'s JSON (`""`: none): `deadLetterTargetArn` must name a queue of
    /// `queue`'s namespace and region (crest moves messages within a namespace; SQS within a
    /// region), `maxReceiveCount` 1–1,000.
    fn parse(queue: &QueueName, home: &str, value: &str) -> Result<Option<Redrive>, SqsError> {
        if value.is_empty() {
            return Ok(None);
        }
        let bad = |why: &str| {
            SqsError::invalid(format!(
                "Value {value} for parameter RedrivePolicy is invalid. Reason: {why}"
            ))
        };
        let json: serde_json::Value = serde_json::from_str(value)
            .map_err(|_| bad("Redrive policy is not a valid JSON map."))?;
        let arn = json
            .get("deadLetterTargetArn")
            .and_then(|v| v.as_str())
            .ok_or_else(|| {
                bad("Redrive policy does not contain mandatory attribute: deadLetterTargetArn.")
            })?;
        let count = match json.get("maxReceiveCount") {
            Some(serde_json::Value::Number(n)) => n.to_string(),
            Some(serde_json::Value::String(s)) => s.clone(),
            _ => {
                return Err(bad(
                    "Redrive policy does not contain mandatory attribute: maxReceiveCount.",
                ));
            }
        };
        let max_receive_count = parse_within("maxReceiveCount", &count, 1, 1_000)?;
        let dead_letter = QueueName::from_arn(arn, home).ok_or_else(|| {
            bad("Dead-letter target is not a queue ARN (arn:aws:sqs:REGION:NAMESPACE:NAME).")
        })?;
        if dead_letter.namespace != queue.namespace {
            return Err(bad(
                "Dead-letter target owner is not this queue's namespace.",
            ));
        }
        if dead_letter.region != queue.region {
            return Err(bad("Dead-letter target is not in this queue's region."));
        }
        Ok(Some(Redrive {
            dead_letter,
            max_receive_count,
        }))
    }

    /// As `RedrivePolicy`'s JSON.
    fn json(&self, region: &str) -> String {
        serde_json::json!({
            "deadLetterTargetArn": self.dead_letter.arn(region),
            "maxReceiveCount": self.max_receive_count,
        })
        .to_string()
    }
}

/// A `Policy` value: `""` for none, else a JSON object of at most [`POLICY_BYTES_MAX`].
fn policy(value: &str) -> Result<Option<String>, SqsError> {
    if value.is_empty() {
        return Ok(None);
    }
    if value.len() > POLICY_BYTES_MAX {
        return Err(SqsError::invalid(format!(
            "Invalid value for the parameter Policy. Reason: longer than {POLICY_BYTES_MAX} bytes."
        )));
    }
    match serde_json::from_str::<serde_json::Value>(value) {
        Ok(serde_json::Value::Object(_)) => Ok(Some(value.to_string())),
        _ => Err(SqsError::invalid(
            "Invalid value for the parameter Policy. Reason: not a JSON policy document.",
        )),
    }
}

/// `value` as a whole number from `low` to `high`.
fn parse_within(name: &str, value: &str, low: u32, high: u32) -> Result<u32, SqsError> {
    value
        .parse()
        .ok()
        .filter(|v| (low..=high).contains(v))
        .ok_or_else(|| {
            SqsError::invalid(format!(
                "Invalid value for the parameter {name}: {value:?} is not a whole number \
                 from {low} to {high}."
            ))
        })
}

/// One queue: its attributes and timestamps, as the tree keeps them in its topic's
/// configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queue {
    /// Its attributes.
    pub attributes: QueueAttributes,
    /// When it was created, in seconds since the Unix epoch.
    pub created: u64,
    /// When its attributes last changed.
    pub modified: u64,
    /// When it was last purged (`PurgeQueueInProgress` for 60 s after), if ever.
    pub purged: Option<u64>,
    /// Its tags (`TagQueue`), kept with it in the tree.
    pub tags: BTreeMap<String, String>,
    /// Its topic's quotas, set with `crest topic set` (kept as they are when SQS calls
    /// change the queue's attributes).
    pub limits: crest_sdk::Limits,
}

impl Queue {
    /// A new queue, created now.
    pub fn new(attributes: QueueAttributes) -> Queue {
        let now = seconds_now();
        Queue {
            attributes,
            created: now,
            modified: now,
            purged: None,
            tags: BTreeMap::new(),
            limits: Default::default(),
        }
    }

    /// The topic configuration that keeps it: the attributes under `sqs.` names, the
    /// redrive policy as the topic's `max_attempts` and `dead_letter_topic`.
    pub fn to_config(&self) -> TopicConfig {
        let mut attributes: BTreeMap<String, String> = self
            .attributes
            .listed("")
            .into_iter()
            .filter(|(name, _)| *name != "RedrivePolicy")
            .map(|(name, value)| (format!("{KEY_PREFIX}{name}"), value))
            .collect();
        attributes.insert(CREATED.into(), self.created.to_string());
        attributes.insert(MODIFIED.into(), self.modified.to_string());
        if let Some(purged) = self.purged {
            attributes.insert(PURGED.into(), purged.to_string());
        }
        for (key, value) in &self.tags {
            attributes.insert(format!("{TAG_PREFIX}{key}"), value.clone());
        }
        let redrive = self.attributes.redrive.as_ref();
        let fifo = self.attributes.fifo.is_some();
        TopicConfig {
            settings: TopicSettings {
                max_attempts: redrive.map(|r| r.max_receive_count),
                dead_letter_topic: redrive.map(|r| r.dead_letter.topic()),
                fifo: fifo.then_some(true),
                dedup_window_ms: fifo.then_some(FIFO_DEDUP_WINDOW_MS),
                ..TopicSettings::default()
            },
            attributes,
            limits: self.limits,
            ..TopicConfig::default()
        }
    }

    /// The queue a topic configuration keeps, if it is one (set by a gateway).
    pub fn from_config(config: &TopicConfig) -> Option<Queue> {
        let number = |key: &str| config.attributes.get(key)?.parse::<u64>().ok();
        let created = number(CREATED)?;
        let modified = number(MODIFIED).unwrap_or(created);
        let mut attributes = QueueAttributes::default();
        for (name, field, low, high) in NUMBERS {
            if let Some(value) = number(&format!("{KEY_PREFIX}{name}")) {
                *field(&mut attributes) = (value as u32).clamp(low, high);
            }
        }
        attributes.policy = config.attributes.get(POLICY_KEY).cloned();
        if config.settings.is_fifo() {
            let attribute = |name: &str| config.attributes.get(&format!("{KEY_PREFIX}{name}"));
            attributes.fifo = Some(Fifo {
                content_based: attribute("ContentBasedDeduplication").is_some_and(|v| v == "true"),
                dedup_per_group: attribute("DeduplicationScope")
                    .is_some_and(|v| v == "messageGroup"),
                throughput_per_group: attribute("FifoThroughputLimit")
                    .is_some_and(|v| v == "perMessageGroupId"),
            });
        }
        let settings = &config.settings;
        if let (Some(topic), Some(count)) = (&settings.dead_letter_topic, settings.max_attempts) {
            attributes.redrive = Some(Redrive {
                dead_letter: QueueName::from_topic(topic)?,
                max_receive_count: count,
            });
        }
        Some(Queue {
            attributes,
            created,
            modified,
            purged: number(PURGED),
            tags: config
                .attributes
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix(TAG_PREFIX)?.to_string(), v.clone())))
                .collect(),
            limits: config.limits,
        })
    }
}

/// A queue's place: its namespace, name and region.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueName {
    /// The crest namespace.
    pub namespace: String,
    /// The SQS queue name.
    pub name: String,
    /// Its region when not the gateway's own (`None`): each region's queues are a space of
    /// their own, as on SQS.
    pub region: Option<String>,
}

/// Whether `text` reads as an AWS region (`eu-central-1`): lowercase letters, digits and
/// hyphens, with a hyphen, at most 32.
fn is_region(text: &str) -> bool {
    (1..=32).contains(&text.len())
        && text.contains('-')
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl QueueName {
    /// Checks a queue name as SQS does: 1–80 of `[A-Za-z0-9_-]`, a FIFO queue's ending in
    /// `.fifo`; of the gateway's own region.
    pub fn checked(namespace: &str, name: &str) -> Result<QueueName, SqsError> {
        let base = name.strip_suffix(".fifo").unwrap_or(name);
        if !is_name(base) || name.len() > NAME_BYTES_MAX {
            return Err(SqsError::invalid(format!(
                "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in \
                 length: {name:?}."
            )));
        }
        if !is_name(namespace) {
            return Err(SqsError::invalid(format!("not a namespace: {namespace:?}")));
        }
        Ok(QueueName {
            namespace: namespace.to_string(),
            name: name.to_string(),
            region: None,
        })
    }

    /// The same queue name in `region` (`home`: the gateway's own).
    pub fn in_region(mut self, region: Option<&str>, home: &str) -> QueueName {
        self.region = region.filter(|r| *r != home).map(str::to_string);
        self
    }

    /// From a queue URL (`http://HOST/NS/NAME`, or `http://HOST/REGION/NS/NAME` for a queue of
    /// another region than the gateway's, `home`; any scheme and host).
    pub fn from_url(url: &str, home: &str) -> Result<QueueName, SqsError> {
        let path = url
            .split_once("://")
            .map_or(url, |(_, rest)| rest.split_once('/').map_or("", |(_, p)| p));
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let [.., namespace, name] = parts[..] else {
            return Err(SqsError::no_queue());
        };
        let region = parts
            .len()
            .checked_sub(3)
            .map(|at| parts[at])
            .filter(|r| is_region(r));
        let queue = QueueName::checked(namespace, name).map_err(|_| SqsError::no_queue())?;
        Ok(queue.in_region(region, home))
    }

    /// The queue a request's `QueueUrl` names: a URL, or, as SQS also takes, the bare name
    /// of a queue of the caller's `namespace` in its `region`.
    pub fn addressed(
        url: &str,
        namespace: &str,
        region: Option<&str>,
        home: &str,
    ) -> Result<QueueName, SqsError> {
        if url.contains('/') {
            QueueName::from_url(url, home)
        } else {
            let queue = QueueName::checked(namespace, url).map_err(|_| SqsError::no_queue())?;
            Ok(queue.in_region(region, home))
        }
    }

    /// The name as its topic holds it: `REGION:NAME` for another region's (`:` is in no
    /// queue name, so the spaces cannot meet).
    fn topic_name(&self) -> String {
        match &self.region {
            Some(region) => format!("{region}:{}", self.name),
            None => self.name.clone(),
        }
    }

    /// The crest topic.
    pub fn topic(&self) -> String {
        if self.namespace == crest_core::access::DEFAULT_NAMESPACE {
            self.topic_name()
        } else {
            format!("{}/{}", self.namespace, self.topic_name())
        }
    }

    /// Its URL on `host`.
    pub fn url(&self, host: &str) -> String {
        match &self.region {
            Some(region) => format!("http://{host}/{region}/{}/{}", self.namespace, self.name),
            None => format!("http://{host}/{}/{}", self.namespace, self.name),
        }
    }

    /// Its ARN: `arn:aws:sqs:REGION:NAMESPACE:NAME` (the namespace in the account's place;
    /// `home` for a queue of the gateway's region).
    pub fn arn(&self, home: &str) -> String {
        let region = self.region.as_deref().unwrap_or(home);
        format!("arn:aws:sqs:{region}:{}:{}", self.namespace, self.name)
    }

    /// From an ARN (`home`: the gateway's region).
    pub fn from_arn(arn: &str, home: &str) -> Option<QueueName> {
        let rest = arn.strip_prefix("arn:aws:sqs:")?;
        let mut parts = rest.split(':');
        let (region, namespace, name) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || !is_region(region) {
            return None;
        }
        Some(
            QueueName::checked(namespace, name)
                .ok()?
                .in_region(Some(region), home),
        )
    }

    /// The queue of a crest topic, if its name is one.
    pub fn from_topic(topic: &str) -> Option<QueueName> {
        let (namespace, name) = topic
            .split_once('/')
            .unwrap_or((crest_core::access::DEFAULT_NAMESPACE, topic));
        let (region, name) = match name.split_once(':') {
            Some((region, name)) if is_region(region) => (Some(region.to_string()), name),
            Some(_) => return None,
            None => (None, name),
        };
        let mut queue = QueueName::checked(namespace, name).ok()?;
        queue.region = region;
        Some(queue)
    }

    /// The topic prefix that lists the queues of `namespace` in `region` (`None`: the
    /// gateway's) whose names start with `prefix`.
    pub fn topic_prefix(namespace: &str, region: Option<&str>, prefix: &str) -> String {
        let prefix = match region {
            Some(region) => format!("{region}:{prefix}"),
            None => prefix.to_string(),
        };
        if namespace == crest_core::access::DEFAULT_NAMESPACE {
            prefix
        } else {
            format!("{namespace}/{prefix}")
        }
    }
}

pub(crate) fn seconds_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOME: &str = "us-east-1";

    #[test]
    fn urls_name_the_namespace_and_the_queue() {
        let q = QueueName::from_url("http://127.0.0.1:9324/orders/eu-jobs", HOME).unwrap();
        assert_eq!(q.namespace, "orders");
        assert_eq!(q.topic(), "orders/eu-jobs");
        assert_eq!(q.url("h:1"), "http://h:1/orders/eu-jobs");
        let d = QueueName::from_url("https://sqs.example/default/jobs", HOME).unwrap();
        assert_eq!(d.topic(), "jobs");
        for bad in ["http://h/", "http://h/jobs", "http://h/ns/a b", "nothing"] {
            assert_eq!(
                QueueName::from_url(bad, HOME),
                Err(SqsError::no_queue()),
                "{bad}"
            );
        }
        let bare = QueueName::addressed("eu-jobs", "orders", None, HOME).unwrap();
        assert_eq!(bare.topic(), "orders/eu-jobs");
        assert_eq!(
            QueueName::addressed("a b", "orders", None, HOME),
            Err(SqsError::no_queue())
        );
        let by_url = QueueName::addressed("http://h/default/jobs", "orders", None, HOME);
        assert_eq!(by_url.unwrap().topic(), "jobs");
        assert_eq!(
            QueueName::checked("default", "x.fifo").unwrap().topic(),
            "x.fifo"
        );
        assert!(QueueName::checked("default", ".fifo").is_err());
        assert!(QueueName::checked("default", "x.fifo.fifo").is_err());
        assert!(QueueName::checked("default", &format!("{}.fifo", "a".repeat(76))).is_err());
        assert!(QueueName::checked("default", &"a".repeat(81)).is_err());
    }

    #[test]
    fn each_region_s_queues_are_a_space_of_their_own() {
        let home = QueueName::checked("orders", "jobs").unwrap();
        let away = home.clone().in_region(Some("eu-central-1"), HOME);
        assert_eq!(home.clone().in_region(Some(HOME), HOME), home);
        assert_ne!(away, home);
        assert_eq!(away.topic(), "orders/eu-central-1:jobs");
        assert_eq!(away.url("h"), "http://h/eu-central-1/orders/jobs");
        assert_eq!(away.arn(HOME), "arn:aws:sqs:eu-central-1:orders:jobs");
        assert_eq!(QueueName::from_url(&away.url("h"), HOME), Ok(away.clone()));
        assert_eq!(QueueName::from_topic(&away.topic()), Some(away.clone()));
        assert_eq!(
            QueueName::from_arn(&away.arn(HOME), HOME),
            Some(away.clone())
        );
        assert_eq!(
            QueueName::from_arn(&home.arn(HOME), HOME),
            Some(home.clone())
        );
        let bare = QueueName::addressed("jobs", "orders", Some("eu-central-1"), HOME);
        assert_eq!(bare, Ok(away.clone()));
        // A region's listing prefix finds its queues only; the home listing filters by name.
        assert_eq!(
            QueueName::topic_prefix("orders", Some("eu-central-1"), "jo"),
            "orders/eu-central-1:jo"
        );
        assert_eq!(QueueName::from_topic("orders/nope:jobs"), None);
    }

    #[test]
    fn attributes_are_checked_against_sqs_ranges() {
        let queue = QueueName::checked("default", "q").unwrap();
        let mut a = QueueAttributes::default();
        a.set(&queue, HOME, "VisibilityTimeout", "60").unwrap();
        assert_eq!(a.visibility_timeout, 60);
        assert_eq!(
            a.set(&queue, HOME, "DelaySeconds", "901").unwrap_err().code,
            "InvalidParameterValue"
        );
        assert_eq!(
            a.set(&queue, HOME, "Nope", "1").unwrap_err().code,
            "InvalidAttributeName"
        );
        // FIFO attributes are a FIFO queue's only, and its kind does not change.
        assert_eq!(
            a.set(&queue, HOME, "FifoQueue", "true").unwrap_err().code,
            "InvalidAttributeName"
        );
        assert_eq!(
            a.set(&queue, HOME, "DeduplicationScope", "queue")
                .unwrap_err()
                .code,
            "InvalidAttributeName"
        );
        let mut fifo = QueueAttributes {
            fifo: Some(Fifo::default()),
            ..QueueAttributes::default()
        };
        fifo.set(&queue, HOME, "FifoQueue", "True").unwrap();
        fifo.set(&queue, HOME, "ContentBasedDeduplication", "true")
            .unwrap();
        fifo.set(&queue, HOME, "DeduplicationScope", "messageGroup")
            .unwrap();
        assert_eq!(
            fifo.fifo,
            Some(Fifo {
                content_based: true,
                dedup_per_group: true,
                throughput_per_group: false,
            })
        );
        assert_eq!(
            fifo.set(&queue, HOME, "FifoQueue", "false")
                .unwrap_err()
                .code,
            "InvalidAttributeValue"
        );
        // Kept with the topic: a FIFO topic, SQS's five-minute deduplication, read back whole.
        let kept = Queue::new(fifo.clone()).to_config();
        assert!(kept.settings.is_fifo());
        assert_eq!(kept.settings.dedup_window_ms, Some(FIFO_DEDUP_WINDOW_MS));
        assert_eq!(Queue::from_config(&kept).unwrap().attributes, fifo);
        // Encryption at rest: only the truth, `false`, is taken.
        a.set(&queue, HOME, SSE_ATTRIBUTE, "false").unwrap();
        assert_eq!(
            a.set(&queue, HOME, SSE_ATTRIBUTE, "true").unwrap_err().code,
            "InvalidAttributeValue"
        );
    }

    #[test]
    fn a_redrive_policy_names_a_queue_of_the_namespace_and_region_and_a_receive_count() {
        let queue = QueueName::checked("orders", "source").unwrap();
        let mut a = QueueAttributes::default();
        let policy =
            r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:orders:dlq","maxReceiveCount":"3"}"#;
        a.set(&queue, HOME, "RedrivePolicy", policy).unwrap();
        let redrive = a.redrive.clone().unwrap();
        assert_eq!(
            (redrive.dead_letter.topic(), redrive.max_receive_count),
            ("orders/dlq".into(), 3)
        );
        let listed = a.listed(HOME);
        let (_, json) = listed.iter().find(|(n, _)| *n == "RedrivePolicy").unwrap();
        assert_eq!(
            json,
            r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:orders:dlq","maxReceiveCount":3}"#
        );
        for bad in [
            r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:other:dlq","maxReceiveCount":3}"#,
            r#"{"deadLetterTargetArn":"arn:aws:sqs:eu-west-1:orders:dlq","maxReceiveCount":3}"#,
            r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:orders:dlq","maxReceiveCount":0}"#,
            r#"{"deadLetterTargetArn":"not an arn","maxReceiveCount":3}"#,
            r#"{"maxReceiveCount":3}"#,
            "[1",
        ] {
            assert_eq!(
                a.set(&queue, HOME, "RedrivePolicy", bad).unwrap_err().code,
                "InvalidParameterValue",
                "{bad}"
            );
        }
        a.set(&queue, HOME, "RedrivePolicy", "").unwrap();
        assert_eq!(a.redrive, None);
    }

    #[test]
    fn a_queue_round_trips_through_its_topic_configuration() {
        let mut attributes = QueueAttributes {
            visibility_timeout: 7,
            delay_seconds: 3,
            ..QueueAttributes::default()
        };
        attributes.redrive = Some(Redrive {
            dead_letter: QueueName::checked("orders", "dlq").unwrap(),
            max_receive_count: 4,
        });
        let queue = Queue::new(attributes);
        let config = queue.to_config();
        assert_eq!(config.settings.max_attempts, Some(4));
        assert_eq!(
            config.settings.dead_letter_topic.as_deref(),
            Some("orders/dlq")
        );
        assert_eq!(Queue::from_config(&config), Some(queue));
        assert_eq!(
            Queue::from_config(&TopicConfig::default()),
            None,
            "not a queue"
        );
    }
}
