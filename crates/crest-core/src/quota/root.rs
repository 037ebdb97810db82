//! The root's side of quotas: the leaves' accounts, and the grants that answer their reports.

use super::*;

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
    /// Each rated scope's token bucket.
    buckets: BTreeMap<String, Bucket>,
    /// What each scope's leaves admitted and refused, since the root started.
    meters: BTreeMap<String, Meter>,
    /// Each scope with a pop rate: its tokens, and when they were last filled.
    pop_buckets: BTreeMap<String, (f64, Time)>,
    /// Some scope has a pop rate or an in-flight quota.
    pop_limited: bool,
    /// Each scope's messages in flight over the leaves: as each last reported, and what the
    /// root delivered of it since.
    in_flight: BTreeMap<String, u64>,
    /// What pops waiting now may still deliver, per scope with an in-flight quota.
    in_flight_pending: BTreeMap<String, u64>,
    /// Each topics-limited scope's topics.
    topics: super::topics::TopicCounts,
}

/// Why the root refuses a pop.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum PopRefused {
    /// A pop rate has no token now: retry after `wait_ms`.
    RateLimited {
        /// The rate.
        rate: QuotaExceeded,
        /// When its bucket holds a token again, in milliseconds.
        wait_ms: u64,
    },
    /// The scope has `in_flight_max` messages in flight: settle some first.
    InFlight(QuotaExceeded),
}

/// A scope's admissions and refusals, and its recent push rate.
#[derive(Debug, Default, Clone, Copy)]
struct Meter {
    pushed: Amount,
    refused: Refused,
    popped: u64,
    /// The pushes and pops counted at the start of the current measuring window.
    mark: Option<(Time, Amount, u64)>,
    /// Pushes per second over the last full window.
    per_second: Amount,
    /// Pops per second over the last full window.
    popped_per_second: u64,
}

impl Meter {
    /// Rates are measured over windows of at least this long.
    const WINDOW: Duration = Duration::from_secs(1);

    fn count(&mut self, now: Time, pushed: Amount, refused: Refused, popped: u64) {
        self.pushed.add(pushed);
        self.refused.add(refused);
        self.popped = self.popped.saturating_add(popped);
        let (since, pushed_then, popped_then) =
            *self.mark.get_or_insert((now, self.pushed, self.popped));
        let elapsed = now.saturating_since(since);
        if elapsed >= Meter::WINDOW {
            let seconds = elapsed.as_secs_f64();
            let per_second = |done: u64| (done as f64 / seconds).round() as u64;
            let done = self.pushed.minus(pushed_then);
            self.per_second = Amount {
                messages: per_second(done.messages),
                bytes: per_second(done.bytes),
            };
            self.popped_per_second = per_second(self.popped - popped_then);
            self.mark = Some((now, self.pushed, self.popped));
        }
    }
}

/// A scope's push rate tokens (messages, bytes): `burst` at most, filled at the rate.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    messages: f64,
    bytes: f64,
    at: Time,
}

impl Bucket {
    fn full(limits: &Limits, now: Time) -> Bucket {
        let burst = |rate: Option<Rate>| rate.map_or(0.0, |r| r.burst as f64);
        Bucket {
            messages: burst(limits.push_rate),
            bytes: burst(limits.push_bytes_rate),
            at: now,
        }
    }

    /// Adds what the rates brought since the last fill.
    fn fill(&mut self, limits: &Limits, now: Time) {
        let seconds = now.as_micros().saturating_sub(self.at.as_micros()) as f64 / 1e6;
        self.at = self.at.max(now);
        let add = |level: f64, rate: Option<Rate>| {
            rate.map_or(0.0, |r| {
                (level + r.per_second as f64 * seconds).min(r.burst as f64)
            })
        };
        self.messages = add(self.messages, limits.push_rate);
        self.bytes = add(self.bytes, limits.push_bytes_rate);
    }

