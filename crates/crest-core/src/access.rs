//! Who may do what: namespaces, permissions and the principals that hold them.
//!
//! A topic lives in the namespace named before its first `/` (`orders/eu` is topic `orders/eu`
//! of namespace `orders`); a topic without `/` lives in [`DEFAULT_NAMESPACE`]. A principal
//! holds, per namespace (or `*` for every one), any of the permissions `produce`, `consume`
//! and `admin`. Nodes authenticate a client's connection and hand its [`Principal`] to their
//! machine ([`crate::machine::Machine::handle_principal`]); leaves then check `produce` on
//! every pushed message, the root `consume` on pops and `admin` on admin requests. A
//! connection the host gave no principal is the host's own (the simulator, core tests) and is
//! not checked: a node serving clients gives every client connection one.

use serde::{Deserialize, Serialize};
use siphasher::sip::SipHasher13;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::Hasher;
use std::str::FromStr;
use std::sync::Arc;

/// The namespace of topics whose name has no `/`.
pub const DEFAULT_NAMESPACE: &str = "default";
/// A grant on this namespace applies to every namespace.
pub const ANY_NAMESPACE: &str = "*";

/// The namespace `topic` lives in; a principal's scope (`@NAME`, its rates) lives in every
/// namespace ([`ANY_NAMESPACE`]): configuring it takes `admin` on `*`.
pub fn namespace(topic: &str) -> &str {
    if topic.starts_with('@') {
        return ANY_NAMESPACE;
    }
    topic
        .split_once('/')
        .map_or(DEFAULT_NAMESPACE, |(namespace, _)| namespace)
}

/// Longest principal name, in bytes.
pub const PRINCIPAL_NAME_BYTES_MAX: usize = 64;

/// Checks a principal's name: 1 to [`PRINCIPAL_NAME_BYTES_MAX`] letters, digits, `.`, `-`,
/// `_` or `@`.
///
/// # Errors
/// A message naming what is wrong.
pub fn check_principal_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-@".contains(c);
    if name.is_empty() || name.len() > PRINCIPAL_NAME_BYTES_MAX || !name.chars().all(allowed) {
        return Err(format!(
            "principal name {name:?}: 1 to {PRINCIPAL_NAME_BYTES_MAX} letters, digits, '.', '-', '_' or '@'"
        ));
    }
    Ok(())
}

/// What a principal may do in a namespace.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// Push messages to the namespace's topics.
    Produce,
    /// Pop the namespace's messages and settle (ack, nack, extend) their deliveries.
    Consume,
    /// List, redrive and purge dead letters; purge topics, move messages between them and
    /// configure them; settle leases by id; read the namespace's stats.
    Admin,
}

impl Permission {
    /// Every permission.
    pub const ALL: [Permission; 3] = [Permission::Produce, Permission::Consume, Permission::Admin];

    /// The permission's name as written in access files.
    pub fn name(self) -> &'static str {
        match self {
            Permission::Produce => "produce",
            Permission::Consume => "consume",
            Permission::Admin => "admin",
        }
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Permission {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Permission::ALL
            .into_iter()
            .find(|p| p.name() == text)
            .ok_or_else(|| {
                format!("unknown permission {text:?}: expected produce, consume or admin")
            })
    }
}

/// The permissions of one principal, by namespace ([`ANY_NAMESPACE`] for all).
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Grants(pub BTreeMap<String, Vec<Permission>>);

impl Grants {
    /// Every permission on every namespace.
    pub fn everything() -> Grants {
        Grants(BTreeMap::from([(
            ANY_NAMESPACE.to_string(),
            Permission::ALL.to_vec(),
        )]))
    }

    /// Whether these grants allow `permission` in `namespace`.
    pub fn allow(&self, namespace: &str, permission: Permission) -> bool {
        [namespace, ANY_NAMESPACE].iter().any(|ns| {
            self.0
                .get(*ns)
                .is_some_and(|granted| granted.contains(&permission))
        })
    }

    /// The grants a settlement is checked against, `None` when they allow `consume` in every
    /// namespace (nothing to check, and nothing to send with a `Confirm`).
    pub fn to_check_for_consume(&self) -> Option<&Grants> {
        (!self.allow(ANY_NAMESPACE, Permission::Consume)).then_some(self)
    }

    /// Whether these grants allow anything at all in `namespace`.
    pub fn any_in(&self, namespace: &str) -> bool {
        Permission::ALL
            .into_iter()
            .any(|permission| self.allow(namespace, permission))
    }

    /// Adds `permissions` on `namespace`.
    pub fn add(&mut self, namespace: &str, permissions: &[Permission]) {
        let granted = self.0.entry(namespace.to_string()).or_default();
        for permission in permissions {
            if !granted.contains(permission) {
                granted.push(*permission);
            }
        }
        granted.sort();
    }

    /// Parses `NAMESPACE:PERM[,PERM...]` (as `crest token create --grant` takes it).
    ///
    /// # Errors
    /// A message naming what is wrong.
    pub fn parse_one(text: &str) -> Result<(String, Vec<Permission>), String> {
        let (namespace, permissions) = text.split_once(':').ok_or_else(|| {
            format!("grant {text:?}: expected NAMESPACE:PERMISSION[,PERMISSION...]")
        })?;
        if namespace.is_empty() || namespace.contains('/') {
            return Err(format!(
                "grant {text:?}: a namespace is a non-empty name without '/' (or *)"
            ));
        }
        let permissions = permissions
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<Permission>, String>>()?;
        Ok((namespace.to_string(), permissions))
    }
}

