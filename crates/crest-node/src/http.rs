//! HTTP on every node (axum): what operators and the dashboard read.
//!
//! - `GET /healthz`: `{"node", "role", "status": "ok", "children", "parent_connected"}` when
//!   the node's actor answers (503 otherwise);
//! - `GET /stats`: the node's subtree [`Report`] as JSON — one summary per node, the recent
//!   latency histograms merged over the subtree, topic depths merged over its leaves (at the
//!   root: the whole tree) — and, under `links`, this node's own QUIC connections (round
//!   trip, congestion window, path MTU, packets sent and lost);
//! - `GET /metrics`: the node's own measurements for Prometheus, and at the root the tree's
//!   topics and quotas ([`crate::exporter`]); `GET /metrics/process` the process's alone;
//! - `GET /`: the dashboard, a self-contained page (no external scripts) that polls `/stats`.
//!
//! A replica of a replicated leaf serves HTTP for its whole life, leading or not: `/healthz`
//! adds where it stands in its group (`replica`, a [`ReplicaStatus`]) and `/metrics` its
//! `crest_replica_*` series; `/stats` answers only while it serves the leaf (503 on a
//! follower).

use crate::actor::{Links, NodeMsg};
use crate::exporter::{self, DiskUse, ProcessUse, Scrape};
use crate::replica::ReplicaStatus;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use crest_core::metrics::Report;
use ractor::ActorRef;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// How long a handler waits for the node's actor.
const ACTOR_TIMEOUT_MS: u64 = 2_000;

/// The dashboard page.
const DASHBOARD: &str = include_str!("dashboard.html");

/// What a node's HTTP answers from.
pub(crate) struct HttpState {
    pub(crate) name: String,
    pub(crate) role: String,
    /// The node's actor: always there on a plain node; on a replica, while it serves.
    pub(crate) actor: Box<dyn Fn() -> Option<ActorRef<NodeMsg>> + Send + Sync>,
    /// Where a replica stands in its group.
    pub(crate) replica: Option<Box<dyn Fn() -> ReplicaStatus + Send + Sync>>,
    /// A leaf's log directory (its disk use is in `/metrics`).
    pub(crate) data_dir: Option<std::path::PathBuf>,
    /// Names the dashboard and `/stats` answer under besides IP addresses and `localhost`
    /// (see [`host_allowed`]).
    pub(crate) hosts: Vec<String>,
}

/// The names a node's pages answer under: its own address's host and `http_hosts`.
pub(crate) fn hosts_of(spec: &crest_core::topology::NodeSpec) -> Vec<String> {
    let own = spec
        .address
        .rsplit_once(':')
        .map_or(spec.address.as_str(), |(host, _)| host);
    let mut hosts = spec.settings.http_hosts.clone();
    hosts.push(own.trim_matches(['[', ']']).to_string());
    hosts
}

/// Whether a request's `Host` names this node as its operators reach it: an IP address (a
/// DNS name rebound to the node's address by another site's page arrives as that site's
/// name, never as an address), `localhost`, or one of `hosts`. A request without `Host`
/// (HTTP/1.0 tools) is not a browser's.
fn host_allowed(headers: &HeaderMap, hosts: &[String]) -> bool {
    let Some(host) = headers.get(header::HOST) else {
        return true;
    };
    let Ok(host) = host.to_str() else {
        return false;
    };
    if host.starts_with('[') {
        return host
            .split_once(']')
            .is_some_and(|(ip, _)| ip[1..].parse::<std::net::Ipv6Addr>().is_ok());
    }
    let name = host.split_once(':').map_or(host, |(name, _)| name);
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || hosts.iter().any(|h| h.eq_ignore_ascii_case(name))
}

/// 403 for a request whose `Host` is not one of the node's names.
fn wrong_host(headers: &HeaderMap) -> Response {
    let host = headers
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
        .unwrap_or_default();
    (
        StatusCode::FORBIDDEN,
        format!(
            "Host {host:?} is not a name of this node: use its address, or list the name in \
             http_hosts\n"
        ),
    )
        .into_response()
}