    /// Takes up to `want` tokens, or `1/shares` of the level if more and anything is wanted;
    /// what it gave, and how long until `short` more would be there (0: they are), in
    /// milliseconds.
    fn take(
        &mut self,
        limits: &Limits,
        want: Amount,
        short: Amount,
        shares: u64,
        ahead: bool,
    ) -> (Amount, u64) {
        let mut given = Amount::default();
        let mut wait_ms = 0;
        for (rate, level, want, short, given) in [
            (
                limits.push_rate,
                &mut self.messages,
                want.messages,
                short.messages,
                &mut given.messages,
            ),
            (
                limits.push_bytes_rate,
                &mut self.bytes,
                want.bytes,
                short.bytes,
                &mut given.bytes,
            ),
        ] {
            let Some(rate) = rate else { continue };
            // Tokens asked for ahead of any push are only given from a bucket far from empty.
            if ahead && (want as f64) * shares as f64 > *level {
                continue;
            }
            let share = if want > 0 {
                (*level / shares as f64) as u64
            } else {
                0
            };
            *given = want.max(share).min(level.floor() as u64);
            *level -= *given as f64;
            if short > *given {
                let missing = (short - *given) as f64 - *level;
                let ms = (missing.max(0.0) * 1000.0 / rate.per_second as f64).ceil() as u64;
                wait_ms = wait_ms.max(ms.max(1));
            }
        }
        (given, wait_ms)
    }
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
    /// Rate tokens granted, in total.
    tokens_granted: Amount,
    /// Messages in flight: as last reported, and what the root delivered since.
    in_flight: u64,
}

impl Account {
    fn bound(&self) -> Amount {
        self.used.plus(self.granted.minus(self.taken))
    }
}

