//! `crest status`: every node of a topology as its HTTP `/healthz` describes it — which are
//! up, the root in charge (the one its children are with) and, for each replicated leaf, its
//! leader and how far behind each follower is — with what its `/metrics` and `/stats` add:
//! its version, its link's round trip, a leaf's log disk and recent sync p99. Exits 2 when a
//! node is down, for scripts and health checks.

use anyhow::Result;
use crest::core::topology::{NodeSpec, Topology};
use crest::core::wire::Role;
use http_body_util::BodyExt;
use serde_json::Value;
use std::time::Duration;

/// How long one node's `/healthz` may take.
const HEALTHZ_TIMEOUT: Duration = Duration::from_secs(2);

/// One node's answer: its `/healthz` body, or why there is none; and what its `/metrics`
/// and `/stats` say of it (empty when they do not answer).
struct Seen {
    node: NodeSpec,
    health: Result<Value, String>,
    details: Details,
}

/// A node's version, link and disk, from its `/metrics`, and a leaf's recent log sync p99,
/// from its `/stats`.
#[derive(Clone, Debug, Default, PartialEq)]
struct Details {
    version: Option<String>,
    /// The largest smoothed round trip of its links of the kind that matters for it (its
    /// parent's; at the root, the direct links to the leaves), in milliseconds.
    rtt_ms: Option<f64>,
    disk_used_bytes: Option<u64>,
    disk_free_bytes: Option<u64>,
    /// Microseconds.
    sync_p99_us: Option<u64>,
}

/// What a node's `/metrics` (classic text format) says of it.
fn details_of(metrics: &str, root: bool) -> Details {
    let mut details = Details::default();
    let link = if root {
        "kind=\"leaf\""
    } else {
        "kind=\"parent\""
    };
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = series.split('{').next().unwrap_or_default();
        let number = || value.parse::<f64>().ok();
        match name {
            "crest_build_info" => {
                details.version = series
                    .split("version=\"")
                    .nth(1)
                    .and_then(|rest| rest.split('"').next())
                    .map(str::to_string);
            }
            "crest_quic_rtt_max_seconds" if series.contains(link) => {
                details.rtt_ms = number().map(|s| s * 1e3);
            }
            "crest_log_disk_used_bytes" => details.disk_used_bytes = number().map(|b| b as u64),
            "crest_log_disk_free_bytes" => details.disk_free_bytes = number().map(|b| b as u64),
            _ => {}
        }
    }
    details
}

pub(crate) async fn status(topology: Topology, json: bool) -> Result<()> {
    let mut asks = tokio::task::JoinSet::new();
    for (index, node) in topology.nodes.iter().enumerate() {
        let http = node.http;
        let (root, leaf) = (node.role == Role::Root, node.role == Role::Leaf);
        asks.spawn(async move {
            let Some(addr) = http else {
                let health = Err("no http address in the topology".to_string());
                return (index, health, Details::default());
            };
            let health = get(addr, "/healthz").await.and_then(|body| {
                serde_json::from_slice(&body).map_err(|e| format!("not a health answer: {e}"))
            });
            let mut details = Details::default();
            if health.is_ok() {
                if let Ok(metrics) = get(addr, "/metrics").await {
                    details = details_of(&String::from_utf8_lossy(&metrics), root);
                }
                if leaf
                    && let Ok(stats) = get(addr, "/stats").await
                    && let Ok(stats) = serde_json::from_slice::<Value>(&stats)
                {
                    details.sync_p99_us = stats["nodes"][0]["latency"]["LogSync"]["p99"].as_u64();
                }
            }
            (index, health, details)
        });
    }
    let mut seen: Vec<Option<Seen>> = topology.nodes.iter().map(|_| None).collect();
    while let Some(joined) = asks.join_next().await {
        let (index, health, details) = joined?;
        seen[index] = Some(Seen {
            node: topology.nodes[index].clone(),
            health,
            details,
        });
    }
    let seen: Vec<Seen> = seen.into_iter().flatten().collect();
    let summary = summarize(&topology, &seen);
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", render(&summary));
    }
    let down = summary["down"].as_array().map_or(0, Vec::len);
    if down > 0 {
        // Scripts and health checks: 2 when something is down (1 is an error of the command).
        std::process::exit(DOWN_EXIT);
    }
    Ok(())
}

