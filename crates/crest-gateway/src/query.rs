//! SQS's older query protocol: form-encoded `Action=...` requests (or a GET's query string)
//! with XML answers, what older AWS SDKs send. Requests become the JSON protocol's input and
//! answers are rendered from its output, so both protocols run the same operations.

use crate::error::SqsError;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The XML namespace of SQS's answers.
const XMLNS: &str = "http://queue.amazonaws.com/doc/2012-11-05/";

/// `application/x-www-form-urlencoded` pairs (`+` is a space).
pub(crate) fn form_pairs(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| crate::sigv4::decode(&s.replace('+', " "));
            (decode(name), decode(value))
        })
        .collect()
}

/// Lists the query protocol flattens as `NAME.N` (a string each), by their JSON name.
const LISTS: [(&str, &str); 3] = [
    ("AttributeName", "AttributeNames"),
    ("MessageAttributeName", "MessageAttributeNames"),
    ("MessageSystemAttributeName", "MessageSystemAttributeNames"),
];

/// The JSON protocol's input for a request's parameters (`Action` and `Version` left out).
pub(crate) fn to_input(params: &[(String, String)]) -> Value {
    let mut out = Map::new();
    // Numbered groups: (prefix, index) → the group's remaining parameters.
    let mut groups: BTreeMap<(String, u32), Vec<(String, String)>> = BTreeMap::new();
    for (name, value) in params {
        if matches!(name.as_str(), "Action" | "Version") {
            continue;
        }
        let mut parts = name.splitn(3, '.');
        let (head, index, rest) = (parts.next(), parts.next(), parts.next());
        match (head, index.and_then(|i| i.parse::<u32>().ok())) {
            (Some(head), Some(index)) => groups
                .entry((head.to_string(), index))
                .or_default()
                .push((rest.unwrap_or_default().to_string(), value.clone())),
            _ => {
                out.insert(name.clone(), Value::String(value.clone()));
            }
        }
    }
    for ((head, _), members) in groups {
        let field = |name: &str| {
            members
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        if let Some((_, list)) = LISTS.iter().find(|(item, _)| *item == head) {
            let items = out.entry(*list).or_insert_with(|| Value::Array(Vec::new()));
            if let (Value::Array(items), Some(value)) = (items, field("")) {
                items.push(value.into());
            }
        } else if head == "Attribute" {
            if let (Some(name), Some(value)) = (field("Name"), field("Value")) {
                let map = out.entry("Attributes").or_insert_with(|| Map::new().into());
                map[name] = value.into();
            }
        } else if head == "MessageAttribute" {
            if let Some(name) = field("Name") {
                let mut value = Map::new();
                for (member, text) in &members {
                    if let Some(part) = member.strip_prefix("Value.") {
                        value.insert(part.to_string(), text.clone().into());
                    }
                }
                let map = out
                    .entry("MessageAttributes")
                    .or_insert_with(|| Map::new().into());
                map[name] = value.into();
            }
        } else if head.ends_with("BatchRequestEntry") {
            let entries = out
                .entry("Entries")
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(entries) = entries {
                entries.push(to_input(&members));
            }
        } else {
            // Unknown numbered parameters are kept whole, for the operation to refuse.
            for (member, value) in members {
                out.insert(format!("{head}.{member}"), value.into());
            }
        }
    }
    Value::Object(out)
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\r' => out.push_str("&#xD;"),
            c => out.push(c),
        }
    }
    out
}

/// `value` as the XML elements of one answer's result (`action` names the batch entries).
fn elements(action: &str, name: &str, value: &Value, out: &mut String) {
    let element = |out: &mut String, name: &str, text: &str| {
        out.push_str(&format!("<{name}>{}</{name}>", escape(text)));
    };
    match (name, value) {
        ("Attributes", Value::Object(map)) => {
            for (key, value) in map {
                out.push_str("<Attribute>");
                element(out, "Name", key);
                element(out, "Value", value.as_str().unwrap_or_default());
                out.push_str("</Attribute>");
            }
        }
        ("MessageAttributes", Value::Object(map)) => {
            for (key, value) in map {
                out.push_str("<MessageAttribute>");
                element(out, "Name", key);
                out.push_str("<Value>");
                for (field, text) in value.as_object().into_iter().flatten() {
                    element(out, field, text.as_str().unwrap_or_default());
                }
                out.push_str("</Value></MessageAttribute>");
            }
        }
        (_, Value::Array(items)) => {
            let item = match name {
                "QueueUrls" => "QueueUrl".to_string(),
                "Messages" => "Message".to_string(),
                "Failed" => "BatchResultErrorEntry".to_string(),
                "Successful" => format!("{action}ResultEntry"),
                other => other.trim_end_matches('s').to_string(),
            };
            for value in items {
                elements(action, &item, value, out);
            }
        }
        (_, Value::Object(map)) => {
            out.push_str(&format!("<{name}>"));
            for (key, value) in map {
                elements(action, key, value, out);
            }
            out.push_str(&format!("</{name}>"));
        }
        (_, Value::String(text)) => element(out, name, text),
        (_, Value::Null) => {}
        (_, other) => element(out, name, &other.to_string()),
    }
}

