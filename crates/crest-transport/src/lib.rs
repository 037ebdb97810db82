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
    /// The node refused the connection before its handshake: too many handshakes were under
    /// way there, or it is closing. Retrying later may succeed.
    #[error(
        "connect to {addr}: the node refused the connection (too many handshakes under way there, or it is closing); retry"
    )]
    Refused {
        /// The address dialled.
        addr: String,
    },
}

/// QUIC transport parameters derived from the settings, for client connections (and a
/// node's side of the connections it accepts: QUIC ends a connection at the shorter of the
/// two sides' idle timeouts, so a child's link gets the child's `link_idle_timeout_ms`).
pub fn transport_config(settings: &Settings) -> Arc<quinn::TransportConfig> {
    transport_config_with(settings, settings.idle_timeout_ms, settings.keep_alive_ms)
}

/// The same for the links of the tree a node dials: to its parent, and the root's to leaves.
pub fn link_transport_config(settings: &Settings) -> Arc<quinn::TransportConfig> {
    transport_config_with(
        settings,
        settings.link_idle_timeout_ms,
        settings.link_keep_alive_ms,
    )
}

fn transport_config_with(
    settings: &Settings,
    idle_ms: u64,
    keep_alive_ms: u64,
) -> Arc<quinn::TransportConfig> {
    let mut config = quinn::TransportConfig::default();
    let idle = Duration::from_millis(idle_ms);
    config.max_idle_timeout(Some(
        idle.try_into().expect("idle timeout within QUIC range"),
    ));
    config.keep_alive_interval(Some(Duration::from_millis(keep_alive_ms)));
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
    // Cubic grows its window only while the window is what limits sending; crest's links carry
    // bursts (a batch of pushes, a pop's grants) between idle gaps, so their windows stayed near
    // the 12 KB start and every burst waited for round trips of ACKs (docs/performance-history.md).
    let mut cubic = quinn::congestion::CubicConfig::default();
    cubic.initial_window(settings.quic_initial_window_bytes);
    config.congestion_controller_factory(Arc::new(cubic));
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(settings.udp_payload_max);
    config.mtu_discovery_config(Some(mtu));
    Arc::new(config)
}

/// A producer's or consumer's configuration: it trusts the CA in `ca_pem` and takes any node
/// of the cluster ([`tls::Verify::AnyNode`]).
///
/// # Errors
/// [`TransportError::Tls`] if the CA does not parse.
pub fn client_config(
    ca_pem: &str,
    settings: &Settings,
) -> Result<quinn::ClientConfig, TransportError> {
    client_config_as(ca_pem, None, settings)
}

/// As [`client_config`], presenting `identity` (a client certificate) if one is given.
///
/// # Errors
/// [`TransportError::Tls`] if the CA or the certificate does not parse.
pub fn client_config_as(
    ca_pem: &str,
    identity: Option<&tls::CertifiedKey>,
    settings: &Settings,
) -> Result<quinn::ClientConfig, TransportError> {
    client_config_verifying(ca_pem, identity, settings, tls::Verify::AnyNode)
}

/// As [`client_config_as`], checking the node at the other end as `verify` says: with
/// [`tls::Verify::Named`], only the node whose name the connection asks for.
///
/// # Errors
/// [`TransportError::Tls`] if the CA or the certificate does not parse.
pub fn client_config_verifying(
    ca_pem: &str,
    identity: Option<&tls::CertifiedKey>,
    settings: &Settings,
    verify: tls::Verify,
) -> Result<quinn::ClientConfig, TransportError> {
    let crypto = tls::client_crypto(ca_pem, verify, identity)?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(transport_config(settings));
    Ok(config)
}

/// A node's configuration for the links it dials (its parent, the root's direct links to
/// leaves): it presents `node`'s certificate, takes only the node whose name it dials
/// ([`tls::Verify::Named`]), with the links' keep-alive and idle timeout.
///
/// # Errors
/// [`TransportError::Tls`] if the CA or the node's certificate does not parse.
pub fn link_client_config(
    ca_pem: &str,
    node: &tls::CertifiedKey,
    settings: &Settings,
) -> Result<quinn::ClientConfig, TransportError> {
    let crypto = tls::client_crypto(ca_pem, tls::Verify::Named, Some(node))?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(link_transport_config(settings));
    Ok(config)
}

