//! Settings: every bound of crest, named, with its default.
//!
//! A topology file sets cluster-wide values in `[settings]` and per-node overrides in a node's
//! `settings` table; anything unset takes the default below. Relations between defaults are
//! checked at compile time; [`Settings::validate`] checks the same relations for loaded values.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

mod topic;
mod validate;

pub use topic::{
    AGING_PRIORITIES_MAX, Aging, FAIRNESS_WEIGHTS_MAX, KeyWeights, Scheduling, TIERS_MAX,
    TopicPolicy, TopicSettings, WEIGHT_MAX, Weights,
};

/// Largest payload of one message, in bytes (1 MiB, SQS's largest message).
pub const PAYLOAD_BYTES_MAX_DEFAULT: u32 = 1024 * 1024;
/// Largest frame on any stream, in bytes (16 MiB).
pub const FRAME_BYTES_MAX_DEFAULT: u32 = 16 * 1024 * 1024;
/// What a replica group's RPC carries beside one entry's operations, at most: the request's
/// fields and the entry's framing (see `replica_rpc_bytes_max`).
pub const REPLICA_RPC_OVERHEAD_BYTES: u64 = 64 * 1024;
/// Largest number of messages in one push batch.
pub const PUSH_BATCH_MESSAGES_MAX_DEFAULT: u32 = 4096;
/// Largest total payload of one push batch, in bytes (4 MiB).
pub const PUSH_BATCH_BYTES_MAX_DEFAULT: u32 = 4 * 1024 * 1024;
/// Largest number of messages returned by one pop.
pub const POP_MESSAGES_MAX_DEFAULT: u32 = 1000;
/// How long a child gathers non-urgent offer changes, in microseconds (see
/// [`Settings::offer_linger_us`]). 0: a linger bought no throughput on the real
/// tree and cost latency in the simulator (docs/simulation.md).
pub const OFFER_LINGER_US_DEFAULT: u64 = 0;
/// Default of [`Settings::wal_ack_sync_linger_us`] (docs/storage.md: 2 ms beat 0.5, 1 and 4 ms).
pub const WAL_ACK_SYNC_LINGER_US_DEFAULT: u64 = 2000;
/// Default of [`Settings::replica_log_flush_linger_us`] (docs/performance-history.md: raft-log's
/// own default of 1 ms made an idle push wait 11 ms; 20 µs, 1.2 ms).
pub const REPLICA_LOG_FLUSH_LINGER_US_DEFAULT: u64 = 20;
/// Default of [`Settings::udp_payload_max`]. Measured on loopback against 1,452 and 6,550
/// (docs/performance-history.md): pops gain as much as with 6,550, and pushes do not lose
/// what they lost with 6,550 when the CPU bounds them.
pub const UDP_PAYLOAD_MAX_DEFAULT: u16 = 3000;
/// Highest allowed [`Settings::udp_payload_max`]: quinn sends up to 10 packets in one
/// segmentation-offload `sendmsg`, whose total must fit a UDP datagram (65,507 bytes on IPv4).
pub const UDP_PAYLOAD_MAX_CEILING: u16 = 6550;
/// Room in a frame for everything that is not payload (headers, keys, metadata).
pub const FRAME_OVERHEAD_BYTES: u32 = 1024 * 1024;

// The largest push batch, and the largest reply to a full pop of maximal payloads, must fit in
// one frame; otherwise a valid request could never be sent or answered.
const _: () =
    assert!(PUSH_BATCH_BYTES_MAX_DEFAULT + FRAME_OVERHEAD_BYTES <= FRAME_BYTES_MAX_DEFAULT);
const _: () = assert!(PAYLOAD_BYTES_MAX_DEFAULT <= PUSH_BATCH_BYTES_MAX_DEFAULT);

/// When a leaf acknowledges a push batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// After the batch is written and `fdatasync`ed (the default): survives machine crashes.
    #[default]
    Fsync,
    /// After the batch is written to the file, before it is synced: survives a crash of the
    /// process, loses the last moments on a crash of the machine. Opt-in, for throughput.
    Buffered,
}

/// When a replicated leaf's leader acknowledges a push batch (and counts a lease granted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicaAcks {
    /// Once a majority of the group holds it durably in its log (the default): a group of
    /// three goes on through the loss of any one replica.
    #[default]
    Majority,
    /// Once every replica in sync holds it (and always a majority): a replica is in sync while
    /// it holds the leader's last entry or took one within `replica_election_timeout_ms`, so a
    /// replica that is down or far behind delays acknowledgements by that long, not for ever.
    All,
}

/// Most names `http_hosts` may list.
pub const HTTP_HOSTS_MAX: usize = 64;

/// `reserve_ahead_max` where the topology does not set it and has a replicated leaf: enough
/// entries for two reserve round trips of pops at a few hundred thousand a second, each round
/// trip a group commit of a few milliseconds (docs/performance.md, "Replicated leaves").
pub const RESERVED_AHEAD_REPLICATED: u32 = 4096;