/// An authenticated client: its name, what it may do, and the key that binds the receipts
/// delivered to it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Principal {
    /// The principal's name (its token's owner, or its client certificate's name).
    pub name: Arc<str>,
    /// Its permissions.
    pub grants: Grants,
    /// Masks the lease tokens of the receipts the root delivers to this principal; a receipt
    /// settled by another principal is unmasked with that one's key into a token its leaf
    /// never issued. `None`: receipts are not bound (a tree without access control).
    pub receipt_key: Option<[u8; 16]>,
}

impl Principal {
    /// The principal of a tree without access control: may do everything, receipts unbound.
    pub fn anonymous() -> Principal {
        Principal {
            name: "anonymous".into(),
            grants: Grants::everything(),
            receipt_key: None,
        }
    }

    /// Whether this principal may do `permission` on `topic`'s namespace.
    pub fn may(&self, topic: &str, permission: Permission) -> bool {
        self.grants.allow(namespace(topic), permission)
    }

    /// The refusal text of `permission` on `topic`.
    pub fn refusal(&self, topic: &str, permission: Permission) -> String {
        format!(
            "principal {:?} may not {permission} in namespace {:?}",
            self.name,
            namespace(topic)
        )
    }

    /// The mask XORed onto the lease token of message `id` delivered to this principal (0
    /// when receipts are not bound). Masking twice with the same key gives the token back.
    pub fn receipt_mask(&self, id: crate::id::MessageId) -> u64 {
        let Some(key) = self.receipt_key else {
            return 0;
        };
        let mut hasher = SipHasher13::new_with_key(&key);
        hasher.write_u64(id.0);
        hasher.finish()
    }
}

/// How many requests each principal has waiting, against a cap ([`Settings`]'s
/// `principal_*_max`).
///
/// [`Settings`]: crate::config::Settings
#[derive(Default, Debug)]
pub struct Tally(std::collections::HashMap<Arc<str>, u32>);

impl Tally {
    /// Counts one more request of `principal` unless it holds `max` already (`None`, a
    /// connection without a principal, is not counted).
    pub fn take(&mut self, principal: Option<&Arc<str>>, max: u32) -> bool {
        let Some(name) = principal else {
            return true;
        };
        let held = self.0.entry(name.clone()).or_default();
        if *held >= max {
            return false;
        }
        *held += 1;
        true
    }

    /// Counts one request of `principal` fewer.
    pub fn give(&mut self, principal: Option<&Arc<str>>) {
        let Some(name) = principal else {
            return;
        };
        if let Some(held) = self.0.get_mut(name) {
            *held -= 1;
            if *held == 0 {
                self.0.remove(name);
            }
        }
    }
}

/// The refusal of a request over a principal's cap.
pub(crate) fn over_cap(principal: &str, what: &str, setting: &str, max: u32) -> String {
    format!("principal {principal:?} has {max} {what} waiting already ({setting}); retry")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::MessageId;

    #[test]
    fn topics_without_a_slash_are_in_the_default_namespace() {
        assert_eq!(namespace("jobs"), DEFAULT_NAMESPACE);
        assert_eq!(namespace("orders/eu"), "orders");
        assert_eq!(namespace("orders/eu/late"), "orders");
    }

    #[test]
    fn grants_apply_to_their_namespace_and_the_wildcard_to_all() {
        let mut grants = Grants::default();
        grants.add("orders", &[Permission::Produce]);
        grants.add("*", &[Permission::Consume]);
        assert!(grants.allow("orders", Permission::Produce));
        assert!(!grants.allow("billing", Permission::Produce));
        assert!(grants.allow("billing", Permission::Consume));
        assert!(!grants.allow("orders", Permission::Admin));
        assert!(grants.any_in("billing"));
        assert!(!Grants::default().any_in("orders"));
    }

    #[test]
    fn a_grant_is_parsed_or_refused_with_a_reason() {
        assert_eq!(
            Grants::parse_one("orders:produce,consume").unwrap(),
            (
                "orders".to_string(),
                vec![Permission::Produce, Permission::Consume]
            )
        );
        assert!(
            Grants::parse_one("orders")
                .unwrap_err()
                .contains("NAMESPACE:")
        );
        assert!(
            Grants::parse_one("orders:write")
                .unwrap_err()
                .contains("unknown permission")
        );
        assert!(Grants::parse_one("a/b:admin").unwrap_err().contains("'/'"));
    }

    #[test]
    fn receipt_masks_differ_by_principal_and_undo_themselves() {
        let principal = |key: u8| Principal {
            name: format!("p{key}").into(),
            grants: Grants::default(),
            receipt_key: Some([key; 16]),
        };
        let (a, b) = (principal(1), principal(2));
        let id = MessageId(42);
        let token = 0x1234_5678_9abc_def0_u64;
        let masked = token ^ a.receipt_mask(id);
        assert_ne!(masked, token);
        assert_eq!(masked ^ a.receipt_mask(id), token);
        assert_ne!(masked ^ b.receipt_mask(id), token);
        assert_eq!(Principal::anonymous().receipt_mask(id), 0);
    }
}
