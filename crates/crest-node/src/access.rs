//! The access file: principals, their grants per namespace, and their API tokens, stored
//! hashed. `crest token create/list/revoke` edit it; nodes read it at start and again on
//! `SIGHUP` ([`crate::NodeHandle::reload_access`]).
//!
//! A token is `crest_ID_SECRET`: `ID` (16 hex digits) names it in listings and revocations,
//! `SECRET` (64 hex digits, 256 random bits) proves it. The file keeps only the SHA-256 of the
//! secret: a secret of 256 random bits cannot be guessed from its hash, so a slow password
//! hash would add nothing but work on every connection.
//!
//! The file also holds the receipt key: each principal's receipt mask key is derived from it
//! (HMAC-SHA-256 over the principal's name), so a root restarted, or a standby root, unmasks
//! the receipts its predecessor delivered.

use crest_core::access::{Grants, Principal, check_principal_name};
use ring::{digest, hmac};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Most principals an access file may hold.
pub const PRINCIPALS_MAX: usize = 10_000;
/// Most tokens an access file may hold.
pub const TOKENS_MAX: usize = 100_000;
/// Largest access file read, in bytes.
pub const ACCESS_FILE_BYTES_MAX: u64 = 64 << 20;
/// How every token starts.
pub const TOKEN_PREFIX: &str = "crest_";

/// One principal of the access file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrincipalEntry {
    /// Its permissions by namespace (`*`: every namespace).
    #[serde(default)]
    pub grants: Grants,
}

/// One API token of the access file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenEntry {
    /// The token's public id (16 hex digits).
    pub id: String,
    /// The principal it authenticates.
    pub principal: String,
    /// SHA-256 of the token's secret, in hex.
    pub sha256: String,
    /// When it was created, in seconds since the Unix epoch.
    pub created: u64,
}

/// The access file's contents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessFile {
    /// 32 random bytes in hex: receipt masks are derived from it.
    pub receipt_key: String,
    /// Principals by name.
    #[serde(default)]
    pub principals: BTreeMap<String, PrincipalEntry>,
    /// API tokens.
    #[serde(default)]
    pub tokens: Vec<TokenEntry>,
}

/// Why an access file was refused.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// The file could not be read or written.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        error: std::io::Error,
    },
    /// The file is not a valid access file.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// The file in a local tree's data directory that keeps its receipt key: leases outlive a
/// restart of their leaf, and their receipts must too.
pub const RECEIPT_KEY_FILE: &str = "receipt-key";

/// The receipt key kept in `dir` ([`RECEIPT_KEY_FILE`]), or `fresh` written there (readable by
/// its owner only) when there is none yet.
///
/// # Errors
/// [`crate::NodeError::Io`] if the file cannot be read or written, or holds no valid key.
pub fn kept_receipt_key(dir: &std::path::Path, fresh: &str) -> Result<String, crate::NodeError> {
    let path = dir.join(RECEIPT_KEY_FILE);
    let io = |error: std::io::Error| crate::NodeError::Io {
        path: path.display().to_string(),
        error,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let key = text.trim().to_string();
            if unhex(&key).is_none_or(|bytes| bytes.len() != 32) {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "not a receipt key (64 hex digits)",
                )));
            }
            Ok(key)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::create_dir_all(dir).map_err(io)?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(io)?;
            writeln!(file, "{fresh}")
                .and_then(|()| file.sync_all())
                .map_err(io)?;
            Ok(fresh.to_string())
        }
        Err(error) => Err(io(error)),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    rand::fill(&mut bytes[..]);
    bytes
}

fn sha256_hex(secret: &str) -> String {
    hex(digest::digest(&digest::SHA256, secret.as_bytes()).as_ref())
}