/// All tunable bounds and timings of a node. Field names carry their unit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Largest payload of one message, in bytes.
    pub payload_bytes_max: u32,
    /// Largest frame accepted or sent on any stream, in bytes.
    pub frame_bytes_max: u32,
    /// Largest number of messages in one push batch.
    pub push_batch_messages_max: u32,
    /// Largest total payload bytes in one push batch.
    pub push_batch_bytes_max: u32,
    /// Longest topic name, in bytes.
    pub topic_bytes_max: u32,
    /// Most metadata entries on one message.
    pub metadata_entries_max: u32,
    /// Most metadata bytes (keys plus values) on one message.
    pub metadata_bytes_max: u32,
    /// Most distinct topics a leaf holds at once; pushes to further topics are rejected.
    pub topics_max: u32,
    /// Most of a leaf's `topics_max` topics one namespace holds: the share that keeps one
    /// tenant from taking every topic a leaf may hold from the others. A tree of one tenant
    /// may raise it to `topics_max`.
    pub namespace_topics_max: u32,
    /// Entries per topic a parent lets each child hold in its window (the credit).
    pub credits_per_topic: u32,
    /// Most messages a leaf holds (all states); pushes beyond it are rejected as full.
    pub leaf_messages_max: u64,
    /// Most push batches a leaf has waiting for storage at once.
    pub leaf_pending_batches_max: u32,
    /// Most acknowledgement requests (acks, nacks, extends) consumers sent a leaf directly
    /// that it has waiting for storage at once.
    pub leaf_pending_settles_max: u32,
    /// Default visibility timeout of a delivery, in milliseconds.
    pub lease_timeout_ms: u64,
    /// Largest visibility timeout a pop may ask for, in milliseconds.
    pub lease_timeout_max_ms: u64,
    /// Whether a leaf answers a reserve only once the records of the leases it granted are
    /// durable (a sync per reserve; in a replicated leaf, committed by the group), so that no
    /// crash nor deposed leader can have handed out a lease its log does not know. A grant
    /// whose record the log refuses is undone and denied `Unavailable`. Off: grants are
    /// answered at once and their records ride the next sync.
    pub lease_grants_wait_for_log: bool,
    /// Most messages one pop may ask for.
    pub pop_messages_max: u32,
    /// Longest a pop may wait for a message (long-poll), in milliseconds.
    pub pop_wait_max_ms: u64,
    /// How long the root holds a pop whose best candidate may still be beaten by an entry a
    /// child has not offered yet (its window from that child is being refilled), before it
    /// serves the best entry it holds anyway, in milliseconds.
    pub pop_order_wait_ms: u64,
    /// Most pops the root holds waiting (long-poll and refills) at once.
    pub root_pending_pops_max: u32,
    /// Most acknowledgement requests the root has waiting on leaves at once.
    pub root_pending_requests_max: u32,
    /// How long the root waits for a leaf's answer to a request it routed there — a reserve,
    /// a confirm (ack, nack, extend), an admin request —, in milliseconds, before it gives up
    /// on it: a reserve's entry is then passed over, a confirm answered `TimedOut`, an admin
    /// request answered with the leaf named unreachable. Checked every quarter of it. A leaf
    /// whose link ends is given up on at once instead; this bounds the wait on one that is
    /// connected but does not answer (say, stuck on a failing disk).
    pub request_timeout_ms: u64,
    /// How long a parent (root, aggregator) waits, from its start or from the end of a child's
    /// session, for the leaves below that child to be reported again before it treats them as
    /// empty, in milliseconds. While it waits, the root serves only entries it is certain of
    /// (pops are held, at most this long), and an aggregator that has just started does not
    /// open its session with its parent, so that a restarted root or aggregator serves the
    /// most urgent message of the whole tree first, not the most urgent of the children that
    /// came back first. A child that comes back is reported within milliseconds: it sends
    /// its offers and a report as soon as it is welcomed, and a restarted node's peers
    /// notice it at their next packet (keep-alives every `link_keep_alive_ms`). The price is
    /// paid when a node is lost for good: every pop of the tree waits this long once. 0:
    /// never wait (availability first: serve what the children present hold).
    pub absent_child_wait_ms: u64,
    /// Frames read from one connection but not yet handled by the node (bounds the mailbox).
    pub connection_inflight_frames_max: u32,
    /// Frames queued for writing on one connection; a peer that lets it fill is disconnected.
    pub connection_send_queue_max: u32,
    /// Most concurrent incoming connections of a node from producers and consumers (peers that
    /// present no node certificate); child nodes have a budget of their own,
    /// `node_connections_max`, so idle clients cannot keep the tree's own links out.
    pub connections_max: u32,
    /// Most concurrent incoming connections of a node from peers that present a certificate of
    /// the cluster (child nodes, and the root's direct links at a leaf).
    pub node_connections_max: u32,
    /// An incoming connection that has not said `Hello` this long after it opened is closed,
    /// in milliseconds.
    pub hello_timeout_ms: u64,
    /// Most connections one principal (a client of an access file) may hold to one node at
    /// once; more are refused `Overloaded`, so that one client cannot take every slot of
    /// `connections_max`.
    pub principal_connections_max: u32,
    /// Most pops (long-polls) of one principal the root holds waiting at once; more are
    /// refused `Overloaded`, so that one client cannot take every slot of
    /// `root_pending_pops_max`.
    pub principal_pops_max: u32,
    /// Most requests of one principal waiting at once: acks, nacks, extends and admin
    /// requests at the root, push batches waiting for the log at a leaf; more are refused
    /// `Overloaded`.
    pub principal_requests_max: u32,
    /// A client connection with no traffic for this long is closed, in milliseconds.
    pub idle_timeout_ms: u64,
    /// How long a client (the SDK, the CLI) waits for a connection to a node to be made —
    /// QUIC and TLS handshakes and crest's `Hello` — in milliseconds: an address with nothing
    /// listening fails in this time.
    pub connect_timeout_ms: u64,
    /// Keep-alive interval on client connections, in milliseconds.
    pub keep_alive_ms: u64,
    /// A link of the tree (a node to its parent, the root to a leaf) with no traffic for this
    /// long is closed, in milliseconds: how long a host that vanished without a word (power,
    /// network cut) goes unnoticed. A node that restarts is noticed at once instead: it answers
    /// its predecessor's packets with a stateless reset, from a key derived from its own.
    pub link_idle_timeout_ms: u64,
    /// Keep-alive interval on the tree's links, in milliseconds (well below
    /// `link_idle_timeout_ms`, so that a lost packet or two does not end a healthy link).
    pub link_keep_alive_ms: u64,
    /// Kernel receive and send buffer asked for each node's and client's UDP socket, in bytes
    /// (the kernel caps it at `net.core.rmem_max` / `wmem_max`; 0: the system default). A
    /// buffer that overflows drops datagrams, and QUIC's loss recovery then halves the link's
    /// sending rate.
    pub udp_buffer_bytes: u32,
    /// Largest UDP datagram a node or client sends or accepts, in bytes (1200..=6550). QUIC
    /// starts every path at 1200 bytes and raises its packet size by MTU discovery up to this
    /// bound; probes the path cannot carry are lost and discovery settles below them, so a
    /// bound above the path's MTU is safe. Where the path allows it (loopback, jumbo frames)
    /// fewer, larger packets carry a batch of frames: fewer to encrypt, send, acknowledge and
    /// receive. The ceiling 6550 keeps a send of 10 packets (quinn's most per `sendmsg` with
    /// segmentation offload) within a UDP datagram's 64 KiB; above it such sends fail.
    pub udp_payload_max: u16,
    /// Congestion window every QUIC connection starts with, in bytes (at least 2,400). crest's
    /// links are long-lived and carry bursts between idle gaps; a congestion controller grows
    /// its window only while the window limits sending, so with the usual 12 KB start the
    /// windows stayed small and each burst waited for round trips of acknowledgements. Lower it
    /// for links that cross a slow or shared network.
    pub quic_initial_window_bytes: u64,
    /// First delay before reconnecting to a parent, in milliseconds (doubles per failure).
    pub reconnect_backoff_initial_ms: u64,
    /// A child of the root that went to a root standing by dials the root this often, and
    /// goes back to it as soon as it answers, in milliseconds: after a cut heals or the root
    /// is back, the tree gathers under one root again.
    pub root_fail_back_ms: u64,
    /// How often the leader of a replica group tells its followers it is alive, in
    /// milliseconds.
    pub replica_heartbeat_ms: u64,
    /// The election timeout T, in milliseconds: with the heartbeat, what bounds the time a
    /// group is without a leader. A follower that hears no leader for 1.2 T to 2.2 T (drawn
    /// at random, so that followers do not all stand at once) asks the others whether they
    /// would elect it, and stands for election only if a majority would; a replica grants
    /// that (and its vote) only after 1.1 T without hearing a leader itself.
    pub replica_election_timeout_ms: u64,
    /// Most log entries (each one leader write, a batch of records) sent to a follower in one
    /// message.
    pub replica_append_entries_max: u64,
    /// A replica snapshots its state after this many log entries since the last snapshot, and
    /// then lets go of the entries before it (but this many): a follower further behind is
    /// sent the snapshot.
    pub replica_snapshot_after_entries: u64,
    /// Most log entries a replica keeps in memory (the rest are read from its log on disk).
    pub replica_log_cache_entries: u64,
    /// Most bytes of log entries a replica keeps in memory.
    pub replica_log_cache_bytes: u64,
    /// How many of its latest applied entries a replica remembers the size of (16 bytes
    /// each): a follower's lag in bytes is counted over them (one further behind shows as
    /// behind by more than they hold).
    pub replica_lag_window_entries: u64,
    /// Bytes a replica writes to its crest log between syncs of it. Its Raft log, synced
    /// before every acknowledgement, is what makes a write durable; the crest log is the
    /// applied state, and after a crash a replica applies again from its Raft log what it
    /// wrote after the last of these syncs (at most this many bytes). The sync runs beside
    /// the apply, but on a disk the Raft log shares it delays that log's syncs while it
    /// writes: a smaller value spreads the writing out (a steadier tail under sustained load)
    /// where a larger one leaves more to the page cache in a short burst.
    pub replica_journal_sync_bytes: u64,
    /// The leader of a replica group gathers the leaf's storage operations waiting for it into
    /// one log entry up to this many bytes (a larger single operation is an entry alone).
    pub replica_entry_bytes_max: u64,
    /// How long a replica's Raft log waits for more appends to join a flush before it syncs,
    /// in microseconds (at most one second). Appends already queued join anyway; every
    /// microsecond waited here is added to a commit on the leader and again on each
    /// follower, and the leader already gathers a leaf's operations into entries, so the wait
    /// is short by default.
    pub replica_log_flush_linger_us: u64,
    /// Log entries the leader has handed to Raft and not yet seen committed, at most; while
    /// they are out, the leaf's operations gather into the next entry.
    pub replica_entries_in_flight_max: u64,
    /// When a replicated leaf's leader acknowledges a push (`majority` or `all`).
    pub replica_acks: ReplicaAcks,
    /// Most bytes of one message between the replicas of a group (a batch of entries, a
    /// snapshot chunk, or their answers). A batch of entries past it is sent in parts; it must
    /// hold the largest entry: at least `replica_entry_bytes_max` + `frame_bytes_max` + 16 ×
    /// `push_batch_messages_max` + 64 KiB. It also bounds the entry bodies a leader streams
    /// ahead to each follower and the follower holds until named (the oldest go past it).
    pub replica_rpc_bytes_max: u64,
    /// Largest snapshot a replica takes from its group's leader, in bytes (a replica too far
    /// behind for the log is sent the leaf's whole state): a part past it is refused and
    /// counted, so no member can fill another's disk with one. Raise it for leaves that hold
    /// more.
    pub replica_snapshot_bytes_max: u64,
    /// When a leaf acknowledges pushes (leaves with a data directory).
    pub durability: Durability,
    /// A log segment is sealed and a new one started past this size, in bytes.
    pub wal_segment_bytes_max: u64,
    /// Allocate each new log segment at its full size when it is created (`fallocate`), so
    /// that an `fdatasync` flushes the written bytes without journaling a file-size change.
    pub wal_preallocate: bool,
    /// Storage operations queued for the log writer at most.
    pub wal_queue_ops_max: u32,
    /// Bytes the log writer gathers into one write (one group commit) at most.
    pub wal_write_batch_bytes_max: u32,
    /// Records nobody waits for (leases granted, expiries, lease timeouts) are written at
    /// once but synced with the next group commit that has a waiter (a push, an ack), or
    /// after this long at the latest, in milliseconds. A process crash loses none of them; a
    /// machine crash can lose those of this last moment (a message then comes back with one
    /// attempt fewer, or expires again).
    pub wal_unwaited_sync_ms: u64,
    /// While pushes are coming (one forced a sync within this long), an ack's delete (and a
    /// nack's release, a compaction step) is written at once but waits up to this
    /// long, in microseconds, for a sync that a push forces, instead of forcing one of its
    /// own; its answer goes out once it is durable, as before. A push that arrives meanwhile
    /// then waits for one sync instead of two: under a mixed load this cuts a leaf's syncs by
    /// 40 % and the push-ack tail with them. With no pushes coming, acks sync at once. 0: every
    /// ack syncs at once.
    pub wal_ack_sync_linger_us: u64,
    /// A leaf takes a checkpoint once its log grew by this many bytes since the last one (and
    /// the snapshot would be at most half that size), in bytes.
    pub checkpoint_log_bytes: u64,
    /// A leaf takes a checkpoint at the latest this long after logging something new, in
    /// milliseconds.
    pub checkpoint_interval_ms: u64,
    /// Memory for message bodies (metadata and payload, plus each one's bookkeeping:
    /// `record::CACHED_BODY_OVERHEAD_BYTES`) a leaf with a log keeps after they are durable, so
    /// that their delivery needs no read. Bodies beyond it are read back
    /// from the log when reserved: memory per queued message is then its index entry only.
    pub leaf_body_cache_bytes: u64,
    /// A sealed log segment is compacted (its live messages rewritten at the end of the log,
    /// so that the next checkpoint can delete it) once the bodies still live in it take less
    /// than this percentage of the bodies written to it (0: never compact).
    pub compaction_live_pct: u32,
    /// Messages one compaction step reads and rewrites at most.
    pub compaction_batch_messages: u32,
    /// Longest delay between reconnect attempts, in milliseconds: how long a node that came
    /// back may wait for a child that gave up dialing it for a while. An attempt costs one
    /// handshake packet and its retransmissions.
    pub reconnect_backoff_max_ms: u64,
    /// Deliveries of a message before it moves to its topic's dead-letter queue (the
    /// delivery that fails for the `max_attempts`-th time moves it).
    pub max_attempts: u32,
    /// A second push with the same dedup key within this window after the first is
    /// acknowledged with the first message's id and not enqueued again, in milliseconds.
    pub dedup_window_ms: u64,
    /// Most dedup keys a leaf remembers at once; pushes with new keys beyond it are refused.
    pub dedup_keys_max: u64,
    /// Longest dedup key, in bytes.
    pub dedup_key_bytes_max: u32,
    /// Longest delivery delay (`deliver_after`, nack delay) a message may ask for, in
    /// milliseconds.
    pub delay_max_ms: u64,
    /// Default time to live of a message once it is ready, in milliseconds (0: forever).
    pub message_ttl_ms: u64,
    /// Longest failure reason a nack may carry, in bytes (also an admin's reason to
    /// reprioritize a message).
    pub reason_bytes_max: u32,
    /// How often a leaf looks for messages of aging topics (a topic's `aging`) that waited past
    /// their priority's threshold, in milliseconds: a promotion comes at most this late.
    pub aging_check_ms: u64,
    /// Most ready messages of one priority of one topic a leaf looks at per aging check (the
    /// oldest first; those past their threshold are promoted): bounds the work of one check.
    pub aging_scan_messages: u32,
    /// Longest fairness key (`Message::fairness_key`), in bytes.
    pub fairness_key_bytes_max: u32,
    /// Most lanes of fairness keys one `weighted` topic has at a leaf at once (a lane per key
    /// with ready messages in a tier: a key ready in two tiers has two); the messages of
    /// further keys share their tier's lane until a key's lane empties. Bounds the lanes a
    /// topic sends up, and the root's work per delivery.
    pub fairness_keys_max: u32,
    /// Entries a parent lets each child hold in its window for each fairness key's lane (a
    /// topic's or tier's credit is `credits_per_topic`): the root's window grows by this
    /// much per key with ready messages and child. `credits_per_topic` caps it.
    pub credits_per_key: u32,
    /// Most ready and delayed messages one leaf deletes for one `PurgeTopic` request (the
    /// caller repeats until none are left): bounds the records one request logs. Also bounds
    /// the messages one `MoveTopic` request moves.
    pub purge_batch_messages: u32,
    /// Most topic configurations (set at run time through `Admin::configure`, deleted ones
    /// included until they are set again) a leaf keeps.
    pub topic_configs_max: u32,
    /// Most of a leaf's `topic_configs_max` configurations whose topics (or scopes) are in one
    /// namespace: one tenant's admin cannot take every configuration from the others (nor the
    /// room an operator needs for a quota).
    pub namespace_topic_configs_max: u32,
    /// Most bytes of attributes (names and values) one topic configuration carries.
    pub topic_attributes_bytes_max: u32,
    /// Most scopes (topics and namespaces) with quotas; a leaf does not keep a configuration
    /// that would limit one more (and the configuring client is told no leaf kept it).
    pub quota_scopes_max: u32,
    /// How often a leaf reports its usage of each limited scope to the root, which answers
    /// with its allowances, in milliseconds (a leaf short of allowance reports at once).
    pub quota_report_ms: u64,
    /// Least allowance a busy leaf asks for, in messages (it asks for twice its admissions
    /// of the last report interval plus this); also what a leaf asks ahead for when a scope's
    /// limits are set, if the quota or burst is at least eight times this.
    pub quota_grant_messages_min: u64,
    /// Least allowance a busy leaf asks for, in payload bytes.
    pub quota_grant_bytes_min: u64,
    /// How long a leaf that ran short of its allowance of a quota (or of a rate's tokens, before
    /// the root said when more come) and could not hold the batch any longer asks the producer
    /// to wait before sending it again, in milliseconds.
    pub quota_retry_ms: u64,
    /// How long a leaf that ran short of its allowance (or of a rate's tokens, before the root
    /// said when more come) holds a push batch for the root's grant before it refuses it with
    /// a time to retry, in milliseconds.
    pub quota_hold_ms: u64,
    /// Most push batches a leaf holds waiting for the root's grant (`quota_hold_ms`); past
    /// it a batch is refused with a time to retry.
    pub quota_hold_batches_max: u32,
    /// After it starts, the root grants no allowance until every leaf reported its usage or
    /// this long passed, in milliseconds (a leaf still unheard of is counted once it reports).
    /// Also how often at most the root sends a limited scope's configuration again to a leaf
    /// that lacks it.
    pub quota_start_wait_ms: u64,
    /// Largest HTTP request body an SQS gateway reads, in bytes (SQS's largest request, a
    /// message or batch of 1 MiB, fits in the default with room for JSON's escapes).
    pub gateway_body_bytes_max: u64,
    /// Most requests an SQS gateway serves at once; beyond, `RequestThrottled` (SDKs back off
    /// and retry).
    pub gateway_requests_max: u32,
    /// Most of `gateway_requests_max` one access key's requests hold at once (long polls
    /// included), so one key's clients cannot take every slot from the others; beyond,
    /// `RequestThrottled` naming this bound (a value above `gateway_requests_max` is that).
    pub gateway_requests_per_key_max: u32,
    /// How long an SQS gateway uses a queue's attributes read from the tree before it reads
    /// them again, in milliseconds (another gateway's change shows after at most this long).
    pub gateway_queue_cache_ms: u64,
    /// How long an SQS receive without a wait (a short poll) may wait for a first message, in
    /// milliseconds: one sent or made visible again just before is still on its way up the
    /// tree to the root, where SQS's short poll would find it. It answers as soon as one
    /// comes; only a queue with nothing ready waits this long (0: answer at once).
    pub gateway_short_poll_ms: u64,
    /// Most queues whose attributes an SQS gateway caches per access key.
    pub gateway_queue_cache_max: u32,
    /// Most message move tasks an SQS gateway remembers for `ListMessageMoveTasks`, running
    /// ones included: with this many running, another start is `RequestThrottled`. Shared by
    /// every key of the gateway (one running task per source queue).
    pub gateway_move_tasks_max: u32,
    /// Most HTTP connections an SQS gateway holds open at once; a connection past it is
    /// answered 503 and closed.
    pub gateway_connections_max: u32,
    /// Most HTTP connections an SQS gateway holds open from one client address (a share of
    /// `gateway_connections_max`, so one host cannot take every connection; a value above it
    /// is that).
    pub gateway_connections_per_address_max: u32,
    /// How long an SQS gateway waits for a request's headers (and, on a kept-alive
    /// connection, for the next request to start) before it closes the connection, in
    /// milliseconds.
    pub gateway_header_timeout_ms: u64,
    /// How long an SQS gateway waits for a request's body once its headers came, in
    /// milliseconds; past it the request is answered `RequestTimeout`.
    pub gateway_body_timeout_ms: u64,
    /// Most body bytes an SQS gateway holds, over all connections, of requests whose
    /// signature is not verified yet (a request reserves its `Content-Length` before its
    /// body is read); past it a request is answered `RequestThrottled` without being read.
    pub gateway_unauthenticated_bytes_max: u64,
    /// Most parameters an SQS query-protocol request may carry (a batch of ten messages
    /// with ten attributes each needs about 500).
    pub gateway_query_params_max: u32,
    /// Host names (besides IP addresses, `localhost` and the host of the node's own
    /// `address`) under which a node's dashboard and `/stats` answer a browser: a page of
    /// another site whose name was rebound to the node's address sends that site's name, and
    /// is refused (at most 64 names).
    pub http_hosts: Vec<String>,
    /// Per-topic overrides of the delivery policy, by topic name.
    pub topics: BTreeMap<String, TopicSettings>,
    /// How often a leaf or aggregator reports its subtree's measurements to its parent, in
    /// milliseconds.
    pub report_interval_ms: u64,
    /// Most topics a report carries (the deepest are kept).
    pub report_topics_max: u32,
    /// Most (topic, priority) pairs whose consumer lag the root measures for `/metrics`
    /// (`crest_consumer_lag_seconds`); deliveries of further pairs are counted, not measured.
    pub consumer_lag_series_max: u32,
    /// Whether a child swaps a more urgent entry in for the least urgent one its parent holds
    /// when its credit is used up (the rule that keeps credits from inverting priorities).
    /// Off only to measure what it is worth (`crest sim`).
    pub offer_swap: bool,
    /// How long a child may hold back a change of its offers to gather more into one `Offer`,
    /// in microseconds (0: every change goes at once). Urgent changes never wait (see
    /// `offer_urgent_flush`), nor does the refill after a reserve.
    pub offer_linger_us: u64,
    /// A child sends its gathered offer changes of a topic once this many are waiting, linger
    /// or not.
    pub offer_batch_entries: u32,
    /// Whether a change that would enter the front of what the parent holds from this child
    /// (an entry more urgent than every one the parent holds from it, or a lower frontier) is
    /// sent at once instead of waiting for the linger. Off only to measure what it is worth.
    pub offer_urgent_flush: bool,
    /// Whether the root connects to every leaf and sends reserves, settles and admin requests
    /// to it directly (the answers, grants with their payloads included, come back the same
    /// way) instead of through the aggregators, which then carry offers only and learn of
    /// taken entries from the leaf's retracts. Off: the whole pop path goes through the tree.
    pub direct_pop_path: bool,
    /// Most entries per topic the root keeps reserved ahead of pops. The buffer follows
    /// recent pop demand below this bound. 0, the default, turns reserve-ahead off: where a
    /// reserve is a quick round trip it costs more than it saves (measured on a loopback tree).
    /// In a tree with replicated leaves the default is 4,096 ([`RESERVED_AHEAD_REPLICATED`]):
    /// there every reserve waits for its leases to be committed by the group, and a pop that
    /// finds its entries reserved ahead does not wait for that.
    pub reserve_ahead_max: u32,
    /// Most payload bytes all of the root's reserve-ahead buffers hold together.
    pub reserve_ahead_bytes_max: u64,
    /// Longest an entry stays reserved ahead before it is given back to its leaf, in
    /// milliseconds.
    pub reserve_ahead_hold_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            payload_bytes_max: PAYLOAD_BYTES_MAX_DEFAULT,
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
            push_batch_messages_max: PUSH_BATCH_MESSAGES_MAX_DEFAULT,
            push_batch_bytes_max: PUSH_BATCH_BYTES_MAX_DEFAULT,
            topic_bytes_max: 128,
            metadata_entries_max: 32,
            metadata_bytes_max: 4096,
            topics_max: 1024,
            namespace_topics_max: 512,
            credits_per_topic: 256,
            leaf_messages_max: 10_000_000,
            leaf_pending_batches_max: 1024,
            leaf_pending_settles_max: 10_000,
            lease_timeout_ms: 30_000,
            lease_timeout_max_ms: 12 * 3600 * 1000,
            lease_grants_wait_for_log: false,
            pop_messages_max: POP_MESSAGES_MAX_DEFAULT,
            pop_wait_max_ms: 20_000,
            pop_order_wait_ms: 50,
            root_pending_pops_max: 10_000,
            root_pending_requests_max: 10_000,
            request_timeout_ms: 2_000,
            absent_child_wait_ms: 1_000,
            connection_inflight_frames_max: 64,
            connection_send_queue_max: 4096,
            connections_max: 1024,
            node_connections_max: 256,
            hello_timeout_ms: 5_000,
            principal_connections_max: 256,
            principal_pops_max: 1_024,
            principal_requests_max: 1_024,
            idle_timeout_ms: 10_000,
            connect_timeout_ms: 2_000,
            keep_alive_ms: 1_000,
            link_idle_timeout_ms: 1_000,
            link_keep_alive_ms: 200,
            udp_buffer_bytes: 4 * 1024 * 1024,
            udp_payload_max: UDP_PAYLOAD_MAX_DEFAULT,
            quic_initial_window_bytes: 1024 * 1024,
            reconnect_backoff_initial_ms: 50,
            root_fail_back_ms: 2_000,
            replica_heartbeat_ms: 100,
            replica_election_timeout_ms: 500,
            replica_append_entries_max: 256,
            replica_snapshot_after_entries: 100_000,
            replica_log_cache_entries: 4_096,
            replica_log_cache_bytes: 64 * 1024 * 1024,
            replica_lag_window_entries: 65_536,
            replica_journal_sync_bytes: 64 * 1024 * 1024,
            replica_entry_bytes_max: 1024 * 1024,
            replica_log_flush_linger_us: REPLICA_LOG_FLUSH_LINGER_US_DEFAULT,
            replica_entries_in_flight_max: 2,
            replica_acks: ReplicaAcks::Majority,
            replica_rpc_bytes_max: 64 * 1024 * 1024,
            replica_snapshot_bytes_max: 256 * 1024 * 1024 * 1024,
            durability: Durability::Fsync,
            wal_segment_bytes_max: 64 * 1024 * 1024,
            wal_preallocate: true,
            wal_queue_ops_max: 65_536,
            wal_write_batch_bytes_max: 8 * 1024 * 1024,
            wal_unwaited_sync_ms: 100,
            wal_ack_sync_linger_us: WAL_ACK_SYNC_LINGER_US_DEFAULT,
            checkpoint_log_bytes: 256 * 1024 * 1024,
            checkpoint_interval_ms: 300_000,
            leaf_body_cache_bytes: 64 * 1024 * 1024,
            compaction_live_pct: 25,
            compaction_batch_messages: 1024,
            reconnect_backoff_max_ms: 500,
            max_attempts: 10,
            dedup_window_ms: 5 * 60 * 1000,
            dedup_keys_max: 1_000_000,
            dedup_key_bytes_max: 128,
            delay_max_ms: 30 * 24 * 3600 * 1000,
            message_ttl_ms: 0,
            reason_bytes_max: 1024,
            aging_check_ms: 1000,
            aging_scan_messages: 4096,
            fairness_key_bytes_max: 128,
            fairness_keys_max: 64,
            credits_per_key: 16,
            purge_batch_messages: 100_000,
            topic_configs_max: 10_000,
            namespace_topic_configs_max: 5_000,
            topic_attributes_bytes_max: 16 * 1024,
            quota_scopes_max: 1024,
            quota_report_ms: 100,
            quota_grant_messages_min: 100,
            quota_grant_bytes_min: 1 << 20,
            quota_retry_ms: 5,
            quota_hold_ms: 100,
            quota_hold_batches_max: 256,
            quota_start_wait_ms: 2_000,
            gateway_body_bytes_max: 4 << 20,
            gateway_requests_max: 1024,
            gateway_requests_per_key_max: 256,
            gateway_queue_cache_ms: 1000,
            gateway_short_poll_ms: 200,
            gateway_queue_cache_max: 10_000,
            gateway_move_tasks_max: 1000,
            gateway_connections_max: 2048,
            gateway_connections_per_address_max: 512,
            gateway_header_timeout_ms: 10_000,
            gateway_body_timeout_ms: 30_000,
            gateway_unauthenticated_bytes_max: 64 << 20,
            gateway_query_params_max: 1000,
            topics: BTreeMap::new(),
            report_interval_ms: 1_000,
            http_hosts: Vec::new(),
            report_topics_max: 256,
            consumer_lag_series_max: 4096,
            offer_swap: true,
            offer_linger_us: OFFER_LINGER_US_DEFAULT,
            offer_batch_entries: 64,
            offer_urgent_flush: true,
            direct_pop_path: true,
            reserve_ahead_max: 0,
            reserve_ahead_bytes_max: 8 * 1024 * 1024,
            reserve_ahead_hold_ms: 200,
        }
    }
}

