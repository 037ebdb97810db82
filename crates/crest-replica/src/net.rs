//! Raft's RPCs between the replicas of a group, over QUIC with the cluster's mutual TLS.
//!
//! Each replica listens on its group address with its node certificate; a replica dials
//! another by that one's node name, and a listener serves only peers whose certificate names
//! a member of its group. Each RPC is one bidirectional stream: the request, MessagePack,
//! then the answer; so a slow snapshot chunk never holds up a heartbeat. Requests and
//! answers are bounded by `rpc_bytes_max`. A stream that starts with [`stage::STAGE_TAG`]
//! carries the leader's staged entry bodies instead ([`crate::stage`]).

use crate::heard::{self, Heard};
use crate::log_store::LogStore;
use crate::rejoin::Rejoin;
use crate::stage::{self, Link, Ref, Staged, Stager};
use crate::{Raft, ReplicaId, TypeConfig};
use openraft::BasicNode;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

/// A request from one replica to another.
#[derive(Serialize, Deserialize)]
enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    /// An append whose entries at `refs` (place in `rpc.entries`, body number, CRC-32) have
    /// empty payloads: their bodies were staged in `session`.
    AppendStaged {
        rpc: AppendEntriesRequest<TypeConfig>,
        session: u64,
        refs: Vec<Ref>,
    },
    Vote(VoteRequest<ReplicaId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    /// Would the receiver vote for `candidate`, whose log ends at `last_log_id`
    /// ([`crate::prevote`])?
    PreVote {
        candidate: ReplicaId,
        last_log_id: Option<openraft::LogId<ReplicaId>>,
    },
}

impl Request {
    /// About how many bytes it encodes to: its entries' payloads and a little for the rest,
    /// so that a request of a megabyte is encoded into a buffer that does not grow.
    fn bytes_hint(&self) -> usize {
        match self {
            Request::Append(append) | Request::AppendStaged { rpc: append, .. } => append
                .entries
                .iter()
                .map(entry_bytes)
                .sum::<usize>()
                .saturating_add(256),
            Request::Vote(_) | Request::PreVote { .. } => 256,
            Request::Snapshot(chunk) => chunk.data.len() + 256,
        }
    }
}

/// About how many bytes one entry takes in a request (see [`Request::bytes_hint`]).
fn entry_bytes(entry: &openraft::Entry<TypeConfig>) -> usize {
    match &entry.payload {
        openraft::EntryPayload::Normal(batch) => batch.0.len() + 64,
        _ => 256,
    }
}

/// Drops the entries past the first ones that fit in a request of `bytes_max` (the first
/// stays, whatever its size: settings keep an entry within it); answers whether any went.
fn fit(entries: &mut Vec<openraft::Entry<TypeConfig>>, bytes_max: usize) -> bool {
    let mut bytes = 256;
    let keep = entries
        .iter()
        .position(|entry| {
            bytes += entry_bytes(entry);
            bytes > bytes_max
        })
        .map_or(entries.len(), |at| at.max(1));
    let cut = keep < entries.len();
    entries.truncate(keep);
    cut
}

/// Its answer.
#[derive(Serialize, Deserialize)]
enum Response {
    Append(Result<AppendEntriesResponse<ReplicaId>, RaftError<ReplicaId>>),
    Vote(Result<VoteResponse<ReplicaId>, RaftError<ReplicaId>>),
    Snapshot(
        Result<InstallSnapshotResponse<ReplicaId>, RaftError<ReplicaId, InstallSnapshotError>>,
    ),
    /// A staged body named in an append is not here: send it in full.
    Missing,
    /// Whether it would vote for the candidate.
    PreVote(bool),
}

/// The members of a group: number → node name.
pub(crate) type Names = Arc<BTreeMap<ReplicaId, String>>;

/// Dials the other replicas (openraft asks it for one [`Peer`] per replica).
pub(crate) struct Network {
    pub(crate) endpoint: quinn::Endpoint,
    pub(crate) names: Names,
    pub(crate) rpc_bytes_max: usize,
    pub(crate) stager: Stager,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: ReplicaId, node: &BasicNode) -> Peer {
        Peer {
            endpoint: self.endpoint.clone(),
            target,
            address: node.addr.parse().ok(),
            name: self.names.get(&target).cloned().unwrap_or_default(),
            connection: None,
            rpc_bytes_max: self.rpc_bytes_max,
            stage: self.stager.link(target),
        }
    }
}

/// One other replica, and the connection to it once made.
pub(crate) struct Peer {
    endpoint: quinn::Endpoint,
    target: ReplicaId,
    address: Option<SocketAddr>,
    name: String,
    connection: Option<quinn::Connection>,
    rpc_bytes_max: usize,
    /// The bodies staged for this replica.
    stage: Option<Arc<Link>>,
}

