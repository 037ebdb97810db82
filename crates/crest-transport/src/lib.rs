//! QUIC transport of crest: TLS, endpoints and framed long-lived streams.
//!
//! # Layout
//! - [`tls`]: the cluster CA, node certificates, rustls/quinn crypto configs;
//! - [`stream`]: frame reader and batching writer over quinn streams, the stream pair;
//! - this module: endpoint construction from [`Settings`].

pub mod stream;
pub mod tls;

use crest_core::config::Settings;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// What can go wrong in the transport.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// Certificates, keys or TLS configuration.
    #[error("tls: {0}")]
    Tls(String),
    /// Binding or configuring a UDP endpoint.
    #[error("endpoint: {0}")]
    Endpoint(String),
    /// Establishing a connection.
    #[error("connect to {addr}: {reason}")]
    Connect {
        /// The address dialled.
        addr: String,
        /// Why it failed.
        reason: String,
    },
    /// A stream broke or misbehaved.
    #[error("stream: {0}")]
    Stream(String),
}

/// QUIC transport parameters derived from the settings.
pub fn transport_config(settings: &Settings) -> Arc<quinn::TransportConfig> {
    let mut config = quinn::TransportConfig::default();
    let idle = Duration::from_millis(settings.idle_timeout_ms);
    config.max_idle_timeout(Some(
        idle.try_into().expect("idle timeout within QUIC range"),
    ));
    config.keep_alive_interval(Some(Duration::from_millis(settings.keep_alive_ms)));
    // Two long-lived streams per connection, with windows large enough for batched traffic.
    config.max_concurrent_bidi_streams(4u32.into());
    config.max_concurrent_uni_streams(0u32.into());
    config.stream_receive_window((16u32 * 1024 * 1024).into());
    config.receive_window((32u32 * 1024 * 1024).into());
    config.send_window(32 * 1024 * 1024);
    // Ask peers to acknowledge every 10th packet (or after the usual delay) instead of every
    // other one: at moderate load each message crosses several links in small packets, and
    // pure ACK packets were a large share of the packets and syscalls (`perf`).
    let mut ack_frequency = quinn::AckFrequencyConfig::default();
    ack_frequency.ack_eliciting_threshold(quinn::VarInt::from_u32(10));
    config.ack_frequency_config(Some(ack_frequency));
    Arc::new(config)
}

/// A client configuration that trusts the CA in `ca_pem`.
///
/// # Errors
/// [`TransportError::Tls`] if the CA does not parse.
pub fn client_config(
    ca_pem: &str,
    settings: &Settings,
) -> Result<quinn::ClientConfig, TransportError> {
    let mut config = quinn::ClientConfig::new(Arc::new(tls::client_crypto(ca_pem)?));
    config.transport_config(transport_config(settings));
    Ok(config)
}

/// A server configuration presenting `node`'s certificate.
///
/// # Errors
/// [`TransportError::Tls`] if the certificate or key does not parse.
pub fn server_config(
    node: &tls::CertifiedKey,
    settings: &Settings,
) -> Result<quinn::ServerConfig, TransportError> {
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(tls::server_crypto(node)?));
    config.transport_config(transport_config(settings));
    Ok(config)
}

/// Binds a node's endpoint: it accepts connections on `listen` and dials its parent from the
/// same socket.
///
/// # Errors
/// [`TransportError::Endpoint`] if the address cannot be bound.
pub fn node_endpoint(
    listen: SocketAddr,
    server: quinn::ServerConfig,
    client: quinn::ClientConfig,
) -> Result<quinn::Endpoint, TransportError> {
    let mut endpoint = quinn::Endpoint::server(server, listen)
        .map_err(|e| TransportError::Endpoint(format!("bind {listen}: {e}")))?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}

/// Binds a client-only endpoint on an ephemeral port of the right address family.
///
/// # Errors
/// [`TransportError::Endpoint`] if no socket can be bound.
pub fn client_endpoint(
    for_addr: SocketAddr,
    client: quinn::ClientConfig,
) -> Result<quinn::Endpoint, TransportError> {
    let bind: SocketAddr = if for_addr.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()
    .expect("literal");
    let mut endpoint = quinn::Endpoint::client(bind)
        .map_err(|e| TransportError::Endpoint(format!("bind {bind}: {e}")))?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}

/// Dials `addr` with the endpoint's default client configuration.
///
/// # Errors
/// [`TransportError::Connect`] naming the address.
pub async fn connect(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
) -> Result<quinn::Connection, TransportError> {
    let connect_error = |reason: String| TransportError::Connect {
        addr: addr.to_string(),
        reason,
    };
    let connecting = endpoint
        .connect(addr, tls::SERVER_NAME)
        .map_err(|e| connect_error(e.to_string()))?;
    connecting.await.map_err(|e| connect_error(e.to_string()))
}
