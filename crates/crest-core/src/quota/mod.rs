//! Quotas: limits on what a namespace, or one topic, holds in the whole tree (messages, payload
//! bytes) and on its largest message, enforced by allowances the root grants the leaves.
//!
//! # Scopes
//! Limits live in a topic configuration (`TopicConfig::limits`), kept by the tree like
//! the rest of it: on a topic's own configuration, or on the one named `NS/`, the *namespace
//! scope* of namespace `NS` (a topic name cannot end in `/`). A message counts in both its
//! topic's scope and its namespace's; what a scope holds is its messages in every state but
//! acknowledged: ready, delayed, in flight, dead letters, and pushes waiting for the log.
//!
//! # Allowances
//! Messages enter at any leaf, so no leaf alone can tell whether a push passes a quota. Each
//! leaf reports every limited scope to the root ([`Usage`], every `quota_report_ms`, and at
//! once when a push finds its allowance short): what it holds (`used`), what the root granted
//! it so far (`granted`, a running total) and how much of that it has consumed (`taken`:
//! admitted, or given back unused). Over the leaves, `used + granted − taken` bounds what the
//! scope can come to hold if every leaf spends what it was granted; the root grants more
//! ([`Grant`], running totals, so a lost or repeated grant does no harm) only while that bound
//! stays within the limit, and a leaf admits a push batch only within its allowance. So the
//! tree never holds more than a quota, except through:
//! - messages that enter a topic without a push: a dead-letter topic's, a move task's
//!   (they stay within their namespace, whose total they do not change);
//! - a root restart while a leaf is down: the new root learns each leaf's usage from its
//!   reports, and a leaf that does not report is not counted until it does.
//!
//! The cost is early refusals near a limit: a leaf's push may be refused while other leaves
//! hold allowance they have not used yet. A busy leaf asks for about two report intervals of
//! its recent admissions (at least `quota_grant_messages_min` / `quota_grant_bytes_min`); an
//! idle one gives its allowance back at its next report. A scope whose limits are new is asked
//! for ahead (that least, of limits at least eight times as large, granted only that far from
//! them), so that the first push after a configuration does not wait for the root.
//!
//! # Principals and pops
//! A principal's rates are the scope `@NAME` (a topic name cannot start with `@`): a leaf
//! charges it every message of a batch its connection's principal pushes. Pop rates are kept by
//! the root alone, which serves every pop ([`Ledger::take_pops`]): a pop takes up to its `max`
//! tokens of each scope it counts in when it arrives and gives back the unused ones when it is
//! answered. In-flight quotas are the root's too: leaves report what each scope has leased,
//! the root adds what it delivered since and what waiting pops may take, and a pop takes at
//! most the room left. Topic quotas count the union of the names the leaves hold
//! (`topics` module): a leaf asks before it holds a topic new to it.
//!
//! Counters are per leaf incarnation ([`Usage::epoch`]): a restarted leaf, or a replicated
//! leaf's new leader, starts with nothing granted, and the root forgets what it granted the
//! former one. A changed limit takes effect at once: each leaf gives back what it was granted
//! under the old one.

use crate::id::LeafId;
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::Duration;

/// Most limited scopes a [`Usage`] or [`Grant`] carries, and so the ceiling of the
/// `quota_scopes_max` setting.
pub const QUOTA_SCOPES_MAX: usize = 4096;

/// Most topic names one scope of a [`Usage`] or [`Grant`] carries (the ceiling of a leaf's
/// `topics_max`).
pub const QUOTA_TOPICS_MAX: usize = 65_536;

/// What a leaf holds, for its usage report: per limited scope, messages and bytes, messages in
/// flight, and (for scopes with `topics_max`) its topics.
#[derive(Debug, Default)]
pub struct Holdings {
    /// Messages and payload bytes held.
    pub used: HashMap<String, Amount>,
    /// Messages leased.
    pub in_flight: HashMap<String, u64>,
    /// Topics held.
    pub topics: HashMap<String, Vec<String>>,
}

