//! One client connection: handshake, request numbering, and the task that routes answers.
//!
//! Requests go out on the data stream; every answer names its request, so many requests can be
//! in flight on one connection at once (at most `requests_in_flight_max`). When the connection
//! ends, every waiting request fails with [`ClientError::Disconnected`].

use crate::ClientError;
use crate::{ClientTls, Credential};
use bytes::Bytes;
use crest_core::config::Settings;
use crest_core::frame::encode_frame;
use crest_core::wire::{ErrorReply, Hello, PROTOCOL_VERSION, PeerKind, Secret, Welcome, Wire};
use crest_transport::stream::{FrameReader, Outgoing, ReadEvent, open_streams, spawn_writer};
use crest_transport::tls::Verify;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, oneshot};

type Waiters = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<Wire>>>>>;

/// See the module doc.
pub(crate) struct Link {
    data: mpsc::Sender<Outgoing>,
    /// Largest frame written (frames a request encodes itself are held to it too).
    frame_bytes_max: u32,
    waiters: Waiters,
    next_request: AtomicU64,
    in_flight: Arc<Semaphore>,
    connection: quinn::Connection,
    welcome: Welcome,
    _endpoint: quinn::Endpoint,
}

/// The refusal a node closed `connection` with (`CODE: text`, as nodes close refused peers),
/// if that is how it ended.
fn refusal(connection: &quinn::Connection) -> Option<ClientError> {
    let close = match connection.close_reason()? {
        quinn::ConnectionError::ApplicationClosed(close) => close,
        // TLS 1.3 lets a client finish its handshake before the server checks the client's
        // certificate: a refused certificate shows as a TLS alert after the connect.
        quinn::ConnectionError::ConnectionClosed(close)
            if (0x100..0x200).contains(&u64::from(close.error_code)) =>
        {
            return Some(ClientError::Connect(format!(
                "the node refused the TLS handshake (a client certificate of another CA, or expired?): {close}"
            )));
        }
        _ => return None,
    };
    let text = std::str::from_utf8(&close.reason).ok()?;
    let (code, message) = text.split_once(": ")?;
    Some(ClientError::Rejected {
        code: code.parse().ok()?,
        message: message.to_string(),
    })
}

/// The error a refusal stands for.
fn refused(error: ErrorReply) -> ClientError {
    match error {
        ErrorReply {
            code: crest_core::wire::ErrorCode::QuotaExceeded,
            quota: Some(quota),
            ..
        } => ClientError::QuotaExceeded(*quota),
        ErrorReply {
            code,
            message,
            retry_after_ms: Some(ms),
            ..
        } => ClientError::RetryLater {
            code,
            message,
            after: Duration::from_millis(ms),
        },
        ErrorReply { code, message, .. } => ClientError::Rejected { code, message },
    }
}

/// The settings of a client's connection that is given up after `idle` without traffic,
/// with keep-alives every fifth of it (as the tree's own links), so a peer whose host
/// vanished is noticed within `idle`.
pub(crate) fn settings_idle_after(idle: Duration) -> crest_core::config::Settings {
    let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX).max(5);
    crest_core::config::Settings {
        idle_timeout_ms: idle_ms,
        keep_alive_ms: idle_ms / 5,
        ..crest_core::config::Settings::default()
    }
}

impl Link {
    /// Connects to `address`, says who we are, and waits for the node's `Welcome`.
    pub(crate) async fn connect(
        address: &str,
        peer: PeerKind,
        tls: &ClientTls,
        settings: &Settings,
        requests_in_flight_max: usize,
    ) -> Result<Link, ClientError> {
        let limit = Duration::from_millis(settings.connect_timeout_ms);
        let connect = Link::connect_now(address, peer, tls, settings, requests_in_flight_max);
        tokio::time::timeout(limit, connect).await.map_err(|_| {
            ClientError::Connect(format!(
                "{address}: no answer within {} ms (connect_timeout_ms)",
                settings.connect_timeout_ms
            ))
        })?
    }

