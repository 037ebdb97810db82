//! `AddPermission` and `RemovePermission`: statements of a queue's `Policy`, edited as SQS
//! edits them (a statement per label, `Sid` = the label). Like the `Policy` itself they grant
//! nothing in crest, where a key's principal's grants decide (docs/sqs.md).

use crate::error::SqsError;
use crate::queues::POLICY_BYTES_MAX;
use serde_json::{Map, Value, json};

/// The policy version SQS writes.
const VERSION: &str = "2008-10-17";

/// Longest label SQS takes.
const LABEL_BYTES_MAX: usize = 80;

/// Checks a label as SQS does: 1–80 of letters, digits, `-` and `_`.
fn check_label(label: &str) -> Result<(), SqsError> {
    let fine = !label.is_empty()
        && label.len() <= LABEL_BYTES_MAX
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if fine {
        Ok(())
    } else {
        Err(invalid_label(
            label,
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
        ))
    }
}

fn invalid_label(label: &str, why: &str) -> SqsError {
    SqsError::invalid(format!(
        "Value {label} for parameter Label is invalid. Reason: {why}."
    ))
}

/// One value, or a list of several, as SQS writes a statement's principals and actions.
fn one_or_list(values: Vec<String>) -> Value {
    match <[String; 1]>::try_from(values) {
        Ok([one]) => one.into(),
        Err(values) => values.into(),
    }
}

/// The statements of `policy` (an object or a list of them), and the document without them.
fn split(policy: Option<&str>) -> (Map<String, Value>, Vec<Value>) {
    let Some(Value::Object(mut document)) = policy.and_then(|p| serde_json::from_str(p).ok())
    else {
        return (Map::new(), Vec::new());
    };
    let statements = match document.remove("Statement") {
        Some(Value::Array(list)) => list,
        Some(one @ Value::Object(_)) => vec![one],
        _ => Vec::new(),
    };
    (document, statements)
}

/// The document with `statements`, or none when none are left (SQS then has no `Policy`).
fn join(mut document: Map<String, Value>, statements: Vec<Value>) -> Option<String> {
    if statements.is_empty() {
        return None;
    }
    document.insert("Statement".into(), statements.into());
    Some(Value::Object(document).to_string())
}

fn sid(statement: &Value) -> Option<&str> {
    statement.get("Sid").and_then(Value::as_str)
}

/// `policy` with a statement `label` letting `accounts` do `actions` on queue `arn`.
pub(crate) fn add(
    policy: Option<&str>,
    arn: &str,
    label: &str,
    accounts: Vec<String>,
    actions: Vec<String>,
) -> Result<Option<String>, SqsError> {
    check_label(label)?;
    if accounts.is_empty() {
        return Err(SqsError::missing("AWSAccountIds"));
    }
    if actions.is_empty() {
        return Err(SqsError::missing("Actions"));
    }
    let (mut document, mut statements) = split(policy);
    if statements.iter().any(|s| sid(s) == Some(label)) {
        return Err(invalid_label(label, "Already exists"));
    }
    document.entry("Version").or_insert_with(|| VERSION.into());
    document
        .entry("Id")
        .or_insert_with(|| format!("{arn}/SQSDefaultPolicy").into());
    let principals = accounts
        .iter()
        .map(|account| format!("arn:aws:iam::{account}:root"))
        .collect();
    let actions = actions.iter().map(|a| format!("SQS:{a}")).collect();
    statements.push(json!({
        "Sid": label,
        "Effect": "Allow",
        "Principal": { "AWS": one_or_list(principals) },
        "Action": one_or_list(actions),
        "Resource": arn,
    }));
    let policy = join(document, statements);
    let bytes = policy.as_ref().map_or(0, String::len);
    if bytes > POLICY_BYTES_MAX {
        return Err(SqsError::invalid(format!(
            "Invalid value for the parameter Policy. Reason: longer than {POLICY_BYTES_MAX} bytes."
        )));
    }
    Ok(policy)
}

/// `policy` without its statement `label`.
pub(crate) fn remove(policy: Option<&str>, label: &str) -> Result<Option<String>, SqsError> {
    let (document, mut statements) = split(policy);
    let before = statements.len();
    statements.retain(|s| sid(s) != Some(label));
    if statements.len() == before {
        return Err(invalid_label(label, "can't find label"));
    }
    Ok(join(document, statements))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARN: &str = "arn:aws:sqs:us-east-1:orders:jobs";

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn statements_are_added_and_removed_by_label_as_sqs_writes_them() {
        let one = add(
            None,
            ARN,
            "a",
            strings(&["111"]),
            strings(&["ReceiveMessage"]),
        )
        .unwrap()
        .unwrap();
        let two = add(
            Some(&one),
            ARN,
            "b",
            strings(&["111", "222"]),
            strings(&["SendMessage", "DeleteMessage"]),
        )
        .unwrap();
        let document: Value = serde_json::from_str(two.as_deref().unwrap()).unwrap();
        assert_eq!(document["Version"], VERSION);
        assert_eq!(document["Id"], format!("{ARN}/SQSDefaultPolicy"));
        let statements = document["Statement"].as_array().unwrap();
        assert_eq!(statements[0]["Principal"]["AWS"], "arn:aws:iam::111:root");
        assert_eq!(statements[0]["Action"], "SQS:ReceiveMessage");
        assert_eq!(statements[1]["Sid"], "b");
        assert_eq!(statements[1]["Resource"], ARN);
        assert_eq!(
            statements[1]["Principal"]["AWS"],
            json!(["arn:aws:iam::111:root", "arn:aws:iam::222:root"])
        );

        let taken = add(two.as_deref(), ARN, "a", strings(&["3"]), strings(&["*"]));
        assert!(
            taken
                .unwrap_err()
                .message
                .ends_with("Reason: Already exists.")
        );
        let without_a = remove(two.as_deref(), "a").unwrap();
        assert!(!without_a.as_deref().unwrap().contains("\"Sid\":\"a\""));
        assert_eq!(
            remove(without_a.as_deref(), "b").unwrap(),
            None,
            "none left"
        );
        assert!(
            remove(None, "b")
                .unwrap_err()
                .message
                .ends_with("Reason: can't find label.")
        );
    }

    #[test]
    fn a_policy_set_by_hand_keeps_its_statements_and_bad_labels_are_refused() {
        let own = r#"{"Version":"2012-10-17","Statement":{"Sid":"mine","Effect":"Deny"}}"#;
        let more = add(Some(own), ARN, "x", strings(&["1"]), strings(&["*"]))
            .unwrap()
            .unwrap();
        let document: Value = serde_json::from_str(&more).unwrap();
        assert_eq!(document["Version"], "2012-10-17");
        assert_eq!(document["Statement"][0]["Sid"], "mine");
        assert_eq!(document["Statement"][1]["Sid"], "x");
        for label in ["", "has space", &"l".repeat(81)] {
            assert!(add(None, ARN, label, strings(&["1"]), strings(&["*"])).is_err());
        }
        assert_eq!(
            add(None, ARN, "x", Vec::new(), strings(&["*"]))
                .unwrap_err()
                .code,
            "MissingParameter"
        );
    }
}