/// The answer to a query protocol request for `action`.
pub(crate) fn render(action: &str, request_id: &str, result: Result<Value, SqsError>) -> Response {
    let xml = |status: StatusCode, body: String| {
        let body = format!("<?xml version=\"1.0\"?>{body}");
        (status, [("content-type", "text/xml")], body).into_response()
    };
    let metadata =
        format!("<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata>");
    match result {
        Ok(value) => {
            let mut result = String::new();
            for (key, value) in value.as_object().into_iter().flatten() {
                elements(action, key, value, &mut result);
            }
            let body = format!(
                "<{action}Response xmlns=\"{XMLNS}\"><{action}Result>{result}</{action}Result>\
                 {metadata}</{action}Response>"
            );
            xml(StatusCode::OK, body)
        }
        Err(error) => {
            let fault = if error.sender { "Sender" } else { "Receiver" };
            let body = format!(
                "<ErrorResponse xmlns=\"{XMLNS}\"><Error><Type>{fault}</Type><Code>{}</Code>\
                 <Message>{}</Message><Detail/></Error><RequestId>{request_id}</RequestId>\
                 </ErrorResponse>",
                escape(&error.code),
                escape(&error.message)
            );
            xml(error.status, body)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flattened_parameters_become_the_json_input() {
        let params = form_pairs(
            "Action=SendMessageBatch&QueueUrl=http%3A%2F%2Fh%2Fdefault%2Fq\
             &SendMessageBatchRequestEntry.1.Id=a&SendMessageBatchRequestEntry.1.MessageBody=x+y\
             &SendMessageBatchRequestEntry.1.MessageAttribute.1.Name=Priority\
             &SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType=Number\
             &SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue=3\
             &SendMessageBatchRequestEntry.2.Id=b&SendMessageBatchRequestEntry.2.MessageBody=z\
             &AttributeName.1=All&Attribute.1.Name=DelaySeconds&Attribute.1.Value=5",
        );
        assert_eq!(
            to_input(&params),
            json!({
                "QueueUrl": "http://h/default/q",
                "AttributeNames": ["All"],
                "Attributes": { "DelaySeconds": "5" },
                "Entries": [
                    { "Id": "a", "MessageBody": "x y", "MessageAttributes": {
                        "Priority": { "DataType": "Number", "StringValue": "3" } } },
                    { "Id": "b", "MessageBody": "z" },
                ],
            })
        );
    }

    #[test]
    fn answers_and_errors_are_sqs_s_xml() {
        let value = json!({
            "Messages": [{ "MessageId": "1.2", "Body": "a<b", "Attributes": { "SentTimestamp": "9" },
                           "MessageAttributes": { "Priority": { "DataType": "Number", "StringValue": "1" } } }],
        });
        let mut out = String::new();
        for (key, value) in value.as_object().unwrap() {
            elements("ReceiveMessage", key, value, &mut out);
        }
        assert_eq!(
            out,
            "<Message><Attribute><Name>SentTimestamp</Name><Value>9</Value></Attribute>\
             <Body>a&lt;b</Body><MessageAttribute><Name>Priority</Name><Value><DataType>Number\
             </DataType><StringValue>1</StringValue></Value></MessageAttribute><MessageId>1.2\
             </MessageId></Message>"
        );
        let mut out = String::new();
        elements(
            "DeleteMessageBatch",
            "Successful",
            &json!([{ "Id": "a" }]),
            &mut out,
        );
        assert_eq!(
            out,
            "<DeleteMessageBatchResultEntry><Id>a</Id></DeleteMessageBatchResultEntry>"
        );
    }
}
