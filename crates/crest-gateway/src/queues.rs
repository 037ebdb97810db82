//! The queues the gateway knows: each a crest topic with the SQS attributes it was created
//! with. A queue `NAME` of namespace `NS` is topic `NS/NAME` (`NAME` in namespace `default`),
//! and its URL `http://HOST/NS/NAME`.

use crate::error::SqsError;
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
    /// `MaximumMessageSize`: 1,024–262,144 bytes (default 262,144).
    pub maximum_message_size: u32,
}

impl Default for QueueAttributes {
    fn default() -> Self {
        QueueAttributes {
            visibility_timeout: 30,
            delay_seconds: 0,
            retention_seconds: 345_600,
            receive_wait_seconds: 0,
            maximum_message_size: 262_144,
        }
    }
}

impl QueueAttributes {
    /// Sets the attribute `name` from its text, checking its range.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), SqsError> {
        let (field, low, high) = match name {
            "VisibilityTimeout" => (&mut self.visibility_timeout, 0, 43_200),
            "DelaySeconds" => (&mut self.delay_seconds, 0, 900),
            "MessageRetentionPeriod" => (&mut self.retention_seconds, 60, 1_209_600),
            "ReceiveMessageWaitTimeSeconds" => (&mut self.receive_wait_seconds, 0, 20),
            "MaximumMessageSize" => (&mut self.maximum_message_size, 1_024, 262_144),
            "RedrivePolicy"
            | "RedriveAllowPolicy"
            | "FifoQueue"
            | "ContentBasedDeduplication"
            | "KmsMasterKeyId"
            | "KmsDataKeyReusePeriodSeconds"
            | "SqsManagedSseEnabled"
            | "DeduplicationScope"
            | "FifoThroughputLimit"
            | "Policy" => {
                return Err(SqsError::unsupported(&format!("the attribute {name}")));
            }
            _ => return Err(SqsError::bad_attribute(name)),
        };
        let parsed: u32 = value
            .parse()
            .ok()
            .filter(|v| (low..=high).contains(v))
            .ok_or_else(|| {
                SqsError::invalid(format!(
                    "Invalid value for the parameter {name}: {value:?} is not a whole number \
                     from {low} to {high}."
                ))
            })?;
        *field = parsed;
        Ok(())
    }

    /// Every attribute as SQS names it, with its text.
    pub fn listed(&self) -> Vec<(&'static str, String)> {
        vec![
            ("VisibilityTimeout", self.visibility_timeout.to_string()),
            ("DelaySeconds", self.delay_seconds.to_string()),
            ("MessageRetentionPeriod", self.retention_seconds.to_string()),
            (
                "ReceiveMessageWaitTimeSeconds",
                self.receive_wait_seconds.to_string(),
            ),
            ("MaximumMessageSize", self.maximum_message_size.to_string()),
        ]
    }
}

/// One queue.
#[derive(Clone, Debug)]
pub struct Queue {
    /// Its attributes.
    pub attributes: QueueAttributes,
    /// When it was created, in seconds since the Unix epoch.
    pub created: u64,
    /// When its attributes last changed.
    pub modified: u64,
}

/// A queue's place: its namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueName {
    /// The crest namespace.
    pub namespace: String,
    /// The SQS queue name.
    pub name: String,
}

impl QueueName {
    /// Checks a queue name as SQS does: 1–80 of `[A-Za-z0-9_-]` (FIFO queues, `.fifo`, are
    /// not offered).
    pub fn checked(namespace: &str, name: &str) -> Result<QueueName, SqsError> {
        if name.ends_with(".fifo") {
            return Err(SqsError::unsupported("FIFO queues (.fifo)"));
        }
        if !is_name(name) {
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
        })
    }

    /// From a queue URL (`http://HOST/NS/NAME`; any scheme and host).
    pub fn from_url(url: &str) -> Result<QueueName, SqsError> {
        let path = url
            .split_once("://")
            .map_or(url, |(_, rest)| rest.split_once('/').map_or("", |(_, p)| p));
        let mut parts = path.trim_end_matches('/').rsplitn(2, '/');
        let (Some(name), Some(namespace)) = (parts.next(), parts.next()) else {
            return Err(SqsError::no_queue());
        };
        let namespace = namespace.rsplit('/').next().unwrap_or(namespace);
        QueueName::checked(namespace, name).map_err(|_| SqsError::no_queue())
    }

    /// The crest topic.
    pub fn topic(&self) -> String {
        if self.namespace == crest_core::access::DEFAULT_NAMESPACE {
            self.name.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        }
    }

    /// Its URL on `host`.
    pub fn url(&self, host: &str) -> String {
        format!("http://{host}/{}/{}", self.namespace, self.name)
    }
}

