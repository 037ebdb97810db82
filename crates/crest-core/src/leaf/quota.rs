//! Quotas at the leaf: admitting pushes within the allowances the root grants, and reporting
//! what the leaf holds of each limited scope ([`crate::quota`]).

use super::*;
use crate::machine::ConnId;
use crate::quota::{Amount, Shortfall};
use crate::time::Time;
use crate::wire::{ErrorCode, Push, Wire};
use std::collections::HashMap;
use std::time::Duration;

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

    /// Admits `push` within the allowances, or answers its refusal: `QuotaExceeded`, or
    /// `Overloaded` with a time to retry while the leaf asks the root for a larger share.
    pub(super) fn admit_within_quotas(&mut self, now: Time, conn: ConnId, push: &Push) -> bool {
        if self.allowances.is_empty() {
            return true;
        }
        let messages = push
            .messages
            .iter()
            .map(|m| (m.topic.as_str(), m.payload.len() as u64));
        let reply = match self.allowances.admit(now, messages) {
            Ok(()) => return true,
            Err(Shortfall::Exceeded(quota)) => {
                self.counters.pushes_over_quota += 1;
                Wire::over_quota(push.request, quota)
            }
            Err(Shortfall::RateLimited { rate, wait_ms }) => {
                self.counters.pushes_rate_limited += 1;
                let after = wait_ms.unwrap_or(self.config.settings.quota_retry_ms);
                Wire::rate_limited(push.request, rate, after)
            }
            Err(Shortfall::Waiting(why)) => {
                self.counters.pushes_awaiting_allowance += 1;
                let after = self.config.settings.quota_retry_ms;
                Wire::retry_later(push.request, ErrorCode::Overloaded, why, after)
            }
        };
        self.counters.pushes_refused += 1;
        self.send(conn, reply);
        false
    }

    /// Sends the usage report when one is due.
    pub(super) fn report_usage(&mut self, now: Time) {
        if self.allowances.due().is_none_or(|due| due > now) {
            return;
        }
        let mut used: HashMap<String, Amount> = HashMap::new();
        for (name, topic) in &self.topics {
            for scope in self.allowances.scopes_of(name) {
                used.entry(scope.to_string()).or_default().add(Amount {
                    messages: topic.messages,
                    bytes: topic.bytes,
                });
            }
        }
        for batch in self.writes.batches.values() {
            for message in &batch.messages {
                for scope in self.allowances.scopes_of(&message.topic) {
                    let one = Amount::one(u64::from(message.size));
                    used.entry(scope.to_string()).or_default().add(one);
                }
            }
        }
        let s = &self.config.settings;
        let least = Amount {
            messages: s.quota_grant_messages_min,
            bytes: s.quota_grant_bytes_min,
        };
        let interval = Duration::from_millis(s.quota_report_ms);
        let id = self.config.id;
        let Some(usage) = self.allowances.report(now, id, &used, interval, least) else {
            return;
        };
        if let Some(parent) = self.upstream.session() {
            self.send(parent, Wire::Usage(usage));
        }
    }
}
