//! Traces that follow a message: `crest local` with `OTEL_EXPORTER_OTLP_ENDPOINT` set sends
//! each message's spans (push, offer, reserve, delivery, ack) over OTLP/HTTP to a receiver
//! of the test's own, which decodes them with the OpenTelemetry protocol's own messages. A
//! message pushed with a W3C `traceparent` has its push and delivery spans in the producer's
//! trace, children of the producer's span; a malformed one starts a trace of its own. With
//! `RUST_LOG` naming `crest::message`, the same spans are JSON log lines, and no other span is.

#[path = "common/printing.rs"]
mod printing;

use axum::body::Bytes;
use crest_testkit::{eventually, eventually_blocking};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use printing::{Process, ephemeral_default_topology, node_table, spawn_printing};
use prost::Message as _;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crest::sdk::{ClientTls, Consumer, ConsumerConfig, Message, Producer, ProducerConfig};

const CREST: &str = env!("CARGO_BIN_EXE_crest");
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";
/// How long the exporter has to deliver a span (it sends every 100 ms here).
const WAIT: Duration = Duration::from_secs(30);

/// A span as the receiver got it.
#[derive(Clone, Debug)]
struct Received {
    name: String,
    trace_id: String,
    parent_span_id: String,
    service: String,
    attributes: Vec<(String, String)>,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// An OTLP/HTTP receiver on a port it holds: every span of every export request it decodes.
async fn receiver() -> (String, Arc<Mutex<Vec<Received>>>) {
    let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
    let store = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let store = store.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP request");
                let mut got = store.lock().unwrap();
                for resource in request.resource_spans {
                    let service = resource
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|a| a.key == "service.name")
                        .map(|a| text(a.value.as_ref()))
                        .unwrap_or_default();
                    for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                        got.push(Received {
                            name: span.name,
                            trace_id: hex(&span.trace_id),
                            parent_span_id: hex(&span.parent_span_id),
                            service: service.clone(),
                            attributes: span
                                .attributes
                                .iter()
                                .map(|a| (a.key.clone(), text(a.value.as_ref())))
                                .collect(),
                        });
                    }
                }
                (
                    [("content-type", "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), spans)
}

/// `crest local` on ephemeral ports exporting to `endpoint`: the process, a leaf's and the
/// root's QUIC addresses.
fn start_local(dir: &Path, endpoint: &str) -> (Process, String, String) {
    let path = dir.join("topology.toml");
    std::fs::write(&path, ephemeral_default_topology()).unwrap();
    let mut command = Command::new(CREST);
    command
        .args([
            "--log-format",
            "json",
            "local",
            "--memory",
            "--no-sqs",
            "--topology",
        ])
        .arg(&path)
        .arg("--ca-out")
        .arg(dir.join("ca.pem"))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("RUST_LOG", "info,crest::message=trace")
        .stderr(std::fs::File::create(dir.join("local.log")).unwrap());
    let (process, lines) = spawn_printing(command);
    let nodes = node_table(&lines);
    let leaf = nodes.iter().find(|n| n.name == "leaf-1").unwrap();
    let root = nodes.iter().find(|n| n.role == "root").unwrap();
    (process, leaf.quic.clone(), root.quic.clone())
}

/// Waits until the receiver holds a span of each of `stages` for message `id`; those spans.
fn spans_of(spans: &Mutex<Vec<Received>>, id: &str, stages: &[&str]) -> Vec<Received> {
    let what = format!("spans {stages:?} of message {id}");
    eventually_blocking(WAIT, what, || {
        let got: Vec<Received> = spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.attribute("messaging.message.id") == Some(id))
            .cloned()
            .collect();
        if stages
            .iter()
            .all(|stage| got.iter().any(|s| s.name == *stage))
        {
            Ok(got)
        } else {
            Err(got.iter().map(|s| s.name.clone()).collect::<Vec<_>>())
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_s_spans_join_its_producer_s_trace() {
    let dir = tempfile::tempdir().unwrap();
    let (endpoint, spans) = receiver().await;
    let (_local, leaf, root) = start_local(dir.path(), &endpoint);
    let ca = std::fs::read_to_string(dir.path().join("ca.pem")).unwrap();
    let token = std::fs::read_to_string(dir.path().join("admin.token")).unwrap();
    let tls = ClientTls::new(ca).with_token(token.trim());
    let producer = Producer::connect(ProducerConfig::new(vec![leaf], tls.clone()))
        .await
        .unwrap();
    let consumer = Consumer::connect(ConsumerConfig::new(root, tls))
        .await
        .unwrap();
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let traced = Message::new("traced", "with a trace")
        .priority(2)
        .metadata("traceparent", traceparent.clone());
    let untraced = Message::new("traced", "malformed").metadata("traceparent", "00-not-a-trace");
    let ids = producer
        .send_batch(vec![traced, untraced])
        .await
        .unwrap()
        .acked()
        .await
        .unwrap();
    let mut popped = Vec::new();
    eventually(WAIT, "both messages popped", async || {
        popped.extend(
            consumer
                .pop("traced", 2, Duration::from_secs(5))
                .await
                .unwrap(),
        );
        if popped.len() < 2 {
            Err(popped.len())
        } else {
            Ok(())
        }
    })
    .await;
    // The consumer gets the producer's context with the message, to link its own work to.
    let delivered = popped.iter().find(|d| d.id == ids[0]).unwrap();
    assert!(
        delivered
            .metadata
            .contains(&("traceparent".to_string(), traceparent.clone())),
        "{:?}",
        delivered.metadata
    );
    for delivery in &popped {
        consumer.ack(&delivery.receipt()).await.unwrap();
    }

    let stages = ["push", "offer", "reserve", "delivery", "ack"];
    let id = ids[0].to_string();
    let traced = spans_of(&spans, &id, &stages);
    for span in &traced {
        assert_eq!(span.service, "crest", "{span:?}");
        assert_eq!(span.attribute("messaging.destination.name"), Some("traced"));
        assert_eq!(span.attribute("crest.priority"), Some("2"), "{span:?}");
        assert_eq!(span.attribute("messaging.system"), Some("crest"));
    }
    // The push and the delivery are children of the producer's span, in its trace.
    for stage in ["push", "delivery"] {
        let span = traced.iter().find(|s| s.name == stage).unwrap();
        assert_eq!(span.trace_id, TRACE_ID, "{span:?}");
        assert_eq!(span.parent_span_id, PARENT_ID, "{span:?}");
    }

    // The log has the spans as lines, with the traceparent; no other crate's spans.
    let log = std::fs::read_to_string(dir.path().join("local.log")).unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let closed: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "close")
        .collect();
    for stage in ["push", "delivery"] {
        assert!(
            closed.iter().any(|l| l["span"]["name"] == stage
                && l["span"]["message_id"] == id.as_str()
                && l["span"]["traceparent"] == traceparent.as_str()),
            "no {stage} line for {id}:\n{log}"
        );
    }
    assert!(
        closed.iter().all(|l| l["target"] == "crest::message"),
        "{log}"
    );

    // A malformed traceparent is no parent: the message's spans start traces of their own.
    let id = ids[1].to_string();
    let own = spans_of(&spans, &id, &stages);
    for span in own
        .iter()
        .filter(|s| s.name == "push" || s.name == "delivery")
    {
        assert_ne!(span.trace_id, TRACE_ID, "{span:?}");
        assert!(span.parent_span_id.is_empty(), "{span:?}");
        assert_eq!(span.trace_id.len(), 32, "{span:?}");
    }
}