/// A setting that is out of range or inconsistent with another.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting {name}: {problem}")]
pub struct SettingsError {
    /// The setting's name.
    pub name: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl Settings {
    /// The default visibility timeout.
    pub fn lease_timeout(&self) -> Duration {
        Duration::from_millis(self.lease_timeout_ms)
    }
}

/// Most topics a report's stats carry, and so the ceiling of `report_topics_max`: a parent
/// refuses a child's report listing more while decoding it.
pub const REPORT_TOPICS_MAX: usize = 65_536;

/// What a receiver allows in the lists of a client's `Push` and `Ack`, checked while the body
/// is decoded, before they are allocated (each entry costs far more memory than its bytes
/// on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Messages in one push (`push_batch_messages_max`).
    pub batch_messages_max: u32,
    /// Metadata entries on one message (`metadata_entries_max`).
    pub metadata_entries_max: u32,
    /// Receipts in one ack (`pop_messages_max`).
    pub receipts_max: u32,
    /// Adds, and retracts, in one offer of a child (`credits_per_topic`: a child holds no
    /// more than its credit in its parent's window, so it never adds or takes back more).
    pub offer_entries_max: u32,
}

impl DecodeLimits {
    /// No limit but the frame's length.
    pub const NONE: DecodeLimits = DecodeLimits {
        batch_messages_max: u32::MAX,
        metadata_entries_max: u32::MAX,
        receipts_max: u32::MAX,
        offer_entries_max: u32::MAX,
    };

