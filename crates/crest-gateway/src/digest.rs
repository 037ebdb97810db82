//! The MD5 digests SQS answers with, computed exactly as SQS does: AWS SDKs check them
//! against what they sent and received.
//!
//! `MD5OfMessageBody` is the MD5 of the body's UTF-8 bytes. `MD5OfMessageAttributes` is the
//! MD5 of the attributes sorted by name, each encoded as its name, its data type (each as a
//! 4-byte big-endian length and the UTF-8 bytes), a transport byte (1: a string value, 2: a
//! binary one) and its value (length and bytes).
//! Reference: <https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-message-metadata.html>.

use md5::{Digest, Md5};

/// One message attribute's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttributeValue {
    /// A `String` or `Number` (or custom `String.x`, `Number.x`) value.
    Text(String),
    /// A `Binary` (or `Binary.x`) value.
    Binary(Vec<u8>),
}

/// A message attribute: its data type (`String`, `Number`, `Binary`, with an optional custom
/// suffix) and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attribute {
    /// `String`, `Number`, `Binary`, or one of them with `.suffix`.
    pub data_type: String,
    /// The value.
    pub value: AttributeValue,
}

/// `MD5OfMessageBody`.
pub fn md5_of_body(body: &str) -> String {
    crate::sigv4::hex(&Md5::digest(body.as_bytes()))
}

/// `MD5OfMessageAttributes` of `attributes` (any order; `None` when there are none).
pub fn md5_of_attributes<'a>(
    attributes: impl IntoIterator<Item = (&'a str, &'a Attribute)>,
) -> Option<String> {
    let mut sorted: Vec<(&str, &Attribute)> = attributes.into_iter().collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut md5 = Md5::new();
    let field = |md5: &mut Md5, bytes: &[u8]| {
        md5.update((bytes.len() as u32).to_be_bytes());
        md5.update(bytes);
    };
    for (name, attribute) in sorted {
        field(&mut md5, name.as_bytes());
        field(&mut md5, attribute.data_type.as_bytes());
        match &attribute.value {
            AttributeValue::Text(text) => {
                md5.update([1u8]);
                field(&mut md5, text.as_bytes());
            }
            AttributeValue::Binary(bytes) => {
                md5.update([2u8]);
                field(&mut md5, bytes);
            }
        }
    }
    Some(crate::sigv4::hex(&md5.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_s_digest_is_its_md5() {
        // RFC 1321's test vectors.
        assert_eq!(md5_of_body(""), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(md5_of_body("abc"), "900150983cd24fb0d6963f7d28e17f72");
    }

    #[test]
    fn attributes_are_digested_sorted_with_lengths_and_transport_bytes() {
        let text = |t: &str, v: &str| Attribute {
            data_type: t.into(),
            value: AttributeValue::Text(v.into()),
        };
        let a = text("String", "x");
        let b = text("Number", "1");
        let one = md5_of_attributes([("b", &b), ("a", &a)]);
        let other = md5_of_attributes([("a", &a), ("b", &b)]);
        assert_eq!(one, other, "order does not matter");
        // The same bytes built by hand.
        let mut bytes = Vec::new();
        for part in [&b"a"[..], b"String"] {
            bytes.extend((part.len() as u32).to_be_bytes());
            bytes.extend(part);
        }
        bytes.extend([1, 0, 0, 0, 1, b'x']);
        for part in [&b"b"[..], b"Number"] {
            bytes.extend((part.len() as u32).to_be_bytes());
            bytes.extend(part);
        }
        bytes.extend([1, 0, 0, 0, 1, b'1']);
        assert_eq!(one.unwrap(), crate::sigv4::hex(&Md5::digest(&bytes)));
        assert_eq!(md5_of_attributes(std::iter::empty()), None);
    }
}
