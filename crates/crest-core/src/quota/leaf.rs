//! The leaf's side of quotas: admitting pushes within its allowances, and its reports.

use super::*;

/// Why a leaf does not admit a push batch.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Shortfall {
    /// The batch would pass a limit.
    Exceeded(QuotaExceeded),
    /// The leaf's allowance of `scope` does not cover it yet; it asked the root for more.
    Waiting {
        /// The scope.
        scope: String,
        /// Why, for the producer.
        why: String,
    },
    /// The scope's rate has no tokens for it now: retry after `wait_ms` (`None`: not known
    /// yet, the leaf asked the root).
    RateLimited {
        /// The rate and its scope.
        rate: QuotaExceeded,
        /// When to retry, in milliseconds.
        wait_ms: Option<u64>,
    },
}

/// What a leaf may admit of each limited scope.
#[derive(Debug, Default)]
pub struct Allowances {
    pub(super) epoch: Option<u64>,
    scopes: BTreeMap<String, Allowance>,
    /// When the next report is due (`None`: no scope is limited, and none is owed).
    due: Option<Time>,
    /// A report is owed to a new parent session even without a limited scope: the root
    /// learns that the leaf is there and which scopes it knows.
    owed: bool,
    /// When the last report went (the pace of admissions is measured over the time since).
    last_report: Option<Time>,
    /// A report asking for more went and no grant came since: no other is sent early.
    asking: bool,
}

#[derive(Debug, Default)]
struct Allowance {
    version: Time,
    limits: Limits,
    granted: Amount,
    /// Admitted or given back, in total (the root's grants are measured against it).
    taken: Amount,
    /// Admitted, in total: what [`Allowance::ceiling`] is measured against (give-backs
    /// after the report the ceiling answers must not count against it).
    admitted: Amount,
    /// Admitted since the last report.
    recent: Amount,
    /// Refused for want of allowance since the last report.
    short: Amount,
    /// The root's last word on how far `admitted` could go ([`ScopeGrant::ceiling`]).
    ceiling: Option<Amount>,
    /// What the leaf asked for in its last report.
    want: Amount,
    /// The last report with something admitted or refused since the one before (idleness
    /// is measured in time: a leaf reports early for other scopes).
    busy_at: Option<Time>,
    /// It gave its allowance back for another leaf: its next report asks only for what it
    /// was refused (rather than take it right back).
    yielded: bool,
    /// Rate tokens granted, in total.
    tokens_granted: Amount,
    /// Rate tokens used or given back, in total.
    tokens_taken: Amount,
    /// Refused for want of rate tokens since the last report.
    token_short: Amount,
    /// The root's last word on when tokens come ([`ScopeGrant::token_wait_ms`]).
    token_wait_ms: u64,
    /// What the leaf asked for in tokens in its last report.
    tokens_want: Amount,
    /// Messages refused since the last report.
    refused: Refused,
    /// Topics new to the leaf the root admitted (a scope with `topics_max`).
    topics_admitted: BTreeSet<String>,
    /// Topics the root refused since the last report.
    topics_refused: BTreeSet<String>,
    /// Topics pushes wait for, to ask the root at the next report.
    topics_wanted: BTreeSet<String>,
    /// Its limits are new and nothing was admitted since: the leaf's reports ask ahead for a
    /// standing allowance ([`Allowance::standing`]), so that the first push after a
    /// configuration does not wait for the root; given back, like any, after two quiet
    /// report intervals.
    fresh: bool,
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

    /// Less than half of what the leaf last asked for is left in hand (allowance or tokens).
    fn running_low(&self) -> bool {
        let pooled = self.limits.pooled();
        let half = |want: u64| want / 2;
        let left = self.remaining();
        let tokens = self.tokens_granted.minus(self.tokens_taken);
        let quota_low = pooled
            && ((self.limits.messages_max.is_some() && left.messages < half(self.want.messages))
                || (self.limits.bytes_max.is_some() && left.bytes < half(self.want.bytes)));
        let rate_low = (self.limits.push_rate.is_some()
            && tokens.messages < half(self.tokens_want.messages))
            || (self.limits.push_bytes_rate.is_some()
                && tokens.bytes < half(self.tokens_want.bytes));
        quota_low || rate_low
    }

