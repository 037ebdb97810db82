//! SQS's errors, as the JSON protocol carries them: `__type` names the error shape, the
//! `x-amzn-query-error` header its classic (query protocol) code, which AWS SDKs report and
//! base their retries on.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use crest_core::wire::{ErrorCode, ReceiptError};
use crest_sdk::ClientError;

/// An error answered to an SQS request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqsError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The JSON protocol's error shape (`QueueDoesNotExist`).
    pub shape: &'static str,
    /// The query protocol's code (`AWS.SimpleQueueService.NonExistentQueue`).
    pub code: String,
    /// Whether the client is at fault (`Sender`) or the service (`Receiver`).
    pub sender: bool,
    /// What went wrong, for people.
    pub message: String,
}

impl SqsError {
    fn new(
        status: StatusCode,
        shape: &'static str,
        code: impl Into<String>,
        message: String,
    ) -> Self {
        SqsError {
            status,
            shape,
            code: code.into(),
            sender: status.is_client_error(),
            message,
        }
    }

    /// An error whose JSON shape and query code are the same name.
    fn named(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self::new(status, code, code, message.into())
    }

    /// An error of SQS's own, its query code `AWS.SimpleQueueService.` and its shape.
    fn sqs(shape: &'static str, message: impl Into<String>) -> Self {
        let code = format!("AWS.SimpleQueueService.{shape}");
        Self::new(StatusCode::BAD_REQUEST, shape, code, message.into())
    }

    /// A parameter out of range or of the wrong form.
    pub fn invalid(message: impl Into<String>) -> Self {
        let (shape, code) = ("InvalidParameterValueException", "InvalidParameterValue");
        Self::new(StatusCode::BAD_REQUEST, shape, code, message.into())
    }

    /// A required parameter is absent.
    pub fn missing(name: &str) -> Self {
        let m = format!("The request must contain the parameter {name}.");
        let (shape, code) = ("MissingRequiredParameterException", "MissingParameter");
        Self::new(StatusCode::BAD_REQUEST, shape, code, m)
    }

    /// No such queue.
    pub fn no_queue() -> Self {
        let m = "The specified queue does not exist.".to_string();
        let code = "AWS.SimpleQueueService.NonExistentQueue";
        Self::new(StatusCode::BAD_REQUEST, "QueueDoesNotExist", code, m)
    }

    /// A queue of that name exists with other attributes.
    /// SQS's refusal of a `CreateQueue` that gives `attribute` another value than the
    /// existing queue of that name has.
    pub fn queue_exists(attribute: &str) -> Self {
        let m = format!(
            "A queue already exists with the same name and a different value for attribute \
             {attribute}"
        );
        Self::new(
            StatusCode::BAD_REQUEST,
            "QueueNameExists",
            "QueueAlreadyExists",
            m,
        )
    }

    /// A receipt handle that is not one, or no longer valid.
    pub fn bad_receipt(message: impl Into<String>) -> Self {
        let m = message.into();
        let (shape, code) = ("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid");
        Self::new(StatusCode::BAD_REQUEST, shape, code, m)
    }

    /// An attribute name SQS or crest does not have.
    pub fn bad_attribute(name: &str) -> Self {
        let m = format!("Unknown Attribute {name}.");
        Self::named(StatusCode::BAD_REQUEST, "InvalidAttributeName", m)
    }

    /// An attribute this queue cannot take, in SQS's words (`InvalidAttributeName`).
    pub fn named_attribute(message: String) -> Self {
        Self::named(StatusCode::BAD_REQUEST, "InvalidAttributeName", message)
    }

    /// A value an attribute cannot take, and why (SQS's `InvalidAttributeValue`).
    pub fn bad_attribute_value(name: &str, why: &str) -> Self {
        let m = format!("Invalid value for the parameter {name}. Reason: {why}.");
        Self::named(StatusCode::BAD_REQUEST, "InvalidAttributeValue", m)
    }

    /// A message body with characters SQS does not allow.
    pub fn bad_contents(message: impl Into<String>) -> Self {
        Self::named(StatusCode::BAD_REQUEST, "InvalidMessageContents", message)
    }

    /// A batch of more than 10 entries.
    pub fn too_many_entries(count: usize) -> Self {
        let m = format!("Maximum number of entries per request are 10. You have sent {count}.");
        let code = "AWS.SimpleQueueService.TooManyEntriesInBatchRequest";
        Self::new(
            StatusCode::BAD_REQUEST,
            "TooManyEntriesInBatchRequest",
            code,
            m,
        )
    }

    /// A second purge of queue `name` within a minute.
    pub fn purge_in_progress(name: &str) -> Self {
        let m = format!("Only one PurgeQueue operation on {name} is allowed every 60 seconds.");
        Self::sqs("PurgeQueueInProgress", m)
    }

    /// A batch whose messages come to `bytes`, past SQS's `max`.
    pub fn batch_too_long(max: usize, bytes: usize) -> Self {
        let m = format!(
            "Batch requests cannot be longer than {max} bytes. You have sent {bytes} bytes."
        );
        Self::sqs("BatchRequestTooLong", m)
    }

    /// A batch with no entries.
    pub fn empty_batch() -> Self {
        let m = "There should be at least one entry in the request.".to_string();
        Self::sqs("EmptyBatchRequest", m)
    }

    /// Two entries of a batch with one id.
    pub fn ids_not_distinct(id: &str) -> Self {
        let m = format!("Id {id} repeated.");
        Self::sqs("BatchEntryIdsNotDistinct", m)
    }

