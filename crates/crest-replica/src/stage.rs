//! Entry bodies sent to the followers ahead of the AppendEntries that carries them.
//!
//! openraft has one AppendEntries out to a follower at a time: the next leaves when the
//! answer to the last is back. An RPC carrying a megabyte spends about as long in transit
//! (encoding, QUIC, decoding) as the follower spends writing and syncing it, so a follower
//! syncs half the time and waits for bytes the other half. The leader therefore *stages*
//! each batch it hands to Raft: a task per follower streams it at once, while the RPC before
//! is still out, and the AppendEntries that later carries the entry names the staged body
//! instead of carrying it. The follower puts the body back and appends exactly the entry it
//! would have received.
//!
//! Staging is only a cache of bodies in transit; Raft's messages and what a follower
//! appends are unchanged. A body is named by the leader's stream (`session`), its place in
//! it (`seq`) and the CRC-32 of the entry's payload; the leader names one only when the
//! entry's payload is the very buffer it staged (the same allocation, held alive by the
//! stage), and the follower puts a body back only if its CRC matches the name.
//! A follower that lacks a named body (its stage stream broke, it evicted the body, a new
//! leader's session replaced the old) answers [`Missing`], and the leader sends the same
//! entries in full. Both sides hold at most `replica_rpc_bytes_max` bytes of staged bodies
//! per follower, dropping the oldest past it.

use crate::{Batch, ReplicaId, TypeConfig};
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bodies smaller than this go with their entry: an RPC carries them in about the time its
/// fixed costs take, and staging one costs a stream write and a wakeup on both sides.
pub(crate) const STAGE_BYTES_MIN: usize = 64 * 1024;

/// The first byte of a stage stream. Every RPC request starts with a MessagePack map or
/// array marker (0x80 and up), never with it.
pub(crate) const STAGE_TAG: u8 = 0;

/// A follower's answer when a body the leader named is not there: send it in full.
#[derive(Debug)]
pub(crate) struct Missing;

/// The leader's side: what it staged per follower. Clones share.
#[derive(Clone)]
pub struct Stager {
    links: Arc<BTreeMap<ReplicaId, Arc<Link>>>,
}

impl Stager {
    /// A stager for `followers` (every other member), each holding at most `bytes_max` bytes.
    pub(crate) fn new(followers: impl IntoIterator<Item = ReplicaId>, bytes_max: usize) -> Stager {
        // A session no earlier leader of the group drew (with overwhelming likelihood): a
        // follower keeps the bodies of one session only.
        let session = crate::random_u64();
        let links = followers
            .into_iter()
            .map(|id| (id, Arc::new(Link::new(session, bytes_max))))
            .collect();
        Stager {
            links: Arc::new(links),
        }
    }

    /// Streams `batch` to every follower ahead of the entry that will carry it. Call it with
    /// the very buffer handed to Raft, before handing it.
    pub fn stage(&self, batch: &Batch) {
        if batch.0.len() < STAGE_BYTES_MIN || self.links.is_empty() {
            return;
        }
        // Once for every follower: the name of the body in each AppendEntries.
        let crc = crc32fast::hash(&batch.0);
        for link in self.links.values() {
            link.stage(&batch.0, crc);
        }
    }

    /// How AppendEntries went out since the start, all followers together.
    pub fn counts(&self) -> StageCounts {
        let mut counts = StageCounts::default();
        for link in self.links.values() {
            counts.named += link.named.load(Ordering::Relaxed);
            counts.missing += link.missing.load(Ordering::Relaxed);
        }
        counts
    }

    /// The link to follower `id`.
    pub(crate) fn link(&self, id: ReplicaId) -> Option<Arc<Link>> {
        self.links.get(&id).cloned()
    }

    /// Starts one task per follower that streams its staged bodies over `endpoint` to the
    /// address `peers` gives it, dialing it by its node name.
    pub(crate) fn spawn(
        &self,
        endpoint: &quinn::Endpoint,
        peers: &BTreeMap<ReplicaId, (String, SocketAddr)>,
        backoff: Duration,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        self.links
            .iter()
            .filter_map(|(id, link)| {
                let (name, address) = peers.get(id)?.clone();
                Some(tokio::spawn(link.clone().run(
                    endpoint.clone(),
                    name,
                    address,
                    backoff,
                )))
            })
            .collect()
    }
}

