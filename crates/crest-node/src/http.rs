//! HTTP on every node (axum): what operators and the dashboard read.
//!
//! - `GET /healthz`: `{"node", "role", "status": "ok", "children", "parent_connected"}` when
//!   the node's actor answers (503 otherwise);
//! - `GET /stats`: the node's subtree [`Report`] as JSON — one summary per node, the recent
//!   latency histograms merged over the subtree, topic depths merged over its leaves (at the
//!   root: the whole tree) — and, under `links`, this node's own QUIC connections (round
//!   trip, congestion window, path MTU, packets sent and lost);
//! - `GET /metrics`: the same in Prometheus text format (counters and gauges per node, the
//!   histograms as Prometheus histograms, topic depths);
//! - `GET /`: the dashboard, a self-contained page (no external scripts) that polls `/stats`.
//!
//! A replica of a replicated leaf serves HTTP for its whole life, leading or not: `/healthz`
//! adds where it stands in its group (`replica`, a [`ReplicaStatus`]) and `/metrics` its
//! `crest_replica_*` series; `/stats` answers only while it serves the leaf (503 on a
//! follower).

use crate::actor::{Links, NodeMsg};
use crate::replicated::ReplicaStatus;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use crest_core::metrics::{Hist, Metric, Report};
use ractor::ActorRef;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
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
}