/// The scope of namespace `namespace`'s limits: its name and a `/`.
pub fn namespace_scope(namespace: &str) -> String {
    format!("{namespace}/")
}

/// The namespace a scope name is the scope of, if it is a namespace scope.
pub fn scope_namespace(scope: &str) -> Option<&str> {
    scope.strip_suffix('/')
}

/// The scope of principal `principal`'s rates: `@` and its name (a topic name cannot start
/// with `@`).
pub fn principal_scope(principal: &str) -> String {
    format!("@{principal}")
}

/// The principal a scope name is the scope of, if it is a principal scope.
pub fn scope_principal(scope: &str) -> Option<&str> {
    scope.strip_prefix('@')
}

/// What a scope may hold (each `None`: no limit).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct Limits {
    /// Most messages held in the whole tree.
    pub messages_max: Option<u64>,
    /// Most payload bytes held in the whole tree.
    pub bytes_max: Option<u64>,
    /// Largest payload of one message, in bytes.
    pub message_bytes_max: Option<u64>,
    /// Messages pushed per second, over the whole tree.
    #[serde(default)]
    pub push_rate: Option<Rate>,
    /// Payload bytes pushed per second, over the whole tree.
    #[serde(default)]
    pub push_bytes_rate: Option<Rate>,
    /// Messages popped per second, over the whole tree (the root serves every pop).
    #[serde(default)]
    pub pop_rate: Option<Rate>,
    /// Most messages in flight (delivered, neither acknowledged, nacked nor expired) in the
    /// whole tree.
    #[serde(default)]
    pub in_flight_max: Option<u64>,
    /// Most topics of a namespace holding messages in the whole tree (a namespace's limit).
    #[serde(default)]
    pub topics_max: Option<u64>,
}

/// A rate: `per_second` on average, at most `burst` at once (a token bucket of `burst`
/// tokens filled at `per_second`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Rate {
    /// Sustained rate.
    pub per_second: u64,
    /// Most taken at once after a quiet time.
    pub burst: u64,
}

impl Rate {
    /// `per_second` with `burst`, which defaults to one second's worth (`None`: no rate).
    pub fn of(per_second: Option<u64>, burst: Option<u64>) -> Option<Rate> {
        per_second.map(|per_second| Rate {
            per_second,
            burst: burst.unwrap_or(per_second),
        })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s burst {}", self.per_second, self.burst)
    }
}

impl Limits {
    /// No limit set.
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// The limit on `which`, if one is set (a rate's per second).
    pub fn of(&self, which: Quota) -> Option<u64> {
        match which {
            Quota::Messages => self.messages_max,
            Quota::Bytes => self.bytes_max,
            Quota::MessageBytes => self.message_bytes_max,
            Quota::PushRate => self.push_rate.map(|r| r.per_second),
            Quota::PushBytesRate => self.push_bytes_rate.map(|r| r.per_second),
            Quota::PopRate => self.pop_rate.map(|r| r.per_second),
            Quota::InFlight => self.in_flight_max,
            Quota::Topics => self.topics_max,
        }
    }

    /// The rate `which` is, if it is a rate and set.
    pub fn rate(&self, which: Quota) -> Option<Rate> {
        match which {
            Quota::PushRate => self.push_rate,
            Quota::PushBytesRate => self.push_bytes_rate,
            Quota::PopRate => self.pop_rate,
            _ => None,
        }
    }

    /// Checks that each limit set is at least 1.
    ///
    /// # Errors
    /// A sentence naming the limit.
    pub fn check(&self) -> Result<(), String> {
        for which in Quota::ALL {
            if self.of(which) == Some(0) {
                return Err(format!("{which} must be at least 1"));
            }
        }
        for which in Quota::ALL {
            if self.rate(which).is_some_and(|r| r.burst == 0) {
                return Err(format!("{which}'s burst must be at least 1"));
            }
        }
        Ok(())
    }