/// A server configuration presenting `node`'s certificate and checking its peers' against
/// the CA in `ca_pem`.
///
/// # Errors
/// [`TransportError::Tls`] if the certificate, key or CA does not parse.
pub fn server_config(
    node: &tls::CertifiedKey,
    ca_pem: &str,
    settings: &Settings,
) -> Result<quinn::ServerConfig, TransportError> {
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(tls::server_crypto(node, ca_pem)?));
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
    node: &NodeEndpointConfig,
    settings: &Settings,
) -> Result<quinn::Endpoint, TransportError> {
    let socket = udp_socket(listen, settings.udp_buffer_bytes).map_err(bind_error(listen))?;
    endpoint_from(socket, listen, Some(node), None, settings)
}

/// What a node's endpoint is made of: its server and client configurations and what its
/// stateless resets are made with.
#[derive(Clone)]
pub struct NodeEndpointConfig {
    /// Accepting connections.
    pub server: quinn::ServerConfig,
    /// Dialing its links.
    pub client: quinn::ClientConfig,
    /// The same across restarts lets a restarted node end its predecessor's connections at
    /// their peers' first packet.
    pub reset: tls::StatelessReset,
}

/// Binds a client-only endpoint on an ephemeral port of the right address family.
///
/// # Errors
/// [`TransportError::Endpoint`] if no socket can be bound.
pub fn client_endpoint(
    for_addr: SocketAddr,
    client: quinn::ClientConfig,
    settings: &Settings,
) -> Result<quinn::Endpoint, TransportError> {
    let bind: SocketAddr = if for_addr.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()
    .expect("literal");
    let socket = udp_socket(bind, settings.udp_buffer_bytes).map_err(bind_error(bind))?;
    endpoint_from(socket, bind, None, Some(client), settings)
}

/// As [`node_endpoint`], on a socket the caller bound and held (a test that chose its ports
/// by binding them hands them over, so no other process can take them in between).
///
/// # Errors
/// [`TransportError::Endpoint`] if the socket cannot serve as an endpoint.
pub fn node_endpoint_on(
    socket: std::net::UdpSocket,
    node: &NodeEndpointConfig,
    settings: &Settings,
) -> Result<quinn::Endpoint, TransportError> {
    let addr = socket
        .local_addr()
        .map_err(|e| TransportError::Endpoint(format!("a held socket: {e}")))?;
    set_buffers(&socket2::SockRef::from(&socket), settings.udp_buffer_bytes);
    endpoint_from(socket, addr, Some(node), None, settings)
}

/// What a failure to make an endpoint on `addr` says.
fn bind_error(addr: SocketAddr) -> impl Fn(std::io::Error) -> TransportError {
    move |e| TransportError::Endpoint(format!("bind {addr}: {e}"))
}