/// The exit code when a node is down.
const DOWN_EXIT: i32 = 2;

/// GETs `path` of `addr`: its body (503s included: a health answer says what is wrong).
async fn get(addr: std::net::SocketAddr, path: &'static str) -> Result<bytes::Bytes, String> {
    let ask = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        let request = hyper::Request::get(path)
            .header(hyper::header::HOST, addr.to_string())
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(body)
    };
    tokio::time::timeout(HEALTHZ_TIMEOUT, ask)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {HEALTHZ_TIMEOUT:?}")))
}

/// What `crest status` prints, as JSON with `--json`.
fn summarize(topology: &Topology, seen: &[Seen]) -> Value {
    let up = |s: &Seen| {
        s.health
            .as_ref()
            .is_ok_and(|h| h["status"].as_str() == Some("ok"))
    };
    let state = |s: &Seen| match &s.health {
        Ok(health) => health["status"].as_str().unwrap_or("unknown").to_string(),
        Err(_) => "down".to_string(),
    };
    let error = |s: &Seen| s.health.as_ref().err().cloned();
    let roots: Vec<Value> = seen
        .iter()
        .filter(|s| s.node.role == Role::Root)
        .map(|s| {
            let children = s.health.as_ref().ok().and_then(|h| h["children"].as_u64());
            serde_json::json!({
                "node": s.node.name,
                "state": state(s),
                "children": children,
                "error": error(s),
            })
        })
        .collect();
    // The root in charge: the first (in file order) its children are with.
    let in_charge = roots
        .iter()
        .find(|r| r["children"].as_u64().is_some_and(|c| c > 0))
        .map(|r| r["node"].clone())
        .unwrap_or(Value::Null);
    let nodes: Vec<Value> = seen
        .iter()
        .filter(|s| s.node.replica.is_none())
        .map(|s| {
            let d = &s.details;
            serde_json::json!({
                "node": s.node.name,
                "role": s.node.role.to_string(),
                "parent": s.node.parent,
                "up": up(s),
                "state": state(s),
                "error": error(s),
                "version": d.version,
                "rtt_ms": d.rtt_ms,
                "disk_used_bytes": d.disk_used_bytes,
                "disk_free_bytes": d.disk_free_bytes,
                "sync_p99_us": d.sync_p99_us,
            })
        })
        .collect();
    let down: Vec<&str> = seen
        .iter()
        .filter(|s| !up(s))
        .map(|s| s.node.name.as_str())
        .collect();
    // The leaf whose log syncs are slowest lately.
    let slowest = seen
        .iter()
        .filter_map(|s| Some((s.details.sync_p99_us?, s.node.name.as_str())))
        .max()
        .map(|(p99, node)| serde_json::json!({"node": node, "sync_p99_us": p99}));
    let mut groups = Vec::new();
    for s in seen {
        let Some(replica) = &s.node.replica else {
            continue;
        };
        if replica.number != 1 {
            continue;
        }
        let members: Vec<&Seen> = topology
            .members(&replica.group)
            .iter()
            .filter_map(|m| seen.iter().find(|s| s.node.name == m.name))
            .collect();
        let status = |s: &Seen| s.health.as_ref().ok().map(|h| h["replica"].clone());
        // The leader: a member that serves the leaf, in the newest term.
        let leader = members
            .iter()
            .filter_map(|m| {
                let status = status(m)?;
                status["serving"].as_u64().map(|term| (term, *m, status))
            })
            .max_by_key(|(term, _, _)| *term);
        let lags = leader
            .as_ref()
            .map(|(_, _, status)| status["followers"].clone())
            .unwrap_or(Value::Null);
        let replicas: Vec<Value> = members
            .iter()
            .map(|m| {
                let status = status(m).unwrap_or(Value::Null);
                let lag = lags
                    .as_array()
                    .and_then(|lags| lags.iter().find(|l| l["name"] == m.node.name.as_str()))
                    .cloned()
                    .unwrap_or(Value::Null);
                // A leader that does not serve (cut off from its group, or rebuilding its
                // leaf) is not the group's leader: say so.
                let shown = match (up(m), status["state"].as_str(), status["serving"].is_null()) {
                    (false, _, _) => Value::String(state(m)),
                    (true, Some("leader"), true) => Value::String("leader, not serving".into()),
                    (true, _, _) => status["state"].clone(),
                };
                serde_json::json!({
                    "node": m.node.name,
                    "up": up(m),
                    "state": shown,
                    "serving": status["serving"],
                    "term": status["term"],
                    "applied": status["applied"],
                    "pre_votes": status["pre_votes"],
                    "lag_entries": lag["lag_entries"],
                    "lag_bytes": lag["lag_bytes"],
                    "error": error(m),
                })
            })
            .collect();
        groups.push(serde_json::json!({
            "group": replica.group,
            "leader": leader.as_ref().map(|(_, m, _)| m.node.name.clone()),
            "term": leader.as_ref().map(|(term, _, _)| *term),
            "replicas": replicas,
        }));
    }
    serde_json::json!({
        "root_in_charge": in_charge,
        "roots": roots,
        "nodes": nodes,
        "groups": groups,
        "down": down,
        "slowest_sync": slowest,
    })
}