/// Compares without stopping at the first difference, so the time taken tells nothing of
/// how much of a stored hash a guess got right.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl AccessFile {
    /// An empty access file with a fresh receipt key.
    pub fn new() -> AccessFile {
        AccessFile {
            receipt_key: hex(&random_bytes::<32>()),
            principals: BTreeMap::new(),
            tokens: Vec::new(),
        }
    }

    /// Parses and checks an access file's text.
    ///
    /// # Errors
    /// What is wrong, as text.
    pub fn parse(text: &str) -> Result<AccessFile, String> {
        let file: AccessFile = toml::from_str(text).map_err(|e| e.to_string())?;
        file.check()?;
        Ok(file)
    }

    fn check(&self) -> Result<(), String> {
        if unhex(&self.receipt_key).is_none_or(|key| key.len() != 32) {
            return Err("receipt_key must be 64 hex digits".into());
        }
        if self.principals.len() > PRINCIPALS_MAX {
            return Err(format!("more than {PRINCIPALS_MAX} principals"));
        }
        if self.tokens.len() > TOKENS_MAX {
            return Err(format!("more than {TOKENS_MAX} tokens"));
        }
        for (name, entry) in &self.principals {
            check_principal_name(name)?;
            for namespace in entry.grants.0.keys() {
                if namespace.is_empty() || namespace.contains('/') {
                    return Err(format!(
                        "principal {name:?}: namespace {namespace:?} must be a non-empty name without '/' (or *)"
                    ));
                }
            }
        }
        let mut ids = std::collections::HashSet::new();
        for token in &self.tokens {
            if token.id.len() != 16 || unhex(&token.id).is_none() {
                return Err(format!("token id {:?} must be 16 hex digits", token.id));
            }
            if !ids.insert(token.id.as_str()) {
                return Err(format!("token id {:?} appears twice", token.id));
            }
            if unhex(&token.sha256).is_none_or(|hash| hash.len() != 32) {
                return Err(format!("token {}: sha256 must be 64 hex digits", token.id));
            }
            if !self.principals.contains_key(&token.principal) {
                return Err(format!(
                    "token {} names principal {:?}, which has no [principals.{}] entry",
                    token.id, token.principal, token.principal
                ));
            }
        }
        Ok(())
    }

    /// Reads and checks the access file at `path`.
    ///
    /// # Errors
    /// [`AccessError`] naming the file.
    pub fn load(path: &Path) -> Result<AccessFile, AccessError> {
        let io = |error| AccessError::Io {
            path: path.display().to_string(),
            error,
        };
        let size = std::fs::metadata(path).map_err(io)?.len();
        if size > ACCESS_FILE_BYTES_MAX {
            return Err(AccessError::Invalid {
                path: path.display().to_string(),
                reason: format!("{size} bytes exceed {ACCESS_FILE_BYTES_MAX}"),
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        AccessFile::parse(&text).map_err(|reason| AccessError::Invalid {
            path: path.display().to_string(),
            reason,
        })
    }

    /// Writes the file to `path` (readable by its owner only), replacing it whole: a node
    /// reading it at the same moment sees the old or the new file, never half of one.
    ///
    /// # Errors
    /// [`AccessError::Io`] naming the file.
    pub fn save(&self, path: &Path) -> Result<(), AccessError> {
        use std::io::Write;
        let io = |error| AccessError::Io {
            path: path.display().to_string(),
            error,
        };
        let text = format!(
            "# crest access file: principals, their grants, and their API tokens (hashed).\n\
             # Edit grants here; create and revoke tokens with `crest token`. Nodes re-read it on SIGHUP.\n{}",
            toml::to_string(self).map_err(|e| io(std::io::Error::other(e)))?
        );
        let temporary = path.with_extension("tmp");
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&temporary).map_err(io)?;
        file.write_all(text.as_bytes()).map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&temporary, path).map_err(io)
    }

    /// Adds `grants` to principal `name`, creating it if new.
    ///
    /// # Errors
    /// The name is not a principal's name.
    pub fn grant(&mut self, name: &str, grants: &Grants) -> Result<(), String> {
        check_principal_name(name)?;
        if !self.principals.contains_key(name) && self.principals.len() >= PRINCIPALS_MAX {
            return Err(format!(
                "the file holds {PRINCIPALS_MAX} principals already"
            ));
        }
        let entry = self.principals.entry(name.to_string()).or_default();
        for (namespace, permissions) in &grants.0 {
            entry.grants.add(namespace, permissions);
        }
        Ok(())
    }

    /// Creates a token for principal `name` (which must exist) and returns it: the only time
    /// it is shown.
    ///
    /// # Errors
    /// The principal does not exist, or the file holds [`TOKENS_MAX`] tokens.
    pub fn create_token(&mut self, name: &str, created: u64) -> Result<String, String> {
        if !self.principals.contains_key(name) {
            return Err(format!("no principal {name:?}"));
        }
        if self.tokens.len() >= TOKENS_MAX {
            return Err(format!("the file holds {TOKENS_MAX} tokens already"));
        }
        let id = loop {
            let id = hex(&random_bytes::<8>());
            if self.tokens.iter().all(|t| t.id != id) {
                break id;
            }
        };
        let secret = hex(&random_bytes::<32>());
        self.tokens.push(TokenEntry {
            id: id.clone(),
            principal: name.to_string(),
            sha256: sha256_hex(&secret),
            created,
        });
        Ok(format!("{TOKEN_PREFIX}{id}_{secret}"))
    }

    /// Removes the token with id `id`; whether there was one.
    pub fn revoke(&mut self, id: &str) -> bool {
        let before = self.tokens.len();
        self.tokens.retain(|t| t.id != id);
        self.tokens.len() < before
    }
}