    /// What a leaf asks ahead for while its scope is fresh, of the quota and of the rates'
    /// tokens: `least` of each limit or burst at least eight times as large, nothing of a
    /// smaller one (where a share held ahead by a leaf that may never push would be missed by
    /// those that do).
    fn standing(&self, least: Amount) -> (Amount, Amount) {
        let part = |limit: Option<u64>, least: u64| {
            limit.map_or(0, |l| if l / 8 >= least { least } else { 0 })
        };
        let limits = &self.limits;
        let burst = |rate: Option<Rate>| rate.map(|r| r.burst);
        let quota = Amount {
            messages: part(limits.messages_max, least.messages),
            bytes: part(limits.bytes_max, least.bytes),
        };
        let tokens = Amount {
            messages: part(burst(limits.push_rate), least.messages),
            bytes: part(burst(limits.push_bytes_rate), least.bytes),
        };
        (quota, tokens)
    }

    /// The rate `need` would pass with the tokens in hand.
    fn lacks_tokens(&self, need: Amount) -> Option<Quota> {
        let left = self.tokens_granted.minus(self.tokens_taken);
        if self.limits.push_rate.is_some() && need.messages > left.messages {
            return Some(Quota::PushRate);
        }
        if self.limits.push_bytes_rate.is_some() && need.bytes > left.bytes {
            return Some(Quota::PushBytesRate);
        }
        None
    }

