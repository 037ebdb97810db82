//! The consumer: pops deliveries from the root and acknowledges them.
//!
//! Delivery is at-least-once: a delivery is leased to this consumer until its visibility
//! timeout; acknowledge it with its receipt before then, or it is delivered again (and the late
//! acknowledgement is refused as stale).

use crate::link::Link;
use crate::{ClientError, ClientTls};
use crest_core::config::Settings;
use crest_core::id::Receipt;
use crest_core::topology::Topology;
use crest_core::wire::{Ack, Delivery, PeerKind, Pop, ReceiptError, Wire};
use std::time::Duration;

/// Extra time beyond a pop's wait before the consumer gives up on the root.
const ANSWER_MARGIN: Duration = Duration::from_secs(10);

/// How a consumer connects.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// The root's address (`host:port`).
    pub root: String,
    /// Trust.
    pub tls: ClientTls,
    /// Requests in flight at once on the connection.
    pub requests_in_flight_max: usize,
}

impl ConsumerConfig {
    /// Defaults for the given root.
    pub fn new(root: impl Into<String>, tls: ClientTls) -> ConsumerConfig {
        ConsumerConfig {
            root: root.into(),
            tls,
            requests_in_flight_max: 64,
        }
    }

    /// The root of a topology.
    pub fn from_topology(topology: &Topology, tls: ClientTls) -> ConsumerConfig {
        ConsumerConfig::new(topology.root().address.clone(), tls)
    }
}

/// Options of one pop.
#[derive(Clone, Debug)]
pub struct PopOptions {
    /// Most deliveries to return (at least 1).
    pub max: u32,
    /// How long the root may wait for a first message.
    pub wait: Duration,
    /// Visibility timeout of the deliveries (`None`: the root's default).
    pub visibility: Option<Duration>,
}

/// See the module doc.
pub struct Consumer {
    link: Link,
}

impl Consumer {
    /// Connects to the root.
    ///
    /// # Errors
    /// [`ClientError`] if the root cannot be reached or refuses us.
    pub async fn connect(config: ConsumerConfig) -> Result<Consumer, ClientError> {
        let settings = Settings::default();
        let link = Link::connect(
            &config.root,
            PeerKind::Consumer,
            &config.tls.ca_pem,
            &settings,
            config.requests_in_flight_max,
        )
        .await?;
        Ok(Consumer { link })
    }

    /// Pops up to `max` deliveries of `topic`, most urgent first, waiting up to `wait` for
    /// the first one. Returns an empty list if none was ready in time.
    ///
    /// # Errors
    /// [`ClientError::Rejected`] for invalid arguments (named in the message).
    pub async fn pop(
        &self,
        topic: &str,
        max: u32,
        wait: Duration,
    ) -> Result<Vec<Delivery>, ClientError> {
        self.pop_with(
            topic,
            PopOptions {
                max,
                wait,
                visibility: None,
            },
        )
        .await
    }

    /// Pops with all options.
    ///
    /// # Errors
    /// As [`Consumer::pop`].
    pub async fn pop_with(
        &self,
        topic: &str,
        options: PopOptions,
    ) -> Result<Vec<Delivery>, ClientError> {
        let wait_ms = options.wait.as_millis() as u64;
        let lease_ms = options.visibility.map(|v| v.as_millis() as u64);
        let answer = self
            .link
            .request(
                |request| {
                    Wire::Pop(Pop {
                        request,
                        topic: topic.to_string(),
                        max: options.max,
                        wait_ms,
                        lease_ms,
                    })
                },
                options.wait + ANSWER_MARGIN,
            )
            .await?;
        match answer {
            Wire::PopReply(reply) => Ok(reply.deliveries),
            other => Err(ClientError::Protocol(format!(
                "expected PopReply, got {}",
                other.name()
            ))),
        }
    }

    /// Acknowledges one delivery: the message is deleted.
    ///
    /// # Errors
    /// [`ClientError::Receipt`] if the receipt is stale or unknown.
    pub async fn ack(&self, receipt: &Receipt) -> Result<(), ClientError> {
        let results = self.ack_many(std::slice::from_ref(receipt)).await?;
        results
            .into_iter()
            .next()
            .unwrap_or(Err(ReceiptError::Unavailable))
            .map_err(ClientError::Receipt)
    }

    /// Acknowledges many deliveries; one result per receipt, in order.
    ///
    /// # Errors
    /// [`ClientError`] if the request as a whole failed.
    pub async fn ack_many(
        &self,
        receipts: &[Receipt],
    ) -> Result<Vec<Result<(), ReceiptError>>, ClientError> {
        let receipts = receipts.to_vec();
        let answer = self
            .link
            .request(
                |request| Wire::Ack(Ack { request, receipts }),
                ANSWER_MARGIN,
            )
            .await?;
        match answer {
            Wire::AckReply(reply) => Ok(reply.results),
            other => Err(ClientError::Protocol(format!(
                "expected AckReply, got {}",
                other.name()
            ))),
        }
    }

    /// Closes the connection.
    pub fn close(&self) {
        self.link.close();
    }
}