    async fn connect_now(
        address: &str,
        peer: PeerKind,
        tls: &ClientTls,
        settings: &Settings,
        requests_in_flight_max: usize,
    ) -> Result<Link, ClientError> {
        let (node, host) = named(address);
        let addr = resolve(host).await?;
        let (identity, token) = match &tls.credential {
            Credential::None => (None, None),
            Credential::Token(token) => (None, Some(Secret(token.clone()))),
            Credential::Certificate { cert_pem, key_pem } => (
                Some(crest_transport::tls::CertifiedKey {
                    cert_pem: cert_pem.clone(),
                    key_pem: key_pem.clone(),
                }),
                None,
            ),
        };
        // A named node must prove that name before the Hello (and its token) goes out: any
        // other node of the cluster could otherwise stand in for it.
        let (verify, server_name) = match node {
            Some(name) => (Verify::Named, name),
            None => (Verify::AnyNode, crest_transport::tls::SERVER_NAME),
        };
        let client = crest_transport::client_config_verifying(
            &tls.ca_pem,
            identity.as_ref(),
            settings,
            verify,
        )?;
        let endpoint = crest_transport::client_endpoint(addr, client, settings)?;
        let connection = crest_transport::connect(&endpoint, addr, server_name).await?;
        let streams = open_streams(&connection)
            .await
            .map_err(|error| refusal(&connection).unwrap_or_else(|| error.into()))?;
        let max = settings.frame_bytes_max;
        let capacity = settings.connection_send_queue_max as usize;
        let control = spawn_writer(streams.control.0, max, capacity);
        let data = spawn_writer(streams.data.0, max, capacity);
        let hello = Wire::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            token,
            peer,
        });
        control.send(hello.into()).await.map_err(|_| {
            refusal(&connection)
                .unwrap_or_else(|| ClientError::Disconnected("control stream closed".into()))
        })?;
        let mut control_reader = FrameReader::new(streams.control.1, max);
        // Bounded by `connect_timeout_ms` with the rest of the connect. A node that refuses
        // the `Hello` answers and closes at once: the close may overtake the answer, but it
        // carries the same code and text.
        let first = control_reader
            .next()
            .await
            .map_err(|error| refusal(&connection).unwrap_or_else(|| error.into()))?;
        let welcome = match first {
            Some(ReadEvent::Frame(Wire::Welcome(welcome))) => welcome,
            Some(ReadEvent::Frame(Wire::Error(ErrorReply { code, message, .. }))) => {
                return Err(ClientError::Rejected { code, message });
            }
            None => {
                return Err(refusal(&connection).unwrap_or_else(|| {
                    ClientError::Protocol("the node closed the control stream".into())
                }));
            }
            other => {
                return Err(ClientError::Protocol(format!(
                    "expected Welcome, got {other:?}"
                )));
            }
        };
        let waiters: Waiters = Arc::new(Mutex::new(Some(HashMap::new())));
        tokio::spawn(route_answers(
            FrameReader::new(streams.data.1, max),
            waiters.clone(),
            connection.clone(),
        ));
        tokio::spawn(watch_control(control_reader, control, connection.clone()));
        Ok(Link {
            data,
            frame_bytes_max: max,
            waiters,
            next_request: AtomicU64::new(1),
            in_flight: Arc::new(Semaphore::new(requests_in_flight_max)),
            connection,
            welcome,
            _endpoint: endpoint,
        })
    }

    /// The node's `Welcome` (its limits).
    pub(crate) fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    /// Whether the connection has ended.
    pub(crate) fn is_closed(&self) -> bool {
        self.connection.close_reason().is_some()
    }

    /// Whether the connection ended because the node went silent (its idle timeout): its host
    /// is gone or cut off, unlike a node that restarted (its reset ends the connection at
    /// once) or refused us.
    pub(crate) fn went_silent(&self) -> bool {
        matches!(
            self.connection.close_reason(),
            Some(quinn::ConnectionError::TimedOut)
        )
    }

    /// Sends the request built for a fresh request number and waits for its answer.
    /// An `Error` answer becomes [`ClientError::Rejected`].
    pub(crate) async fn request(
        &self,
        build: impl FnOnce(u64) -> Wire,
        timeout: Duration,
    ) -> Result<Wire, ClientError> {
        let _permit = self
            .in_flight
            .acquire()
            .await
            .map_err(|_| ClientError::Closed)?;
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(waiters) = waiters.as_mut() else {
                return Err(self.disconnected());
            };
            waiters.insert(request, tx);
        }
        if self.data.send(build(request).into()).await.is_err() {
            self.forget(request);
            return Err(self.disconnected());
        }
        self.answer(request, rx, timeout).await
    }

    /// As [`Link::request`], but the request is framed here and given back with the answer,
    /// so that the caller can send it elsewhere if this node does not answer.
    pub(crate) async fn request_keeping(
        &self,
        build: impl FnOnce(u64) -> Wire,
        timeout: Duration,
    ) -> (Option<Wire>, Result<Wire, ClientError>) {
        let Ok(_permit) = self.in_flight.acquire().await else {
            return (None, Err(ClientError::Closed));
        };
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        let msg = build(request);
        let mut frame = Vec::new();
        if let Err(error) = encode_frame(&msg, self.frame_bytes_max, &mut frame) {
            return (
                Some(msg),
                Err(ClientError::InvalidArgument(error.to_string())),
            );
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(waiters) = waiters.as_mut() else {
                return (Some(msg), Err(self.disconnected()));
            };
            waiters.insert(request, tx);
        }
        if self
            .data
            .send(Outgoing::Frame(Bytes::from(frame)))
            .await
            .is_err()
        {
            self.forget(request);
            return (Some(msg), Err(self.disconnected()));
        }
        (Some(msg), self.answer(request, rx, timeout).await)
    }

    /// Waits for the answer to `request`.
    async fn answer(
        &self,
        request: u64,
        rx: oneshot::Receiver<Wire>,
        timeout: Duration,
    ) -> Result<Wire, ClientError> {
        let answer = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => return Err(self.disconnected()),
            Err(_) => {
                self.forget(request);
                return Err(ClientError::Timeout(format!(
                    "no answer within {timeout:?}"
                )));
            }
        };
        match answer {
            Wire::Error(error) => Err(refused(error)),
            answer => Ok(answer),
        }
    }

    fn forget(&self, request: u64) {
        if let Some(waiters) = self
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            waiters.remove(&request);
        }
    }

    fn disconnected(&self) -> ClientError {
        let reason = self
            .connection
            .close_reason()
            .map_or_else(|| "connection closed".into(), |r| r.to_string());
        ClientError::Disconnected(reason)
    }

    /// Closes the connection.
    pub(crate) fn close(&self) {
        self.connection.close(0u32.into(), b"client closed");
    }
}

