//! The optional OpenTelemetry exporter of per-message spans (`--otlp-endpoint`).
//!
//! The nodes emit a `tracing` span per stage of a message ([`crest::core::trace`]); this layer
//! turns each, as it closes, into an OpenTelemetry span sent over OTLP/HTTP (protobuf) by the
//! SDK's batch processor. A span whose message carries a W3C `traceparent` is a child of that
//! context, so a push and a delivery join the producer's trace. `tracing-opentelemetry` would
//! parent a span only on another `tracing` span or on a context set from code holding the
//! span; here the parent is a field of the span, read when it closes, which this small layer
//! does (ARCHITECTURE.md, "Traces").

use crest::core::trace::{TARGET, TRACEPARENT};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span as _, SpanKind, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context as LayerContext;
use tracing_subscriber::registry::LookupSpan;

/// The exporter of this process, once started (before the runtime: its HTTP client is a
/// blocking one, which must not be made or dropped on a runtime's thread).
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Where spans go: `endpoint` is the collector's base URL (`http://host:4318`), as
/// `OTEL_EXPORTER_OTLP_ENDPOINT` gives it; spans go to its `/v1/traces`.
pub(crate) fn start(endpoint: &str) -> anyhow::Result<()> {
    let base = endpoint.trim_end_matches('/');
    let url = if base.ends_with("/v1/traces") {
        base.to_string()
    } else {
        format!("{base}/v1/traces")
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(url)
        .build()?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("crest")
        .build();
    // The batch processor's queue is bounded (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048 spans): past
    // it, spans are dropped rather than held.
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let _ = PROVIDER.set(provider);
    Ok(())
}

/// Sends what is still queued and stops the exporter (at exit, off the runtime).
pub(crate) fn shutdown() {
    if let Some(provider) = PROVIDER.get()
        && let Err(error) = provider.shutdown()
    {
        eprintln!("warning: the OTLP exporter did not flush: {error}");
    }
}

/// The layer that exports message spans, if [`start`] ran.
pub(crate) fn layer() -> Option<MessageSpans> {
    PROVIDER.get().map(|provider| MessageSpans {
        tracer: provider.tracer("crest"),
        propagator: TraceContextPropagator::new(),
    })
}

/// Turns closed message spans into OpenTelemetry spans.
pub(crate) struct MessageSpans {
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
}

/// What a message span said.
#[derive(Default)]
struct Fields {
    message_id: String,
    topic: String,
    priority: u64,
    traceparent: String,
    elapsed_us: u64,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "topic" => self.topic = value.to_string(),
            TRACEPARENT => self.traceparent = value.to_string(),
            "message_id" => self.message_id = value.to_string(),
            _ => {}
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "priority" => self.priority = value,
            "elapsed_us" => self.elapsed_us = value,
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message_id" {
            self.message_id = format!("{value:?}");
        }
    }
}

impl<S> Layer<S> for MessageSpans
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: LayerContext<'_, S>) {
        if attrs.metadata().target() != TARGET {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_close(&self, id: Id, ctx: LayerContext<'_, S>) {
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let Some(fields) = span.extensions_mut().remove::<Fields>() else {
            return;
        };
        let stage = span.name();
        let end = SystemTime::now();
        let start = end
            .checked_sub(Duration::from_micros(fields.elapsed_us))
            .unwrap_or(end);
        // A malformed or absent traceparent gives an empty context: the span starts a trace.
        let parent = if fields.traceparent.is_empty() {
            Context::new()
        } else {
            let carrier = HashMap::from([(TRACEPARENT.to_string(), fields.traceparent)]);
            self.propagator.extract(&carrier)
        };
        // The push and the delivery answer a client's request; the rest is the tree's work.
        let kind = match stage {
            "push" | "delivery" => SpanKind::Server,
            _ => SpanKind::Internal,
        };
        let attributes = vec![
            KeyValue::new("messaging.system", "crest"),
            KeyValue::new("messaging.operation.name", stage),
            KeyValue::new("messaging.message.id", fields.message_id),
            KeyValue::new("messaging.destination.name", fields.topic),
            KeyValue::new("crest.priority", fields.priority as i64),
        ];
        let mut exported = self
            .tracer
            .span_builder(stage)
            .with_kind(kind)
            .with_start_time(start)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        exported.end_with_timestamp(end);
    }
}
