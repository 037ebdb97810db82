//! [`Settings::validate`]: every setting's range and the relations between settings, each
//! refusal naming the setting and the rule it breaks.

use super::*;

impl Settings {
    /// Checks ranges and the relations between settings.
    ///
    /// # Errors
    /// The first setting found out of range, named, with the rule it breaks.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let fail = |name: &'static str, problem: String| Err(SettingsError { name, problem });
        let positive: [(&'static str, u64); 75] = [
            ("aging_check_ms", self.aging_check_ms),
            ("fairness_key_bytes_max", self.fairness_key_bytes_max.into()),
            ("fairness_keys_max", self.fairness_keys_max.into()),
            ("credits_per_key", self.credits_per_key.into()),
            ("aging_scan_messages", self.aging_scan_messages.into()),
            ("quota_retry_ms", self.quota_retry_ms),
            ("quota_hold_ms", self.quota_hold_ms),
            ("quota_hold_batches_max", self.quota_hold_batches_max.into()),
            ("quota_start_wait_ms", self.quota_start_wait_ms),
            ("quota_scopes_max", self.quota_scopes_max.into()),
            ("quota_report_ms", self.quota_report_ms),
            ("quota_grant_messages_min", self.quota_grant_messages_min),
            ("quota_grant_bytes_min", self.quota_grant_bytes_min),
            ("gateway_body_bytes_max", self.gateway_body_bytes_max),
            ("gateway_requests_max", self.gateway_requests_max.into()),
            (
                "gateway_requests_per_key_max",
                self.gateway_requests_per_key_max.into(),
            ),
            (
                "gateway_queue_cache_max",
                self.gateway_queue_cache_max.into(),
            ),
            ("gateway_move_tasks_max", self.gateway_move_tasks_max.into()),
            (
                "gateway_connections_max",
                self.gateway_connections_max.into(),
            ),
            (
                "gateway_connections_per_address_max",
                self.gateway_connections_per_address_max.into(),
            ),
            ("gateway_header_timeout_ms", self.gateway_header_timeout_ms),
            ("gateway_body_timeout_ms", self.gateway_body_timeout_ms),
            (
                "gateway_unauthenticated_bytes_max",
                self.gateway_unauthenticated_bytes_max,
            ),
            (
                "gateway_query_params_max",
                self.gateway_query_params_max.into(),
            ),
            ("topic_configs_max", self.topic_configs_max.into()),
            (
                "namespace_topic_configs_max",
                self.namespace_topic_configs_max.into(),
            ),
            (
                "topic_attributes_bytes_max",
                self.topic_attributes_bytes_max.into(),
            ),
            ("purge_batch_messages", self.purge_batch_messages.into()),
            ("root_fail_back_ms", self.root_fail_back_ms),
            ("replica_heartbeat_ms", self.replica_heartbeat_ms),
            (
                "replica_election_timeout_ms",
                self.replica_election_timeout_ms,
            ),
            (
                "replica_append_entries_max",
                self.replica_append_entries_max,
            ),
            (
                "replica_snapshot_after_entries",
                self.replica_snapshot_after_entries,
            ),
            ("replica_log_cache_entries", self.replica_log_cache_entries),
            ("replica_log_cache_bytes", self.replica_log_cache_bytes),
            (
                "replica_lag_window_entries",
                self.replica_lag_window_entries,
            ),
            (
                "replica_journal_sync_bytes",
                self.replica_journal_sync_bytes,
            ),
            ("replica_entry_bytes_max", self.replica_entry_bytes_max),
            (
                "replica_entries_in_flight_max",
                self.replica_entries_in_flight_max,
            ),
            ("replica_rpc_bytes_max", self.replica_rpc_bytes_max),
            (
                "compaction_batch_messages",
                self.compaction_batch_messages.into(),
            ),
            ("reserve_ahead_hold_ms", self.reserve_ahead_hold_ms),
            ("offer_batch_entries", self.offer_batch_entries.into()),
            ("report_interval_ms", self.report_interval_ms),
            ("report_topics_max", self.report_topics_max.into()),
            (
                "consumer_lag_series_max",
                self.consumer_lag_series_max.into(),
            ),
            ("max_attempts", self.max_attempts.into()),
            ("dedup_keys_max", self.dedup_keys_max),
            ("dedup_key_bytes_max", self.dedup_key_bytes_max.into()),
            ("checkpoint_log_bytes", self.checkpoint_log_bytes),
            ("checkpoint_interval_ms", self.checkpoint_interval_ms),
            ("wal_segment_bytes_max", self.wal_segment_bytes_max),
            ("wal_queue_ops_max", self.wal_queue_ops_max.into()),
            (
                "wal_write_batch_bytes_max",
                self.wal_write_batch_bytes_max.into(),
            ),
            ("payload_bytes_max", self.payload_bytes_max.into()),
            (
                "push_batch_messages_max",
                self.push_batch_messages_max.into(),
            ),
            ("topic_bytes_max", self.topic_bytes_max.into()),
            ("topics_max", self.topics_max.into()),
            ("namespace_topics_max", self.namespace_topics_max.into()),
            ("credits_per_topic", self.credits_per_topic.into()),
            ("leaf_messages_max", self.leaf_messages_max),
            (
                "leaf_pending_batches_max",
                self.leaf_pending_batches_max.into(),
            ),
            (
                "leaf_pending_settles_max",
                self.leaf_pending_settles_max.into(),
            ),
            ("lease_timeout_ms", self.lease_timeout_ms),
            ("pop_messages_max", self.pop_messages_max.into()),
            ("root_pending_pops_max", self.root_pending_pops_max.into()),
            (
                "root_pending_requests_max",
                self.root_pending_requests_max.into(),
            ),
            (
                "connection_inflight_frames_max",
                self.connection_inflight_frames_max.into(),
            ),
            (
                "connection_send_queue_max",
                self.connection_send_queue_max.into(),
            ),
            ("connections_max", self.connections_max.into()),
            ("node_connections_max", self.node_connections_max.into()),
            ("hello_timeout_ms", self.hello_timeout_ms),
            (
                "principal_connections_max",
                self.principal_connections_max.into(),
            ),
            ("principal_pops_max", self.principal_pops_max.into()),
            ("principal_requests_max", self.principal_requests_max.into()),
        ];
        for (name, value) in positive {
            if value == 0 {
                return fail(name, "must be at least 1".into());
            }
        }
        if self.http_hosts.len() > HTTP_HOSTS_MAX
            || self
                .http_hosts
                .iter()
                .any(|h| h.is_empty() || h.len() > 253 || h.contains([':', '/', ' ']))
        {
            return fail(
                "http_hosts",
                format!("at most {HTTP_HOSTS_MAX} host names of 1 to 253 bytes, without a port"),
            );
        }
        // A replica group's largest entry (operations gathered up to replica_entry_bytes_max,
        // then one more, of at most a frame) and its overhead must fit in one RPC, or the
        // follower refuses it at every retry and never catches up.
        // (its messages' spans, 16 bytes each at most, beside their bodies).
        let entry_max = self
            .replica_entry_bytes_max
            .saturating_add(u64::from(self.frame_bytes_max))
            .saturating_add(u64::from(self.push_batch_messages_max) * 16)
            .saturating_add(REPLICA_RPC_OVERHEAD_BYTES);
        if self.replica_rpc_bytes_max < entry_max {
            return fail(
                "replica_rpc_bytes_max",
                format!(
                    "{} is below replica_entry_bytes_max + frame_bytes_max + 16 × \
                     push_batch_messages_max + {REPLICA_RPC_OVERHEAD_BYTES} = {entry_max}: the \
                     largest entry would not fit in one RPC",
                    self.replica_rpc_bytes_max
                ),
            );
        }
        // A gateway reserves a whole body of the unauthenticated budget before reading it.
        if self.gateway_body_bytes_max > self.gateway_unauthenticated_bytes_max {
            return fail(
                "gateway_body_bytes_max",
                format!(
                    "{} exceeds gateway_unauthenticated_bytes_max {}: no request could be read",
                    self.gateway_body_bytes_max, self.gateway_unauthenticated_bytes_max
                ),
            );
        }
        if self.gateway_unauthenticated_bytes_max > u64::from(u32::MAX) {
            return fail(
                "gateway_unauthenticated_bytes_max",
                format!("{} exceeds 4 GiB", self.gateway_unauthenticated_bytes_max),
            );
        }
        if self.payload_bytes_max > self.push_batch_bytes_max {
            return fail(
                "payload_bytes_max",
                format!(
                    "{} exceeds push_batch_bytes_max {}",
                    self.payload_bytes_max, self.push_batch_bytes_max
                ),
            );
        }
        if u64::from(self.push_batch_bytes_max) + u64::from(FRAME_OVERHEAD_BYTES)
            > u64::from(self.frame_bytes_max)
        {
            return fail(
                "frame_bytes_max",
                format!(
                    "{} leaves no room for a push batch of push_batch_bytes_max {} plus {} bytes of headers",
                    self.frame_bytes_max, self.push_batch_bytes_max, FRAME_OVERHEAD_BYTES
                ),
            );
        }
        // Body locations address a segment with 32-bit offsets; a segment grows past its
        // maximum by at most one group commit (a write batch plus one record).
        let segment_max = self.wal_segment_bytes_max
            + u64::from(self.wal_write_batch_bytes_max)
            + u64::from(self.frame_bytes_max);
        if segment_max > u64::from(u32::MAX) {
            return fail(
                "wal_segment_bytes_max",
                format!(
                    "{} plus a write batch (wal_write_batch_bytes_max {}) and a record \
                     (frame_bytes_max {}) exceeds 4 GiB",
                    self.wal_segment_bytes_max,
                    self.wal_write_batch_bytes_max,
                    self.frame_bytes_max
                ),
            );
        }
        if self.report_topics_max as usize > REPORT_TOPICS_MAX {
            return fail(
                "report_topics_max",
                format!(
                    "{} exceeds {}, the most topics a parent decodes in a report",
                    self.report_topics_max, REPORT_TOPICS_MAX
                ),
            );
        }
        // A usage report names each limited scope with eight numbers and its limits.
        let usage_bytes =
            u64::from(self.quota_scopes_max) * (u64::from(self.topic_bytes_max) + 160);
        if self.quota_scopes_max as usize > crate::quota::QUOTA_SCOPES_MAX
            || usage_bytes + 64 > u64::from(self.frame_bytes_max)
        {
            return fail(
                "quota_scopes_max",
                format!(
                    "{} exceeds {}, or its usage reports ({usage_bytes} bytes with \
                     topic_bytes_max {}) do not fit frame_bytes_max {}",
                    self.quota_scopes_max,
                    crate::quota::QUOTA_SCOPES_MAX,
                    self.topic_bytes_max,
                    self.frame_bytes_max
                ),
            );
        }
        if self.replica_election_timeout_ms <= self.replica_heartbeat_ms {
            return fail(
                "replica_election_timeout_ms",
                format!(
                    "{} must exceed replica_heartbeat_ms {}, or followers stand for election \
                     while their leader is alive",
                    self.replica_election_timeout_ms, self.replica_heartbeat_ms
                ),
            );
        }
        if self.compaction_live_pct > 100 {
            return fail(
                "compaction_live_pct",
                format!("{} exceeds 100", self.compaction_live_pct),
            );
        }
        if self.wal_ack_sync_linger_us > 1_000_000 {
            return fail(
                "wal_ack_sync_linger_us",
                format!("{} exceeds one second", self.wal_ack_sync_linger_us),
            );
        }
        if self.replica_log_flush_linger_us > 1_000_000 {
            return fail(
                "replica_log_flush_linger_us",
                format!("{} exceeds one second", self.replica_log_flush_linger_us),
            );
        }
        if self.gateway_short_poll_ms > 20_000 {
            return fail(
                "gateway_short_poll_ms",
                format!(
                    "{} is more than 20000 (20 s, SQS's longest receive wait)",
                    self.gateway_short_poll_ms
                ),
            );
        }
        if self.offer_linger_us > 1_000_000 {
            return fail(
                "offer_linger_us",
                format!("{} exceeds one second", self.offer_linger_us),
            );
        }
        if self.reserve_ahead_hold_ms.saturating_mul(2) > self.lease_timeout_ms {
            return fail(
                "reserve_ahead_hold_ms",
                format!(
                    "{} must be at most half of lease_timeout_ms {}: an entry held ahead must \
                     leave its consumer most of its lease",
                    self.reserve_ahead_hold_ms, self.lease_timeout_ms
                ),
            );
        }
        if self.lease_timeout_ms > self.lease_timeout_max_ms {
            return fail(
                "lease_timeout_ms",
                format!(
                    "{} exceeds lease_timeout_max_ms {}",
                    self.lease_timeout_ms, self.lease_timeout_max_ms
                ),
            );
        }
        if !(1200..=UDP_PAYLOAD_MAX_CEILING).contains(&self.udp_payload_max) {
            return fail(
                "udp_payload_max",
                format!(
                    "{} is outside 1200..={UDP_PAYLOAD_MAX_CEILING}",
                    self.udp_payload_max
                ),
            );
        }
        if self.quic_initial_window_bytes < 2400 {
            return fail(
                "quic_initial_window_bytes",
                format!(
                    "{} is below 2400 (two packets of 1200 bytes)",
                    self.quic_initial_window_bytes
                ),
            );
        }
        if self.request_timeout_ms < 4 {
            return fail(
                "request_timeout_ms",
                format!("{} is below 4", self.request_timeout_ms),
            );
        }
        if self.keep_alive_ms == 0 || self.keep_alive_ms >= self.idle_timeout_ms {
            return fail(
                "keep_alive_ms",
                format!(
                    "{} must be above 0 and below idle_timeout_ms {}",
                    self.keep_alive_ms, self.idle_timeout_ms
                ),
            );
        }
        if self.link_keep_alive_ms == 0 || self.link_keep_alive_ms >= self.link_idle_timeout_ms {
            return fail(
                "link_keep_alive_ms",
                format!(
                    "{} must be above 0 and below link_idle_timeout_ms {}",
                    self.link_keep_alive_ms, self.link_idle_timeout_ms
                ),
            );
        }
        if self.reconnect_backoff_initial_ms == 0
            || self.reconnect_backoff_initial_ms > self.reconnect_backoff_max_ms
        {
            return fail(
                "reconnect_backoff_initial_ms",
                "must be above 0 and at most reconnect_backoff_max_ms".into(),
            );
        }
        for (topic, overrides) in &self.topics {
            if let Err(problem) = overrides.check(self, topic) {
                return fail("topics", problem);
            }
        }
        Ok(())
    }
}