    /// [`Limits::check`], and that a principal's scope (`@NAME`) sets rates only: what a
    /// principal pushed is held by topics, not by it.
    ///
    /// # Errors
    /// A sentence naming the limit.
    pub fn check_for(&self, scope: &str) -> Result<(), String> {
        self.check()?;
        if self.topics_max.is_some() && scope_namespace(scope).is_none() {
            return Err(format!(
                "{scope} is not a namespace: topics_max limits a namespace's (NS/) topics"
            ));
        }
        if scope_principal(scope).is_some() {
            let held = [
                Quota::Messages,
                Quota::Bytes,
                Quota::MessageBytes,
                Quota::InFlight,
            ];
            if let Some(which) = held.into_iter().find(|w| self.of(*w).is_some()) {
                return Err(format!(
                    "{scope} is a principal: it takes rates (push_rate, push_bytes_rate, \
                     pop_rate), not {which}"
                ));
            }
        }
        Ok(())
    }

    /// Limits on the rate of pushes.
    fn rated(&self) -> bool {
        self.push_rate.is_some() || self.push_bytes_rate.is_some()
    }

    /// Limits the tree pools over the leaves (through allowances), as opposed to those each
    /// leaf checks alone.
    fn pooled(&self) -> bool {
        self.messages_max.is_some() || self.bytes_max.is_some()
    }
}

/// Which limit a push would pass.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub enum Quota {
    /// `messages_max`.
    Messages,
    /// `bytes_max`.
    Bytes,
    /// `message_bytes_max`.
    MessageBytes,
    /// `push_rate`.
    PushRate,
    /// `push_bytes_rate`.
    PushBytesRate,
    /// `pop_rate`.
    PopRate,
    /// `in_flight_max`.
    InFlight,
    /// `topics_max`.
    Topics,
}

impl Quota {
    /// Every limit.
    pub const ALL: [Quota; 8] = [
        Quota::Messages,
        Quota::Bytes,
        Quota::MessageBytes,
        Quota::PushRate,
        Quota::PushBytesRate,
        Quota::PopRate,
        Quota::InFlight,
        Quota::Topics,
    ];

    /// Its name in configurations and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Quota::Messages => "messages_max",
            Quota::Bytes => "bytes_max",
            Quota::MessageBytes => "message_bytes_max",
            Quota::PushRate => "push_rate",
            Quota::PushBytesRate => "push_bytes_rate",
            Quota::PopRate => "pop_rate",
            Quota::InFlight => "in_flight_max",
            Quota::Topics => "topics_max",
        }
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A count of messages and their payload bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct Amount {
    /// Messages.
    pub messages: u64,
    /// Payload bytes.
    pub bytes: u64,
}

impl Amount {
    /// One message of `bytes` payload bytes.
    pub fn one(bytes: u64) -> Amount {
        Amount { messages: 1, bytes }
    }

    fn plus(self, other: Amount) -> Amount {
        Amount {
            messages: self.messages.saturating_add(other.messages),
            bytes: self.bytes.saturating_add(other.bytes),
        }
    }

    fn minus(self, other: Amount) -> Amount {
        Amount {
            messages: self.messages.saturating_sub(other.messages),
            bytes: self.bytes.saturating_sub(other.bytes),
        }
    }

    fn is_zero(self) -> bool {
        self == Amount::default()
    }

    /// Each count the larger of the two.
    fn at_least(self, other: Amount) -> Amount {
        Amount {
            messages: self.messages.max(other.messages),
            bytes: self.bytes.max(other.bytes),
        }
    }

    /// Adds `other` in place.
    pub fn add(&mut self, other: Amount) {
        *self = self.plus(other);
    }
}

/// Why a push was refused for a quota: the typed part of the error answer.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct QuotaExceeded {
    /// The scope: a topic, or a namespace scope (`NS/`).
    pub scope: String,
    /// The limit the push would pass.
    pub which: Quota,
    /// Its value.
    pub limit: u64,
}