impl HttpState {
    /// A plain node's: its actor, no group.
    pub(crate) fn node(
        actor: ActorRef<NodeMsg>,
        name: String,
        role: String,
        data_dir: Option<std::path::PathBuf>,
        hosts: Vec<String>,
    ) -> HttpState {
        HttpState {
            name,
            role,
            actor: Box::new(move || Some(actor.clone())),
            replica: None,
            data_dir,
            hosts,
        }
    }
}

/// Serves HTTP on `listener` until `shutdown`.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    state: HttpState,
    shutdown: CancellationToken,
) {
    let state = Arc::new(state);
    let app = Router::new()
        .route("/", get(dashboard))
        .route("/healthz", get(healthz))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .route("/metrics/process", get(process_metrics))
        .with_state(state);
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await;
    if let Err(error) = result {
        tracing::warn!(%error, "HTTP server stopped");
    }
}

/// Asks the node's actor (`message` wraps the reply port); 503 naming the node if it does not
/// answer within [`ACTOR_TIMEOUT_MS`].
async fn ask<T: Send + 'static>(
    state: &HttpState,
    message: impl FnOnce(ractor::RpcReplyPort<T>) -> NodeMsg,
) -> Result<T, Response> {
    let Some(actor) = (state.actor)() else {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "replica {} does not lead its group: the leader serves the leaf\n",
                state.name
            ),
        )
            .into_response());
    };
    ractor::call_t!(actor, message, ACTOR_TIMEOUT_MS).map_err(|error| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("node {} did not answer: {error}\n", state.name),
        )
            .into_response()
    })
}

/// The node's subtree report and its own links.
async fn report_and_links(state: &HttpState) -> Result<(Report, Links), Response> {
    Ok((
        ask(state, NodeMsg::Report).await?,
        ask(state, NodeMsg::Links).await?,
    ))
}

async fn dashboard(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    if !host_allowed(&headers, &state.hosts) {
        return wrong_host(&headers);
    }
    Html(DASHBOARD).into_response()
}

async fn healthz(State(state): State<Arc<HttpState>>) -> Response {
    // A follower is healthy while its group member runs: it has no node to ask.
    let answered = match (state.actor)() {
        Some(actor) => ractor::call_t!(actor, NodeMsg::Stats, ACTOR_TIMEOUT_MS).map(Some),
        None if state.replica.is_some() => Ok(None),
        None => Err(ractor::RactorErr::Timeout),
    };
    let mut body = serde_json::json!({
        "node": state.name,
        "role": state.role,
        "status": if answered.is_ok() { "ok" } else { "unresponsive" },
    });
    if let Ok(Some(stats)) = &answered {
        body["children"] = stats.children.into();
        body["parent_connected"] = stats.parent_connected.into();
    }
    if let Some(replica) = &state.replica {
        body["replica"] = serde_json::to_value(replica()).unwrap_or_default();
    }
    let code = if answered.is_ok() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(body)).into_response()
}

async fn stats(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    if !host_allowed(&headers, &state.hosts) {
        return wrong_host(&headers);
    }
    let (report, links) = match report_and_links(&state).await {
        Ok(both) => both,
        Err(response) => return response,
    };
    let mut body = serde_json::to_value(report).unwrap_or_default();
    if let Some(object) = body.as_object_mut() {
        object.insert(
            "links".into(),
            serde_json::to_value(links).unwrap_or_default(),
        );
        if let Some(replica) = &state.replica {
            object.insert(
                "replica".into(),
                serde_json::to_value(replica()).unwrap_or_default(),
            );
        }
    }
    axum::Json(body).into_response()
}