    /// Whether `need` of `which` is past what the tree could give this leaf.
    fn past_ceiling(&self, need: Amount, which: Quota) -> bool {
        let Some(ceiling) = self.ceiling else {
            return false;
        };
        let reach = self.admitted.plus(need);
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
                allowance.tokens_taken = allowance.tokens_granted;
                allowance.ceiling = None;
                // Quiet intervals count from the change.
                allowance.busy_at = Some(now);
                allowance.fresh = true;
            }
        }
        self.due = match (self.scopes.is_empty(), self.due) {
            (true, _) => None,
            (false, None) => Some(now),
            (false, due) => due,
        };
    }

    /// Admits a push batch within the allowances, or refuses all of it; a short leaf asks the
    /// root for more at once.
    ///
    /// # Errors
    /// The first limit the batch would pass, or the scope whose allowance is short.
    pub fn admit<'a>(
        &mut self,
        now: Time,
        messages: impl Iterator<Item = (&'a str, u64)>,
    ) -> Result<(), Shortfall> {
        self.admit_held(now, messages, None, &|_| true, false)
    }

    /// [`Allowances::admit`] for a batch held since an earlier try (`again`): the leaf asks
    /// again at once only if its last report went before `now` (the root answered that one;
    /// within the same instant asking again would only repeat it).
    ///
    /// # Errors
    /// As [`Allowances::admit`].
    pub fn admit_held<'a>(
        &mut self,
        now: Time,
        messages: impl Iterator<Item = (&'a str, u64)>,
        principal: Option<&str>,
        holds: &dyn Fn(&str) -> bool,
        again: bool,
    ) -> Result<(), Shortfall> {
        if self.scopes.is_empty() {
            return Ok(());
        }
        let Needs { scopes, new_topics } = self.needs(messages, principal, holds)?;
        if !new_topics.is_empty() {
            // The report that asks for the topics asks for what else the batch lacks: one
            // round trip to the root, not one for the topics and then one for the allowance.
            for (scope, need) in &scopes {
                let allowance = self.scopes.get_mut(scope).expect("listed");
                if allowance.lacks(*need).is_some() {
                    allowance.short.add(*need);
                }
                if allowance.lacks_tokens(*need).is_some() {
                    allowance.token_short.add(*need);
                }
            }
            return Err(self.ask_for_topics(now, new_topics, again));
        }
        if let Some(shortfall) = self.short_of_allowance(now, &scopes, again) {
            return Err(shortfall);
        }
        if let Some(shortfall) = self.short_of_tokens(now, &scopes, again) {
            return Err(shortfall);
        }
        self.take(now, scopes);
        Ok(())
    }

    /// What a batch needs of each limited scope (its topic's, its namespace's, its
    /// principal's), and the topics new to this leaf in namespaces that limit topics.
    ///
    /// # Errors
    /// A message larger than a scope's `message_bytes_max`.
    fn needs<'a>(
        &self,
        messages: impl Iterator<Item = (&'a str, u64)>,
        principal: Option<&str>,
        holds: &dyn Fn(&str) -> bool,
    ) -> Result<Needs, Shortfall> {
        let mut needs: Vec<(&str, Amount)> = Vec::new();
        let mut new_topics: Vec<(&str, &str)> = Vec::new();
        let mut total = Amount::default();
        // A batch is mostly one topic: its scopes are looked up once per run.
        let mut run = TopicScopes::default();
        for (topic, size) in messages {
            total.add(Amount::one(size));
            if run.topic != topic || run.topic.is_empty() {
                run = TopicScopes::of(&self.scopes, topic);
                if let Some((scope, allowance)) = run.namespace
                    && allowance.limits.topics_max.is_some()
                    && !allowance.topics_admitted.contains(topic)
                    && !new_topics.contains(&(scope.as_str(), topic))
                    && !holds(topic)
                {
                    new_topics.push((scope.as_str(), topic));
                }
            }
            for (scope, allowance) in [run.own, run.namespace].into_iter().flatten() {
                if let Some(limit) = allowance.limits.message_bytes_max
                    && size > limit
                {
                    return Err(Shortfall::Exceeded(QuotaExceeded {
                        scope: scope.clone(),
                        which: Quota::MessageBytes,
                        limit,
                    }));
                }
                if !allowance.limits.pooled() && !allowance.limits.rated() {
                    continue;
                }
                match needs.iter_mut().find(|(s, _)| *s == scope.as_str()) {
                    Some((_, need)) => need.add(Amount::one(size)),
                    None => needs.push((scope.as_str(), Amount::one(size))),
                }
            }
        }
        let mut scopes: Vec<(String, Amount)> = needs
            .into_iter()
            .map(|(scope, need)| (scope.to_string(), need))
            .collect();
        // A principal's rates count every message of its batch, whatever the topic.
        if let Some(principal) = principal {
            let scope = principal_scope(principal);
            if self.scopes.get(&scope).is_some_and(|a| a.limits.rated()) {
                scopes.push((scope, total));
            }
        }
        let new_topics = new_topics
            .into_iter()
            .map(|(scope, topic)| (scope.to_string(), topic.to_string()))
            .collect();
        Ok(Needs { scopes, new_topics })
    }

    /// The shortfall of the first scope whose allowance in hand does not cover its need:
    /// every short scope notes it and the leaf asks the root (`again`: as for
    /// [`Allowances::admit_held`]); past the scope's ceiling the batch is refused outright.
    fn short_of_allowance(
        &mut self,
        now: Time,
        needs: &[(String, Amount)],
        again: bool,
    ) -> Option<Shortfall> {
        let (scope, which, full) = needs.iter().find_map(|(scope, need)| {
            let allowance = &self.scopes[scope];
            let which = allowance.lacks(*need)?;
            Some((scope.clone(), which, allowance.past_ceiling(*need, which)))
        })?;
        let limit = self.scopes[&scope].limits.of(which).expect("pooled");
        for (name, need) in needs {
            let allowance = self.scopes.get_mut(name).expect("listed");
            if allowance.lacks(*need).is_some() {
                allowance.short.add(*need);
            }
        }
        if !again || self.last_report.is_some_and(|at| at < now) {
            self.due = Some(now.min(self.due.unwrap_or(now)));
        }
        if full {
            return Some(Shortfall::Exceeded(QuotaExceeded {
                scope,
                which,
                limit,
            }));
        }
        let why = format!(
            "{scope}: this leaf's share of {which} {limit} is used; it asked the root for more"
        );
        Some(Shortfall::Waiting { scope, why })
    }

    /// The rate limit of the first scope whose tokens in hand do not cover its need: every
    /// short scope notes it, and the leaf asks the root when the root said the bucket has
    /// them (else at once, `again` as for [`Allowances::admit_held`]).
    fn short_of_tokens(
        &mut self,
        now: Time,
        needs: &[(String, Amount)],
        again: bool,
    ) -> Option<Shortfall> {
        let (scope, which) = needs.iter().find_map(|(scope, need)| {
            let which = self.scopes[scope].lacks_tokens(*need)?;
            Some((scope.clone(), which))
        })?;
        let allowance = &self.scopes[&scope];
        let limit = allowance.limits.of(which).expect("rated");
        let wait_ms = (allowance.token_wait_ms > 0).then_some(allowance.token_wait_ms);
        for (name, need) in needs {
            let allowance = self.scopes.get_mut(name).expect("listed");
            if allowance.lacks_tokens(*need).is_some() {
                allowance.token_short.add(*need);
            }
        }
        // The root said when the bucket has the tokens: the leaf asks then, not at once (a
        // producer offering far more than the rate would have it report at every push).
        let ask_at = match wait_ms {
            Some(ms) => Some(now + Duration::from_millis(ms)),
            None if !again || self.last_report.is_some_and(|at| at < now) => Some(now),
            None => None,
        };
        if let Some(at) = ask_at {
            self.due = Some(at.min(self.due.unwrap_or(at)));
        }
        let rate = QuotaExceeded {
            scope,
            which,
            limit,
        };
        Some(Shortfall::RateLimited { rate, wait_ms })
    }

    /// Takes an admitted batch's needs from the allowances in hand; once half of what a
    /// scope asked for is used, the leaf asks for more before it runs out, so a busy producer
    /// never waits for a grant.
    fn take(&mut self, now: Time, needs: Vec<(String, Amount)>) {
        let mut low = false;
        for (scope, need) in needs {
            let allowance = self.scopes.get_mut(&scope).expect("listed");
            allowance.taken.add(need);
            allowance.admitted.add(need);
            allowance.recent.add(need);
            if allowance.limits.rated() {
                allowance.tokens_taken.add(need);
            }
            low |= allowance.running_low();
        }
        if low && !self.asking {
            self.asking = true;
            self.due = Some(now.min(self.due.unwrap_or(now)));
        }
    }

    /// Topics new to the leaf wait for the root's word: refused if it refused one since the
    /// last report, else asked for (at once, unless `again` in the instant of the last report).
    fn ask_for_topics(
        &mut self,
        now: Time,
        topics: Vec<(String, String)>,
        again: bool,
    ) -> Shortfall {
        for (scope, topic) in &topics {
            let allowance = self.scopes.get_mut(scope).expect("listed");
            if allowance.topics_refused.contains(topic) {
                let limit = allowance.limits.topics_max.expect("limited");
                return Shortfall::Exceeded(QuotaExceeded {
                    scope: scope.clone(),
                    which: Quota::Topics,
                    limit,
                });
            }
        }
        let (scope, first) = topics[0].clone();
        for (scope, topic) in topics {
            let allowance = self.scopes.get_mut(&scope).expect("listed");
            allowance.topics_wanted.insert(topic);
        }
        if !again || self.last_report.is_some_and(|at| at < now) {
            self.due = Some(now.min(self.due.unwrap_or(now)));
        }
        let why = format!(
            "{scope}: topic {first} is new to this leaf; it asked the root whether it fits \
             topics_max"
        );
        Shortfall::Waiting { scope, why }
    }

    /// Whether `scope` counts its topics (`topics_max`).
    pub fn counts_topics(&self, scope: &str) -> bool {
        self.scopes
            .get(scope)
            .is_some_and(|a| a.limits.topics_max.is_some())
    }

    /// Counts `refused` messages of `scope` for its next report.
    pub fn count_refused(&mut self, scope: &str, refused: Refused) {
        if let Some(allowance) = self.scopes.get_mut(scope) {
            allowance.refused.add(refused);
        }
    }

    /// The scopes a message of `topic` counts in, of those limited (a principal's scope
    /// counts every message its principal pushes).
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

    /// The report due at `now`, of what the leaf holds of each scope (absent: none).
    /// An allowance beyond twice what the leaf wants is given back. The next is due
    /// `interval` later.
    pub fn report(
        &mut self,
        now: Time,
        leaf: LeafId,
        holdings: &Holdings,
        interval: Duration,
        least: Amount,
    ) -> Option<Usage> {
        if self.scopes.is_empty() && !std::mem::take(&mut self.owed) {
            self.due = None;
            return None;
        }
        self.owed = false;
        let epoch = *self.epoch.get_or_insert(now.as_micros().max(1));
        // The pace since the last report, scaled to two report intervals: a report sent early
        // (the leaf ran low) asks for as much as one sent on time would at that pace.
        let since = self
            .last_report
            .map_or(interval, |at| {
                Duration::from_micros(now.as_micros().saturating_sub(at.as_micros()))
            })
            .max(Duration::from_millis(1));
        let pace = |recent: Amount| Amount {
            messages: (recent.messages as f64 * 2.0 * interval.as_secs_f64() / since.as_secs_f64())
                .ceil() as u64,
            bytes: (recent.bytes as f64 * 2.0 * interval.as_secs_f64() / since.as_secs_f64()).ceil()
                as u64,
        };
        self.last_report = Some(now);
        let scopes = self
            .scopes
            .iter_mut()
            .map(|(scope, allowance)| {
                let busy = !allowance.recent.is_zero()
                    || !allowance.short.is_zero()
                    || !allowance.token_short.is_zero();
                if busy {
                    allowance.busy_at = Some(now);
                }
                let quiet = allowance
                    .busy_at
                    .map_or(Duration::MAX, |at| now.saturating_since(at));
                let idle = match quiet {
                    _ if busy => 0,
                    quiet if quiet < interval * 2 => 1,
                    _ => 2,
                };
                if idle != 1 {
                    allowance.fresh = false;
                }
                // A grant may come just after a report: it is kept for two quiet intervals
                // (for the push that waited for it), given back after.
                let want = match idle {
                    _ if std::mem::take(&mut allowance.yielded) => allowance.short,
                    0 => pace(allowance.recent).plus(allowance.short).plus(least),
                    1 if allowance.fresh => allowance.standing(least).0,
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
                // Tokens: what two intervals at the recent pace take, and what was refused;
                // an idle leaf gives its tokens back (they are not returned to the bucket).
                let tokens_want = if idle >= 2 {
                    allowance.tokens_taken = allowance.tokens_granted;
                    Amount::default()
                } else if allowance.fresh {
                    allowance.standing(least).1
                } else {
                    pace(allowance.recent).plus(allowance.token_short)
                };
                allowance.tokens_want = tokens_want;
                let tokens_short = std::mem::take(&mut allowance.token_short);
                // Refused topics are asked for again after this report (room may have come).
                allowance.topics_refused.clear();
                let short = std::mem::take(&mut allowance.short);
                let recent = std::mem::take(&mut allowance.recent);
                ScopeUsage {
                    scope: scope.clone(),
                    version: allowance.version,
                    limits: allowance.limits,
                    used: holdings
                        .used
                        .get(scope.as_str())
                        .copied()
                        .unwrap_or_default(),
                    in_flight: (holdings.in_flight.get(scope.as_str()).copied())
                        .unwrap_or_default(),
                    topics: holdings
                        .topics
                        .get(scope.as_str())
                        .cloned()
                        .unwrap_or_default(),
                    topics_wanted: std::mem::take(&mut allowance.topics_wanted)
                        .into_iter()
                        .collect(),
                    granted: allowance.granted,
                    taken: allowance.taken,
                    admitted: allowance.admitted,
                    want,
                    short,
                    recent,
                    tokens_granted: allowance.tokens_granted,
                    tokens_taken: allowance.tokens_taken,
                    tokens_want,
                    tokens_short,
                    refused: std::mem::take(&mut allowance.refused),
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

    /// A report goes at once (batches held for allowance still lack it after a grant that
    /// gave more: the root may give more again).
    pub fn ask(&mut self, now: Time) {
        self.due = Some(now.min(self.due.unwrap_or(now)));
    }

    /// Takes the root's grant (one for another incarnation is ignored); whether it gave
    /// anything more.
    pub fn grant(&mut self, grant: &Grant) -> bool {
        self.asking = false;
        if self.epoch != Some(grant.epoch) {
            return false;
        }
        let mut grew = false;
        for given in &grant.scopes {
            if let Some(allowance) = self.scopes.get_mut(&given.scope) {
                let before = (allowance.granted, allowance.tokens_granted);
                allowance.granted = Amount {
                    messages: allowance.granted.messages.max(given.granted.messages),
                    bytes: allowance.granted.bytes.max(given.granted.bytes),
                };
                allowance.ceiling = given.ceiling;
                allowance.tokens_granted = Amount {
                    messages: allowance
                        .tokens_granted
                        .messages
                        .max(given.tokens_granted.messages),
                    bytes: allowance
                        .tokens_granted
                        .bytes
                        .max(given.tokens_granted.bytes),
                };
                allowance.token_wait_ms = given.token_wait_ms;
                grew |= (allowance.granted, allowance.tokens_granted) != before;
                // A reclaim carries no word on topics: what was admitted stays.
                if allowance.limits.topics_max.is_some() && !given.release {
                    allowance.topics_admitted = given.topics_admitted.iter().cloned().collect();
                    allowance
                        .topics_refused
                        .extend(given.topics_refused.iter().cloned());
                }
                if given.release {
                    allowance.taken = allowance.granted;
                    allowance.yielded = true;
                    self.due = Some(Time::ZERO);
                }
            }
        }
        grew
    }
}

/// What a push batch needs of the limited scopes.
struct Needs {
    /// Each limited scope's need, in the order first met.
    scopes: Vec<(String, Amount)>,
    /// Topics new to this leaf in namespaces with `topics_max`: (namespace scope, topic).
    new_topics: Vec<(String, String)>,
}

/// The limited scopes one topic is counted in: its own, and its namespace's.
#[derive(Default)]
struct TopicScopes<'a> {
    topic: &'a str,
    own: Option<(&'a String, &'a Allowance)>,
    namespace: Option<(&'a String, &'a Allowance)>,
}

impl<'a> TopicScopes<'a> {
    fn of(scopes: &'a BTreeMap<String, Allowance>, topic: &'a str) -> Self {
        let namespace = namespace_scope(crate::access::namespace(topic));
        TopicScopes {
            topic,
            own: scopes.get_key_value(topic),
            namespace: scopes.get_key_value(namespace.as_str()),
        }
    }
}
