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
fn form_pairs(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| crate::sigv4::decode(&s.replace('+', " "));
            (decode(name), decode(value))
        })
        .collect()
}

/// A request's parameters: those of its query string, then those of its form body; at
/// most `max` of them (`gateway_query_params_max`).
pub(crate) fn params(
    query: &str,
    form: &[u8],
    max: usize,
) -> Result<Vec<(String, String)>, SqsError> {
    let form = String::from_utf8_lossy(form);
    let count = |text: &str| text.split('&').filter(|pair| !pair.is_empty()).count();
    let given = count(query) + count(&form);
    if given > max {
        return Err(SqsError::invalid(format!(
            "the request has {given} parameters, more than the gateway takes \
             (gateway_query_params_max = {max})"
        )));
    }
    let mut params = form_pairs(query);
    params.extend(form_pairs(&form));
    Ok(params)
}

/// Lists the query protocol flattens as `NAME.N` (a string each), by their JSON name.
const LISTS: [(&str, &str); 6] = [
    ("AttributeName", "AttributeNames"),
    ("MessageAttributeName", "MessageAttributeNames"),
    ("MessageSystemAttributeName", "MessageSystemAttributeNames"),
    ("TagKey", "TagKeys"),
    ("AWSAccountId", "AWSAccountIds"),
    ("ActionName", "Actions"),
];

/// The JSON protocol's input for a request's parameters (`Action` and `Version` left out).
///
/// # Errors
/// A parameter given both plainly and as numbered members (`Attributes=x` beside
/// `Attribute.1.Name=...`), or batch entries nested in a batch entry: SQS nests one level,
/// and the parser does not recurse past it, so no request's shape can exhaust the stack.
pub(crate) fn to_input(params: &[(String, String)]) -> Result<Value, SqsError> {
    group(params, true).map(Value::Object)
}

/// The members of one parameter group; `entries`: whether batch entries may appear (only
/// at the top).
fn group(params: &[(String, String)], entries: bool) -> Result<Map<String, Value>, SqsError> {
    let mut out = Map::new();
    // Numbered groups: (prefix, index) → the group's remaining parameters.
    let mut groups: BTreeMap<(&str, u32), Vec<(String, String)>> = BTreeMap::new();
    for (name, value) in params {
        if matches!(name.as_str(), "Action" | "Version") {
            continue;
        }
        let mut parts = name.splitn(3, '.');
        let (head, index, rest) = (parts.next(), parts.next(), parts.next());
        match (head, index.and_then(|i| i.parse::<u32>().ok())) {
            (Some(head), Some(index)) => groups
                .entry((head, index))
                .or_default()
                .push((rest.unwrap_or_default().to_string(), value.clone())),
            _ => {
                out.insert(name.clone(), Value::String(value.clone()));
            }
        }
    }
    // A member collection already given a plain value is refused, not overwritten.
    fn slot<'a>(
        out: &'a mut Map<String, Value>,
        name: &str,
        empty: fn() -> Value,
    ) -> Result<&'a mut Value, SqsError> {
        let slot = out.entry(name).or_insert_with(empty);
        if slot.is_string() {
            return Err(SqsError::invalid(format!(
                "{name} is given both as a value and as numbered members"
            )));
        }
        Ok(slot)
    }
    let list = || Value::Array(Vec::new());
    let map = || Value::Object(Map::new());
    for ((head, _), members) in groups {
        let field = |name: &str| {
            members
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        if let Some((_, name)) = LISTS.iter().find(|(item, _)| *item == head) {
            if let (Value::Array(items), Some(value)) = (slot(&mut out, name, list)?, field("")) {
                items.push(value.into());
            }
        } else if head == "Attribute" {
            if let (Some(name), Some(value)) = (field("Name"), field("Value"))
                && let Value::Object(map) = slot(&mut out, "Attributes", map)?
            {
                map.insert(name, value.into());
            }
        } else if head == "Tag" {
            if let (Some(key), Some(value)) = (field("Key"), field("Value"))
                && let Value::Object(map) = slot(&mut out, "Tags", map)?
            {
                map.insert(key, value.into());
            }
        } else if let Some(member) = match head {
            "MessageAttribute" => Some("MessageAttributes"),
            "MessageSystemAttribute" => Some("MessageSystemAttributes"),
            _ => None,
        } {
            if let Some(name) = field("Name")
                && let Value::Object(map) = slot(&mut out, member, map)?
            {
                let mut value = Map::new();
                for (member, text) in &members {
                    if let Some(part) = member.strip_prefix("Value.") {
                        value.insert(part.to_string(), text.clone().into());
                    }
                }
                map.insert(name, value.into());
            }
        } else if head.ends_with("BatchRequestEntry") {
            if !entries {
                return Err(SqsError::invalid(format!(
                    "{head}.N is nested in a batch entry; batch entries do not nest"
                )));
            }
            if let Value::Array(items) = slot(&mut out, "Entries", list)? {
                items.push(Value::Object(group(&members, false)?));
            }
        } else {
            // Unknown numbered parameters are kept whole, for the operation to refuse.
            for (member, value) in members {
                out.insert(format!("{head}.{member}"), value.into());
            }
        }
    }
    Ok(out)
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
        ("Tags", Value::Object(map)) => {
            for (key, value) in map {
                out.push_str("<Tag>");
                element(out, "Key", key);
                element(out, "Value", value.as_str().unwrap_or_default());
                out.push_str("</Tag>");
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
                "QueueUrls" | "queueUrls" => "QueueUrl".to_string(),
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
            // An empty result is an empty element, as SQS writes it.
            let result = if result.is_empty() {
                format!("<{action}Result/>")
            } else {
                format!("<{action}Result>{result}</{action}Result>")
            };
            let body = format!(
                "<{action}Response xmlns=\"{XMLNS}\">{result}{metadata}</{action}Response>"
            );
            xml(StatusCode::OK, body)
        }
        // SQS answers a queue's URL asked for no action with this element alone.
        Err(error) if error.shape == "UnknownOperationException" => {
            xml(error.status, "<UnknownOperationException/>".to_string())
        }
        Err(mut error) => {
            // The query protocol's words for a queue that does not exist are older.
            if error.code == "AWS.SimpleQueueService.NonExistentQueue" {
                error.message = "The specified queue does not exist for this wsdl version.".into();
            }
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
            to_input(&params).unwrap(),
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
    fn nested_entries_and_a_parameter_given_twice_are_refused() {
        let nested = form_pairs(
            "SendMessageBatchRequestEntry.1.SendMessageBatchRequestEntry.1.SendMessageBatch\
             RequestEntry.1.Id=x",
        );
        let error = to_input(&nested).unwrap_err();
        assert!(error.message.contains("do not nest"), "{error:?}");
        for text in [
            "Attributes=x&Attribute.1.Name=DelaySeconds&Attribute.1.Value=1",
            "AttributeNames=x&AttributeName.1=All",
            "Entries=x&SendMessageBatchRequestEntry.1.Id=a",
        ] {
            let error = to_input(&form_pairs(text)).unwrap_err();
            assert!(error.message.contains("given both"), "{text}: {error:?}");
        }
        let error = params("a=1&b=2", b"c=3", 2).unwrap_err();
        assert!(error.message.contains("3 parameters"), "{error:?}");
        assert_eq!(params("a=1", b"b=2", 2).unwrap().len(), 2);
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
