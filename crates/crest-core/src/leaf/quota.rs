//! Quotas at the leaf: admitting pushes within the allowances the root grants, and reporting
//! what the leaf holds of each limited scope ([`crate::quota`]).

use super::*;
use crate::machine::ConnId;
use crate::quota::{Amount, Holdings, Refused, Shortfall};
use crate::time::Time;
use crate::wire::{ErrorCode, Push, Wire};
use std::time::Duration;

/// A push batch waiting at the leaf for the allowance it asked the root for: a short wait
/// here costs the producer less than a refusal and a retry.
pub(super) struct HeldPush {
    /// When it arrived.
    since: Time,
    pub(super) conn: ConnId,
    push: Push,
    /// Whose it is: held, it counts as one of its principal's requests waiting here
    /// (`principal_requests_max`).
    pub(super) principal: Option<std::sync::Arc<str>>,
}

impl Leaf {
    /// Configurations that limit a scope.
    pub(super) fn limited_configs(&self) -> usize {
        self.configs
            .values()
            .filter(|c| !c.deleted && !c.limits.is_empty())
            .count()
    }

    /// Follows the configurations' limits (after a change, and once recovered).
    pub(super) fn sync_allowances(&mut self, now: Time) {
        let limited = self
            .configs
            .iter()
            .filter(|(_, c)| !c.deleted && !c.limits.is_empty())
            .map(|(name, c)| (name, c.version, c.limits));
        let max = self.config.settings.quota_scopes_max as usize;
        self.allowances.sync(now, limited, max);
    }

    /// Admits `push` (held since `held`) within the allowances and gives it back, or holds
    /// it until the root's grant while the leaf asks for a larger share, or answers its
    /// refusal: `QuotaExceeded`, `RateLimited`, or `Overloaded` with a time to retry when it
    /// waited `quota_hold_ms` or `quota_hold_batches_max` others wait.
    pub(super) fn admit_within_quotas(
        &mut self,
        now: Time,
        conn: ConnId,
        push: Push,
        held: Option<Time>,
    ) -> Option<Push> {
        if self.allowances.is_empty() {
            return Some(push);
        }
        let messages = push
            .messages
            .iter()
            .map(|m| (m.topic.as_str(), m.payload.len() as u64));
        let since = held.unwrap_or(now);
        let s = &self.config.settings;
        let holds = now.saturating_since(since) < Duration::from_millis(s.quota_hold_ms)
            && self.held_pushes.len() < s.quota_hold_batches_max as usize;
        let principal = self.principals.get(&conn).map(|p| p.name.clone());
        let requests_max = s.principal_requests_max;
        let topics = &self.topics;
        let known = |topic: &str| topics.contains_key(topic);
        let admitted =
            self.allowances
                .admit_held(now, messages, principal.as_deref(), &known, held.is_some());
        let reply = match admitted {
            Ok(()) => return Some(push),
            Err(Shortfall::Exceeded(quota)) => {
                self.counters.pushes_over_quota += 1;
                let count = self.messages_in(&quota.scope, &push);
                let refused = Refused {
                    over_quota: count,
                    ..Refused::default()
                };
                self.allowances.count_refused(&quota.scope, refused);
                Wire::over_quota(push.request, quota)
            }
            Err(Shortfall::RateLimited {
                rate,
                wait_ms: Some(after),
            }) => {
                self.counters.pushes_rate_limited += 1;
                self.count_rate_limited(&rate.scope, &push);
                Wire::rate_limited(push.request, rate, after)
            }
            Err(Shortfall::RateLimited { wait_ms: None, .. } | Shortfall::Waiting { .. })
                if holds && self.push_tally.take(principal.as_ref(), requests_max) =>
            {
                self.counters.pushes_held += u64::from(held.is_none());
                self.held_pushes.push_back(HeldPush {
                    since,
                    conn,
                    push,
                    principal,
                });
                return None;
            }
            // Its principal has `principal_requests_max` batches held or written here already:
            // one producer cannot take every place `quota_hold_batches_max` gives.
            Err(Shortfall::RateLimited { wait_ms: None, .. } | Shortfall::Waiting { .. })
                if holds =>
            {
                let name = principal.as_deref().unwrap_or_default();
                let text = crate::access::over_cap(
                    name,
                    "push batches",
                    "principal_requests_max",
                    requests_max,
                );
                let after = self.config.settings.quota_retry_ms;
                Wire::retry_later(push.request, ErrorCode::Overloaded, text, after)
            }
            Err(Shortfall::RateLimited {
                rate,
                wait_ms: None,
            }) => {
                self.counters.pushes_rate_limited += 1;
                self.count_rate_limited(&rate.scope, &push);
                let after = self.config.settings.quota_retry_ms;
                Wire::rate_limited(push.request, rate, after)
            }
            Err(Shortfall::Waiting { scope, why }) => {
                self.counters.pushes_awaiting_allowance += 1;
                let refused = Refused {
                    awaiting_allowance: self.messages_in(&scope, &push),
                    ..Refused::default()
                };
                self.allowances.count_refused(&scope, refused);
                let after = self.config.settings.quota_retry_ms;
                Wire::retry_later(push.request, ErrorCode::Overloaded, why, after)
            }
        };
        self.counters.pushes_refused += 1;
        self.send(conn, reply);
        None
    }

