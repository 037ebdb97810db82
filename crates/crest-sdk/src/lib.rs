//! crest client library: [`Producer`] pushes to leaves, [`Consumer`] pops from the root and
//! settles deliveries, [`Admin`] manages dead-letter queues and reads stats.
//!
//! Both speak the crest protocol over QUIC with TLS 1.3, trusting the cluster CA given in
//! [`ClientTls`]. Nothing of the node implementation (actors) appears in this API.
//!
//! ```no_run
//! # async fn demo(ca_pem: String) -> Result<(), crest_sdk::ClientError> {
//! use crest_sdk::{ClientTls, Consumer, ConsumerConfig, Producer, ProducerConfig};
//! use std::time::Duration;
//! let tls = ClientTls { ca_pem };
//! let producer = Producer::connect(ProducerConfig::new(vec!["127.0.0.1:7411".into()], tls.clone())).await?;
//! let id = producer.push("jobs", crest_sdk::tier::HIGH, "hello").await?;
//! let consumer = Consumer::connect(ConsumerConfig::new("127.0.0.1:7400", tls)).await?;
//! for delivery in consumer.pop("jobs", 10, Duration::from_secs(1)).await? {
//!     consumer.ack(&delivery.receipt()).await?;
//! }
//! # let _ = id; Ok(()) }
//! ```

mod admin;
mod consumer;
mod link;
mod producer;

pub use admin::{Admin, AdminAnswer};
pub use consumer::{Consumer, ConsumerConfig, Heartbeat, PopOptions};
pub use crest_core::id::{LeafId, MessageId, Receipt};
pub use crest_core::key::tier;
pub use crest_core::time::Time;
pub use crest_core::wire::{
    DeadLetter, Delivery, ErrorCode, ReceiptError, Settle, Stats, TopicStats,
};
pub use producer::{BatchHandle, Message, Producer, ProducerConfig, PushHandle};

/// What a client trusts: the cluster CA.
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// The cluster CA certificate (PEM).
    pub ca_pem: String,
}

impl ClientTls {
    /// Reads the CA certificate from a PEM file.
    ///
    /// # Errors
    /// [`ClientError::Connect`] naming the file.
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<ClientTls, ClientError> {
        let path = path.as_ref();
        std::fs::read_to_string(path)
            .map(|ca_pem| ClientTls { ca_pem })
            .map_err(|e| {
                ClientError::Connect(format!("reading CA certificate {}: {e}", path.display()))
            })
    }
}

/// Everything a client call can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// Could not reach or set up a connection.
    #[error("connect: {0}")]
    Connect(String),
    /// The connection ended; requests in flight may or may not have been applied.
    #[error("disconnected: {0}")]
    Disconnected(String),
    /// The node refused the request; the code is stable, the message names the problem.
    #[error("rejected ({code}): {message}")]
    Rejected {
        /// Stable error code.
        code: ErrorCode,
        /// Details.
        message: String,
    },
    /// A receipt operation was refused.
    #[error(transparent)]
    Receipt(#[from] ReceiptError),
    /// An argument was refused before sending.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No answer in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The node broke the protocol.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The client is shut down.
    #[error("client closed")]
    Closed,
}

impl From<crest_transport::TransportError> for ClientError {
    fn from(error: crest_transport::TransportError) -> Self {
        match error {
            crest_transport::TransportError::Stream(reason) => ClientError::Disconnected(reason),
            other => ClientError::Connect(other.to_string()),
        }
    }
}