impl Default for AccessFile {
    fn default() -> Self {
        AccessFile::new()
    }
}

/// Who a client proved to be, kept per connection so that a reloaded access file can be
/// applied to connections already open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Credential {
    /// The token with this id.
    Token(String),
    /// A client certificate naming this principal.
    Certificate(String),
}

/// What nodes check clients against: an access file, ready to use.
#[derive(Clone, Debug)]
pub struct Access {
    file: Arc<AccessFile>,
    receipt_key: hmac::Key,
}

impl Access {
    /// Ready-to-use access control from `file` (checked already by [`AccessFile::parse`] or
    /// [`AccessFile::load`]).
    pub fn new(file: AccessFile) -> Access {
        let key = unhex(&file.receipt_key).unwrap_or_default();
        Access {
            receipt_key: hmac::Key::new(hmac::HMAC_SHA256, &key),
            file: Arc::new(file),
        }
    }

    /// Reads `path` ([`AccessFile::load`]).
    ///
    /// # Errors
    /// As [`AccessFile::load`].
    pub fn load(path: &Path) -> Result<Access, AccessError> {
        AccessFile::load(path).map(Access::new)
    }

    /// The principal named `name`, with its grants and receipt key.
    fn principal(&self, name: &str) -> Option<Principal> {
        let entry = self.file.principals.get(name)?;
        let tag = hmac::sign(&self.receipt_key, name.as_bytes());
        let mut receipt_key = [0u8; 16];
        receipt_key.copy_from_slice(&tag.as_ref()[..16]);
        Some(Principal {
            name: name.into(),
            grants: entry.grants.clone(),
            receipt_key: Some(receipt_key),
        })
    }

    /// Checks `token` and returns the credential it is.
    pub(crate) fn check_token(&self, token: &str) -> Result<Credential, String> {
        let malformed = || "the token is malformed (expected crest_ID_SECRET)".to_string();
        let rest = token.strip_prefix(TOKEN_PREFIX).ok_or_else(malformed)?;
        let (id, secret) = rest.split_once('_').ok_or_else(malformed)?;
        let entry = self
            .file
            .tokens
            .iter()
            .find(|t| t.id == id)
            .ok_or_else(|| format!("token {id} is unknown or revoked"))?;
        let stored = unhex(&entry.sha256).unwrap_or_default();
        let given = digest::digest(&digest::SHA256, secret.as_bytes());
        if !same(&stored, given.as_ref()) {
            return Err(format!("token {id}: wrong secret"));
        }
        Ok(Credential::Token(id.to_string()))
    }