impl fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (scope_namespace(&self.scope), scope_principal(&self.scope)) {
            (Some(namespace), _) => write!(f, "namespace {namespace}")?,
            (_, Some(principal)) => write!(f, "principal {principal}")?,
            _ => write!(f, "topic {}", self.scope)?,
        }
        let what = match self.which {
            Quota::Messages => "would hold more messages than",
            Quota::Bytes => "would hold more payload bytes than",
            Quota::MessageBytes => "takes no message larger than",
            Quota::PushRate => "takes no more messages per second than",
            Quota::PushBytesRate => "takes no more payload bytes per second than",
            Quota::PopRate => "gives no more messages per second than",
            Quota::InFlight => "would have more messages in flight than",
            Quota::Topics => "would hold more topics than",
        };
        write!(f, " {what} its {} {}", self.which, self.limit)
    }
}

/// One limited scope in a leaf's [`Usage`].
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ScopeUsage {
    /// The scope.
    pub scope: String,
    /// The version of the configuration the limits come from (the newest wins at the root).
    pub version: Time,
    /// The limits.
    pub limits: Limits,
    /// What the leaf holds of the scope.
    pub used: Amount,
    /// Its messages in flight (leased) at the leaf.
    #[serde(default)]
    pub in_flight: u64,
    /// For a scope with `topics_max`: the topics the leaf holds of it.
    #[serde(
        default,
        deserialize_with = "crate::bounded::vec::<_, _, QUOTA_TOPICS_MAX>"
    )]
    pub topics: Vec<String>,
    /// Topics new to the leaf that pushes wait for the root to admit.
    #[serde(
        default,
        deserialize_with = "crate::bounded::vec::<_, _, QUOTA_TOPICS_MAX>"
    )]
    pub topics_wanted: Vec<String>,
    /// What the root granted this incarnation of the leaf, in total.
    pub granted: Amount,
    /// What of that it admitted or gave back, in total.
    pub taken: Amount,
    /// What it admitted, in total (this incarnation): the basis of the ceiling the root
    /// answers ([`ScopeGrant::ceiling`]).
    pub admitted: Amount,
    /// What it would like to have in hand.
    pub want: Amount,
    /// What it refused for want of allowance since its last report.
    #[serde(default)]
    pub short: Amount,
    /// What it admitted since its last report.
    #[serde(default)]
    pub recent: Amount,
    /// Rate tokens the root granted this incarnation, in total.
    #[serde(default)]
    pub tokens_granted: Amount,
    /// What of them it used or gave back, in total.
    #[serde(default)]
    pub tokens_taken: Amount,
    /// Tokens it would like to have in hand.
    #[serde(default)]
    pub tokens_want: Amount,
    /// What it refused for want of tokens since its last report.
    #[serde(default)]
    pub tokens_short: Amount,
    /// Messages it refused for good since its last report, by reason.
    #[serde(default)]
    pub refused: Refused,
}

/// A limited scope's standing at the root, as `/stats`, `crest stats` and `/metrics` show it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ScopeStats {
    /// The scope: a topic, or a namespace's `NS/`.
    pub scope: String,
    /// Its limits.
    pub limits: Limits,
    /// What its topics hold (messages and payload bytes), as the leaves last reported.
    pub used: Amount,
    /// Its messages in flight: as the leaves last reported, with what the root delivered
    /// since and what waiting pops may take.
    #[serde(default)]
    pub in_flight: u64,
    /// Its topics holding messages, with those admitted and not yet reported (a scope with
    /// `topics_max`).
    #[serde(default)]
    pub topics: u64,
    /// What they may come to hold with the allowances the root granted (at most the quota).
    pub bound: Amount,
    /// What the leaves admitted since the root started.
    pub pushed: Amount,
    /// What they admitted per second, over the last second or so.
    pub pushed_per_second: Amount,
    /// Messages they refused since the root started, by reason.
    pub refused: Refused,
    /// Messages delivered to pops since the root started.
    #[serde(default)]
    pub popped: u64,
    /// Messages delivered per second, over the last second or so.
    #[serde(default)]
    pub popped_per_second: u64,
}