/// How a leader's AppendEntries went out ([`Stager::counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageCounts {
    /// Appends that named bodies staged ahead instead of carrying them.
    pub named: u64,
    /// Of those, appends the follower answered lacking a body: sent again in full.
    pub missing: u64,
}

/// The stage towards one follower.
pub(crate) struct Link {
    session: u64,
    bytes_max: usize,
    state: Mutex<LinkState>,
    wake: tokio::sync::Notify,
    named: AtomicU64,
    missing: AtomicU64,
}

#[derive(Default)]
struct LinkState {
    /// The number of the next body staged.
    next: u64,
    /// Staged, not yet written to the stream.
    queued: VecDeque<StagedBody>,
    /// Written to the stream, not yet named by an AppendEntries.
    written: VecDeque<StagedBody>,
    /// Bytes of both.
    bytes: usize,
    /// The next AppendEntries goes in full (the last staged one failed on the way).
    full_next: bool,
}

/// A body staged towards a follower: its number in the session, its bytes and their CRC-32.
type StagedBody = (u64, Bytes, u32);

/// A body named in an AppendEntries: the entry's place in it, the body's number in the
/// session, and the CRC-32 of the entry's payload.
pub(crate) type Ref = (u32, u64, u32);

/// An AppendEntries whose staged bodies were taken out, and what puts them back.
pub(crate) struct Named {
    /// The stage's session.
    pub(crate) session: u64,
    /// Per entry taken out: its place in the request, its body's number and CRC-32.
    pub(crate) refs: Vec<Ref>,
    /// The bodies taken out, to put back if the follower lacks one.
    originals: Vec<(usize, Bytes)>,
}

impl Named {
    /// Puts the bodies back into `entries`.
    pub(crate) fn restore(self, entries: &mut [openraft::Entry<TypeConfig>]) {
        for (at, body) in self.originals {
            if let Some(openraft::EntryPayload::Normal(batch)) =
                entries.get_mut(at).map(|entry| &mut entry.payload)
            {
                batch.0 = body;
            }
        }
    }
}

