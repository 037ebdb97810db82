//! A small SQS client of crest's own: AWS JSON 1.0 requests signed with SigV4, over one
//! pool of HTTP/1.1 keep-alive connections. The gateway's load generator
//! (`crest bench-sqs`) and process tests use it; applications use an AWS SDK.

use crate::sigv4;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use std::time::SystemTime;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The endpoint is not `http://HOST:PORT`.
    #[error("endpoint {0:?} is not http://HOST:PORT")]
    Endpoint(String),
    /// No answer: the connection failed or broke.
    #[error("no answer from the gateway: {0}")]
    Transport(String),
    /// An SQS error answer.
    #[error("{code} ({status}): {message}")]
    Sqs {
        /// HTTP status.
        status: u16,
        /// The error shape (`__type` without its namespace).
        code: String,
        /// Its message.
        message: String,
    },
}

/// See the module doc.
#[derive(Clone)]
pub struct SqsClient {
    http: Client<HttpConnector, Full<Bytes>>,
    endpoint: String,
    host: String,
    key_id: String,
    secret: String,
    region: String,
}

impl SqsClient {
    /// A client of the gateway at `endpoint` (`http://HOST:PORT`) signing with the key
    /// `key_id` and its `secret`, at most `connections` idle connections kept.
    ///
    /// # Errors
    /// [`CallError::Endpoint`] for an endpoint that is not `http://HOST:PORT`.
    pub fn new(
        endpoint: &str,
        key_id: &str,
        secret: &str,
        connections: usize,
    ) -> Result<SqsClient, CallError> {
        let host = endpoint
            .strip_prefix("http://")
            .map(|rest| rest.trim_end_matches('/'))
            .filter(|host| !host.is_empty() && !host.contains('/'))
            .ok_or_else(|| CallError::Endpoint(endpoint.to_string()))?;
        let http = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(connections)
            .build_http();
        Ok(SqsClient {
            http,
            endpoint: format!("http://{host}/"),
            host: host.to_string(),
            key_id: key_id.to_string(),
            secret: secret.to_string(),
            region: "us-east-1".into(),
        })
    }

    /// Calls `action` (`SendMessageBatch`) with `input`; answers its JSON.
    ///
    /// # Errors
    /// [`CallError`] if there was no answer or an SQS error.
    pub async fn call(&self, action: &str, input: &Value) -> Result<Value, CallError> {
        let body = Bytes::from(input.to_string());
        let target = format!("AmazonSQS.{action}");
        let headers = vec![
            ("host".to_string(), self.host.clone()),
            (
                "content-type".to_string(),
                "application/x-amz-json-1.0".to_string(),
            ),
            ("x-amz-target".to_string(), target),
        ];
        let (date, authorization) = sigv4::sign(
            "POST",
            "/",
            &headers,
            &body,
            &self.key_id,
            &self.secret,
            &self.region,
            SystemTime::now(),
        );
        let mut request = Request::post(&self.endpoint);
        for (name, value) in &headers {
            request = request.header(name, value);
        }
        let request = request
            .header("x-amz-date", date)
            .header("authorization", authorization)
            .body(Full::new(body))
            .map_err(|e| CallError::Transport(e.to_string()))?;
        let response = self
            .http
            .request(request)
            .await
            .map_err(|e| CallError::Transport(e.to_string()))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| CallError::Transport(e.to_string()))?
            .to_bytes();
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(value);
        }
        let shape = value["__type"].as_str().unwrap_or_default();
        Err(CallError::Sqs {
            status: status.as_u16(),
            code: shape.rsplit('#').next().unwrap_or(shape).to_string(),
            message: value["message"].as_str().unwrap_or_default().to_string(),
        })
    }
}
