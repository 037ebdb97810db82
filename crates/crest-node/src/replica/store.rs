//! The leader's storage: operations gathered into entries of the group's log, answers passed
//! back in order.
//!
//! The gathering runs on a thread of its own, fed by the leaf's storage channel as a single
//! leaf's writer thread is, and encodes each entry there, off the runtime's workers; it waits
//! for Raft (an entry in flight's permit, the hand-over) through `Handle::block_on`, which a
//! thread outside the runtime may use.

use super::acks::{Acks, InSync};
use super::{EntryWriter, Operation, Placement, Sent, locations_of, placed};
use crest_core::machine::{StorageDone, StorageOp};
use std::collections::HashMap;
use std::sync::{Arc, mpsc};

/// A leader's storage: operations go through the group's log, in the order the leaf emits
/// them, gathered into entries; completions come back, in that order, to `on_done`.
pub struct ReplicatedStore {
    ops: mpsc::SyncSender<Operation>,
}

/// What became of one append the leader's leaf waits for.
pub type Outcome = Result<StorageDone, (u64, String)>;

/// How the leader's store gathers operations into entries.
#[derive(Clone, Copy, Debug)]
pub struct Gathering {
    /// Operations waiting for the store at most (then the leaf waits, as for its own disk):
    /// `wal_queue_ops_max`.
    pub queue: usize,
    /// An entry stops gathering past this many bytes (`replica_entry_bytes_max`); one
    /// operation larger than that is an entry alone.
    pub entry_bytes_max: usize,
    /// Entries sent and not yet answered at most (`replica_entries_in_flight_max`): while
    /// they are all out, operations gather into the next entry.
    pub in_flight: usize,
    /// The largest log record (`frame_bytes_max`).
    pub record_bytes_max: u32,
}

impl Gathering {
    /// As `settings` say.
    pub fn of(settings: &crest_core::config::Settings) -> Gathering {
        let size = |value: u64| usize::try_from(value).unwrap_or(usize::MAX).max(1);
        Gathering {
            queue: size(settings.wal_queue_ops_max.into()),
            entry_bytes_max: size(settings.replica_entry_bytes_max),
            in_flight: size(settings.replica_entries_in_flight_max),
            record_bytes_max: settings.frame_bytes_max,
        }
    }
}

/// An entry handed to Raft: the appends its leaf waits for, those refused before it was sent,
/// and Raft's answer to come.
struct Handed {
    sent: Vec<Sent>,
    refused: Vec<Outcome>,
    answer: Result<crest_replica::WriteAnswer, String>,
    permit: tokio::sync::OwnedSemaphorePermit,
}

