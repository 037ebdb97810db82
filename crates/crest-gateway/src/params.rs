//! A request's parameters, read from its JSON (the query protocol is turned into the same
//! JSON first): each missing or mistyped one is the `SqsError` SQS answers.

use crate::error::SqsError;
use serde_json::Value;

pub(crate) fn text<'a>(input: &'a Value, name: &str) -> Result<&'a str, SqsError> {
    match input.get(name) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(SqsError::missing(name)),
        Some(_) => Err(SqsError::invalid(format!("{name} must be a string"))),
    }
}

/// A whole number parameter in `0..=max`, or `default` when absent.
pub(crate) fn number(input: &Value, name: &str, default: u64, max: u64) -> Result<u64, SqsError> {
    number_within(input, name, default, 0, max)
}

/// A whole number parameter from `low` to `high`, `default` when absent; refused as SQS
/// words it.
pub(crate) fn number_within(
    input: &Value,
    name: &str,
    default: u64,
    low: u64,
    high: u64,
) -> Result<u64, SqsError> {
    match input.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(value) => value
            .as_u64()
            .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
            .filter(|v| (low..=high).contains(v))
            .ok_or_else(|| {
                let given = value
                    .as_str()
                    .map_or_else(|| value.to_string(), str::to_string);
                let range = if low == 0 {
                    format!(">= 0 and <= {high}")
                } else {
                    format!("between {low} and {high}")
                };
                SqsError::invalid(format!(
                    "Value {given} for parameter {name} is invalid. Reason: Must be {range}, if \
                     provided."
                ))
            }),
    }
}

pub(crate) fn string_map(input: &Value, name: &str) -> Result<Vec<(String, String)>, SqsError> {
    match input.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Ok((k.clone(), other.to_string())),
            })
            .collect(),
        Some(_) => Err(SqsError::invalid(format!("{name} must be a map"))),
    }
}

pub(crate) fn names(input: &Value, field: &str) -> Result<Vec<String>, SqsError> {
    match input.get(field) {
        // The query protocol sends an empty list as an empty value.
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(text)) if text.is_empty() => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| SqsError::invalid(format!("{field} must list strings")))
            })
            .collect(),
        Some(_) => Err(SqsError::invalid(format!("{field} must be a list"))),
    }
}