/// Why an RPC got no answer: the peer could not be reached at all (openraft backs off), or
/// the exchange failed on the way.
enum CallError {
    Unreachable(String),
    Network(String),
}

impl CallError {
    fn into_rpc<E: std::error::Error>(self) -> RPCError<ReplicaId, BasicNode, E> {
        match self {
            CallError::Unreachable(text) => {
                RPCError::Unreachable(Unreachable::new(&std::io::Error::other(text)))
            }
            CallError::Network(text) => {
                RPCError::Network(NetworkError::new(&std::io::Error::other(text)))
            }
        }
    }
}

impl Peer {
    async fn connection(&mut self) -> Result<quinn::Connection, CallError> {
        if let Some(connection) = &self.connection
            && connection.close_reason().is_none()
        {
            return Ok(connection.clone());
        }
        let address = self.address.ok_or_else(|| {
            CallError::Unreachable(format!("replica {} has no valid address", self.target))
        })?;
        let connection = crest_transport::connect(&self.endpoint, address, &self.name)
            .await
            .map_err(|e| CallError::Unreachable(e.to_string()))?;
        self.connection = Some(connection.clone());
        Ok(connection)
    }

    async fn call(&mut self, request: &Request, option: &RPCOption) -> Result<Response, CallError> {
        let exchange = async {
            let connection = self.connection().await?;
            let network = |e: &dyn std::fmt::Display| CallError::Network(e.to_string());
            let (mut send, mut recv) = connection.open_bi().await.map_err(|e| network(&e))?;
            let mut bytes = Vec::with_capacity(request.bytes_hint());
            rmp_serde::encode::write(&mut bytes, request).map_err(|e| network(&e))?;
            // Handed over as it is: quinn keeps the buffer instead of copying it into its own.
            send.write_chunk(bytes.into())
                .await
                .map_err(|e| network(&e))?;
            send.finish().map_err(|e| network(&e))?;
            let answer = recv
                .read_to_end(self.rpc_bytes_max)
                .await
                .map_err(|e| network(&e))?;
            rmp_serde::from_slice(&answer).map_err(|e| network(&e))
        };
        match tokio::time::timeout(option.hard_ttl(), exchange).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(error)) => {
                if matches!(error, CallError::Network(_)) {
                    self.connection = None;
                }
                Err(error)
            }
            Err(_) => Err(CallError::Network(format!(
                "replica {} did not answer within {:?}",
                self.target,
                option.hard_ttl()
            ))),
        }
    }

    /// Sends `request` and takes what `pick` finds in the answer: the peer's result, its
    /// refusal, or why there was none.
    async fn rpc<T, E: std::error::Error>(
        &mut self,
        request: Request,
        option: &RPCOption,
        pick: fn(Response) -> Option<Result<T, E>>,
    ) -> Result<T, RPCError<ReplicaId, BasicNode, E>> {
        let answer = self.call(&request, option).await;
        Self::picked(self.target, answer, pick)
    }

    /// What `pick` finds in `answer`, from replica `target`.
    fn picked<T, E: std::error::Error>(
        target: ReplicaId,
        answer: Result<Response, CallError>,
        pick: fn(Response) -> Option<Result<T, E>>,
    ) -> Result<T, RPCError<ReplicaId, BasicNode, E>> {
        match answer.map(pick) {
            Ok(Some(Ok(answer))) => Ok(answer),
            Ok(Some(Err(error))) => Err(RPCError::RemoteError(RemoteError::new(target, error))),
            Ok(None) => Err(CallError::Network(format!(
                "replica {target} answered another request"
            ))
            .into_rpc()),
            Err(error) => Err(error.into_rpc()),
        }
    }
}

/// One pre-vote question to another replica, on a connection of its own.
pub(crate) struct PreVoteAsk {
    pub(crate) endpoint: quinn::Endpoint,
    pub(crate) name: String,
    pub(crate) address: SocketAddr,
}

