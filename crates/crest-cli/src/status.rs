//! `crest status`: every node of a topology as its HTTP `/healthz` describes it — which are
//! up, the root in charge (the one its children are with) and, for each replicated leaf, its
//! leader and how far behind each follower is.

use anyhow::{Context, Result};
use crest::core::topology::{NodeSpec, Topology};
use crest::core::wire::Role;
use http_body_util::BodyExt;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// How long one node's `/healthz` may take.
const HEALTHZ_TIMEOUT: Duration = Duration::from_secs(2);

/// One node's answer: its `/healthz` body, or why there is none.
struct Seen {
    node: NodeSpec,
    health: Result<Value, String>,
}

pub(crate) async fn status(topology: &Path, json: bool) -> Result<()> {
    let text = std::fs::read_to_string(topology)
        .with_context(|| format!("reading {}", topology.display()))?;
    let topology = Topology::parse(&text)?;
    let mut asks = tokio::task::JoinSet::new();
    for (index, node) in topology.nodes.iter().enumerate() {
        let http = node.http;
        asks.spawn(async move {
            let health = match http {
                None => Err("no http address in the topology".to_string()),
                Some(addr) => healthz(addr).await,
            };
            (index, health)
        });
    }
    let mut seen: Vec<Option<Seen>> = topology.nodes.iter().map(|_| None).collect();
    while let Some(joined) = asks.join_next().await {
        let (index, health) = joined?;
        seen[index] = Some(Seen {
            node: topology.nodes[index].clone(),
            health,
        });
    }
    let seen: Vec<Seen> = seen.into_iter().flatten().collect();
    let summary = summarize(&topology, &seen);
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", render(&summary));
    }
    Ok(())
}

/// GETs `/healthz` of `addr`: its JSON body (503s included: they say what is wrong).
async fn healthz(addr: std::net::SocketAddr) -> Result<Value, String> {
    let ask = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        let request = hyper::Request::get("/healthz")
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
        serde_json::from_slice(&body).map_err(|e| format!("not a health answer: {e}"))
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
            serde_json::json!({
                "node": s.node.name,
                "role": s.node.role.to_string(),
                "up": up(s),
                "state": state(s),
                "error": error(s),
            })
        })
        .collect();
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
    })
}

/// Why a node is down, after its row.
fn because(error: &Value) -> String {
    error
        .as_str()
        .map_or(String::new(), |error| format!("  ({error})"))
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
    let _ = writeln!(out, "{:<20} {:<11} STATE", "NODE", "ROLE");
    for node in summary["nodes"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "{:<20} {:<11} {}{}",
            text(&node["node"]),
            text(&node["role"]),
            text(&node["state"]),
            because(&node["error"])
        );
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
}
