//! crest client library: [`Producer`] pushes to leaves, [`Consumer`] pops from the root and
//! settles deliveries, [`Admin`] manages dead-letter queues and reads stats.
//!
//! Both speak the crest protocol over QUIC with TLS 1.3, trusting the cluster CA given in
//! [`ClientTls`], and prove a principal with its [`Credential`] (an API token or a client
//! certificate) to trees with access control. Nothing of the node implementation (actors) appears in this API.
//!
//! ```no_run
//! # async fn demo(ca_pem: String, token: String) -> Result<(), crest_sdk::ClientError> {
//! use crest_sdk::{ClientTls, Consumer, ConsumerConfig, Producer, ProducerConfig};
//! use std::time::Duration;
//! let tls = ClientTls::new(ca_pem).with_token(token); // `crest token create`, or `crest local`'s

//! let producer = Producer::connect(ProducerConfig::new(vec!["leaf-1@127.0.0.1:7411".into()], tls.clone())).await?;
//! let id = producer.push("jobs", crest_sdk::tier::HIGH, "hello").await?;
//! let consumer = Consumer::connect(ConsumerConfig::new("root@127.0.0.1:7400", tls)).await?;
//! for delivery in consumer.pop("jobs", 10, Duration::from_secs(1)).await? {
//!     consumer.ack(&delivery.receipt()).await?;
//! }
//! # let _ = id; Ok(()) }
//! ```

mod admin;
mod consumer;
mod link;
mod owners;
mod producer;

pub use admin::{Admin, AdminAnswer, PURGE_ROUNDS_MAX};
pub use consumer::{Consumer, ConsumerConfig, Heartbeat, PopOptions};
pub use crest_core::access::{DEFAULT_NAMESPACE, Permission, namespace};
pub use crest_core::config::{KeyWeights, Scheduling, TopicSettings, Weights};
pub use crest_core::id::{LeafId, MessageId, Receipt};
pub use crest_core::key::tier;
pub use crest_core::quota::{Limits, Quota, QuotaExceeded, Rate, Refused, ScopeStats};
pub use crest_core::time::Time;
pub use crest_core::wire::{
    DeadLetter, Delivery, ErrorCode, Escalation, NotWaiting, ReceiptError, Settle, Stats,
    TopicConfig, TopicStats,
};
pub use owners::LeafAddresses;
pub use producer::{BatchHandle, Message, Producer, ProducerConfig, PushHandle};

/// What a client trusts, the cluster CA, and how it proves who it is.
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// The cluster CA certificate (PEM).
    pub ca_pem: String,
    /// The client's credential, for trees with access control.
    pub credential: Credential,
}

/// How a client proves its principal to a tree with access control (`crest token create`,
/// `crest certs --client NAME`).
#[derive(Clone, Default)]
pub enum Credential {
    /// None: accepted only by trees without access control.
    #[default]
    None,
    /// An API token (`crest_ID_SECRET`).
    Token(String),
    /// A client certificate and its key (PEM).
    Certificate {
        /// The certificate (PEM).
        cert_pem: String,
        /// Its private key (PEM).
        key_pem: String,
    },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::None => f.write_str("None"),
            Credential::Token(_) => f.write_str("Token(..)"),
            Credential::Certificate { .. } => f.write_str("Certificate { .. }"),
        }
    }
}

impl Credential {
    /// Reads a credentials file: an API token (its first line), or PEM holding a client
    /// certificate and its private key.
    ///
    /// # Errors
    /// [`ClientError::Connect`] naming the file and what is wrong with it.
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Credential, ClientError> {
        let path = path.as_ref();
        let error = |what: String| {
            ClientError::Connect(format!("reading credentials {}: {what}", path.display()))
        };
        let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
        if text.contains("-----BEGIN") {
            let blocks = |label: &str| {
                text.split_inclusive("-----END")
                    .filter(|block| block.contains(&format!("BEGIN {label}")))
                    .count()
            };
            if blocks("CERTIFICATE") == 0 || !text.contains("PRIVATE KEY-----") {
                return Err(error(
                    "PEM credentials need a CERTIFICATE and a PRIVATE KEY block".into(),
                ));
            }
            return Ok(Credential::Certificate {
                cert_pem: text.clone(),
                key_pem: text,
            });
        }
        match text.lines().next().map(str::trim) {
            Some(token) if !token.is_empty() => Ok(Credential::Token(token.to_string())),
            _ => Err(error("empty: expected a token or PEM".into())),
        }
    }
}

impl ClientTls {
    /// Trusts `ca_pem`, with no credential.
    pub fn new(ca_pem: impl Into<String>) -> ClientTls {
        ClientTls {
            ca_pem: ca_pem.into(),
            credential: Credential::None,
        }
    }

    /// Presents the API token `token`.
    pub fn with_token(mut self, token: impl Into<String>) -> ClientTls {
        self.credential = Credential::Token(token.into());
        self
    }

    /// Presents `credential`.
    pub fn with_credential(mut self, credential: Credential) -> ClientTls {
        self.credential = credential;
        self
    }

    /// Reads the CA certificate from a PEM file.
    ///
    /// # Errors
    /// [`ClientError::Connect`] naming the file.
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<ClientTls, ClientError> {
        let path = path.as_ref();
        std::fs::read_to_string(path)
            .map(ClientTls::new)
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
    /// A push would pass a quota of its namespace or topic; nothing of its batch was
    /// accepted.
    #[error("quota exceeded: {0}")]
    QuotaExceeded(QuotaExceeded),
    /// The node refused the request for now: it may succeed if sent again after `after`
    /// (a producer does so by itself, up to [`ProducerConfig::refused_wait_max`]).
    #[error("rejected ({code}), retry after {after:?}: {message}")]
    RetryLater {
        /// Stable error code.
        code: ErrorCode,
        /// Details.
        message: String,
        /// When to try again.
        after: std::time::Duration,
    },
    /// A receipt operation was refused.
    #[error(transparent)]
    Receipt(#[from] ReceiptError),
    /// A reprioritize found the message not waiting ([`crate::Admin::reprioritize`]).
    #[error(transparent)]
    NotWaiting(#[from] crest_core::wire::NotWaiting),
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
            refused @ crest_transport::TransportError::Refused { .. } => ClientError::Rejected {
                code: crest_core::wire::ErrorCode::Overloaded,
                message: refused.to_string(),
            },
            other => ClientError::Connect(other.to_string()),
        }
    }
}