/// A node's endpoint (`node`) or a client's (`client`).
fn endpoint_from(
    socket: std::net::UdpSocket,
    addr: SocketAddr,
    node: Option<&NodeEndpointConfig>,
    client: Option<quinn::ClientConfig>,
    settings: &Settings,
) -> Result<quinn::Endpoint, TransportError> {
    let error = bind_error(addr);
    let mut endpoint_config = match node {
        Some(node) => {
            let mut config = quinn::EndpointConfig::new(node.reset.key.clone());
            let cid_key = node.reset.cid_key;
            config.cid_generator(move || {
                Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
            });
            config
        }
        None => quinn::EndpointConfig::default(),
    };
    endpoint_config
        .max_udp_payload_size(settings.udp_payload_max)
        .map_err(|e| TransportError::Endpoint(format!("udp_payload_max: {e}")))?;
    let mut endpoint = quinn::Endpoint::new(
        endpoint_config,
        node.map(|node| node.server.clone()),
        socket,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(error)?;
    if let Some(client) = node.map(|node| node.client.clone()).or(client) {
        endpoint.set_default_client_config(client);
    }
    Ok(endpoint)
}

/// A UDP socket bound to `addr`, with kernel buffers of `buffer_bytes` asked for.
///
/// The default buffers (~208 KiB on Linux) overflow under batched traffic between nodes on one
/// host: the kernel drops datagrams, and every loss halves a link's congestion window. The
/// kernel caps the request at `net.core.rmem_max` / `wmem_max`; a smaller grant is logged (info),
/// not an error.
fn udp_socket(addr: SocketAddr, buffer_bytes: u32) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        if let Err(error) = socket.set_only_v6(false) {
            tracing::debug!(%error, "could not make the socket dual-stack");
        }
    }
    set_buffers(&socket, buffer_bytes);
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Asks the kernel for receive and send buffers of `buffer_bytes` (0: the system's).
fn set_buffers(socket: &socket2::Socket, buffer_bytes: u32) {
    if buffer_bytes == 0 {
        return;
    }
    let want = buffer_bytes as usize;
    // Refusals are not fatal: the socket works with the system's buffers.
    let _ = socket.set_recv_buffer_size(want);
    let _ = socket.set_send_buffer_size(want);
    // Linux reports twice the size it grants (the doubling covers its bookkeeping).
    let granted = socket.recv_buffer_size().unwrap_or(0) / 2;
    if granted < want {
        tracing::info!(
            want,
            granted,
            "UDP receive buffer smaller than asked (raise net.core.rmem_max for more)"
        );
    }
}

/// Dials `addr` with `config`, asking for the node named `server_name` (see [`connect`]).
///
/// # Errors
/// [`TransportError::Connect`] naming the address.
pub async fn connect_with(
    endpoint: &quinn::Endpoint,
    config: quinn::ClientConfig,
    addr: SocketAddr,
    server_name: &str,
) -> Result<quinn::Connection, TransportError> {
    finish(endpoint.connect_with(config, addr, server_name), addr).await
}

/// Dials `addr` with the endpoint's default client configuration, asking for the node named
/// `server_name` (a tree link checks it; producers and consumers ask for
/// [`tls::SERVER_NAME`] and take any node).
///
/// # Errors
/// [`TransportError::Connect`] naming the address.
pub async fn connect(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
    server_name: &str,
) -> Result<quinn::Connection, TransportError> {
    finish(endpoint.connect(addr, server_name), addr).await
}

/// Completes a dial, naming `addr` in its error.
async fn finish(
    connecting: Result<quinn::Connecting, quinn::ConnectError>,
    addr: SocketAddr,
) -> Result<quinn::Connection, TransportError> {
    let connect_error = |reason: String| TransportError::Connect {
        addr: addr.to_string(),
        reason,
    };
    connecting
        .map_err(|e| connect_error(e.to_string()))?
        .await
        .map_err(|e| match e {
            quinn::ConnectionError::ConnectionClosed(close)
                if close.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED =>
            {
                TransportError::Refused {
                    addr: addr.to_string(),
                }
            }
            other => connect_error(other.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's cap on a socket buffer request, where it publishes one.
    fn kernel_cap(name: &str) -> Option<usize> {
        std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    #[test]
    fn sockets_get_the_buffers_asked_for_up_to_the_kernel_cap() {
        let want = 1024 * 1024;
        let socket = udp_socket("127.0.0.1:0".parse().unwrap(), want as u32).unwrap();
        let socket = socket2::Socket::from(socket);
        let default = udp_socket("127.0.0.1:0".parse().unwrap(), 0).unwrap();
        let default = socket2::Socket::from(default).recv_buffer_size().unwrap();
        if let Some(cap) = kernel_cap("rmem_max") {
            // Linux reports double what it grants.
            let granted = socket.recv_buffer_size().unwrap() / 2;
            assert!(
                granted >= want.min(cap),
                "receive buffer {granted} < min({want}, {cap})"
            );
            if want.min(cap) * 2 > default {
                assert!(socket.recv_buffer_size().unwrap() > default);
            }
        }
        if let Some(cap) = kernel_cap("wmem_max") {
            let granted = socket.send_buffer_size().unwrap() / 2;
            assert!(
                granted >= want.min(cap),
                "send buffer {granted} < min({want}, {cap})"
            );
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);

    /// A node endpoint on loopback presenting `node`'s certificate, trusting `ca`.
    fn serving(
        ca: &tls::CertificateAuthority,
        node: &tls::CertifiedKey,
        settings: &Settings,
    ) -> quinn::Endpoint {
        let config = NodeEndpointConfig {
            server: server_config(node, ca.cert_pem(), settings).unwrap(),
            client: link_client_config(ca.cert_pem(), node, settings).unwrap(),
            reset: tls::StatelessReset::for_node(node),
        };
        node_endpoint("127.0.0.1:0".parse().unwrap(), &config, settings).unwrap()
    }

    /// A loopback connection with `settings` on both ends, and the server's end.
    async fn loopback_pair(settings: &Settings) -> (quinn::Connection, quinn::Connection) {
        let ca = tls::CertificateAuthority::generate().unwrap();
        let node = ca.issue("server", &[], HOUR).unwrap();
        let server = serving(&ca, &node, settings);
        let addr = server.local_addr().unwrap();
        let client = client_config(ca.cert_pem(), settings).unwrap();
        let dialer = client_endpoint(addr, client, settings).unwrap();
        let accepted = tokio::spawn(async move { server.accept().await.unwrap().await.unwrap() });
        let connection = connect(&dialer, addr, tls::SERVER_NAME).await.unwrap();
        (connection, accepted.await.unwrap())
    }

    /// Dials `server` as a tree link presenting `identity`, asking for `name`; returns the
    /// dialer's result and, when the handshake passed, the server's end.
    async fn dial_link(
        server: &quinn::Endpoint,
        ca_pem: &str,
        identity: &tls::CertifiedKey,
        name: &str,
    ) -> (
        Result<quinn::Connection, TransportError>,
        Option<quinn::Connection>,
    ) {
        let settings = Settings::default();
        let addr = server.local_addr().unwrap();
        let client = link_client_config(ca_pem, identity, &settings).unwrap();
        let dialer = client_endpoint(addr, client, &settings).unwrap();
        let accepting = server.clone();
        let accepted = tokio::spawn(async move {
            let incoming = accepting.accept().await?;
            incoming.await.ok()
        });
        let dialed = connect(&dialer, addr, name).await;
        let accepted = tokio::time::timeout(Duration::from_secs(10), accepted)
            .await
            .ok()
            .and_then(Result::ok)
            .flatten();
        (dialed, accepted)
    }

    #[tokio::test]
    async fn a_link_takes_only_the_node_it_dials_and_each_end_knows_the_other_s_name() {
        let ca = tls::CertificateAuthority::generate().unwrap();
        let settings = Settings::default();
        let parent = ca.issue("agg-1", &[], HOUR).unwrap();
        let server = serving(&ca, &parent, &settings);
        let child = ca.issue("leaf-1", &[], HOUR).unwrap();

        let (dialed, accepted) = dial_link(&server, ca.cert_pem(), &child, "agg-1").await;
        dialed.expect("the parent's certificate is made out to agg-1");
        let accepted = accepted.expect("accepted");
        assert_eq!(tls::peer_is(&accepted, "leaf-1"), Ok(()));
        let error = tls::peer_is(&accepted, "leaf-2").unwrap_err();
        assert!(error.contains("not made out to \"leaf-2\""), "{error}");

        // Another node's certificate does not pass for agg-2.
        let (dialed, _) = dial_link(&server, ca.cert_pem(), &child, "agg-2").await;
        let error = dialed.unwrap_err().to_string();
        assert!(
            error.contains("agg-2") || error.contains("NotValidForName"),
            "{error}"
        );

        // A producer or consumer presents no certificate: it can be no node.
        let client = client_config(ca.cert_pem(), &settings).unwrap();
        let addr = server.local_addr().unwrap();
        let dialer = client_endpoint(addr, client, &settings).unwrap();
        let accepting = server.clone();
        let accepted = tokio::spawn(async move { accepting.accept().await.unwrap().await });
        connect(&dialer, addr, tls::SERVER_NAME)
            .await
            .expect("a client takes any node of the cluster");
        let accepted = accepted.await.unwrap().unwrap();
        let error = tls::peer_is(&accepted, "leaf-1").unwrap_err();
        assert!(error.contains("no certificate"), "{error}");
    }

    #[tokio::test]
    async fn certificates_of_another_ca_or_out_of_date_are_refused() {
        let ca = tls::CertificateAuthority::generate().unwrap();
        let settings = Settings::default();
        let parent = ca.issue("agg-1", &[], HOUR).unwrap();
        let server = serving(&ca, &parent, &settings);

        // A child whose certificate another CA signed: the parent refuses it.
        let stranger = tls::CertificateAuthority::generate()
            .unwrap()
            .issue("leaf-1", &[], HOUR)
            .unwrap();
        let (dialed, accepted) = dial_link(&server, ca.cert_pem(), &stranger, "agg-1").await;
        assert!(accepted.is_none(), "a stranger's certificate is refused");
        if let Ok(connection) = dialed {
            // TLS 1.3: the dialer may finish before the server checks its certificate; the
            // server's refusal then ends the connection.
            let reason = tokio::time::timeout(Duration::from_secs(10), connection.closed())
                .await
                .expect("the refused connection ends");
            assert!(
                matches!(reason, quinn::ConnectionError::ConnectionClosed(_)),
                "{reason:?}"
            );
        }

        // A node whose certificate has expired: neither a link nor a client takes it.
        let now = std::time::SystemTime::now();
        let expired = ca
            .issue_between("agg-2", &[], now - 2 * HOUR, now - HOUR)
            .unwrap();
        let stale = serving(&ca, &expired, &settings);
        let child = ca.issue("leaf-1", &[], HOUR).unwrap();
        let (dialed, _) = dial_link(&stale, ca.cert_pem(), &child, "agg-2").await;
        let error = dialed.unwrap_err().to_string();
        assert!(error.contains("certificate expired"), "{error}");
        let client = client_config(ca.cert_pem(), &settings).unwrap();
        let addr = stale.local_addr().unwrap();
        let dialer = client_endpoint(addr, client, &settings).unwrap();
        tokio::spawn(async move { stale.accept().await.unwrap().await });
        let error = connect(&dialer, addr, tls::SERVER_NAME)
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("certificate expired"), "{error}");
    }

    #[tokio::test]
    async fn links_start_with_the_configured_window_and_find_larger_packets_on_loopback() {
        let settings = Settings::default();
        let (connection, accepted) = loopback_pair(&settings).await;
        assert!(
            connection.stats().path.cwnd >= settings.quic_initial_window_bytes,
            "cwnd {} below quic_initial_window_bytes {}",
            connection.stats().path.cwnd,
            settings.quic_initial_window_bytes
        );
        // A transfer lets MTU discovery probe; loopback carries 64 KiB datagrams, so the path
        // settles above Ethernet's 1452 and never above the bound.
        let reader = tokio::spawn(async move {
            let (_, mut recv) = accepted.accept_bi().await.unwrap();
            let bytes = recv.read_to_end(64 << 20).await.unwrap();
            (accepted, bytes.len())
        });
        let (mut send, _recv) = connection.open_bi().await.unwrap();
        let chunk = vec![7u8; 64 * 1024];
        let mut sent = 0;
        // Traffic on the path until discovery raises its MTU past Ethernet's.
        crest_testkit::eventually(Duration::from_secs(20), "a larger path MTU", async || {
            send.write_all(&chunk).await.unwrap();
            sent += chunk.len();
            connection.stats().path.current_mtu > 1452
        })
        .await;
        send.finish().unwrap();
        let (accepted, received) = reader.await.unwrap();
        assert_eq!(received, sent, "every byte arrives");
        let mtu = connection.stats().path.current_mtu;
        assert!(
            mtu > 1452 && mtu <= settings.udp_payload_max,
            "path MTU {mtu} not in 1453..={}",
            settings.udp_payload_max
        );
        assert_eq!(connection.stats().path.lost_packets, 0, "no sends failed");
        drop(accepted);
    }

    #[tokio::test]
    async fn a_low_bound_keeps_packets_at_ethernet_size() {
        let settings = Settings {
            udp_payload_max: 1452,
            ..Settings::default()
        };
        let (connection, accepted) = loopback_pair(&settings).await;
        let reader = tokio::spawn(async move {
            let (_, mut recv) = accepted.accept_bi().await.unwrap();
            recv.read_to_end(64 << 20).await.unwrap().len()
        });
        let (mut send, _recv) = connection.open_bi().await.unwrap();
        for _ in 0..32 {
            send.write_all(&[1u8; 64 * 1024]).await.unwrap();
        }
        send.finish().unwrap();
        assert_eq!(reader.await.unwrap(), 32 * 64 * 1024);
        assert!(connection.stats().path.current_mtu <= 1452);
    }

    /// A node "killed" (its runtime dropped: no close is sent) and started again on the same
    /// socket: `key_of` picks the certificate whose reset key the new one uses. Returns why
    /// the client's connection to the old one ended.
    async fn restart_under(
        key_of: impl FnOnce(tls::CertifiedKey) -> tls::CertifiedKey,
    ) -> quinn::ConnectionError {
        let settings = Settings::default();
        let ca = tls::CertificateAuthority::generate().unwrap();
        let node = ca.issue("node", &[], HOUR).unwrap();
        let config_for = |key: &tls::CertifiedKey| NodeEndpointConfig {
            server: server_config(key, ca.cert_pem(), &settings).unwrap(),
            client: link_client_config(ca.cert_pem(), key, &settings).unwrap(),
            reset: tls::StatelessReset::for_node(key),
        };
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let old = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let endpoint = {
            let _runtime = old.enter();
            node_endpoint_on(socket.try_clone().unwrap(), &config_for(&node), &settings).unwrap()
        };
        let (accepted, is_accepted) = tokio::sync::oneshot::channel();
        old.spawn(async move {
            let connection = endpoint.accept().await.unwrap().await.unwrap();
            let _ = accepted.send(());
            // Held until the runtime goes: no close frame is ever sent.
            std::future::pending::<()>().await;
            drop(connection);
        });
        // The client dials with the link settings: keep-alives every `link_keep_alive_ms`.
        let child = ca.issue("child", &[], HOUR).unwrap();
        let dialer = client_endpoint(
            addr,
            link_client_config(ca.cert_pem(), &child, &settings).unwrap(),
            &settings,
        )
        .unwrap();
        let connection = connect(&dialer, addr, "node").await.unwrap();
        is_accepted.await.unwrap();
        old.shutdown_background();
        let restarted = node_endpoint_on(socket, &config_for(&key_of(node)), &settings).unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(30), connection.closed())
            .await
            .expect("the connection ends");
        drop(restarted);
        reason
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_restarted_with_its_key_resets_its_predecessors_connections() {
        let reason = restart_under(|same| same).await;
        assert!(
            matches!(reason, quinn::ConnectionError::Reset),
            "a stateless reset, not {reason:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_restarted_with_another_key_leaves_them_to_the_idle_timeout() {
        let other = tls::CertificateAuthority::generate()
            .unwrap()
            .issue("node", &[], HOUR)
            .unwrap();
        let reason = restart_under(|_| other).await;
        assert!(
            matches!(reason, quinn::ConnectionError::TimedOut),
            "the reset is not recognised: {reason:?}"
        );
    }
}