/// A link nobody holds any more closes its connection at once: the node frees its slot (and
/// the principal's, `principal_connections_max`) without waiting out the idle timeout.
impl Drop for Link {
    fn drop(&mut self) {
        self.close();
    }
}

fn request_of(msg: &Wire) -> Option<u64> {
    match msg {
        Wire::PushAck(ack) => Some(ack.request),
        Wire::PopReply(reply) => Some(reply.request),
        Wire::AckReply(reply) => Some(reply.request),
        Wire::AdminReply(reply) => Some(reply.request),
        Wire::Error(error) => error.request,
        _ => None,
    }
}

async fn route_answers(mut reader: FrameReader, waiters: Waiters, connection: quinn::Connection) {
    loop {
        match reader.next().await {
            Ok(Some(ReadEvent::Frame(msg))) => {
                let Some(request) = request_of(&msg) else {
                    tracing::warn!(message = msg.name(), "unexpected message from node");
                    continue;
                };
                let waiter = waiters
                    .lock()
                    .expect("waiters lock")
                    .as_mut()
                    .and_then(|w| w.remove(&request));
                if let Some(waiter) = waiter {
                    let _ = waiter.send(msg);
                }
            }
            Ok(Some(ReadEvent::Bad(error))) => tracing::warn!(%error, "bad frame from node"),
            Ok(None) | Err(_) => break,
        }
    }
    // Closing a connection that already ended would replace why it ended (see
    // `Link::went_silent`) with our close.
    if connection.close_reason().is_none() {
        connection.close(0u32.into(), b"data stream ended");
    }
    // Dropping every waiter wakes its request with "disconnected".
    waiters
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
}

async fn watch_control(
    mut reader: FrameReader,
    _keep_open: mpsc::Sender<Outgoing>,
    connection: quinn::Connection,
) {
    while let Ok(Some(event)) = reader.next().await {
        match event {
            ReadEvent::Frame(Wire::Error(error)) => {
                tracing::warn!(code = %error.code, message = %error.message, "node reported an error")
            }
            other => tracing::debug!(?other, "control message"),
        }
    }
    let _ = connection;
}

/// Resolves `host:port`.
/// The node an address names, and where it is: `NAME@HOST:PORT` (as clients configured from a
/// topology dial, [`crest_core::topology::NodeSpec::dial_address`]) names the node whose
/// certificate the connection takes; a bare `HOST:PORT` takes any node of the cluster.
pub(crate) fn named(address: &str) -> (Option<&str>, &str) {
    match address.split_once('@') {
        Some((name, host)) if !name.is_empty() => (Some(name), host),
        _ => (None, address),
    }
}

pub(crate) async fn resolve(address: &str) -> Result<SocketAddr, ClientError> {
    if let Ok(addr) = address.parse() {
        return Ok(addr);
    }
    tokio::net::lookup_host(address)
        .await
        .map_err(|e| ClientError::Connect(format!("resolve {address}: {e}")))?
        .next()
        .ok_or_else(|| ClientError::Connect(format!("resolve {address}: no address")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An address where a socket is bound but nobody answers (a process that hangs, a host
    /// whose packets vanish): the connect fails after `connect_timeout_ms`, saying so.
    #[tokio::test]
    async fn a_connect_to_a_silent_address_fails_at_the_connect_timeout() {
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let address = silent.local_addr().unwrap().to_string();
        let ca = crest_transport::tls::CertificateAuthority::generate().unwrap();
        let settings = Settings {
            connect_timeout_ms: 300,
            ..Settings::default()
        };
        let peer = PeerKind::Producer;
        let error = Link::connect(&address, peer, &ClientTls::new(ca.cert_pem()), &settings, 1)
            .await
            .err()
            .expect("nothing answers");
        assert!(
            matches!(&error, ClientError::Connect(text) if text.contains("connect_timeout_ms")),
            "{error}"
        );
    }
}