/// What every scope of one report is granted under.
struct Round {
    now: Time,
    /// The reporting leaf.
    leaf: LeafId,
    /// Every leaf reported since the root started, or the wait for them is over.
    ready: bool,
    /// A leaf that asks gets at least one in `shares` of what is free.
    shares: u64,
    /// `quota_start_wait_ms`.
    wait: Duration,
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
        let (mut accounts, dropped) = self.take_accounts(now, usage);
        let heard = |leaf: &LeafId| *leaf == usage.leaf || self.leaves.contains_key(leaf);
        let round = Round {
            now,
            leaf: usage.leaf,
            ready: now >= started + wait || subtree.iter().all(heard),
            // A leaf that asks gets at least this part of what is free or in the bucket.
            shares: 2 * subtree.len().max(1) as u64,
            wait,
        };
        let mut grants = Vec::with_capacity(usage.scopes.len());
        let mut reclaim = Vec::new();
        for scope in &usage.scopes {
            let account = accounts.scopes.get_mut(&scope.scope).expect("taken");
            grants.push(self.grant(&round, scope, account, &mut reclaim));
        }
        self.leaves.insert(usage.leaf, accounts);
        for scope in dropped {
            self.drop_if_unreported(&scope);
        }
        self.pop_limited = self
            .limits
            .values()
            .any(|(_, l)| l.pop_rate.is_some() || l.in_flight_max.is_some());
        let grant = (!grants.is_empty()).then_some(Grant {
            leaf: usage.leaf,
            epoch: usage.epoch,
            scopes: grants,
        });
        Answer {
            grant,
            stale: self.stale(now, usage, wait),
            reclaim: self.reclaims(reclaim),
        }
    }

    /// Takes in a report's accounts: the leaf's accounts, every scope of the report counted
    /// at what it says (grants never go back within an incarnation), those of a former
    /// incarnation or no longer reported forgotten; and the scopes the leaf had before.
    fn take_accounts(&mut self, now: Time, usage: &Usage) -> (LeafAccounts, Vec<String>) {
        let mut accounts = self.leaves.remove(&usage.leaf).unwrap_or_default();
        let mut former = std::mem::take(&mut accounts.scopes);
        let dropped: Vec<String> = former.keys().cloned().collect();
        if accounts.epoch != usage.epoch {
            // A new incarnation: what the former one was granted is void.
            accounts.epoch = usage.epoch;
            for (scope, old) in std::mem::take(&mut former) {
                self.forget(&scope, &old);
                self.topics.forget(usage.leaf, &scope);
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
                granted: old.granted.at_least(scope.granted),
                taken: scope.taken,
                recent: scope.recent,
                in_flight: scope.in_flight,
                tokens_granted: old.tokens_granted.at_least(scope.tokens_granted),
            };
            self.count(&scope.scope, &account);
            accounts.scopes.insert(scope.scope.clone(), account);
            self.meters.entry(scope.scope.clone()).or_default().count(
                now,
                scope.recent,
                scope.refused,
                0,
            );
        }
        for (scope, old) in former {
            self.forget(&scope, &old);
            self.topics.forget(usage.leaf, &scope);
        }
        (accounts, dropped)
    }

    /// What one reported scope is granted: allowances within its limits, rate tokens, and
    /// topic names. Leaves holding allowance unused are added to `reclaim` when the scope
    /// asks for more than is free.
    fn grant(
        &mut self,
        round: &Round,
        scope: &ScopeUsage,
        account: &mut Account,
        reclaim: &mut Vec<(LeafId, u64, String)>,
    ) -> ScopeGrant {
        let name = &scope.scope;
        let limits = self.limits[name].1;
        // What other leaves hold in hand unused: theirs until they give it back. Those that
        // admitted nothing in their last interval are asked to; busy ones are not (they
        // would then run short in turn).
        let mut holders: Vec<(LeafId, u64)> = Vec::new();
        let mut elsewhere = Amount::default();
        for (leaf, other) in &self.leaves {
            let Some(held) = other.scopes.get(name) else {
                continue;
            };
            let unused = held.granted.minus(held.taken);
            elsewhere.add(unused);
            if !unused.is_zero() && held.recent.is_zero() {
                holders.push((*leaf, other.epoch));
            }
        }
        let ahead = scope.recent.is_zero() && scope.short.is_zero() && scope.tokens_short.is_zero();
        let (more, ceiling, unmet) =
            self.allowance(round, scope, account, &limits, elsewhere, ahead);
        if unmet && round.ready {
            reclaim.extend(
                holders
                    .into_iter()
                    .map(|(leaf, epoch)| (leaf, epoch, name.clone())),
            );
        }
        if !more.is_zero() {
            let before = *account;
            account.granted.add(more);
            self.forget(name, &before);
            self.count(name, account);
        }
        let mut token_wait_ms = 0;
        if limits.rated() {
            let bucket = self
                .buckets
                .entry(name.clone())
                .or_insert_with(|| Bucket::full(&limits, round.now));
            bucket.fill(&limits, round.now);
            let in_hand = account.tokens_granted.minus(scope.tokens_taken);
            let want = scope.tokens_want.minus(in_hand);
            let short = scope.tokens_short.minus(in_hand);
            let (given, wait_ms) = bucket.take(&limits, want, short, round.shares, ahead);
            account.tokens_granted.add(given);
            token_wait_ms = wait_ms;
        }
        let (topics_admitted, topics_refused) = match limits.topics_max {
            Some(limit) => self.topics.report(
                round.now,
                round.leaf,
                name,
                limit,
                &scope.topics,
                &scope.topics_wanted,
                round.ready,
                round.wait,
            ),
            None => {
                self.topics.drop_scope(name);
                (Vec::new(), Vec::new())
            }
        };
        ScopeGrant {
            scope: name.clone(),
            granted: account.granted,
            ceiling: round.ready.then_some(ceiling),
            release: false,
            tokens_granted: account.tokens_granted,
            token_wait_ms,
            topics_admitted,
            topics_refused,
        }
    }

    /// The allowance a scope is given more (messages, bytes), the most its leaf could admit
    /// (the ceiling), and whether it asked for more than is free.
    fn allowance(
        &self,
        round: &Round,
        scope: &ScopeUsage,
        account: &Account,
        limits: &Limits,
        elsewhere: Amount,
        ahead: bool,
    ) -> (Amount, Amount, bool) {
        let bound = self.bounds[&scope.scope];
        let in_hand = account.granted.minus(account.taken);
        let deficit = if round.ready {
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
        let admitted = scope.admitted;
        for (limit, bound, deficit, in_hand, elsewhere, admitted, ceiling, more) in [
            (
                limits.messages_max,
                bound.messages,
                deficit.messages,
                in_hand.messages,
                elsewhere.messages,
                admitted.messages,
                &mut ceiling.messages,
                &mut more.messages,
            ),
            (
                limits.bytes_max,
                bound.bytes,
                deficit.bytes,
                in_hand.bytes,
                elsewhere.bytes,
                admitted.bytes,
                &mut ceiling.bytes,
                &mut more.bytes,
            ),
        ] {
            let Some(limit) = limit else { continue };
            let free = limit.saturating_sub(bound);
            // Far from the limit a leaf that asks gets a share of what is free, so a producer
            // that speeds up does not wait for its leaf's next grants. What it asks for ahead
            // of any push is only granted that far (and is not unmet).
            if !(ahead && deficit.saturating_mul(round.shares) > free) {
                let share = if deficit > 0 { free / round.shares } else { 0 };
                *more = deficit.max(share).min(free);
                unmet |= *more < deficit;
            }
            // The most this leaf could admit: what it admitted, what it holds, what is free,
            // and what the other leaves could give back.
            *ceiling = admitted
                .saturating_add(in_hand)
                .saturating_add(free)
                .saturating_add(elsewhere);
        }
        (more, ceiling, unmet)
    }

    /// Limited scopes the reporting leaf lacks or holds an older configuration of, whose
    /// repair was not asked for within `wait`.
    fn stale(&mut self, now: Time, usage: &Usage, wait: Duration) -> Vec<String> {
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
        stale
    }

    /// Grants asking each of `reclaim` (leaf, epoch, scope) to give back what it holds unused.
    fn reclaims(&self, reclaim: Vec<(LeafId, u64, String)>) -> Vec<Grant> {
        reclaim
            .into_iter()
            .map(|(leaf, epoch, scope)| {
                let account = self.leaves[&leaf].scopes[&scope];
                Grant {
                    leaf,
                    epoch,
                    scopes: vec![ScopeGrant {
                        scope,
                        granted: account.granted,
                        ceiling: None,
                        release: true,
                        tokens_granted: account.tokens_granted,
                        token_wait_ms: 0,
                        topics_admitted: Vec::new(),
                        topics_refused: Vec::new(),
                    }],
                }
            })
            .collect()
    }

    /// The standing of each limited scope `show` accepts, by name.
    pub fn stats(&self, show: impl Fn(&str) -> bool) -> Vec<ScopeStats> {
        self.limits
            .iter()
            .filter(|(scope, _)| show(scope))
            .map(|(scope, (_, limits))| {
                let meter = self.meters.get(scope).copied().unwrap_or_default();
                ScopeStats {
                    scope: scope.clone(),
                    limits: *limits,
                    used: self.used.get(scope).copied().unwrap_or_default(),
                    in_flight: self.in_flight_of(scope),
                    topics: self.topics.count(scope),
                    bound: self.bounds.get(scope).copied().unwrap_or_default(),
                    pushed: meter.pushed,
                    pushed_per_second: meter.per_second,
                    refused: meter.refused,
                    popped: meter.popped,
                    popped_per_second: meter.popped_per_second,
                }
            })
            .collect()
    }

    /// The scopes a pop of `topic` by `principal` counts in that have a pop rate or an
    /// in-flight quota (none when no scope has one, without allocating).
    pub fn pop_scopes(&self, topic: &str, principal: Option<&str>) -> Vec<String> {
        if !self.pop_limited {
            return Vec::new();
        }
        let namespace = namespace_scope(crate::access::namespace(topic));
        let principal = principal.map(principal_scope);
        [Some(topic.to_string()), Some(namespace), principal]
            .into_iter()
            .flatten()
            .filter(|scope| {
                self.limits.get(scope).is_some_and(|(_, limits)| {
                    limits.pop_rate.is_some() || limits.in_flight_max.is_some()
                })
            })
            .collect()
    }

    /// Takes what a pop of at most `max` messages may deliver of each of `scopes` at `now`:
    /// as many as `max`, or as the emptiest bucket holds tokens, or as an in-flight quota
    /// leaves room for; none when one of them has no room or less than one token.
    ///
    /// # Errors
    /// The in-flight quota reached, or the rate with no token and the wait.
    pub fn take_pops(&mut self, now: Time, scopes: &[String], max: u64) -> Result<u64, PopRefused> {
        let mut take = max;
        for scope in scopes {
            let Some(limit) = self.limits.get(scope).and_then(|(_, l)| l.in_flight_max) else {
                continue;
            };
            let room = limit.saturating_sub(self.in_flight_of(scope));
            if room == 0 {
                let meter = self.meters.entry(scope.clone()).or_default();
                meter.refused.pops_over_in_flight += 1;
                return Err(PopRefused::InFlight(QuotaExceeded {
                    scope: scope.clone(),
                    which: Quota::InFlight,
                    limit,
                }));
            }
            take = take.min(room);
        }
        for scope in scopes {
            let Some(rate) = self.limits.get(scope).and_then(|(_, l)| l.pop_rate) else {
                continue;
            };
            // A bucket holds at most what it gathered since the root heard its first report:
            // a restarted root (or a standby taking over) gives no burst the one before it
            // may have given already, and one started long ago starts a new scope's full.
            let since = self
                .started
                .map_or(0.0, |t| now.saturating_since(t).as_secs_f64());
            let gathered = (rate.per_second as f64 * since).min(rate.burst as f64);
            let bucket = self
                .pop_buckets
                .entry(scope.clone())
                .or_insert((gathered, now));
            let seconds = now.saturating_since(bucket.1).as_secs_f64();
            bucket.0 = (bucket.0 + rate.per_second as f64 * seconds).min(rate.burst as f64);
            bucket.1 = bucket.1.max(now);
            if bucket.0 < 1.0 {
                let wait_ms = ((1.0 - bucket.0) * 1000.0 / rate.per_second as f64).ceil() as u64;
                let rate = QuotaExceeded {
                    scope: scope.clone(),
                    which: Quota::PopRate,
                    limit: rate.per_second,
                };
                let meter = self.meters.entry(scope.clone()).or_default();
                meter.refused.pops_rate_limited += 1;
                let wait_ms = wait_ms.max(1);
                return Err(PopRefused::RateLimited { rate, wait_ms });
            }
            take = take.min(bucket.0.floor() as u64);
        }
        for scope in scopes {
            if let Some(bucket) = self.pop_buckets.get_mut(scope) {
                bucket.0 -= take as f64;
            }
            if self.limits[scope].1.in_flight_max.is_some() {
                *self.in_flight_pending.entry(scope.clone()).or_default() += take;
            }
        }
        Ok(take)
    }

    /// A pop that took `taken` of `scopes` delivered messages of the leaves `delivered` (one
    /// per message): the tokens it did not use go back, and what it delivered is in flight
    /// until the leaves' next reports count it.
    pub fn popped(
        &mut self,
        now: Time,
        scopes: &[String],
        taken: u64,
        delivered: impl Iterator<Item = LeafId> + Clone,
    ) {
        let count = delivered.clone().count() as u64;
        let unused = taken.saturating_sub(count) as f64;
        for scope in scopes {
            if let Some(pending) = self.in_flight_pending.get_mut(scope) {
                *pending = pending.saturating_sub(taken);
            }
            let Some((_, limits)) = self.limits.get(scope) else {
                continue;
            };
            if let Some(rate) = limits.pop_rate
                && let Some(bucket) = self.pop_buckets.get_mut(scope)
            {
                bucket.0 = (bucket.0 + unused).min(rate.burst as f64);
            }
            if limits.in_flight_max.is_some() {
                for leaf in delivered.clone() {
                    let account = self
                        .leaves
                        .get_mut(&leaf)
                        .and_then(|l| l.scopes.get_mut(scope));
                    if let Some(account) = account {
                        account.in_flight += 1;
                        *self.in_flight.entry(scope.clone()).or_default() += 1;
                    }
                }
            }
            if let Some(meter) = self.meters.get_mut(scope) {
                meter.count(now, Amount::default(), Refused::default(), count);
            }
        }
    }

    fn count(&mut self, scope: &str, account: &Account) {
        let bound = self.bounds.entry(scope.to_string()).or_default();
        bound.add(account.bound());
        self.used
            .entry(scope.to_string())
            .or_default()
            .add(account.used);
        let in_flight = self.in_flight.entry(scope.to_string()).or_default();
        *in_flight = in_flight.saturating_add(account.in_flight);
    }

    fn forget(&mut self, scope: &str, account: &Account) {
        if let Some(bound) = self.bounds.get_mut(scope) {
            *bound = bound.minus(account.bound());
        }
        if let Some(used) = self.used.get_mut(scope) {
            *used = used.minus(account.used);
        }
        if let Some(in_flight) = self.in_flight.get_mut(scope) {
            *in_flight = in_flight.saturating_sub(account.in_flight);
        }
    }

    /// What `scope` has in flight, with what waiting pops may still deliver.
    fn in_flight_of(&self, scope: &str) -> u64 {
        let pending = self
            .in_flight_pending
            .get(scope)
            .copied()
            .unwrap_or_default();
        self.in_flight
            .get(scope)
            .copied()
            .unwrap_or_default()
            .saturating_add(pending)
    }

    /// Drops `scope` once no leaf reports it (its configuration is gone, or lost its limits).
    fn drop_if_unreported(&mut self, scope: &str) {
        if self.leaves.values().all(|l| !l.scopes.contains_key(scope)) {
            self.bounds.remove(scope);
            self.used.remove(scope);
            self.limits.remove(scope);
            self.buckets.remove(scope);
            self.meters.remove(scope);
            self.pop_buckets.remove(scope);
            self.in_flight.remove(scope);
            self.in_flight_pending.remove(scope);
            self.topics.drop_scope(scope);
        }
    }
}