async fn metrics(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    let serving = state.replica.is_none() || (state.actor)().is_some();
    let mut scrape = Scrape {
        node: state.name.clone(),
        role: state.role.clone(),
        replica: state.replica.as_ref().map(|replica| replica()),
        process: ProcessUse::read(),
        now_micros: wall_clock_micros(),
        ..Scrape::default()
    };
    if serving {
        let (report, links) = match report_and_links(&state).await {
            Ok(both) => both,
            Err(response) => return response,
        };
        scrape.report = Some(report);
        scrape.links = Some(links);
        scrape.disk = state.data_dir.as_deref().and_then(DiskUse::read);
    }
    metrics_answer(scrape, &headers)
}

/// `scrape` encoded in the format the scraper asked for: OpenMetrics if its `Accept` names
/// it, else the classic text format.
fn metrics_answer(scrape: Scrape, headers: &HeaderMap) -> Response {
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.contains("application/openmetrics-text"));
    let kind = if openmetrics {
        exporter::OPENMETRICS
    } else {
        exporter::CLASSIC
    };
    (
        [(header::CONTENT_TYPE, kind)],
        exporter::render(scrape, openmetrics),
    )
        .into_response()
}

/// The process's own use only (processor time, memory), answered without asking the node's
/// actor: a node busy with a long step (a large checkpoint) still answers, so a bench
/// reading every node's processor time at its marks misses none.
async fn process_metrics(headers: HeaderMap) -> Response {
    let scrape = Scrape {
        process: ProcessUse::read(),
        ..Scrape::default()
    };
    metrics_answer(scrape, &headers)
}

fn wall_clock_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GETs `path` from `addr` over a plain connection: the status line and the body.
    async fn get_raw(addr: std::net::SocketAddr, path: &str) -> String {
        get_from(addr, path, "node").await
    }

    /// GETs `path` from `addr` with `Host: host`.
    async fn get_from(addr: std::net::SocketAddr, path: &str, host: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn the_process_s_use_is_served_when_the_node_does_not_answer() {
        // A node whose actor cannot be asked: /metrics says so, /metrics/process still
        // answers with the process's processor time.
        let state = HttpState {
            name: "leaf-1".into(),
            role: "leaf".into(),
            actor: Box::new(|| None),
            replica: None,
            data_dir: None,
            hosts: Vec::new(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, state, shutdown.clone()));
        let full = get_raw(addr, "/metrics").await;
        assert!(full.starts_with("HTTP/1.1 503"), "{full}");
        let process = get_raw(addr, "/metrics/process").await;
        assert!(process.starts_with("HTTP/1.1 200"), "{process}");
        assert!(
            process.contains("\nprocess_cpu_seconds_total "),
            "{process}"
        );
        shutdown.cancel();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn pages_answer_only_under_the_node_s_names() {
        // A browser page of another site that rebinds its name to the node's address sends
        // that name as Host: the dashboard and /stats refuse it; addresses, localhost and
        // the configured names are served (here /stats answers 503: no actor, but not 403).
        let state = HttpState {
            name: "root".into(),
            role: "root".into(),
            actor: Box::new(|| None),
            replica: None,
            data_dir: None,
            hosts: vec!["crest.example".into()],
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, state, shutdown.clone()));
        for path in ["/", "/stats"] {
            let refused = get_from(addr, path, "evil.example:7480").await;
            assert!(refused.starts_with("HTTP/1.1 403"), "{path}: {refused}");
            assert!(refused.contains("http_hosts"), "{refused}");
        }
        for host in [
            addr.to_string(),
            "localhost:7480".into(),
            "[::1]:7480".into(),
            "CREST.example:7480".into(),
        ] {
            let page = get_from(addr, "/", &host).await;
            assert!(page.starts_with("HTTP/1.1 200"), "{host}: {page}");
            let stats = get_from(addr, "/stats", &host).await;
            assert!(!stats.starts_with("HTTP/1.1 403"), "{host}: {stats}");
        }
        shutdown.cancel();
        server.await.unwrap();
    }
}