/// Messages refused, by reason (a batch refused for now and sent again counts each time).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct Refused {
    /// Over a quota (`QuotaExceeded`).
    pub over_quota: u64,
    /// Over a rate (`RateLimited`).
    pub rate_limited: u64,
    /// Short of the leaf's allowance and not held (`Overloaded`, retry soon).
    pub awaiting_allowance: u64,
    /// Pops refused over a pop rate (`RateLimited`), counted once per pop.
    #[serde(default)]
    pub pops_rate_limited: u64,
    /// Pops refused at the in-flight quota (`QuotaExceeded`), counted once per pop.
    #[serde(default)]
    pub pops_over_in_flight: u64,
}

impl Refused {
    /// Adds `other`, saturating.
    pub fn add(&mut self, other: Refused) {
        self.over_quota = self.over_quota.saturating_add(other.over_quota);
        self.rate_limited = self.rate_limited.saturating_add(other.rate_limited);
        self.awaiting_allowance = self
            .awaiting_allowance
            .saturating_add(other.awaiting_allowance);
        self.pops_rate_limited = self
            .pops_rate_limited
            .saturating_add(other.pops_rate_limited);
        self.pops_over_in_flight = self
            .pops_over_in_flight
            .saturating_add(other.pops_over_in_flight);
    }
}

/// Leaf → root (through aggregators): what the leaf holds of each limited scope.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Usage {
    /// The leaf.
    pub leaf: LeafId,
    /// Its incarnation: grants to another are not its own.
    pub epoch: u64,
    /// Every limited scope it knows.
    #[serde(deserialize_with = "crate::bounded::vec::<_, _, QUOTA_SCOPES_MAX>")]
    pub scopes: Vec<ScopeUsage>,
}

/// One scope of a [`Grant`].
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ScopeGrant {
    /// The scope.
    pub scope: String,
    /// Everything granted to this incarnation of the leaf so far.
    pub granted: Amount,
    /// The most the leaf's admitted total ([`ScopeUsage::admitted`]) could reach: what it
    /// admitted by the report this answers, what it has in hand, what is free, and what other
    /// leaves could give back. Measured against what was admitted, not what was taken: an
    /// allowance the leaf gives back after its report (a spare, a reclaim) must not count
    /// against it. A push past it is refused as [`QuotaExceeded`] rather than waiting for
    /// more (`None`: not known yet).
    pub ceiling: Option<Amount>,
    /// Another leaf is short: give back what is unused, and report at once.
    #[serde(default)]
    pub release: bool,
    /// Rate tokens granted to this incarnation so far.
    #[serde(default)]
    pub tokens_granted: Amount,
    /// When the scope's rate has tokens again for what the leaf lacked, in milliseconds
    /// (0: it has).
    #[serde(default)]
    pub token_wait_ms: u64,
    /// Topics new to the leaf that it may now hold.
    #[serde(
        default,
        deserialize_with = "crate::bounded::vec::<_, _, QUOTA_TOPICS_MAX>"
    )]
    pub topics_admitted: Vec<String>,
    /// Topics it asked for that would pass `topics_max`.
    #[serde(
        default,
        deserialize_with = "crate::bounded::vec::<_, _, QUOTA_TOPICS_MAX>"
    )]
    pub topics_refused: Vec<String>,
}

/// Root → leaf (through aggregators): the leaf's allowances.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Grant {
    /// The leaf.
    pub leaf: LeafId,
    /// The incarnation the grant is for.
    pub epoch: u64,
    /// Its scopes.
    #[serde(deserialize_with = "crate::bounded::vec::<_, _, QUOTA_SCOPES_MAX>")]
    pub scopes: Vec<ScopeGrant>,
}

mod leaf;
mod root;
mod topics;

pub use leaf::{Allowances, Shortfall};
pub use root::{Answer, Ledger, PopRefused};

#[cfg(test)]
mod tests;
