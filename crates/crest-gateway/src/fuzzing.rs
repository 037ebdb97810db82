//! Entry points for the fuzz targets of `fuzz/` (not an API): the decoders a request
//! reaches, fed what a fuzzer makes. Each must answer a typed error for any input, never
//! panic, and stay within the stack whatever the input's shape.

use crate::query;
use crate::queues::{QueueAttributes, QueueName};
use crate::{Caller, sigv4};
use crate::{api, params};
use serde_json::Value;
use std::time::{Duration, UNIX_EPOCH};

/// The query protocol: a query string and a form body become the JSON protocol's input.
pub fn query_request(query: &str, form: &[u8]) {
    if let Ok(params) = query::params(query, form, 1000)
        && let Ok(input) = query::to_input(&params)
    {
        json_value(&input);
    }
}

/// The JSON protocol: a body, decoded as the gateway decodes one, then every operation's
/// input decoders that need no tree (a message to send, batch entries, receipts,
/// attributes, queue URLs and names).
pub fn json_body(body: &[u8]) {
    if let Ok(input) = serde_json::from_slice::<Value>(body) {
        json_value(&input);
    }
}

fn json_value(input: &Value) {
    if !input.is_object() {
        return;
    }
    let caller = Caller {
        key_id: "AKIAFUZZ".into(),
        secret: "secret".into(),
        namespace: "fuzz".into(),
        region: None,
        host: "127.0.0.1:9324".into(),
        trace: None,
    };
    let name = QueueName::checked("fuzz", "queue").expect("a valid name");
    let queue = QueueAttributes::default();
    let _ = params::text(input, "QueueUrl").map(|url| QueueName::from_url(url, "us-east-1"));
    let _ = params::text(input, "QueueName").map(|n| QueueName::checked("fuzz", n));
    let _ = params::names(input, "AttributeNames");
    let _ = params::names(input, "MessageAttributeNames");
    let _ = params::number(input, "WaitTimeSeconds", 0, 20);
    if let Ok(attributes) = params::string_map(input, "Attributes") {
        let fuzzed = name.clone();
        let mut queue = QueueAttributes::default();
        for (name, value) in attributes {
            let _ = queue.set(&fuzzed, "us-east-1", &name, &value);
        }
    }
    let _ = api::prepare(&caller, &name, &queue, input);
    let _ = api::receipt(input);
    let _ = api::settle_op(api::Op::Visibility, input);
    if let Ok(entries) = api::entries(input) {
        for entry in entries {
            let _ = api::prepare(&caller, &name, &queue, entry);
            let _ = api::receipt(entry);
            let _ = api::settle_op(api::Op::Visibility, entry);
        }
    }
}

/// SigV4: `verify` over any request answers an error or `Ok`, never a panic; and a request
/// signed by [`sigv4::sign`] over any path, headers and body verifies with its secret.
pub fn sigv4_request(
    method: &str,
    path: &str,
    query: &str,
    headers: &[(String, String)],
    body: &[u8],
) {
    let now = UNIX_EPOCH + Duration::from_secs(1_440_938_160);
    let request = sigv4::Signed {
        method,
        path,
        query,
        headers: headers.to_vec(),
        body,
    };
    let _ = sigv4::claimed_key(&request, now);
    let _ = sigv4::verify(&request, "secret", now);

    // Signing is for headers with token names; the ones the signature adds are left out.
    let mut given: Vec<(String, String)> = headers
        .iter()
        .filter(|(n, _)| {
            !n.is_empty()
                && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
                && !matches!(
                    n.as_str(),
                    "authorization" | "x-amz-date" | "x-amz-content-sha256" | "host"
                )
        })
        .cloned()
        .collect();
    given.push(("host".into(), "127.0.0.1:9324".into()));
    let (date, authorization) = sigv4::sign(
        method,
        path,
        &given,
        body,
        "AKIAFUZZ",
        "secret",
        "us-east-1",
        now,
    );
    given.push(("x-amz-date".into(), date));
    given.push(("authorization".into(), authorization));
    let signed = sigv4::Signed {
        method,
        path,
        query: "",
        headers: given,
        body,
    };
    assert_eq!(
        sigv4::verify(&signed, "secret", now),
        Ok(()),
        "a request signed here does not verify"
    );
}