    /// The messages of `push` that count in `scope`.
    fn messages_in(&self, scope: &str, push: &Push) -> u64 {
        if crate::quota::scope_principal(scope).is_some() {
            return push.messages.len() as u64;
        }
        let of = |topic: &str| self.allowances.scopes_of(topic).any(|s| s == scope);
        push.messages.iter().filter(|m| of(&m.topic)).count() as u64
    }

    fn count_rate_limited(&mut self, scope: &str, push: &Push) {
        let refused = Refused {
            rate_limited: self.messages_in(scope, push),
            ..Refused::default()
        };
        self.allowances.count_refused(scope, refused);
    }

    /// A grant came: the held batches are admitted, or held again until the next one.
    pub(super) fn release_held_pushes(&mut self, now: Time) {
        for held in std::mem::take(&mut self.held_pushes) {
            self.push_tally.give(held.principal.as_ref());
            self.push_batch(now, held.conn, held.push, Some(held.since));
        }
    }

    /// When the oldest held batch has waited `quota_hold_ms`.
    pub(super) fn held_pushes_due(&self) -> Option<Time> {
        let hold = Duration::from_millis(self.config.settings.quota_hold_ms);
        self.held_pushes.front().map(|held| held.since + hold)
    }

    /// Held batches that waited `quota_hold_ms` are refused with a time to retry.
    pub(super) fn expire_held_pushes(&mut self, now: Time) {
        while self.held_pushes_due().is_some_and(|due| due <= now) {
            let held = self.held_pushes.pop_front().expect("due");
            self.push_tally.give(held.principal.as_ref());
            self.push_batch(now, held.conn, held.push, Some(held.since));
        }
    }

    /// Sends the usage report when one is due.
    pub(super) fn report_usage(&mut self, now: Time) {
        if self.allowances.due().is_none_or(|due| due > now) {
            return;
        }
        let mut holdings = Holdings::default();
        for (name, topic) in &self.topics {
            for scope in self.allowances.scopes_of(name) {
                holdings
                    .used
                    .entry(scope.to_string())
                    .or_default()
                    .add(Amount {
                        messages: topic.messages,
                        bytes: topic.bytes,
                    });
                if topic.leased > 0 {
                    *holdings.in_flight.entry(scope.to_string()).or_default() += topic.leased;
                }
                if self.allowances.counts_topics(scope) {
                    let names = holdings.topics.entry(scope.to_string()).or_default();
                    if names.len() < crate::quota::QUOTA_TOPICS_MAX {
                        names.push(name.to_string());
                    }
                }
            }
        }
        // Pushes waiting for the log, summed per run of one topic first: the scopes of a
        // topic are looked up once per run, not per message.
        let mut pending: Vec<(&str, Amount)> = Vec::new();
        for batch in self.writes.batches.values() {
            for message in &batch.messages {
                let one = Amount::one(u64::from(message.size));
                match pending.last_mut() {
                    Some((topic, sum)) if **topic == *message.topic => sum.add(one),
                    _ => pending.push((&message.topic, one)),
                }
            }
        }
        for (topic, sum) in pending {
            for scope in self.allowances.scopes_of(topic) {
                holdings.used.entry(scope.to_string()).or_default().add(sum);
            }
        }
        let s = &self.config.settings;
        let least = Amount {
            messages: s.quota_grant_messages_min,
            bytes: s.quota_grant_bytes_min,
        };
        let interval = Duration::from_millis(s.quota_report_ms);
        let id = self.config.id;
        let report = self.allowances.report(now, id, &holdings, interval, least);
        let Some(usage) = report else {
            return;
        };
        if let Some(parent) = self.upstream.session() {
            self.send(parent, Wire::Usage(usage));
        }
    }
}
