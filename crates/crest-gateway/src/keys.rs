//! The keys file of `crest gateway`: each SQS access key with its secret, its namespace and
//! the crest credential it acts with.
//!
//! ```toml
//! [[key]]
//! id = "AKIACRESTORDERS00001"
//! secret = "a long random secret"
//! namespace = "orders"               # default: "default"
//! token = "crest_..."                # or: credentials = "certs/orders.pem"
//! ```
//!
//! The file holds secrets: keep it readable by the gateway's user only.

use crate::AccessKey;
use crest_sdk::Credential;
use serde::Deserialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Most keys one file may hold.
pub const KEYS_MAX: usize = 10_000;
/// Largest keys file read, in bytes.
pub const KEYS_FILE_BYTES_MAX: u64 = 16 << 20;

/// What is wrong with a keys file.
#[derive(Debug, thiserror::Error)]
#[error("keys file {path}: {problem}")]
pub struct KeysError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong, naming the key.
    pub problem: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    key: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    id: String,
    secret: String,
    namespace: Option<String>,
    token: Option<String>,
    credentials: Option<PathBuf>,
}

/// Reads the keys of the file at `path` (a `credentials` path is relative to the file).
///
/// # Errors
/// The file is unreadable, too large, not TOML of this form, or a key is invalid: an empty
/// id or secret, an id twice, a bad namespace, both or neither of `token` and
/// `credentials`, or credentials that cannot be read.
pub fn load(path: &Path) -> Result<Vec<AccessKey>, KeysError> {
    let error = |problem: String| KeysError {
        path: path.to_path_buf(),
        problem,
    };
    let size = std::fs::metadata(path)
        .map_err(|e| error(e.to_string()))?
        .len();
    if size > KEYS_FILE_BYTES_MAX {
        return Err(error(format!("larger than {KEYS_FILE_BYTES_MAX} bytes")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    let file: File = toml::from_str(&text).map_err(|e| error(e.to_string()))?;
    if file.key.is_empty() {
        return Err(error("no [[key]]".into()));
    }
    if file.key.len() > KEYS_MAX {
        return Err(error(format!("more than {KEYS_MAX} keys")));
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let mut ids = BTreeSet::new();
    let mut keys = Vec::with_capacity(file.key.len());
    for entry in file.key {
        let name = entry.id.clone();
        let bad = |problem: &str| error(format!("key {name:?}: {problem}"));
        if entry.id.is_empty() || entry.secret.is_empty() {
            return Err(bad("an empty id or secret"));
        }
        if !ids.insert(entry.id.clone()) {
            return Err(bad("listed twice"));
        }
        let namespace = entry
            .namespace
            .unwrap_or_else(|| crest_core::access::DEFAULT_NAMESPACE.to_string());
        crate::queues::QueueName::checked(&namespace, "q").map_err(|_| {
            bad(&format!(
                "namespace {namespace:?} is not 1-80 of [A-Za-z0-9_-]"
            ))
        })?;
        let credential = match (entry.token, entry.credentials) {
            (Some(token), None) => Credential::Token(token),
            (None, Some(file)) => {
                Credential::from_file(base.join(file)).map_err(|e| bad(&e.to_string()))?
            }
            _ => return Err(bad("give exactly one of token and credentials")),
        };
        keys.push(AccessKey {
            id: entry.id,
            secret: entry.secret,
            namespace,
            credential,
        });
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(text: &str) -> Result<Vec<AccessKey>, KeysError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        std::fs::write(&path, text).unwrap();
        load(&path)
    }

    #[test]
    fn keys_are_read_with_their_namespace_and_credential() {
        let keys = load_text(
            "[[key]]\nid = \"A\"\nsecret = \"s\"\ntoken = \"crest_x\"\n\
             [[key]]\nid = \"B\"\nsecret = \"t\"\nnamespace = \"orders\"\ntoken = \"crest_y\"\n",
        )
        .unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].namespace, "default");
        assert_eq!(keys[1].namespace, "orders");
        assert!(matches!(&keys[1].credential, Credential::Token(t) if t == "crest_y"));
    }

    #[test]
    fn bad_keys_files_are_refused_naming_the_problem() {
        for (text, expected) in [
            ("", "no [[key]]"),
            (
                "[[key]]\nid = \"A\"\nsecret = \"\"\ntoken = \"t\"\n",
                "empty id or secret",
            ),
            (
                "[[key]]\nid = \"A\"\nsecret = \"s\"\ntoken = \"t\"\n\
                 [[key]]\nid = \"A\"\nsecret = \"s\"\ntoken = \"t\"\n",
                "listed twice",
            ),
            (
                "[[key]]\nid = \"A\"\nsecret = \"s\"\n",
                "exactly one of token",
            ),
            (
                "[[key]]\nid = \"A\"\nsecret = \"s\"\ntoken = \"t\"\nnamespace = \"a/b\"\n",
                "namespace",
            ),
            (
                "[[key]]\nid = \"A\"\nsecret = \"s\"\ntoken = \"t\"\nextra = 1\n",
                "unknown field",
            ),
        ] {
            let error = load_text(text).unwrap_err().to_string();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
    }
}