    /// A batch entry id that is not 1-80 of `[A-Za-z0-9_-]`.
    pub fn bad_entry_id() -> Self {
        let m = "A batch entry id can only contain alphanumeric characters, hyphens and \
                 underscores. It can be at most 80 letters long.";
        Self::sqs("InvalidBatchEntryId", m)
    }

    /// An operation the gateway does not offer.
    pub fn unsupported(what: &str) -> Self {
        let m = format!("{what} is not supported by crest's SQS API (see docs/sqs.md).");
        Self::sqs("UnsupportedOperation", m)
    }

    /// An action name SQS does not have.
    pub fn unknown_action(action: &str) -> Self {
        let m = format!("The action {action} is not valid for this endpoint.");
        Self::named(StatusCode::BAD_REQUEST, "InvalidAction", m)
    }

    /// A query-protocol request to a queue's URL that names no action (SQS answers 404).
    pub fn unknown_operation() -> Self {
        let m = "The request names no action.";
        Self::named(StatusCode::NOT_FOUND, "UnknownOperationException", m)
    }

    /// No signature, or not SigV4.
    pub fn unsigned(message: impl Into<String>) -> Self {
        Self::named(StatusCode::FORBIDDEN, "MissingAuthenticationToken", message)
    }

    /// A malformed signature.
    pub fn incomplete_signature(message: impl Into<String>) -> Self {
        Self::named(StatusCode::BAD_REQUEST, "IncompleteSignature", message)
    }

    /// An access key the gateway does not know.
    pub fn unknown_key() -> Self {
        let m = "The security token included in the request is invalid.".to_string();
        Self::named(StatusCode::FORBIDDEN, "InvalidClientTokenId", m)
    }

    /// A signature that does not match.
    pub fn signature_mismatch(message: String) -> Self {
        Self::named(StatusCode::FORBIDDEN, "SignatureDoesNotMatch", message)
    }

    /// A request signed too long ago (or ahead).
    pub fn expired(message: String) -> Self {
        Self::named(StatusCode::BAD_REQUEST, "RequestExpired", message)
    }

    /// An `x-amz-content-sha256` header that is not the body's hash.
    pub fn content_hash_mismatch(message: String) -> Self {
        Self::named(
            StatusCode::BAD_REQUEST,
            "XAmzContentSHA256Mismatch",
            message,
        )
    }

    /// A body larger than `gateway_body_bytes_max`.
    pub fn too_large(bytes_max: usize) -> Self {
        let m = format!(
            "The request body is larger than the gateway reads (gateway_body_bytes_max = \
             {bytes_max} bytes)."
        );
        Self::named(StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge", m)
    }

    /// A body not received within `gateway_body_timeout_ms`.
    pub fn body_timeout(timeout: std::time::Duration) -> Self {
        let m = format!(
            "The request body did not arrive within {} ms (gateway_body_timeout_ms).",
            timeout.as_millis()
        );
        Self::named(StatusCode::REQUEST_TIMEOUT, "RequestTimeout", m)
    }

    /// What the principal may not do in the namespace.
    pub fn denied(message: impl Into<String>) -> Self {
        Self::named(StatusCode::FORBIDDEN, "AccessDenied", message)
    }

    /// The tree refused or could not be reached; SDKs retry a `Receiver` fault.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::named(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            message,
        )
    }

    /// A bound of the tree's reached (e.g. its most topic configurations).
    pub fn over_limit(message: impl Into<String>) -> Self {
        Self::named(StatusCode::FORBIDDEN, "OverLimit", message)
    }

    /// No such resource (a message move task).
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::named(StatusCode::NOT_FOUND, "ResourceNotFoundException", message)
    }

    /// Too many requests at once for the gateway's bounds; SDKs back off and retry.
    pub fn throttled(message: impl Into<String>) -> Self {
        Self::named(StatusCode::BAD_REQUEST, "RequestThrottled", message)
    }

    /// The body as SQS's JSON protocol writes an error.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "__type": format!("com.amazonaws.sqs#{}", self.shape),
            "message": self.message,
        })
    }
}

impl IntoResponse for SqsError {
    fn into_response(self) -> Response {
        let fault = if self.sender { "Sender" } else { "Receiver" };
        let query = format!("{};{fault}", self.code);
        (
            self.status,
            [
                ("content-type", "application/x-amz-json-1.0".to_string()),
                ("x-amzn-query-error", query),
            ],
            self.json().to_string(),
        )
            .into_response()
    }
}

/// The SQS error for a failed call to the tree.
pub(crate) fn tree_error(error: ClientError) -> SqsError {
    match error {
        ClientError::Rejected { code, message } => match code {
            ErrorCode::Forbidden | ErrorCode::Unauthenticated => SqsError::denied(message),
            ErrorCode::InvalidArgument | ErrorCode::BatchTooLarge => SqsError::invalid(message),
            ErrorCode::Overloaded => SqsError::throttled(message),
            _ => SqsError::unavailable(format!("{code}: {message}")),
        },
        ClientError::Receipt(error) => receipt_error(error),
        ClientError::InvalidArgument(message) => SqsError::invalid(message),
        ClientError::QuotaExceeded(quota) => SqsError::over_limit(quota.to_string()),
        ClientError::RetryLater { message, .. } => SqsError::throttled(message),
        other => SqsError::unavailable(other.to_string()),
    }
}

/// The SQS error for a receipt the tree refused.
pub(crate) fn receipt_error(error: ReceiptError) -> SqsError {
    match error {
        ReceiptError::Unavailable | ReceiptError::TimedOut => {
            SqsError::unavailable(error.to_string())
        }
        ReceiptError::Forbidden => SqsError::denied(error.to_string()),
        other => SqsError::bad_receipt(format!("The receipt handle is not valid: {other}")),
    }
}