impl HttpState {
    /// A plain node's: its actor, no group.
    pub(crate) fn node(actor: ActorRef<NodeMsg>, name: String, role: String) -> HttpState {
        HttpState {
            name,
            role,
            actor: Box::new(move || Some(actor.clone())),
            replica: None,
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

async fn dashboard() -> Html<&'static str> {
    Html(DASHBOARD)
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

async fn stats(State(state): State<Arc<HttpState>>) -> Response {
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

async fn metrics(State(state): State<Arc<HttpState>>) -> Response {
    let serving = state.replica.is_none() || (state.actor)().is_some();
    let mut text = String::new();
    if serving {
        let (report, links) = match report_and_links(&state).await {
            Ok(both) => both,
            Err(response) => return response,
        };
        text = render_prometheus(&report, wall_clock_micros());
        render_links(&mut text, &state.name, &links);
    }
    if let Some(replica) = &state.replica {
        render_replica(&mut text, &replica());
    }
    render_process(&mut text, &ProcessUse::read());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The process's own use only (processor time, memory), answered without asking the node's
/// actor: a node busy with a long step (a large checkpoint) still answers, so a bench
/// reading every node's processor time at its marks misses none.
async fn process_metrics() -> Response {
    let mut text = String::new();
    render_process(&mut text, &ProcessUse::read());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// Appends this node's QUIC links, summed per kind, in the Prometheus text format. The sums
/// cover the links open now, so they fall when a link closes: gauges, not counters.
fn render_links(out: &mut String, node: &str, links: &Links) {
    type Field = fn(&crate::actor::LinkTotals) -> u64;
    let families: [(&str, &str, Field); 5] = [
        ("crest_quic_links", "open QUIC connections", |t| t.links),
        (
            "crest_quic_sent_packets",
            "packets sent on the open connections",
            |t| t.sent_packets,
        ),
        (
            "crest_quic_lost_packets",
            "packets lost on the open connections",
            |t| t.lost_packets,
        ),
        (
            "crest_quic_congestion_events",
            "congestion window cuts on the open connections",
            |t| t.congestion_events,
        ),
        (
            "crest_quic_rtt_max_microseconds",
            "largest smoothed round trip among the open connections",
            |t| t.rtt_max_us,
        ),
    ];
    for (name, help, field) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for total in &links.totals {
            let _ = writeln!(
                out,
                "{name}{{node=\"{}\",kind=\"{}\"}} {}",
                label(node),
                total.kind,
                field(total)
            );
        }
    }
}

/// Appends where a replica stands in its group: on every replica its term, whether it serves
/// the leaf, its applied and last log index; on the leader each follower's lag.
fn render_replica(out: &mut String, status: &ReplicaStatus) {
    let labels = format!(
        "node=\"{}\",group=\"{}\"",
        label(&status.name),
        label(&status.group)
    );
    let own: [(&str, &str, Option<u64>); 4] = [
        (
            "crest_replica_term",
            "the group's term as the replica knows it",
            Some(status.term),
        ),
        (
            "crest_replica_serving",
            "1 while the replica leads its group and serves the leaf",
            Some(u64::from(status.serving.is_some())),
        ),
        (
            "crest_replica_applied_index",
            "the last log entry it applied",
            status.applied,
        ),
        (
            "crest_replica_last_log_index",
            "the last entry of its Raft log",
            status.last_log,
        ),
    ];
    for (name, help, value) in own {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        if let Some(value) = value {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    }
    type Lag = fn(&crate::replicated::FollowerLag) -> Option<u64>;
    let lags: [(&str, &str, Lag); 2] = [
        (
            "crest_replica_follower_lag_entries",
            "on the leader: entries of its log a follower does not hold yet",
            |f| Some(f.lag_entries),
        ),
        (
            "crest_replica_follower_lag_bytes",
            "on the leader: the bytes of those entries (within replica_lag_window_entries)",
            |f| f.lag_bytes,
        ),
    ];
    for (name, help, value) in lags {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for follower in &status.followers {
            if let Some(value) = value(follower) {
                let _ = writeln!(
                    out,
                    "{name}{{{labels},follower=\"{}\"}} {value}",
                    label(&follower.name)
                );
            }
        }
    }
}

/// What the process this node runs in uses: its processor time (user and system, every thread,
/// those ended included, from the process's CPU clock) and its resident memory (from Linux's
/// `/proc/self/status`; `None` where that is not available). In `crest local` every node
/// shares one process and reports the same figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct ProcessUse {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<u64>,
}

impl ProcessUse {
    fn read() -> ProcessUse {
        let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        ProcessUse {
            cpu_seconds: Some(cpu.tv_sec as f64 + cpu.tv_nsec as f64 / 1e9),
            resident_bytes: std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|status| resident_bytes(&status)),
        }
    }
}

/// `VmRSS` in a `/proc/PID/status` text, in bytes.
fn resident_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Appends the process's own use under the names Prometheus's client libraries give it.
fn render_process(out: &mut String, usage: &ProcessUse) {
    if let Some(seconds) = usage.cpu_seconds {
        out.push_str(
            "# HELP process_cpu_seconds_total user and system processor time of the process\n",
        );
        out.push_str("# TYPE process_cpu_seconds_total counter\n");
        let _ = writeln!(out, "process_cpu_seconds_total {seconds:.6}");
    }
    if let Some(bytes) = usage.resident_bytes {
        out.push_str("# HELP process_resident_memory_bytes resident memory of the process\n");
        out.push_str("# TYPE process_resident_memory_bytes gauge\n");
        let _ = writeln!(out, "process_resident_memory_bytes {bytes}");
    }
}

fn wall_clock_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Bucket bounds of the Prometheus histograms: microseconds, or messages per batch.
const MICROS_BOUNDS: [u64; 14] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
    5_000_000, 30_000_000,
];
const MESSAGES_BOUNDS: [u64; 12] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096];

/// A label value escaped for the Prometheus text format.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A metric name made of `[a-zA-Z0-9_]` only.
fn metric_name(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Renders a report in the Prometheus text exposition format (version 0.0.4): one `# TYPE`
/// line per family, followed by all its samples.
pub fn render_prometheus(report: &Report, now_micros: u64) -> String {
    let mut out = String::new();
    let mut families = |kind: &str,
                        suffix: &str,
                        pick: &dyn Fn(
        &crest_core::metrics::NodeReport,
    ) -> &std::collections::BTreeMap<String, u64>| {
        let mut names: Vec<&String> = report.nodes.iter().flat_map(|n| pick(n).keys()).collect();
        names.sort();
        names.dedup();
        for name in names {
            let family = format!("crest_{}{suffix}", metric_name(name));
            let _ = writeln!(out, "# TYPE {family} {kind}");
            for node in &report.nodes {
                if let Some(value) = pick(node).get(name) {
                    let _ = writeln!(
                        out,
                        "{family}{{node=\"{}\",role=\"{}\"}} {value}",
                        label(&node.name),
                        label(&node.role)
                    );
                }
            }
        }
    };
    families("counter", "_total", &|n| &n.counters);
    families("gauge", "", &|n| &n.gauges);
    out.push_str("# TYPE crest_node_connected gauge\n");
    for node in &report.nodes {
        let _ = writeln!(
            out,
            "crest_node_connected{{node=\"{}\",role=\"{}\"}} {}",
            label(&node.name),
            label(&node.role),
            u8::from(node.connected)
        );
    }
    for metric in Metric::ALL {
        let empty = Hist::default();
        let hist = report.histograms.get(&metric).unwrap_or(&empty);
        let bounds: &[u64] = if metric.unit() == "messages" {
            &MESSAGES_BOUNDS
        } else {
            &MICROS_BOUNDS
        };
        let family = format!("crest_{}_{}", metric.name(), metric.unit());
        let _ = writeln!(out, "# TYPE {family} histogram");
        for (bound, count) in bounds.iter().zip(hist.cumulative(bounds)) {
            let _ = writeln!(out, "{family}_bucket{{le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{family}_bucket{{le=\"+Inf\"}} {}", hist.count());
        let _ = writeln!(out, "{family}_sum {}", hist.sum());
        let _ = writeln!(out, "{family}_count {}", hist.count());
    }
    let topics = &report.stats.topics;
    out.push_str("# TYPE crest_topic_ready gauge\n");
    for topic in topics {
        for (priority, count) in &topic.ready {
            let _ = writeln!(
                out,
                "crest_topic_ready{{topic=\"{}\",priority=\"{priority}\"}} {count}",
                label(&topic.topic)
            );
        }
    }
    type TopicField = fn(&crest_core::wire::TopicStats) -> u64;
    let fields: [(&str, TopicField); 4] = [
        ("crest_topic_delayed", |t| t.delayed),
        ("crest_topic_in_flight", |t| t.in_flight),
        ("crest_topic_dead", |t| t.dead),
        ("crest_topic_bytes", |t| t.bytes),
    ];
    for (family, field) in fields {
        let _ = writeln!(out, "# TYPE {family} gauge");
        for topic in topics {
            let _ = writeln!(
                out,
                "{family}{{topic=\"{}\"}} {}",
                label(&topic.topic),
                field(topic)
            );
        }
    }
    out.push_str("# TYPE crest_topic_oldest_age_seconds gauge\n");
    for topic in topics {
        if let Some(oldest) = topic.oldest_enqueued_at {
            let age = Duration::from_micros(now_micros.saturating_sub(oldest.0)).as_secs_f64();
            let _ = writeln!(
                out,
                "crest_topic_oldest_age_seconds{{topic=\"{}\"}} {age:.3}",
                label(&topic.topic)
            );
        }
    }
    // Each namespace's messages and payload bytes, over the topics the report carries.
    let mut namespaces: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
    for topic in topics {
        let sum = namespaces
            .entry(crest_core::access::namespace(&topic.topic))
            .or_default();
        sum.0 = sum.0.saturating_add(topic.messages());
        sum.1 = sum.1.saturating_add(topic.bytes);
    }
    for (family, pick) in [
        ("crest_namespace_messages", 0),
        ("crest_namespace_bytes", 1),
    ] {
        let _ = writeln!(out, "# TYPE {family} gauge");
        for (namespace, (messages, bytes)) in &namespaces {
            let value = if pick == 0 { messages } else { bytes };
            let _ = writeln!(
                out,
                "{family}{{namespace=\"{}\"}} {value}",
                label(namespace)
            );
        }
    }
    render_limits(&mut out, &report.stats.limits);
    let stats = &report.stats;
    for (family, value) in [
        ("crest_messages_expired_total", stats.expired),
        ("crest_messages_dead_lettered_total", stats.dead_lettered),
        ("crest_pushes_deduplicated_total", stats.deduplicated),
    ] {
        let _ = writeln!(out, "# TYPE {family} counter\n{family} {value}");
    }
    out
}

/// Each limited scope's limits, admissions and refusals: a namespace's (scope `NS/`) as
/// `crest_namespace_*{namespace="NS"}`, a topic's as `crest_topic_*{topic="T"}`, a
/// principal's (`@NAME`) as `crest_principal_*{principal="NAME"}`.
fn render_limits(out: &mut String, limits: &[crest_core::quota::ScopeStats]) {
    type Pick = fn(&crest_core::quota::ScopeStats) -> Option<u64>;
    let families: [(&str, &str, &str, Pick); 15] = [
        ("messages_max", "gauge", "", |s| s.limits.messages_max),
        ("bytes_max", "gauge", "", |s| s.limits.bytes_max),
        ("message_bytes_max", "gauge", "", |s| {
            s.limits.message_bytes_max
        }),
        ("push_rate_max", "gauge", "", |s| {
            s.limits.push_rate.map(|r| r.per_second)
        }),
        ("push_bytes_rate_max", "gauge", "", |s| {
            s.limits.push_bytes_rate.map(|r| r.per_second)
        }),
        ("pushed_messages_total", "counter", "", |s| {
            Some(s.pushed.messages)
        }),
        ("pushed_bytes_total", "counter", "", |s| {
            Some(s.pushed.bytes)
        }),
        ("pop_rate_max", "gauge", "", |s| {
            s.limits.pop_rate.map(|r| r.per_second)
        }),
        // Pops are counted in scopes with a pop rate only (the root meters those alone).
        ("popped_messages_total", "counter", "", |s| {
            s.limits.pop_rate.map(|_| s.popped)
        }),
        ("in_flight_max", "gauge", "", |s| s.limits.in_flight_max),
        ("topics_max", "gauge", "", |s| s.limits.topics_max),
        ("topics", "gauge", "", |s| {
            s.limits.topics_max.map(|_| s.topics)
        }),
        ("in_flight", "gauge", "", |s| {
            s.limits.in_flight_max.map(|_| s.in_flight)
        }),
        ("refused_pops_total", "counter", "pop_reason", |s| {
            (s.limits.pop_rate.is_some() || s.limits.in_flight_max.is_some()).then_some(0)
        }),
        ("refused_messages_total", "counter", "reason", |_| None),
    ];
    for kind in ["namespace", "topic", "principal"] {
        let scopes: Vec<(&str, &crest_core::quota::ScopeStats)> = limits
            .iter()
            .filter_map(|s| {
                let (of, name) = match (s.scope.strip_suffix('/'), s.scope.strip_prefix('@')) {
                    (Some(namespace), _) => ("namespace", namespace),
                    (_, Some(principal)) => ("principal", principal),
                    _ => ("topic", s.scope.as_str()),
                };
                (of == kind).then_some((name, s))
            })
            .collect();
        if scopes.is_empty() {
            continue;
        }
        for (name, type_, by, pick) in families {
            let family = format!("crest_{kind}_{name}");
            // A family none of the scopes has (no such limit set) is left out.
            if by != "reason" && scopes.iter().all(|(_, s)| pick(s).is_none()) {
                continue;
            }
            let _ = writeln!(out, "# TYPE {family} {type_}");
            for (scope, stats) in &scopes {
                let scope = label(scope);
                if by == "reason" {
                    let r = stats.refused;
                    for (reason, value) in [
                        ("over_quota", r.over_quota),
                        ("rate_limited", r.rate_limited),
                        ("awaiting_allowance", r.awaiting_allowance),
                    ] {
                        let _ = writeln!(
                            out,
                            "{family}{{{kind}=\"{scope}\",reason=\"{reason}\"}} {value}"
                        );
                    }
                } else if by == "pop_reason" {
                    if pick(stats).is_none() {
                        continue;
                    }
                    let r = stats.refused;
                    for (reason, value) in [
                        ("rate_limited", r.pops_rate_limited),
                        ("over_in_flight", r.pops_over_in_flight),
                    ] {
                        let _ = writeln!(
                            out,
                            "{family}{{{kind}=\"{scope}\",reason=\"{reason}\"}} {value}"
                        );
                    }
                } else if let Some(value) = pick(stats) {
                    let _ = writeln!(out, "{family}{{{kind}=\"{scope}\"}} {value}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crest_core::metrics::NodeReport;
    use crest_core::time::Time;
    use crest_core::wire::{Stats, TopicStats};

    fn limited(scope: &str, over_quota: u64, rate_limited: u64) -> crest_core::quota::ScopeStats {
        use crest_core::quota::{Amount, Limits, Rate, Refused, ScopeStats};
        ScopeStats {
            scope: scope.into(),
            limits: Limits {
                messages_max: Some(100),
                push_rate: Some(Rate {
                    per_second: 10,
                    burst: 20,
                }),
                ..Limits::default()
            },
            used: Amount::default(),
            bound: Amount::default(),
            pushed: Amount {
                messages: 40,
                bytes: 400,
            },
            pushed_per_second: Amount::default(),
            refused: Refused {
                over_quota,
                rate_limited,
                ..Refused::default()
            },
            popped: 0,
            popped_per_second: 0,
            in_flight: 0,
            topics: 0,
        }
    }

    /// Principal `name`'s pop rate of 50/s, with `popped` delivered and 2 pops refused.
    fn principal(name: &str, popped: u64) -> crest_core::quota::ScopeStats {
        use crest_core::quota::{Limits, Rate, Refused};
        let limits = Limits {
            pop_rate: Some(Rate {
                per_second: 50,
                burst: 50,
            }),
            ..Limits::default()
        };
        crest_core::quota::ScopeStats {
            limits,
            popped,
            refused: Refused {
                pops_rate_limited: 2,
                ..Refused::default()
            },
            ..limited(&format!("@{name}"), 0, 0)
        }
    }

    #[test]
    fn prometheus_text_groups_families_and_escapes_labels() {
        let node = |name: &str, pushed: u64| NodeReport {
            name: name.into(),
            role: "leaf".into(),
            connected: true,
            counters: [("pushed".to_string(), pushed)].into(),
            gauges: [("messages".to_string(), 3)].into(),
            ..NodeReport::default()
        };
        let report = Report {
            nodes: vec![node("leaf-1", 5), node("le\"af\\2", 7)],
            histograms: [(Metric::PushAck, Hist(vec![(300, 2), (2_000, 1)]))].into(),
            stats: Stats {
                topics: vec![
                    TopicStats {
                        topic: "jobs".into(),
                        ready: vec![(0, 4), (9, 1)],
                        oldest_enqueued_at: Some(Time(1_000_000)),
                        ..TopicStats::default()
                    },
                    TopicStats {
                        topic: "orders/eu".into(),
                        ready: vec![(0, 2)],
                        in_flight: 1,
                        bytes: 30,
                        ..TopicStats::default()
                    },
                    TopicStats {
                        topic: "orders/us".into(),
                        delayed: 4,
                        bytes: 40,
                        ..TopicStats::default()
                    },
                ],
                limits: vec![
                    limited("orders/", 3, 1),
                    limited("jobs", 0, 0),
                    principal("alice", 9),
                ],
                ..Stats::default()
            },
            absent: Vec::new(),
        };
        let text = render_prometheus(&report, 3_000_000);
        for line in [
            "crest_namespace_messages_max{namespace=\"orders\"} 100\n",
            "crest_namespace_push_rate_max{namespace=\"orders\"} 10\n",
            "crest_namespace_pushed_messages_total{namespace=\"orders\"} 40\n",
            "crest_namespace_refused_messages_total{namespace=\"orders\",reason=\"over_quota\"} 3\n",
            "crest_namespace_refused_messages_total{namespace=\"orders\",reason=\"rate_limited\"} 1\n",
            "crest_topic_messages_max{topic=\"jobs\"} 100\n",
            "crest_principal_pop_rate_max{principal=\"alice\"} 50\n",
            "crest_principal_popped_messages_total{principal=\"alice\"} 9\n",
            "crest_principal_refused_pops_total{principal=\"alice\",reason=\"rate_limited\"} 2\n",
            "crest_principal_refused_pops_total{principal=\"alice\",reason=\"over_in_flight\"} 0\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(!text.contains("crest_namespace_bytes_max"), "no such limit");
        assert!(text.contains("# TYPE crest_pushed_total counter\ncrest_pushed_total{node=\"leaf-1\",role=\"leaf\"} 5\ncrest_pushed_total{node=\"le\\\"af\\\\2\",role=\"leaf\"} 7\n"), "{text}");
        assert!(text.contains("crest_push_ack_microseconds_bucket{le=\"250\"} 0\n"));
        assert!(text.contains("crest_push_ack_microseconds_bucket{le=\"500\"} 2\n"));
        assert!(text.contains("crest_push_ack_microseconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("crest_push_ack_microseconds_count 3\n"));
        assert!(text.contains("crest_topic_ready{topic=\"jobs\",priority=\"9\"} 1\n"));
        assert!(text.contains("crest_topic_oldest_age_seconds{topic=\"jobs\"} 2.000\n"));
        assert!(
            text.contains("crest_namespace_messages{namespace=\"orders\"} 7\n"),
            "{text}"
        );
        assert!(text.contains("crest_namespace_bytes{namespace=\"orders\"} 70\n"));
        assert!(text.contains("crest_namespace_messages{namespace=\"default\"} 5\n"));
        // Each family's TYPE line appears once.
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
        let mut unique = types.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(types.len(), unique.len());
    }

    /// GETs `path` from `addr` over a plain connection: the status line and the body.
    async fn get_raw(addr: std::net::SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n");
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

    #[test]
    fn the_process_use_is_read_and_rendered_under_the_standard_names() {
        let status = "Name:\tcrest\nVmHWM:\t  9000 kB\nVmRSS:\t  8192 kB\nThreads:\t9\n";
        assert_eq!(resident_bytes(status), Some(8 << 20));
        assert_eq!(resident_bytes("Name:\tcrest\n"), None);

        let mut text = String::new();
        render_process(
            &mut text,
            &ProcessUse {
                cpu_seconds: Some(3.25),
                resident_bytes: Some(8 << 20),
            },
        );
        assert!(
            text.contains(
                "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.250000\n"
            ),
            "{text}"
        );
        assert!(text.contains("# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 8388608\n"), "{text}");

        // This test's own process: it has run and holds memory.
        let own = ProcessUse::read();
        assert!(own.cpu_seconds.is_some_and(|s| s > 0.0), "{own:?}");
        assert!(own.resident_bytes.is_some_and(|b| b > 0), "{own:?}");
    }
}