/// The queues, bounded.
#[derive(Debug)]
pub struct Queues {
    queues: BTreeMap<QueueName, Queue>,
    max: usize,
}

impl Queues {
    /// No queues yet; at most `max`.
    pub fn new(max: usize) -> Queues {
        Queues {
            queues: BTreeMap::new(),
            max,
        }
    }

    /// Creates a queue, or finds it if it exists with the same attributes.
    pub fn create(&mut self, name: QueueName, attributes: QueueAttributes) -> Result<(), SqsError> {
        if let Some(queue) = self.queues.get(&name) {
            return if queue.attributes == attributes {
                Ok(())
            } else {
                Err(SqsError::queue_exists(&name.name))
            };
        }
        if self.queues.len() >= self.max {
            return Err(SqsError::throttled(format!(
                "the gateway holds its most queues ({}, setting gateway_queues_max)",
                self.max
            )));
        }
        let now = seconds_now();
        self.queues.insert(
            name,
            Queue {
                attributes,
                created: now,
                modified: now,
            },
        );
        Ok(())
    }

    /// The queue of `name`.
    pub fn get(&self, name: &QueueName) -> Result<&Queue, SqsError> {
        self.queues.get(name).ok_or_else(SqsError::no_queue)
    }

    /// Changes a queue's attributes.
    pub fn set(&mut self, name: &QueueName, changes: &[(String, String)]) -> Result<(), SqsError> {
        let queue = self.queues.get_mut(name).ok_or_else(SqsError::no_queue)?;
        let mut attributes = queue.attributes.clone();
        for (key, value) in changes {
            attributes.set(key, value)?;
        }
        queue.attributes = attributes;
        queue.modified = seconds_now();
        Ok(())
    }

    /// Forgets a queue.
    pub fn delete(&mut self, name: &QueueName) -> Result<(), SqsError> {
        self.queues
            .remove(name)
            .map(|_| ())
            .ok_or_else(SqsError::no_queue)
    }

    /// The queues of `namespace` whose name starts with `prefix`, in name order.
    pub fn list(&self, namespace: &str, prefix: &str) -> Vec<QueueName> {
        self.queues
            .keys()
            .filter(|q| q.namespace == namespace && q.name.starts_with(prefix))
            .cloned()
            .collect()
    }
}

fn seconds_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_the_namespace_and_the_queue() {
        let q = QueueName::from_url("http://127.0.0.1:9324/orders/eu-jobs").unwrap();
        assert_eq!(q.namespace, "orders");
        assert_eq!(q.topic(), "orders/eu-jobs");
        assert_eq!(q.url("h:1"), "http://h:1/orders/eu-jobs");
        let d = QueueName::from_url("https://sqs.example/default/jobs").unwrap();
        assert_eq!(d.topic(), "jobs");
        for bad in ["http://h/", "http://h/jobs", "http://h/ns/a b", "nothing"] {
            assert_eq!(QueueName::from_url(bad), Err(SqsError::no_queue()), "{bad}");
        }
        assert!(QueueName::checked("default", "x.fifo").is_err());
        assert!(QueueName::checked("default", &"a".repeat(81)).is_err());
    }

    #[test]
    fn attributes_are_checked_against_sqs_ranges() {
        let mut a = QueueAttributes::default();
        a.set("VisibilityTimeout", "60").unwrap();
        assert_eq!(a.visibility_timeout, 60);
        assert_eq!(
            a.set("DelaySeconds", "901").unwrap_err().code,
            "InvalidParameterValue"
        );
        assert_eq!(a.set("Nope", "1").unwrap_err().code, "InvalidAttributeName");
        assert_eq!(
            a.set("FifoQueue", "true").unwrap_err().code,
            "AWS.SimpleQueueService.UnsupportedOperation"
        );
    }

    #[test]
    fn a_queue_exists_once_and_only_with_the_same_attributes() {
        let mut queues = Queues::new(2);
        let name = QueueName::checked("default", "jobs").unwrap();
        queues
            .create(name.clone(), QueueAttributes::default())
            .unwrap();
        queues
            .create(name.clone(), QueueAttributes::default())
            .unwrap();
        let other = QueueAttributes {
            delay_seconds: 5,
            ..QueueAttributes::default()
        };
        assert_eq!(
            queues.create(name.clone(), other).unwrap_err().code,
            "QueueAlreadyExists"
        );
        queues
            .create(
                QueueName::checked("a", "b").unwrap(),
                QueueAttributes::default(),
            )
            .unwrap();
        let third = QueueName::checked("a", "c").unwrap();
        assert_eq!(
            queues
                .create(third, QueueAttributes::default())
                .unwrap_err()
                .code,
            "RequestThrottled"
        );
        assert_eq!(queues.list("default", "j"), vec![name.clone()]);
        queues.delete(&name).unwrap();
        assert!(queues.get(&name).is_err());
    }
}
