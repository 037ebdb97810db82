//! The gateway's HTTP connections: accepted within `gateway_connections_max` (and
//! `gateway_connections_per_address_max` from one client address), served by hyper's
//! HTTP/1.1 with a deadline for each request's headers (`gateway_header_timeout_ms`, which
//! also closes a kept-alive connection that starts no next request). A connection past a
//! bound is answered 503 at once and closed, never queued: a flood of idle connections holds
//! no more than the bounds, and the ones already served go on.

use crate::GatewayConfig;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// How long the accept loop pauses after the listener fails (out of file descriptors): the
/// failure lasts until connections close, and retrying at once would spin a core.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// Serves `app` on `listener` until the task is aborted.
pub(crate) async fn accept(listener: TcpListener, app: Router, config: GatewayConfig) {
    let admission = Arc::new(Admission {
        total_max: config.connections_max,
        per_address_max: config.connections_per_address_max,
        open: Mutex::new(Open::default()),
    });
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "the SQS gateway could not accept a connection");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let ticket = match Admission::admit(&admission, peer.ip()) {
            Ok(ticket) => ticket,
            Err(bound) => {
                refuse(&stream, bound);
                continue;
            }
        };
        // Answers are small and a client waits for each: no Nagle delay.
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let header_timeout = config.header_timeout;
        tokio::spawn(async move {
            let _ticket = ticket;
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%error, %peer, "an SQS gateway connection ended");
            }
        });
    }
}

/// Answers 503 naming `bound` (best effort: one write that does not wait) and closes.
fn refuse(stream: &TcpStream, bound: &str) {
    let body = format!("the SQS gateway holds its most connections ({bound})\n");
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: \
         {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(answer.as_bytes());
    tracing::debug!(bound, "the SQS gateway refused a connection");
}

/// Connections open, in all and by client address.
#[derive(Default)]
struct Open {
    total: u32,
    by_address: HashMap<IpAddr, u32>,
}

/// The connection bounds, shared by the accept loop and every connection's [`Ticket`].
struct Admission {
    total_max: u32,
    per_address_max: u32,
    open: Mutex<Open>,
}

impl Admission {
    /// A ticket for a connection from `address`, or the name of the bound it would pass.
    fn admit(this: &Arc<Admission>, address: IpAddr) -> Result<Ticket, &'static str> {
        let mut open = this.lock();
        if open.total >= this.total_max {
            return Err("gateway_connections_max");
        }
        let from = open.by_address.entry(address).or_default();
        if *from >= this.per_address_max {
            return Err("gateway_connections_per_address_max");
        }
        *from += 1;
        open.total += 1;
        Ok(Ticket {
            admission: this.clone(),
            address,
        })
    }

    /// The counts; a poisoned lock is taken as it is (they are plain counters, and each
    /// change of them completes under the lock).
    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One admitted connection: counted until dropped.
struct Ticket {
    admission: Arc<Admission>,
    address: IpAddr,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut open = self.admission.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(from) = open.by_address.get_mut(&self.address) {
            *from -= 1;
            if *from == 0 {
                open.by_address.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_counts_in_all_and_by_address_and_gives_back_on_drop() {
        let admission = Arc::new(Admission {
            total_max: 3,
            per_address_max: 2,
            open: Mutex::new(Open::default()),
        });
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let first = Admission::admit(&admission, a).unwrap();
        let _second = Admission::admit(&admission, a).unwrap();
        assert_eq!(
            Admission::admit(&admission, a).err(),
            Some("gateway_connections_per_address_max")
        );
        let _third = Admission::admit(&admission, b).unwrap();
        assert_eq!(
            Admission::admit(&admission, b).err(),
            Some("gateway_connections_max")
        );
        drop(first);
        let _again = Admission::admit(&admission, a).unwrap();
        assert_eq!(admission.lock().total, 3);
        assert_eq!(admission.lock().by_address.len(), 2);
    }
}
