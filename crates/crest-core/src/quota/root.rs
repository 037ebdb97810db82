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
}

/// A scope's admissions and refusals, and its recent push rate.
#[derive(Debug, Default, Clone, Copy)]
struct Meter {
    pushed: Amount,
    refused: Refused,
    /// The pushes counted at the start of the current measuring window.
    mark: Option<(Time, Amount)>,
    /// Pushes per second over the last full window.
    per_second: Amount,
}

impl Meter {
    /// The push rate is measured over windows of at least this long.
    const WINDOW: Duration = Duration::from_secs(1);

    fn count(&mut self, now: Time, pushed: Amount, refused: Refused) {
        self.pushed.add(pushed);
        self.refused.add(refused);
        let (since, at_start) = *self.mark.get_or_insert((now, self.pushed));
        let elapsed = now.saturating_since(since);
        if elapsed >= Meter::WINDOW {
            let seconds = elapsed.as_secs_f64();
            let done = self.pushed.minus(at_start);
            self.per_second = Amount {
                messages: (done.messages as f64 / seconds).round() as u64,
                bytes: (done.bytes as f64 / seconds).round() as u64,
            };
            self.mark = Some((now, self.pushed));
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
    fn take(&mut self, limits: &Limits, want: Amount, short: Amount, shares: u64) -> (Amount, u64) {
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
}

impl Account {
    fn bound(&self) -> Amount {
        self.used.plus(self.granted.minus(self.taken))
    }
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
                tokens_granted: Amount {
                    messages: old
                        .tokens_granted
                        .messages
                        .max(scope.tokens_granted.messages),
                    bytes: old.tokens_granted.bytes.max(scope.tokens_granted.bytes),
                },
            };
            self.count(&scope.scope, &account);
            accounts.scopes.insert(scope.scope.clone(), account);
            self.meters.entry(scope.scope.clone()).or_default().count(
                now,
                scope.recent,
                scope.refused,
            );
        }
        for (scope, old) in former {
            self.forget(&scope, &old);
        }
        let heard = |leaf: &LeafId| *leaf == usage.leaf || self.leaves.contains_key(leaf);
        let ready = now >= started + wait || subtree.iter().all(heard);
        // A leaf that asks gets at least this part of what is free or in the bucket.
        let shares = 2 * subtree.len().max(1) as u64;
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
                // Far from the limit a leaf that asks gets a share of what is free, so a
                // producer that speeds up does not wait for its leaf's next grants.
                let share = if deficit > 0 { free / shares } else { 0 };
                *more = deficit.max(share).min(free);
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
            let mut token_wait_ms = 0;
            if limits.rated() {
                let bucket = self
                    .buckets
                    .entry(name.clone())
                    .or_insert_with(|| Bucket::full(&limits, now));
                bucket.fill(&limits, now);
                let in_hand = account.tokens_granted.minus(scope.tokens_taken);
                let want = scope.tokens_want.minus(in_hand);
                let short = scope.tokens_short.minus(in_hand);
                let (given, wait_ms) = bucket.take(&limits, want, short, shares);
                account.tokens_granted.add(given);
                token_wait_ms = wait_ms;
            }
            grants.push(ScopeGrant {
                scope: name.clone(),
                granted: account.granted,
                ceiling: ready.then_some(ceiling),
                release: false,
                tokens_granted: account.tokens_granted,
                token_wait_ms,
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
                    bound: self.bounds.get(scope).copied().unwrap_or_default(),
                    pushed: meter.pushed,
                    pushed_per_second: meter.per_second,
                    refused: meter.refused,
                }
            })
            .collect()
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
            self.buckets.remove(scope);
            self.meters.remove(scope);
        }
    }
}