impl Link {
    fn new(session: u64, bytes_max: usize) -> Link {
        Link {
            session,
            bytes_max,
            state: Mutex::new(LinkState::default()),
            wake: tokio::sync::Notify::new(),
            named: AtomicU64::new(0),
            missing: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stage(&self, body: &Bytes, crc: u32) {
        if body.len() < STAGE_BYTES_MIN || body.len() > self.bytes_max {
            return;
        }
        {
            let mut state = self.lock();
            let seq = state.next;
            state.next += 1;
            state.bytes += body.len();
            state.queued.push_back((seq, body.clone(), crc));
            // Past the bound, the oldest go: their entries will be sent in full.
            while state.bytes > self.bytes_max {
                let Some((_, old, _)) = state
                    .written
                    .pop_front()
                    .or_else(|| state.queued.pop_front())
                else {
                    break;
                };
                state.bytes -= old.len();
            }
        }
        self.wake.notify_one();
    }

    /// Takes out of `entries` the bodies this link wrote to the follower (the same buffers),
    /// and forgets every body staged before the last one named: the entries they went with
    /// were sent already. `None`: nothing to take out.
    pub(crate) fn name(&self, entries: &mut [openraft::Entry<TypeConfig>]) -> Option<Named> {
        let mut state = self.lock();
        if std::mem::take(&mut state.full_next) || state.written.is_empty() {
            return None;
        }
        let mut named = Named {
            session: self.session,
            refs: Vec::new(),
            originals: Vec::new(),
        };
        let mut last = None;
        for (at, entry) in entries.iter_mut().enumerate() {
            let openraft::EntryPayload::Normal(batch) = &mut entry.payload else {
                continue;
            };
            let same = |staged: &&StagedBody| {
                staged.1.as_ptr() == batch.0.as_ptr() && staged.1.len() == batch.0.len()
            };
            let (Some(&(seq, _, crc)), Ok(place)) =
                (state.written.iter().find(same), u32::try_from(at))
            else {
                continue;
            };
            named.refs.push((place, seq, crc));
            named.originals.push((at, std::mem::take(&mut batch.0)));
            last = Some(seq);
        }
        let last = last?;
        while state
            .written
            .front()
            .is_some_and(|(seq, _, _)| *seq <= last)
        {
            if let Some((_, body, _)) = state.written.pop_front() {
                state.bytes -= body.len();
            }
        }
        self.named.fetch_add(1, Ordering::Relaxed);
        Some(named)
    }

    /// The AppendEntries that named staged bodies failed on the way: the next goes in full.
    pub(crate) fn failed(&self) {
        self.lock().full_next = true;
    }

    /// The follower lacked a body an AppendEntries named: it goes again in full.
    pub(crate) fn missed(&self) {
        self.missing.fetch_add(1, Ordering::Relaxed);
    }

    /// Streams staged bodies to the follower at `address` (until the group aborts it).
    async fn run(
        self: Arc<Self>,
        endpoint: quinn::Endpoint,
        name: String,
        address: SocketAddr,
        backoff: Duration,
    ) {
        let mut stream: Option<quinn::SendStream> = None;
        loop {
            self.wake.notified().await;
            loop {
                let next = self.lock().queued.pop_front();
                let Some((seq, body, crc)) = next else { break };
                if stream.is_none() {
                    stream = open(&endpoint, &name, address, self.session).await;
                }
                let Some(send) = &mut stream else {
                    // Unreachable: what is staged meanwhile goes in full with its entry.
                    {
                        let mut state = self.lock();
                        let dropped: usize = state.queued.drain(..).map(|(_, b, _)| b.len()).sum();
                        state.bytes -= dropped + body.len();
                    }
                    tokio::time::sleep(backoff).await;
                    break;
                };
                let mut head = [0u8; 12];
                head[..8].copy_from_slice(&seq.to_le_bytes());
                head[8..].copy_from_slice(&(body.len() as u32).to_le_bytes());
                let sent = async {
                    send.write_all(&head).await?;
                    send.write_chunk(body.clone()).await
                }
                .await;
                let mut state = self.lock();
                if sent.is_ok() {
                    state.written.push_back((seq, body, crc));
                } else {
                    state.bytes -= body.len();
                    stream = None;
                }
            }
        }
    }
}

/// Opens a stage stream to the follower at `address`: its tag and the session.
async fn open(
    endpoint: &quinn::Endpoint,
    name: &str,
    address: SocketAddr,
    session: u64,
) -> Option<quinn::SendStream> {
    let connection = crest_transport::connect(endpoint, address, name)
        .await
        .ok()?;
    let (mut send, _recv) = connection.open_bi().await.ok()?;
    let mut head = [0u8; 9];
    head[0] = STAGE_TAG;
    head[1..].copy_from_slice(&session.to_le_bytes());
    send.write_all(&head).await.ok()?;
    Some(send)
}

/// Reads a body of `len` bytes and its CRC-32, each piece hashed as it is copied in (while it
/// is in the cache) and nothing written twice: a zero-filled buffer read into cost a pass over
/// every staged byte. `None`: the stream ended or broke first.
async fn read_body(recv: &mut quinn::RecvStream, len: usize) -> Option<(bytes::Bytes, u32)> {
    let mut body = bytes::BytesMut::with_capacity(len);
    let mut crc = crc32fast::Hasher::new();
    while body.len() < len {
        let chunk = recv.read_chunk(len - body.len(), true).await.ok()??;
        crc.update(&chunk.bytes);
        body.extend_from_slice(&chunk.bytes);
    }
    Some((body.freeze(), crc.finalize()))
}

/// The follower's side: the bodies of the current leader's session. Clones share.
#[derive(Clone)]
pub(crate) struct Staged {
    inner: Arc<StagedInner>,
}

struct StagedInner {
    state: Mutex<StagedState>,
    arrived: tokio::sync::Notify,
    bytes_max: usize,
    /// How long a named body that has not arrived yet is waited for on a live stream.
    wait: Duration,
}

#[derive(Default)]
struct StagedState {
    session: u64,
    /// Each body with its CRC-32.
    bodies: BTreeMap<u64, (Bytes, u32)>,
    bytes: usize,
    /// The highest number received in the session.
    highest: Option<u64>,
    /// Stage streams of the session being read.
    open: usize,
}

impl Staged {
    /// Holding at most `bytes_max` bytes; waiting at most `wait` for a named body in transit.
    pub(crate) fn new(bytes_max: usize, wait: Duration) -> Staged {
        Staged {
            inner: Arc::new(StagedInner {
                state: Mutex::new(StagedState::default()),
                arrived: tokio::sync::Notify::new(),
                bytes_max,
                wait,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StagedState> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads a stage stream (its tag already read) until it ends or breaks; a body past the
    /// bound ends it.
    pub(crate) async fn read(&self, mut recv: quinn::RecvStream) {
        let mut session = [0u8; 8];
        if recv.read_exact(&mut session).await.is_err() {
            return;
        }
        let session = u64::from_le_bytes(session);
        {
            let mut state = self.lock();
            if state.session != session {
                // A new leader: the last one's bodies will never be named again.
                *state = StagedState {
                    session,
                    ..StagedState::default()
                };
            }
            state.open += 1;
        }
        loop {
            let mut head = [0u8; 12];
            if recv.read_exact(&mut head).await.is_err() {
                break;
            }
            let seq = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
            let len = u32::from_le_bytes(head[8..].try_into().unwrap_or_default()) as usize;
            if len > self.inner.bytes_max {
                let _ = recv.stop(5u32.into());
                break;
            }
            let Some((body, crc)) = read_body(&mut recv, len).await else {
                break;
            };
            let mut state = self.lock();
            if state.session != session {
                break;
            }
            state.bytes += len;
            state.bodies.insert(seq, (body, crc));
            state.highest = state.highest.max(Some(seq));
            while state.bytes > self.inner.bytes_max {
                let Some((_, (old, _))) = state.bodies.pop_first() else {
                    break;
                };
                state.bytes -= old.len();
            }
            drop(state);
            self.inner.arrived.notify_waiters();
        }
        let mut state = self.lock();
        if state.session == session {
            state.open -= 1;
        }
        drop(state);
        self.inner.arrived.notify_waiters();
    }

    /// Puts the bodies `refs` names back into `entries`, waiting for those still in transit
    /// on a live stream; forgets every body up to the last named. A body whose CRC differs
    /// from its name's is missing.
    pub(crate) async fn fill(
        &self,
        session: u64,
        refs: &[Ref],
        entries: &mut [openraft::Entry<TypeConfig>],
    ) -> Result<(), Missing> {
        let deadline = tokio::time::Instant::now() + self.inner.wait;
        let last = refs.iter().map(|(_, seq, _)| *seq).max().ok_or(Missing)?;
        loop {
            let arrived = self.inner.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            {
                let mut state = self.lock();
                let current = state.session == session;
                let present = current
                    && refs
                        .iter()
                        .all(|(_, seq, _)| state.bodies.contains_key(seq));
                if present {
                    for &(at, seq, crc) in refs {
                        let body = match state.bodies.get(&seq) {
                            Some((body, held)) if *held == crc => body.clone(),
                            _ => return Err(Missing),
                        };
                        match entries.get_mut(at as usize).map(|entry| &mut entry.payload) {
                            Some(openraft::EntryPayload::Normal(batch)) if batch.0.is_empty() => {
                                batch.0 = body;
                            }
                            _ => return Err(Missing),
                        }
                    }
                    let keep = state.bodies.split_off(&(last + 1));
                    let gone: usize = state.bodies.values().map(|(body, _)| body.len()).sum();
                    state.bodies = keep;
                    state.bytes -= gone;
                    return Ok(());
                }
                // Still in transit: later than anything received, on a stream still read.
                let coming = current
                    && state.open > 0
                    && refs.iter().all(|(_, seq, _)| {
                        state.bodies.contains_key(seq) || state.highest.is_none_or(|h| *seq > h)
                    });
                if !coming {
                    return Err(Missing);
                }
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return Err(Missing);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

    fn stage(link: &Link, body: &Bytes) {
        link.stage(body, crc32fast::hash(body));
    }

    fn entry(index: u64, body: &Bytes) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Batch(body.clone())),
        }
    }

    #[test]
    fn only_the_very_buffer_staged_and_written_is_named() {
        let link = Link::new(7, 1 << 20);
        let staged = Bytes::from(vec![1u8; STAGE_BYTES_MIN]);
        let twin = Bytes::from(vec![1u8; STAGE_BYTES_MIN]);
        // Too small to stage.
        stage(&link, &Bytes::from(vec![1u8; STAGE_BYTES_MIN - 1]));
        assert_eq!(link.lock().bytes, 0);
        stage(&link, &staged);
        // Staged but not yet written to the stream: sent in full.
        let mut entries = vec![entry(1, &staged)];
        assert!(link.name(&mut entries).is_none());
        let written = link.lock().queued.pop_front().unwrap();
        link.lock().written.push_back(written);
        // Equal bytes in another buffer are not named; the staged buffer is.
        let mut entries = vec![entry(1, &twin), entry(2, &staged)];
        let named = link.name(&mut entries).unwrap();
        let crc = crc32fast::hash(&staged);
        assert_eq!((named.session, named.refs.clone()), (7, vec![(1, 0, crc)]));
        assert!(matches!(&entries[1].payload, EntryPayload::Normal(b) if b.0.is_empty()));
        assert!(matches!(&entries[0].payload, EntryPayload::Normal(b) if b.0 == twin));
        named.restore(&mut entries);
        assert!(matches!(&entries[1].payload, EntryPayload::Normal(b) if b.0 == staged));
        // Named once: forgotten, with its bytes.
        assert_eq!(link.lock().bytes, 0);
        assert!(link.name(&mut entries).is_none());
    }

    #[test]
    fn a_stage_past_its_bound_drops_its_oldest_bodies() {
        let link = Link::new(1, 5 * STAGE_BYTES_MIN / 2);
        for fill in 0..4u8 {
            stage(&link, &Bytes::from(vec![fill; STAGE_BYTES_MIN]));
        }
        let state = link.lock();
        assert_eq!(state.bytes, 2 * STAGE_BYTES_MIN);
        let kept: Vec<u64> = state.queued.iter().map(|(seq, _, _)| *seq).collect();
        assert_eq!(kept, vec![2, 3]);
    }

    #[test]
    fn a_failed_staged_append_sends_the_next_in_full() {
        let link = Link::new(1, 1 << 20);
        let body = Bytes::from(vec![3u8; STAGE_BYTES_MIN]);
        stage(&link, &body);
        let written = link.lock().queued.pop_front().unwrap();
        link.lock().written.push_back(written);
        link.failed();
        assert!(link.name(&mut [entry(1, &body)]).is_none());
        assert!(link.name(&mut [entry(1, &body)]).is_some());
    }

    #[tokio::test]
    async fn a_follower_lacking_a_named_body_says_so_and_fills_those_it_holds() {
        let staged = Staged::new(1 << 20, Duration::from_millis(50));
        {
            let mut state = staged.lock();
            state.session = 9;
            for (seq, body) in [(4, &b"four"[..]), (5, &b"five"[..])] {
                state
                    .bodies
                    .insert(seq, (Bytes::from_static(body), crc32fast::hash(body)));
            }
            state.bytes = 8;
            state.highest = Some(5);
        }
        let empty = Bytes::new();
        // Another session, or a number below the highest received that is not held: missing.
        let four = crc32fast::hash(b"four");
        let mut entries = vec![entry(1, &empty)];
        assert!(staged.fill(8, &[(0, 4, four)], &mut entries).await.is_err());
        assert!(staged.fill(9, &[(0, 3, four)], &mut entries).await.is_err());
        // A body held under the number named, but not the bytes named: missing.
        assert!(
            staged
                .fill(9, &[(0, 4, four ^ 1)], &mut entries)
                .await
                .is_err()
        );
        // Past the highest received but no stream open: missing, at once.
        assert!(staged.fill(9, &[(0, 6, four)], &mut entries).await.is_err());
        let mut entries = vec![entry(1, &empty), entry(2, &Bytes::from_static(b"x"))];
        staged.fill(9, &[(0, 4, four)], &mut entries).await.unwrap();
        assert!(matches!(&entries[0].payload, EntryPayload::Normal(b) if &b.0[..] == b"four"));
        // Bodies up to the last named are forgotten; later ones stay.
        let state = staged.lock();
        assert_eq!(state.bodies.keys().copied().collect::<Vec<_>>(), vec![5]);
        assert_eq!(state.bytes, 4);
    }
}