impl PreVoteAsk {
    /// Whether the replica grants `candidate`, whose log ends at `last_log_id`, its pre-vote
    /// (no answer: no).
    pub(crate) async fn ask(
        self,
        candidate: ReplicaId,
        last_log_id: Option<openraft::LogId<ReplicaId>>,
    ) -> bool {
        let exchange = async {
            let connection = crest_transport::connect(&self.endpoint, self.address, &self.name)
                .await
                .ok()?;
            let (mut send, mut recv) = connection.open_bi().await.ok()?;
            let request = Request::PreVote {
                candidate,
                last_log_id,
            };
            let bytes = rmp_serde::to_vec(&request).ok()?;
            send.write_all(&bytes).await.ok()?;
            send.finish().ok()?;
            let answer = recv.read_to_end(1024).await.ok()?;
            connection.close(0u32.into(), b"asked");
            match rmp_serde::from_slice(&answer).ok()? {
                Response::PreVote(granted) => Some(granted),
                _ => None,
            }
        };
        exchange.await.unwrap_or(false)
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        AppendEntriesResponse<ReplicaId>,
        RPCError<ReplicaId, BasicNode, RaftError<ReplicaId>>,
    > {
        // Entries past what one RPC may carry (`rpc_bytes_max`: the follower refuses a larger
        // one, and would refuse it again at every retry) go in the next: openraft takes a
        // partial success as that.
        let cut = fit(&mut rpc.entries, self.rpc_bytes_max);
        let last = rpc.entries.last().map(|entry| entry.log_id);
        let pick = |answer| match answer {
            Response::Append(result) => Some(result),
            _ => None,
        };
        let named = self
            .stage
            .as_ref()
            .and_then(|link| link.name(&mut rpc.entries));
        let answer = match named {
            None => self.rpc(Request::Append(rpc), &option, pick).await?,
            Some(named) => {
                let request = Request::AppendStaged {
                    rpc,
                    session: named.session,
                    refs: named.refs.clone(),
                };
                match self.call(&request, &option).await {
                    Ok(Response::Missing) => {
                        if let Some(link) = &self.stage {
                            link.missed();
                        }
                        let Request::AppendStaged { mut rpc, .. } = request else {
                            return Err(
                                CallError::Network("a staged append lost".into()).into_rpc()
                            );
                        };
                        named.restore(&mut rpc.entries);
                        self.rpc(Request::Append(rpc), &option, pick).await?
                    }
                    answer => {
                        if answer.is_err()
                            && let Some(link) = &self.stage
                        {
                            link.failed();
                        }
                        Self::picked(self.target, answer, pick)?
                    }
                }
            }
        };
        Ok(match answer {
            AppendEntriesResponse::Success if cut => AppendEntriesResponse::PartialSuccess(last),
            other => other,
        })
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<ReplicaId>,
        RPCError<ReplicaId, BasicNode, RaftError<ReplicaId, InstallSnapshotError>>,
    > {
        self.rpc(Request::Snapshot(rpc), &option, |answer| match answer {
            Response::Snapshot(result) => Some(result),
            _ => None,
        })
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<ReplicaId>,
        option: RPCOption,
    ) -> Result<VoteResponse<ReplicaId>, RPCError<ReplicaId, BasicNode, RaftError<ReplicaId>>> {
        self.rpc(Request::Vote(rpc), &option, |answer| match answer {
            Response::Vote(result) => Some(result),
            _ => None,
        })
        .await
    }
}

/// Serves the RPCs of the group's other replicas on `endpoint` until it is closed. A peer
/// whose certificate names no member of `names` is closed at once.
pub(crate) async fn serve(endpoint: quinn::Endpoint, names: Names, serving: Arc<Serving>) {
    while let Some(incoming) = endpoint.accept().await {
        let names = names.clone();
        let serving = serving.clone();
        tokio::spawn(async move {
            let Ok(connection) = incoming.await else {
                return;
            };
            let member = names
                .values()
                .any(|name| crest_transport::tls::peer_is(&connection, name).is_ok());
            if !member {
                connection.close(1u32.into(), b"Forbidden: not a replica of this group");
                return;
            }
            while let Ok((send, recv)) = connection.accept_bi().await {
                tokio::spawn(answer(serving.clone(), send, recv));
            }
        });
    }
}

/// What a replica's listener answers with.
pub(crate) struct Serving {
    pub(crate) raft: Raft,
    pub(crate) log: LogStore,
    /// Most bytes of a request (`rpc_bytes_max`).
    pub(crate) rpc_bytes_max: usize,
    pub(crate) rejoin: Arc<Rejoin>,
    pub(crate) staged: Staged,
    pub(crate) heard: Arc<Heard>,
    /// Within this of hearing a leader, no pre-vote is granted (`replica_election_timeout_ms`).
    pub(crate) lease: std::time::Duration,
    /// Most bytes of a snapshot taken (`replica_snapshot_bytes_max`), and the parts refused
    /// for going past it.
    pub(crate) snapshot_bytes_max: u64,
    pub(crate) snapshot_parts_refused: Arc<std::sync::atomic::AtomicU64>,
}

/// Answers one RPC, or reads a stage stream; a request that does not decode gets its stream
/// reset, and so does a vote a replica catching up after an empty start withholds
/// ([`Rejoin`]).
async fn answer(serving: Arc<Serving>, mut send: quinn::SendStream, mut recv: quinn::RecvStream) {
    let Serving {
        raft,
        log,
        rpc_bytes_max: max,
        rejoin,
        staged,
        heard,
        lease,
        snapshot_bytes_max,
        snapshot_parts_refused,
    } = &*serving;
    let max = *max;
    let mut first = [0u8; 1];
    if recv.read_exact(&mut first).await.is_err() {
        return;
    }
    if first[0] == stage::STAGE_TAG {
        let _ = send.finish();
        staged.read(recv).await;
        return;
    }
    let Ok(rest) = recv.read_to_end(max.saturating_sub(1)).await else {
        return;
    };
    let Ok(request) =
        rmp_serde::from_read::<_, Request>(std::io::Read::chain(&first[..], &rest[..]))
    else {
        let _ = send.reset(2u32.into());
        return;
    };
    let request = match request {
        Request::AppendStaged {
            mut rpc,
            session,
            refs,
        } => match staged.fill(session, &refs, &mut rpc.entries).await {
            Ok(()) => Request::Append(rpc),
            Err(stage::Missing) => {
                respond(send, &Response::Missing).await;
                return;
            }
        },
        request => request,
    };
    let response = match request {
        Request::Append(rpc) => {
            let commit = rpc.leader_commit.map(|id| id.index);
            let answer = raft.append_entries(rpc).await;
            if answer.as_ref().is_ok_and(AppendEntriesResponse::is_success) {
                rejoin.reached(commit);
                heard.leader();
            }
            Response::Append(answer)
        }
        Request::Vote(rpc) if rejoin.abstains(rpc.last_log_id.map(|id| id.index)) => {
            let _ = send.reset(4u32.into());
            return;
        }
        Request::Vote(rpc) => Response::Vote(raft.vote(rpc).await),
        Request::Snapshot(rpc)
            if rpc.offset.saturating_add(rpc.data.len() as u64) > *snapshot_bytes_max =>
        {
            snapshot_parts_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(
                offset = rpc.offset,
                bytes = rpc.data.len(),
                "refused a snapshot past replica_snapshot_bytes_max {snapshot_bytes_max}"
            );
            let _ = send.reset(5u32.into());
            return;
        }
        Request::Snapshot(rpc) => Response::Snapshot(raft.install_snapshot(rpc).await),
        Request::AppendStaged { .. } => Response::Missing,
        Request::PreVote { last_log_id, .. } => {
            Response::PreVote(heard::grants(raft, log, heard, rejoin, *lease, last_log_id))
        }
    };
    respond(send, &response).await;
}

/// Sends `response` on `send`, the stream's last use.
async fn respond(mut send: quinn::SendStream, response: &Response) {
    let Ok(bytes) = rmp_serde::to_vec(response) else {
        let _ = send.reset(3u32.into());
        return;
    };
    if send.write_all(&bytes).await.is_ok() {
        let _ = send.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

    fn entries(sizes: &[usize]) -> Vec<Entry<TypeConfig>> {
        sizes
            .iter()
            .enumerate()
            .map(|(index, size)| Entry {
                log_id: LogId::new(CommittedLeaderId::new(1, 1), index as u64 + 1),
                payload: EntryPayload::Normal(crate::Batch(vec![0u8; *size].into())),
            })
            .collect()
    }

    #[test]
    fn no_request_starts_like_a_stage_stream() {
        let append = AppendEntriesRequest {
            vote: openraft::Vote::new_committed(1, 1),
            prev_log_id: None,
            entries: entries(&[10]),
            leader_commit: None,
        };
        let vote = VoteRequest {
            vote: openraft::Vote::new(1, 1),
            last_log_id: None,
        };
        for request in [
            Request::Append(append.clone()),
            Request::AppendStaged {
                rpc: append,
                session: 0,
                refs: vec![(0, 0, 0)],
            },
            Request::Vote(vote),
        ] {
            let bytes = rmp_serde::to_vec(&request).unwrap();
            assert_ne!(bytes[0], stage::STAGE_TAG);
        }
    }

    #[test]
    fn an_append_is_cut_to_what_one_rpc_may_carry_keeping_at_least_one_entry() {
        // Each entry counts its payload and 64 bytes; a request 256 bytes more.
        for (sizes, max, kept, cut) in [
            (vec![1000, 1000, 1000], 256 + 3 * 1064, 3, false),
            (vec![1000, 1000, 1000], 256 + 3 * 1064 - 1, 2, true),
            (vec![1000, 1000, 1000], 256 + 1064, 1, true),
            (vec![5000, 10], 1000, 1, true),
            (vec![], 1000, 0, false),
        ] {
            let mut list = entries(&sizes);
            assert_eq!(fit(&mut list, max), cut, "{sizes:?} in {max}");
            assert_eq!(list.len(), kept, "{sizes:?} in {max}");
            let request = Request::Append(AppendEntriesRequest {
                vote: openraft::Vote::new_committed(1, 1),
                prev_log_id: None,
                entries: list,
                leader_commit: None,
            });
            assert!(kept <= 1 || request.bytes_hint() <= max);
        }
    }
}