    /// The principal `credential` stands for now (`Err`: it no longer stands for anyone).
    pub(crate) fn resolve(&self, credential: &Credential) -> Result<Principal, String> {
        match credential {
            Credential::Token(id) => {
                let entry = self
                    .file
                    .tokens
                    .iter()
                    .find(|t| &t.id == id)
                    .ok_or_else(|| format!("token {id} was revoked"))?;
                self.principal(&entry.principal)
                    .ok_or_else(|| format!("principal {:?} was removed", entry.principal))
            }
            Credential::Certificate(name) => self.principal(name).ok_or_else(|| {
                format!("the client certificate names principal {name:?}, which the access file does not hold")
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with_alice() -> (AccessFile, String) {
        let mut file = AccessFile::new();
        let (namespace, permissions) = Grants::parse_one("orders:produce").unwrap();
        let mut grants = Grants::default();
        grants.add(&namespace, &permissions);
        file.grant("alice", &grants).unwrap();
        let token = file.create_token("alice", 1).unwrap();
        (file, token)
    }

    #[test]
    fn a_token_authenticates_its_principal_until_revoked() {
        let (mut file, token) = file_with_alice();
        assert!(
            !file.tokens[0]
                .sha256
                .contains(&token[TOKEN_PREFIX.len() + 17..])
        );
        let access = Access::new(file.clone());
        let credential = access.check_token(&token).unwrap();
        let principal = access.resolve(&credential).unwrap();
        assert_eq!(&*principal.name, "alice");
        assert!(principal.may("orders/eu", crest_core::access::Permission::Produce));
        let id = file.tokens[0].id.clone();
        assert!(file.revoke(&id));
        let access = Access::new(file);
        assert!(access.check_token(&token).unwrap_err().contains("revoked"));
        assert!(access.resolve(&credential).unwrap_err().contains("revoked"));
    }

    #[test]
    fn wrong_and_malformed_tokens_are_refused_with_a_reason() {
        let (file, token) = file_with_alice();
        let access = Access::new(file);
        let mut wrong = token.clone();
        let last = wrong.pop().unwrap();
        wrong.push(if last == '0' { '1' } else { '0' });
        assert!(
            access
                .check_token(&wrong)
                .unwrap_err()
                .contains("wrong secret")
        );
        for malformed in ["", "crest_", "token", "crest_nosecret"] {
            assert!(access.check_token(malformed).is_err(), "{malformed}");
        }
    }

    #[test]
    fn an_access_file_round_trips_and_bad_ones_are_refused() {
        let (file, _) = file_with_alice();
        let text = toml::to_string(&file).unwrap();
        assert_eq!(AccessFile::parse(&text).unwrap(), file);
        let orphan = text.replace("principal = \"alice\"", "principal = \"bob\"");
        assert!(AccessFile::parse(&orphan).unwrap_err().contains("bob"));
        let short_key = text.replace(&file.receipt_key, "abcd");
        assert!(
            AccessFile::parse(&short_key)
                .unwrap_err()
                .contains("receipt_key")
        );
        assert!(AccessFile::parse("receipt_key = 1").is_err());
    }

    #[test]
    fn receipt_keys_differ_by_principal_and_follow_the_file_s_key() {
        let (mut file, _) = file_with_alice();
        file.grant("bob", &Grants::default()).unwrap();
        let access = Access::new(file.clone());
        let alice = access.principal("alice").unwrap().receipt_key;
        let bob = access.principal("bob").unwrap().receipt_key;
        assert_ne!(alice, bob);
        assert_eq!(
            Access::new(file.clone())
                .principal("alice")
                .unwrap()
                .receipt_key,
            alice
        );
        file.receipt_key = AccessFile::new().receipt_key;
        assert_ne!(
            Access::new(file).principal("alice").unwrap().receipt_key,
            alice
        );
    }
}