    /// The limits of a node with `settings`.
    pub fn of(settings: &Settings) -> DecodeLimits {
        DecodeLimits {
            batch_messages_max: settings.push_batch_messages_max,
            metadata_entries_max: settings.metadata_entries_max,
            receipts_max: settings.pop_messages_max,
            offer_entries_max: settings.credits_per_topic,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Settings::default().validate().unwrap();
    }

    #[test]
    fn inconsistent_settings_are_named() {
        let settings = Settings {
            frame_bytes_max: 1024,
            ..Settings::default()
        };
        let error = settings.validate().unwrap_err();
        assert_eq!(error.name, "frame_bytes_max");
        let settings = Settings {
            credits_per_topic: 0,
            ..Settings::default()
        };
        assert_eq!(settings.validate().unwrap_err().name, "credits_per_topic");
        for (linger, name) in [
            (1_000_001, Some("wal_ack_sync_linger_us")),
            (1_000_000, None),
            (0, None),
        ] {
            let settings = Settings {
                wal_ack_sync_linger_us: linger,
                ..Settings::default()
            };
            assert_eq!(settings.validate().err().map(|e| e.name), name);
            let settings = Settings {
                replica_log_flush_linger_us: linger,
                ..Settings::default()
            };
            assert_eq!(
                settings.validate().err().map(|e| e.name),
                name.map(|_| "replica_log_flush_linger_us")
            );
        }
    }

    #[test]
    fn a_replica_rpc_must_hold_the_largest_entry() {
        let defaults = Settings::default();
        let largest = defaults.replica_entry_bytes_max
            + u64::from(defaults.frame_bytes_max)
            + u64::from(defaults.push_batch_messages_max) * 16
            + REPLICA_RPC_OVERHEAD_BYTES;
        for (rpc, refused) in [(largest - 1, true), (largest, false)] {
            let settings = Settings {
                replica_rpc_bytes_max: rpc,
                ..Settings::default()
            };
            let error = settings.validate().err();
            assert_eq!(
                error.as_ref().map(|e| e.name),
                refused.then_some("replica_rpc_bytes_max")
            );
            if let Some(error) = error {
                assert!(error.problem.contains(&largest.to_string()), "{error:?}");
            }
        }
    }

    #[test]
    fn quic_packet_and_window_bounds_are_checked() {
        for (payload, window, name) in [
            (16_384, 1 << 20, Some("udp_payload_max")),
            (1_000, 1 << 20, Some("udp_payload_max")),
            (1_452, 1_000, Some("quic_initial_window_bytes")),
            (UDP_PAYLOAD_MAX_CEILING, 2_400, None),
        ] {
            let settings = Settings {
                udp_payload_max: payload,
                quic_initial_window_bytes: window,
                ..Settings::default()
            };
            assert_eq!(settings.validate().err().map(|e| e.name), name);
        }
    }
}