/// Why a node is down, after its row.
fn because(error: &Value) -> String {
    error
        .as_str()
        .map_or(String::new(), |error| format!("  ({error})"))
}

/// `bytes` in KiB, MiB, GiB or TiB, one decimal.
fn human_bytes(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

/// The summary as a table.
fn render(summary: &Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_string(),
        other => other.to_string(),
    };
    let _ = writeln!(out, "root in charge: {}", text(&summary["root_in_charge"]));
    let _ = writeln!(
        out,
        "{:<20} {:<11} {:<10} {:<8} {:<8} {:>9} {:>11} {:>11} {:>10}",
        "NODE",
        "ROLE",
        "PARENT",
        "STATE",
        "VERSION",
        "RTT MS",
        "DISK USED",
        "DISK FREE",
        "SYNC P99"
    );
    let bytes = |v: &Value| v.as_u64().map_or("-".to_string(), human_bytes);
    for node in summary["nodes"].as_array().into_iter().flatten() {
        let rtt = node["rtt_ms"]
            .as_f64()
            .map_or("-".to_string(), |ms| format!("{ms:.2}"));
        let sync = node["sync_p99_us"]
            .as_u64()
            .map_or("-".to_string(), |us| format!("{:.2} ms", us as f64 / 1e3));
        let _ = writeln!(
            out,
            "{:<20} {:<11} {:<10} {:<8} {:<8} {:>9} {:>11} {:>11} {:>10}{}",
            text(&node["node"]),
            text(&node["role"]),
            text(&node["parent"]),
            text(&node["state"]),
            text(&node["version"]),
            rtt,
            bytes(&node["disk_used_bytes"]),
            bytes(&node["disk_free_bytes"]),
            sync,
            because(&node["error"])
        );
    }
    if let Some(slowest) = summary["slowest_sync"].as_object() {
        let us = slowest["sync_p99_us"].as_u64().unwrap_or_default();
        let _ = writeln!(
            out,
            "slowest log sync: {} at p99 {:.2} ms (its last 10 to 20 s)",
            text(&slowest["node"]),
            us as f64 / 1e3
        );
    }
    let down = summary["down"].as_array().map_or(0, Vec::len);
    if down > 0 {
        let names: Vec<String> = summary["down"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        let _ = writeln!(out, "down: {}", names.join(", "));
    }
    for group in summary["groups"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "\ngroup {}: leader {} (term {})",
            text(&group["group"]),
            text(&group["leader"]),
            text(&group["term"])
        );
        let row = |out: &mut String, cells: [String; 5], error: String| {
            let [node, state, applied, entries, bytes] = cells;
            let _ = writeln!(
                out,
                "  {node:<18} {state:<10} {applied:>10} {entries:>12} {bytes:>14}{error}"
            );
        };
        let header = ["REPLICA", "STATE", "APPLIED", "LAG ENTRIES", "LAG BYTES"];
        row(&mut out, header.map(String::from), String::new());
        for replica in group["replicas"].as_array().into_iter().flatten() {
            let cells = ["node", "state", "applied", "lag_entries", "lag_bytes"];
            row(
                &mut out,
                cells.map(|cell| text(&replica[cell])),
                because(&replica["error"]),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{Seen, render, summarize};
    use crest::core::topology::Topology;
    use serde_json::json;

    #[test]
    fn a_group_s_leader_is_the_member_serving_in_the_newest_term() {
        let text = include_str!("../../../topology/replicated.toml");
        let topology = Topology::parse(text).unwrap();
        let replica = |name: &str, state: &str, serving: Option<u64>, followers| {
            json!({"status": "ok", "replica": {
                "name": name, "state": state, "term": 4, "serving": serving, "applied": 9,
                "followers": followers,
            }})
        };
        let health = |name: &str| match name {
            "root" => Ok(json!({"status": "ok", "children": 1})),
            // A deposed leader that has not noticed yet: serving in an older term.
            "leaf-1a" => Ok(replica(name, "leader", Some(3), json!([]))),
            "leaf-1b" => Ok(replica(
                name,
                "leader",
                Some(4),
                json!([{"name": "leaf-1a", "lag_entries": 5, "lag_bytes": 700}]),
            )),
            _ => Err("connection refused".to_string()),
        };
        let seen: Vec<Seen> = topology
            .nodes
            .iter()
            .map(|node| Seen {
                node: node.clone(),
                health: health(&node.name),
                details: super::Details::default(),
            })
            .collect();
        let summary = summarize(&topology, &seen);
        assert_eq!(summary["root_in_charge"], "root");
        let group = &summary["groups"][0];
        assert_eq!(group["leader"], "leaf-1b");
        assert_eq!(group["term"], 4);
        assert_eq!(group["replicas"][0]["lag_bytes"], 700);
        assert_eq!(group["replicas"][2]["up"], false);
        let table = render(&summary);
        assert!(
            table.contains("group leaf-1: leader leaf-1b (term 4)"),
            "{table}"
        );
        assert!(table.contains("(connection refused)"), "{table}");
    }

    #[test]
    fn a_node_s_version_link_and_disk_are_read_from_its_metrics() {
        let metrics = "# TYPE crest_build_info gauge\n\
            crest_build_info{node=\"leaf-1\",role=\"leaf\",version=\"0.1.0\",protocol=\"18\"} 1\n\
            crest_quic_rtt_max_seconds{node=\"leaf-1\",kind=\"incoming\"} 0.009\n\
            crest_quic_rtt_max_seconds{node=\"leaf-1\",kind=\"parent\"} 0.0015\n\
            crest_log_disk_used_bytes{node=\"leaf-1\",role=\"leaf\"} 2048\n\
            crest_log_disk_free_bytes{node=\"leaf-1\",role=\"leaf\"} 1e9\n";
        let details = super::details_of(metrics, false);
        assert_eq!(details.version.as_deref(), Some("0.1.0"));
        assert_eq!(details.rtt_ms, Some(1.5));
        assert_eq!(details.disk_used_bytes, Some(2048));
        assert_eq!(details.disk_free_bytes, Some(1_000_000_000));
        // The root's links that matter are its direct ones to the leaves.
        let root = "crest_quic_rtt_max_seconds{node=\"root\",kind=\"leaf\"} 0.002\n";
        assert_eq!(super::details_of(root, true).rtt_ms, Some(2.0));
        assert_eq!(super::human_bytes(2048), "2.0 KiB");
        assert_eq!(super::human_bytes(512), "512 B");
    }
}