impl ReplicatedStore {
    /// Starts the thread that gathers operations into entries for `raft` (staging each with
    /// `stager` before handing it over) and the task that reports completions to `on_done`,
    /// one call per entry.
    ///
    /// # Errors
    /// The thread cannot be spawned.
    pub fn start(
        raft: crest_replica::Raft,
        stager: crest_replica::Stager,
        gathering: Gathering,
        acks: Acks,
        on_done: impl Fn(Vec<Outcome>) + Send + Sync + 'static,
    ) -> std::io::Result<ReplicatedStore> {
        // Shared with the gathering thread, which answers what it can no longer hand on if
        // the answering task ended (it panicked): no write is left waiting for ever.
        let on_done = Arc::new(on_done);
        let refuse = on_done.clone();
        let mut in_sync = InSync::new(&raft, acks);
        let (ops, rx) = mpsc::sync_channel::<Operation>(gathering.queue);
        let runtime = tokio::runtime::Handle::current();
        let in_flight = Arc::new(tokio::sync::Semaphore::new(gathering.in_flight));
        // Entries handed to Raft and not answered yet: bounded by the permits.
        let (pending_tx, mut pending) = tokio::sync::mpsc::unbounded_channel::<Handed>();
        std::thread::Builder::new()
            .name("crest-replicate".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    // Waiting for a permit is what lets operations gather under load.
                    let Ok(permit) = runtime.block_on(in_flight.clone().acquire_owned()) else {
                        return;
                    };
                    let gathered = gather(first, &rx, gathering.entry_bytes_max);
                    let bytes = gathered.iter().map(Operation::bytes).sum();
                    let mut entry = EntryWriter::with_capacity(bytes);
                    let mut sent = Vec::with_capacity(gathered.len());
                    let mut refused = Vec::new();
                    for op in gathered {
                        let token = op.token();
                        match entry.push(op, gathering.record_bytes_max) {
                            Ok(Some(one)) => sent.push(one),
                            Ok(None) => {}
                            // The append alone is refused (its records cannot be logged);
                            // the rest of the entry goes on.
                            Err(reason) => refused.extend(token.map(|token| Err((token, reason)))),
                        }
                    }
                    let answer = if entry.is_empty() {
                        Err("nothing to replicate".to_string())
                    } else {
                        let batch = entry.finish();
                        stager.stage(&batch);
                        runtime
                            .block_on(raft.client_write_ff(batch))
                            .map_err(|e| e.to_string())
                    };
                    let handed = Handed {
                        sent,
                        refused,
                        answer,
                        permit,
                    };
                    if let Err(lost) = pending_tx.send(handed) {
                        let reason =
                            "the replicated write pipeline stopped: its answering task ended";
                        tracing::error!("{reason}; every write from now on is refused");
                        let mut refused = lost.0.refused;
                        refused.extend(outcomes(lost.0.sent, Err(reason.to_string())));
                        refused.extend(
                            rx.try_iter()
                                .filter_map(|op| op.token())
                                .map(|token| Err((token, reason.to_string()))),
                        );
                        refuse(refused);
                        return;
                    }
                }
            })?;
        // Raft answers writes in log order; this task passes the answers on in that order.
        let answering = tokio::spawn(async move {
            while let Some(handed) = pending.recv().await {
                let Handed {
                    sent,
                    mut refused,
                    answer,
                    permit,
                } = handed;
                let answer = match answer {
                    Ok(receiver) => match receiver.await {
                        Ok(Ok(response)) => {
                            drop(permit);
                            if let Some(in_sync) = &mut in_sync {
                                in_sync.hold(response.log_id.index).await;
                            }
                            placed(&response.data).map_err(|e| e.to_string())
                        }
                        Ok(Err(error)) => Err(error.to_string()),
                        Err(_) => Err("the replica group stopped".to_string()),
                    },
                    Err(error) => Err(error),
                };
                if sent.is_empty() && refused.is_empty() {
                    if let Err(error) = answer {
                        tracing::warn!(%error, "log records were not replicated");
                    }
                    continue;
                }
                refused.extend(outcomes(sent, answer));
                on_done(refused);
            }
        });
        tokio::spawn(async move {
            if let Err(error) = answering.await
                && error.is_panic()
            {
                tracing::error!(%error, "the replicated write pipeline's answering task panicked");
            }
        });
        Ok(ReplicatedStore { ops })
    }

    /// Queues `op` for the group (reads are not for this store: the caller reads its own log).
    ///
    /// # Errors
    /// The store has stopped.
    pub fn submit(&self, op: StorageOp) -> Result<(), String> {
        let Some(op) = Operation::of(op) else {
            return Err("reads go to the replica's own log".into());
        };
        self.ops
            .send(op)
            .map_err(|_| "the replica group stopped".to_string())
    }
}

/// `first` and the operations waiting after it, up to `bytes_max` bytes; a checkpoint ends
/// an entry (see [`Operation::Checkpoint`]).
fn gather(first: Operation, rx: &mpsc::Receiver<Operation>, bytes_max: usize) -> Vec<Operation> {
    let mut bytes = first.bytes();
    let mut entry = vec![first];
    while bytes < bytes_max && !matches!(entry.last(), Some(Operation::Checkpoint { .. })) {
        let Ok(op) = rx.try_recv() else { break };
        bytes += op.bytes();
        entry.push(op);
    }
    entry
}

/// One outcome per append of an entry: where its bodies are, or why the entry failed.
fn outcomes(sent: Vec<Sent>, answer: Result<super::Placed, String>) -> Vec<Outcome> {
    let placed = match answer {
        Ok(placed) => placed,
        Err(reason) => {
            return sent
                .into_iter()
                .map(|one| Err((one.token, reason.clone())))
                .collect();
        }
    };
    let mut placed: HashMap<u64, Placement> = placed.into_iter().collect();
    sent.into_iter()
        .map(|one| {
            let token = one.token;
            let locations = match (placed.remove(&token), one.spans) {
                (Some(Placement::Locations(locations)), _) => Ok(locations),
                (Some(Placement::At { segment, offset }), Some((spans, body_len))) => {
                    locations_of(&spans, body_len, segment, offset).map_err(|e| e.to_string())
                }
                (Some(Placement::At { .. }), None) => {
                    Err("the replica placed a body the leader did not encode".to_string())
                }
                (None, _) => Err("the replica's answer left this append out".to_string()),
            };
            match locations {
                Ok(locations) => Ok(StorageDone { token, locations }),
                Err(reason) => Err((token, reason)),
            }
        })
        .collect()
}
