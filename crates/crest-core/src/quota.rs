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
//! idle one gives its allowance back at its next report.
//!
//! Counters are per leaf incarnation ([`Usage::epoch`]): a restarted leaf, or a replicated
//! leaf's new leader, starts with nothing granted, and the root forgets what it granted the
//! former one. A changed limit takes effect at once: each leaf gives back what it was granted
//! under the old one.

use crate::id::LeafId;
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

/// Most limited scopes a [`Usage`] or [`Grant`] carries, and so the ceiling of the
/// `quota_scopes_max` setting.
pub const QUOTA_SCOPES_MAX: usize = 4096;

/// The scope of namespace `namespace`'s limits: its name and a `/`.
pub fn namespace_scope(namespace: &str) -> String {
    format!("{namespace}/")
}

/// The namespace a scope name is the scope of, if it is a namespace scope.
pub fn scope_namespace(scope: &str) -> Option<&str> {
    scope.strip_suffix('/')
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
}

impl Limits {
    /// No limit set.
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// The limit on `which`, if one is set.
    pub fn of(&self, which: Quota) -> Option<u64> {
        match which {
            Quota::Messages => self.messages_max,
            Quota::Bytes => self.bytes_max,
            Quota::MessageBytes => self.message_bytes_max,
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
        Ok(())
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
}

impl Quota {
    /// Every limit.
    pub const ALL: [Quota; 3] = [Quota::Messages, Quota::Bytes, Quota::MessageBytes];

    /// Its name in configurations and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Quota::Messages => "messages_max",
            Quota::Bytes => "bytes_max",
            Quota::MessageBytes => "message_bytes_max",
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

    fn times(self, factor: u64) -> Amount {
        Amount {
            messages: self.messages.saturating_mul(factor),
            bytes: self.bytes.saturating_mul(factor),
        }
    }

    fn is_zero(self) -> bool {
        self == Amount::default()
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
        match scope_namespace(&self.scope) {
            Some(namespace) => write!(f, "namespace {namespace}")?,
            None => write!(f, "topic {}", self.scope)?,
        }
        let what = match self.which {
            Quota::Messages => "would hold more messages than",
            Quota::Bytes => "would hold more payload bytes than",
            Quota::MessageBytes => "takes no message larger than",
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
    /// What the root granted this incarnation of the leaf, in total.
    pub granted: Amount,
    /// What of that it admitted or gave back, in total.
    pub taken: Amount,
    /// What it would like to have in hand.
    pub want: Amount,
    /// What it refused for want of allowance since its last report.
    #[serde(default)]
    pub short: Amount,
    /// What it admitted since its last report.
    #[serde(default)]
    pub recent: Amount,
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
    /// The most the leaf's consumed total (`taken`) could reach: what it has in hand, what is
    /// free, and what other leaves could give back. A push past it is refused as
    /// [`QuotaExceeded`] rather than waiting for more (`None`: not known yet).
    pub ceiling: Option<Amount>,
    /// Another leaf is short: give back what is unused, and report at once.
    #[serde(default)]
    pub release: bool,
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

/// Why a leaf does not admit a push batch.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Shortfall {
    /// The batch would pass a limit.
    Exceeded(QuotaExceeded),
    /// The leaf's allowance does not cover it yet; it asked the root for more.
    Waiting(String),
}

/// What a leaf may admit of each limited scope.
#[derive(Debug, Default)]
pub struct Allowances {
    epoch: Option<u64>,
    scopes: BTreeMap<String, Allowance>,
    /// When the next report is due (`None`: no scope is limited, and none is owed).
    due: Option<Time>,
    /// A report is owed to a new parent session even without a limited scope: the root
    /// learns that the leaf is there and which scopes it knows.
    owed: bool,
}

#[derive(Debug, Default)]
struct Allowance {
    version: Time,
    limits: Limits,
    granted: Amount,
    taken: Amount,
    /// Admitted since the last report.
    recent: Amount,
    /// Refused for want of allowance since the last report.
    short: Amount,
    /// The root's last word on how far `taken` could go ([`ScopeGrant::ceiling`]).
    ceiling: Option<Amount>,
    /// What the leaf asked for in its last report.
    want: Amount,
    /// Reports in a row with nothing admitted nor refused since the one before.
    idle: u8,
    /// It gave its allowance back for another leaf: its next report asks only for what it
    /// was refused (rather than take it right back).
    yielded: bool,
}

impl Allowance {
    fn remaining(&self) -> Amount {
        self.granted.minus(self.taken)
    }

    /// The pooled limit `need` would pass with what is in hand.
    fn lacks(&self, need: Amount) -> Option<Quota> {
        let left = self.remaining();
        if self.limits.messages_max.is_some() && need.messages > left.messages {
            return Some(Quota::Messages);
        }
        if self.limits.bytes_max.is_some() && need.bytes > left.bytes {
            return Some(Quota::Bytes);
        }
        None
    }

    /// Whether `need` of `which` is past what the tree could give this leaf.
    fn past_ceiling(&self, need: Amount, which: Quota) -> bool {
        let Some(ceiling) = self.ceiling else {
            return false;
        };
        let reach = self.taken.plus(need);
        match which {
            Quota::Messages => reach.messages > ceiling.messages,
            _ => reach.bytes > ceiling.bytes,
        }
    }
}

impl Allowances {
    /// No scope is limited.
    pub fn is_empty(&self) -> bool {
        self.scopes.is_empty()
    }

    /// When the next report is due.
    pub fn due(&self) -> Option<Time> {
        self.due
    }

    /// A new parent session: a report goes at once, even without a limited scope.
    pub fn greet(&mut self, now: Time) {
        self.owed = true;
        self.due = Some(now);
    }

    /// Whether `scope` is limited.
    pub fn limits(&self, scope: &str) -> bool {
        self.scopes.contains_key(scope)
    }

    /// Follows the configurations: `limited` lists each scope with limits (at most `max` are
    /// kept, by name), with its configuration's version. An allowance granted under other
    /// limits is given back.
    pub fn sync<'a>(
        &mut self,
        now: Time,
        limited: impl Iterator<Item = (&'a String, Time, Limits)>,
        max: usize,
    ) {
        let limited: BTreeMap<&String, (Time, Limits)> = limited
            .map(|(name, version, limits)| (name, (version, limits)))
            .take(max)
            .collect();
        self.scopes.retain(|scope, _| limited.contains_key(scope));
        for (name, (version, limits)) in limited {
            let allowance = self.scopes.entry(name.clone()).or_default();
            if allowance.version != version {
                allowance.version = version;
                allowance.limits = limits;
                allowance.taken = allowance.granted;
                allowance.ceiling = None;
            }
        }
        self.due = match (self.scopes.is_empty(), self.due) {
            (true, _) => None,
            (false, None) => Some(now),
            (false, due) => due,
        };
    }

    /// Admits a push batch within the allowances, or refuses all of it.
    ///
    /// # Errors
    /// The first limit the batch would pass, or the scope whose allowance is short.
    pub fn admit<'a>(
        &mut self,
        now: Time,
        messages: impl Iterator<Item = (&'a str, u64)>,
    ) -> Result<(), Shortfall> {
        if self.scopes.is_empty() {
            return Ok(());
        }
        let mut needs: Vec<(&str, Amount)> = Vec::new();
        // A batch is mostly one topic: its scopes are looked up once per run.
        let mut run: (&str, [Option<(&String, &Allowance)>; 2]) = ("", [None, None]);
        for (topic, size) in messages {
            if run.0 != topic || run.0.is_empty() {
                let namespace = namespace_scope(crate::access::namespace(topic));
                run = (
                    topic,
                    [
                        self.scopes.get_key_value(topic),
                        self.scopes.get_key_value(namespace.as_str()),
                    ],
                );
            }
            for (scope, allowance) in run.1.into_iter().flatten() {
                if let Some(limit) = allowance.limits.message_bytes_max
                    && size > limit
                {
                    return Err(Shortfall::Exceeded(QuotaExceeded {
                        scope: scope.clone(),
                        which: Quota::MessageBytes,
                        limit,
                    }));
                }
                if !allowance.limits.pooled() {
                    continue;
                }
                match needs.iter_mut().find(|(s, _)| *s == scope.as_str()) {
                    Some((_, need)) => need.add(Amount::one(size)),
                    None => needs.push((scope.as_str(), Amount::one(size))),
                }
            }
        }
        let needs: Vec<(String, Amount)> = needs
            .into_iter()
            .map(|(scope, need)| (scope.to_string(), need))
            .collect();
        let lacking = needs.iter().find_map(|(scope, need)| {
            let allowance = &self.scopes[scope];
            let which = allowance.lacks(*need)?;
            Some((scope.clone(), which, allowance.past_ceiling(*need, which)))
        });
        if let Some((scope, which, full)) = lacking {
            let allowance = self.scopes.get_mut(&scope).expect("listed");
            let limit = allowance.limits.of(which).expect("pooled");
            for (name, need) in needs {
                let allowance = self.scopes.get_mut(&name).expect("listed");
                if allowance.lacks(need).is_some() {
                    allowance.short.add(need);
                }
            }
            self.due = Some(now.min(self.due.unwrap_or(now)));
            if full {
                return Err(Shortfall::Exceeded(QuotaExceeded {
                    scope,
                    which,
                    limit,
                }));
            }
            return Err(Shortfall::Waiting(format!(
                "{scope}: this leaf's share of {which} {limit} is used; it asked the root for more"
            )));
        }
        for (scope, need) in needs {
            let allowance = self.scopes.get_mut(&scope).expect("listed");
            allowance.taken.add(need);
            allowance.recent.add(need);
        }
        Ok(())
    }

    /// The scopes a message of `topic` counts in, of those limited.
    pub fn scopes_of(&self, topic: &str) -> impl Iterator<Item = &str> {
        let namespace = namespace_scope(crate::access::namespace(topic));
        [
            self.scopes.get_key_value(topic).map(|(k, _)| k.as_str()),
            self.scopes
                .get_key_value(namespace.as_str())
                .map(|(k, _)| k.as_str()),
        ]
        .into_iter()
        .flatten()
    }

    /// The report due at `now`: `used` is what the leaf holds of each scope (absent: none).
    /// An allowance beyond twice what the leaf wants is given back. The next is due
    /// `interval` later.
    pub fn report(
        &mut self,
        now: Time,
        leaf: LeafId,
        used: &HashMap<String, Amount>,
        interval: Duration,
        least: Amount,
    ) -> Option<Usage> {
        if self.scopes.is_empty() && !std::mem::take(&mut self.owed) {
            self.due = None;
            return None;
        }
        self.owed = false;
        let epoch = *self.epoch.get_or_insert(now.as_micros().max(1));
        let scopes = self
            .scopes
            .iter_mut()
            .map(|(scope, allowance)| {
                let busy = !allowance.recent.is_zero() || !allowance.short.is_zero();
                allowance.idle = if busy {
                    0
                } else {
                    allowance.idle.saturating_add(1)
                };
                // A grant may come just after a report: it is kept for one quiet interval
                // (for the push that waited for it), given back after two.
                let want = match allowance.idle {
                    _ if std::mem::take(&mut allowance.yielded) => allowance.short,
                    0 => allowance.recent.times(2).plus(allowance.short).plus(least),
                    1 => allowance.want,
                    _ => Amount::default(),
                };
                allowance.want = want;
                let left = allowance.remaining();
                let spare = Amount {
                    messages: if left.messages > want.messages.saturating_mul(2) {
                        left.messages - want.messages
                    } else {
                        0
                    },
                    bytes: if left.bytes > want.bytes.saturating_mul(2) {
                        left.bytes - want.bytes
                    } else {
                        0
                    },
                };
                allowance.taken.add(spare);
                let short = std::mem::take(&mut allowance.short);
                let recent = std::mem::take(&mut allowance.recent);
                ScopeUsage {
                    scope: scope.clone(),
                    version: allowance.version,
                    limits: allowance.limits,
                    used: used.get(scope.as_str()).copied().unwrap_or_default(),
                    granted: allowance.granted,
                    taken: allowance.taken,
                    want,
                    short,
                    recent,
                }
            })
            .collect();
        self.due = (!self.scopes.is_empty()).then(|| now + interval);
        Some(Usage {
            leaf,
            epoch,
            scopes,
        })
    }

    /// Takes the root's grant (one for another incarnation is ignored).
    pub fn grant(&mut self, grant: &Grant) {
        if self.epoch != Some(grant.epoch) {
            return;
        }
        for given in &grant.scopes {
            if let Some(allowance) = self.scopes.get_mut(&given.scope) {
                allowance.granted = Amount {
                    messages: allowance.granted.messages.max(given.granted.messages),
                    bytes: allowance.granted.bytes.max(given.granted.bytes),
                };
                allowance.ceiling = given.ceiling;
                if given.release {
                    allowance.taken = allowance.granted;
                    allowance.yielded = true;
                    self.due = Some(Time::ZERO);
                }
            }
        }
    }
}

/// The root's account of the leaves' allowances.
#[derive(Debug, Default)]
pub struct Ledger {
    leaves: BTreeMap<LeafId, LeafAccounts>,
    /// Each scope's newest limits, with their version.
    limits: BTreeMap<String, (Time, Limits)>,
    /// Each scope's bound over the leaves: `used + granted − taken` summed.
    bounds: BTreeMap<String, Amount>,
    /// Each scope's usage over the leaves, as last reported.
    used: BTreeMap<String, Amount>,
    /// When the first report came: until every leaf reported, or `wait` after it, nothing
    /// is granted (a root that restarted knows nothing of what the leaves hold).
    started: Option<Time>,
    /// When each scope was last found missing or old at a leaf (its repair was asked for).
    repaired: BTreeMap<String, Time>,
}

/// The root's answer to a usage report.
#[derive(Debug, Default)]
pub struct Answer {
    /// The leaf's allowances (`None`: nothing to say).
    pub grant: Option<Grant>,
    /// Limited scopes the leaf lacks or holds an older configuration of: their
    /// configurations must be sent to it again (the leaf was away when they were set).
    pub stale: Vec<String>,
    /// Grants asking other leaves to give back what they hold unused, for this one.
    pub reclaim: Vec<Grant>,
}

#[derive(Debug, Default)]
struct LeafAccounts {
    epoch: u64,
    scopes: BTreeMap<String, Account>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Account {
    used: Amount,
    granted: Amount,
    taken: Amount,
    /// What the leaf admitted in the interval before its last report.
    recent: Amount,
}

impl Account {
    fn bound(&self) -> Amount {
        self.used.plus(self.granted.minus(self.taken))
    }
}

/// A scope's standing at the root.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Standing {
    /// Its limits.
    pub limits: Limits,
    /// What the leaves hold, as last reported.
    pub used: Amount,
    /// What they may come to hold with the allowances granted.
    pub bound: Amount,
}

impl Ledger {
    /// Takes a leaf's report at `now`; `subtree` lists every leaf of the tree. Grants wait
    /// until each of them reported, or `wait` after the first report.
    pub fn report(
        &mut self,
        now: Time,
        usage: &Usage,
        subtree: &[LeafId],
        wait: Duration,
    ) -> Answer {
        let known = self.leaves.get(&usage.leaf).map(|l| l.epoch);
        if known.is_some_and(|epoch| epoch > usage.epoch) {
            return Answer::default();
        }
        let started = *self.started.get_or_insert(now);
        let mut accounts = self.leaves.remove(&usage.leaf).unwrap_or_default();
        let mut former = std::mem::take(&mut accounts.scopes);
        let dropped: Vec<String> = former.keys().cloned().collect();
        if accounts.epoch != usage.epoch {
            // A new incarnation: what the former one was granted is void.
            accounts.epoch = usage.epoch;
            for (scope, old) in std::mem::take(&mut former) {
                self.forget(&scope, &old);
            }
        }
        for scope in &usage.scopes {
            let newer = self
                .limits
                .get(&scope.scope)
                .is_none_or(|(version, _)| *version < scope.version);
            if newer {
                self.limits
                    .insert(scope.scope.clone(), (scope.version, scope.limits));
            }
            let old = former.remove(&scope.scope).unwrap_or_default();
            self.forget(&scope.scope, &old);
            let account = Account {
                used: scope.used,
                granted: Amount {
                    messages: old.granted.messages.max(scope.granted.messages),
                    bytes: old.granted.bytes.max(scope.granted.bytes),
                },
                taken: scope.taken,
                recent: scope.recent,
            };
            self.count(&scope.scope, &account);
            accounts.scopes.insert(scope.scope.clone(), account);
        }
        for (scope, old) in former {
            self.forget(&scope, &old);
        }
        let heard = |leaf: &LeafId| *leaf == usage.leaf || self.leaves.contains_key(leaf);
        let ready = now >= started + wait || subtree.iter().all(heard);
        let mut grants = Vec::with_capacity(usage.scopes.len());
        let mut reclaim: Vec<(LeafId, u64, String)> = Vec::new();
        for scope in &usage.scopes {
            let name = &scope.scope;
            let limits = self.limits[name].1;
            // What other leaves hold in hand unused: theirs until they give it back. Those
            // that admitted nothing in their last interval are asked to; busy ones are not
            // (they would then run short in turn).
            let mut holders: Vec<(LeafId, u64)> = Vec::new();
            let mut elsewhere = Amount::default();
            for (leaf, other) in &self.leaves {
                let Some(account) = other.scopes.get(name) else {
                    continue;
                };
                let unused = account.granted.minus(account.taken);
                elsewhere.add(unused);
                if !unused.is_zero() && account.recent.is_zero() {
                    holders.push((*leaf, other.epoch));
                }
            }
            let account = accounts.scopes.get_mut(name).expect("inserted");
            let bound = self.bounds[name];
            let in_hand = account.granted.minus(account.taken);
            let deficit = if ready {
                scope.want.minus(in_hand)
            } else {
                Amount::default()
            };
            let mut more = Amount::default();
            let mut unmet = false;
            let mut ceiling = Amount {
                messages: u64::MAX,
                bytes: u64::MAX,
            };
            let taken = account.taken;
            for (limit, bound, deficit, in_hand, elsewhere, taken, ceiling, more) in [
                (
                    limits.messages_max,
                    bound.messages,
                    deficit.messages,
                    in_hand.messages,
                    elsewhere.messages,
                    taken.messages,
                    &mut ceiling.messages,
                    &mut more.messages,
                ),
                (
                    limits.bytes_max,
                    bound.bytes,
                    deficit.bytes,
                    in_hand.bytes,
                    elsewhere.bytes,
                    taken.bytes,
                    &mut ceiling.bytes,
                    &mut more.bytes,
                ),
            ] {
                let Some(limit) = limit else { continue };
                let free = limit.saturating_sub(bound);
                *more = deficit.min(free);
                unmet |= *more < deficit;
                // The most this leaf could consume: what it holds, what is free, and what
                // the other leaves could give back.
                *ceiling = taken
                    .saturating_add(in_hand)
                    .saturating_add(free)
                    .saturating_add(elsewhere);
            }
            if unmet && ready {
                reclaim.extend(
                    holders
                        .into_iter()
                        .map(|(leaf, epoch)| (leaf, epoch, name.clone())),
                );
            }
            if !more.is_zero() {
                let before = *account;
                account.granted.add(more);
                let after = *account;
                self.forget(name, &before);
                self.count(name, &after);
            }
            grants.push(ScopeGrant {
                scope: name.clone(),
                granted: accounts.scopes[name].granted,
                ceiling: ready.then_some(ceiling),
                release: false,
            });
        }
        self.leaves.insert(usage.leaf, accounts);
        for scope in dropped {
            self.drop_if_unreported(&scope);
        }
        let mut stale = Vec::new();
        for (scope, (version, _)) in &self.limits {
            let current = usage
                .scopes
                .iter()
                .any(|s| s.scope == *scope && s.version >= *version);
            let asked = self.repaired.get(scope).is_some_and(|at| now < *at + wait);
            if !current && !asked {
                stale.push(scope.clone());
            }
        }
        for scope in &stale {
            self.repaired.insert(scope.clone(), now);
        }
        self.repaired
            .retain(|scope, _| self.limits.contains_key(scope));
        let grant = (!grants.is_empty()).then_some(Grant {
            leaf: usage.leaf,
            epoch: usage.epoch,
            scopes: grants,
        });
        let reclaim = reclaim
            .into_iter()
            .map(|(leaf, epoch, scope)| {
                let granted = self.leaves[&leaf].scopes[&scope].granted;
                Grant {
                    leaf,
                    epoch,
                    scopes: vec![ScopeGrant {
                        scope,
                        granted,
                        ceiling: None,
                        release: true,
                    }],
                }
            })
            .collect();
        Answer {
            grant,
            stale,
            reclaim,
        }
    }

    /// Each limited scope's standing.
    pub fn standings(&self) -> impl Iterator<Item = (&str, Standing)> {
        self.limits.iter().map(|(scope, (_, limits))| {
            let standing = Standing {
                limits: *limits,
                used: self.used.get(scope).copied().unwrap_or_default(),
                bound: self.bounds.get(scope).copied().unwrap_or_default(),
            };
            (scope.as_str(), standing)
        })
    }

    fn count(&mut self, scope: &str, account: &Account) {
        let bound = self.bounds.entry(scope.to_string()).or_default();
        bound.add(account.bound());
        self.used
            .entry(scope.to_string())
            .or_default()
            .add(account.used);
    }

    fn forget(&mut self, scope: &str, account: &Account) {
        if let Some(bound) = self.bounds.get_mut(scope) {
            *bound = bound.minus(account.bound());
        }
        if let Some(used) = self.used.get_mut(scope) {
            *used = used.minus(account.used);
        }
    }

    /// Drops `scope` once no leaf reports it (its configuration is gone, or lost its limits).
    fn drop_if_unreported(&mut self, scope: &str) {
        if self.leaves.values().all(|l| !l.scopes.contains_key(scope)) {
            self.bounds.remove(scope);
            self.used.remove(scope);
            self.limits.remove(scope);
        }
    }
}

#[cfg(test)]
mod tests;
