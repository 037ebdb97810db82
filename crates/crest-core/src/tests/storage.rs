//! What the leaf logs and how it is rebuilt from it: refused batches, sync requests, extends,
//! checkpoints.

use super::*;

/// Adds leaf 1 rebuilt from `log` alone, as a restart does.
fn rebuild(h: &mut Harness, log: &SharedLog) -> usize {
    let operations = crate::machine::replay(&log.lock().unwrap());
    let config = LeafConfig {
        name: "leaf-1".into(),
        id: LeafId(1),
        settings: settings(4),
        token_key: token_key_from_seed(9),
        first_seq: 1,
    };
    h.add(Box::new(Leaf::recover(config, h.now, operations)))
}

#[test]
fn a_leaf_rebuilt_from_its_log_holds_exactly_what_it_held() {
    // Goal: replaying the storage operations a leaf emitted rebuilds its state. Method: run a
    // leaf in the tree, record its log, then recover a second leaf from that log and pop.
    let mut h = Harness::new();
    let (root, first, log) = recorded_leaf_and_root(&mut h);
    let leaf_end = h.link(first, root);
    let producer = h.client(first, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    let ids = h.push(producer, "jobs", &[3, 1, 2, 4]);
    let acked = h.pop(consumer, "jobs", 1).remove(0);
    assert_eq!(h.ack(consumer, vec![acked.receipt()]), vec![Ok(())]);
    let leased = h.pop(consumer, "jobs", 1).remove(0);
    assert_eq!((leased.id, leased.attempt), (ids[2], 1));

    // "Crash": the leaf's session ends; a new leaf is rebuilt from the log alone.
    h.disconnect(leaf_end);
    let rebuilt = rebuild(&mut h, &log);
    assert_eq!(
        h.nodes[rebuilt].stats().messages,
        3,
        "the acked message stays deleted"
    );
    h.link(rebuilt, root);
    let rest: Vec<Delivery> = h.pop(consumer, "jobs", 10);
    let got: Vec<(MessageId, u32)> = rest.iter().map(|d| (d.id, d.attempt)).collect();
    assert_eq!(
        got,
        vec![(ids[0], 1), (ids[3], 1)],
        "the leased message stays leased"
    );
    assert_eq!(
        h.ack(consumer, vec![leased.receipt()]),
        vec![Ok(())],
        "the lease's receipt settles it on the rebuilt leaf"
    );
    let producer = h.client(rebuilt, PeerKind::Producer);
    let new = h.push(producer, "jobs", &[1]);
    assert!(new[0] > ids[3], "ids continue above the recovered ones");
}

#[test]
fn a_batch_storage_refuses_is_answered_with_an_error_and_nothing_is_kept() {
    let mut h = Harness::new();
    let machine = leaf(1, 4);
    let node = h.add(machine);
    let producer = h.client(node, PeerKind::Producer);
    let request = h.request();
    let message = PushMessage {
        topic: "jobs".into(),
        priority: 1,
        metadata: vec![],
        payload: Bytes::from_static(b"x"),
        ..PushMessage::default()
    };
    // Deliver the push by hand so the storage operation can be failed instead of completed.
    let (_, to) = h.ends[&producer];
    h.nodes[node].handle_message(
        h.now,
        to,
        Wire::Push(Push {
            request,
            messages: vec![message],
        }),
    );
    let op = h.nodes[node].poll_storage().unwrap();
    h.nodes[node].handle_storage_failed(h.now, op.token().unwrap(), "No space left on device");
    h.run();
    let Wire::Error(error) = h.recv(producer) else {
        panic!()
    };
    assert_eq!(
        (error.request, error.code),
        (Some(request), ErrorCode::StorageFailed)
    );
    assert!(error.message.contains("No space left"), "{}", error.message);
    assert_eq!(h.nodes[node].stats().messages, 0);
}

#[test]
fn a_push_asks_for_a_sync_at_once_and_an_ack_s_delete_may_linger_for_one() {
    use crate::machine::{StorageOp, SyncWait};
    let mut h = Harness::new();
    let (root, node, log) = recorded_leaf_and_root(&mut h);
    h.link(node, root);
    let producer = h.client(node, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    h.push(producer, "jobs", &[1, 2]);
    let delivery = h.pop(consumer, "jobs", 1).remove(0);
    assert_eq!(h.ack(consumer, vec![delivery.receipt()]), vec![Ok(())]);
    let waited: Vec<(bool, SyncWait)> = log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|op| match op {
            StorageOp::Append {
                token: Some(_),
                records,
                wait,
            } => Some((matches!(records[0], LogRecord::Enqueue { .. }), *wait)),
            _ => None,
        })
        .collect();
    assert_eq!(
        waited,
        vec![(true, SyncWait::Now), (false, SyncWait::Linger)],
        "the push, then the ack"
    );
}

#[test]
fn an_extend_is_logged_and_a_leaf_rebuilt_from_its_log_keeps_the_new_deadline() {
    // Leases survive a restart of their leaf (and a replica taking over from its leader), so
    // a new deadline is logged (the extend is answered at once, as the grant is). Method: extend a lease, rebuild
    // the leaf from its log past the former deadline: the lease still holds, and its receipt
    // acks the message.
    let mut h = Harness::new();
    let (root, node, log) = recorded_leaf_and_root(&mut h);
    let leaf_end = h.link(node, root);
    let producer = h.client(node, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    h.push(producer, "jobs", &[1]);
    let delivery = h.pop(consumer, "jobs", 1).remove(0);
    let logged = log.lock().unwrap().len();
    let extend = Settle::Extend { lease_ms: 60_000 };
    assert_eq!(
        h.settle(consumer, extend, vec![delivery.receipt()]),
        vec![Ok(())]
    );
    assert_eq!(
        log.lock().unwrap().len(),
        logged + 1,
        "the extend is logged"
    );
    h.disconnect(leaf_end);
    h.advance(Duration::from_millis(
        Settings::default().lease_timeout_ms + 1,
    ));
    let rebuilt = rebuild(&mut h, &log);
    h.link(rebuilt, root);
    assert!(h.pop(consumer, "jobs", 1).is_empty(), "still leased");
    assert_eq!(h.ack(consumer, vec![delivery.receipt()]), vec![Ok(())]);
    assert_eq!(h.nodes[rebuilt].stats().messages, 0, "acked");
}

#[test]
fn checkpoints_come_by_log_growth_and_by_time_and_alone_rebuild_the_leaf() {
    let mut h = Harness::new();
    let root = h.add(root_node(settings(4), vec![LeafId(1)]));
    let leaf_settings = Settings {
        checkpoint_log_bytes: 2000,
        checkpoint_interval_ms: 1000,
        ..settings(4)
    };
    let config = LeafConfig {
        name: "leaf-1".into(),
        id: LeafId(1),
        settings: leaf_settings.clone(),
        token_key: token_key_from_seed(1),
        first_seq: 1,
    };
    let log = SharedLog::default();
    let checkpoints = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = || checkpoints.load(std::sync::atomic::Ordering::SeqCst);
    let node = h.add(Box::new(Recording {
        inner: Box::new(Leaf::new(config)),
        log: log.clone(),
        checkpoints: checkpoints.clone(),
    }));
    h.link(node, root);
    let producer = h.client(node, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    h.push(producer, "jobs", &[1; 50]);
    assert_eq!(
        count(),
        0,
        "a snapshot of everything would not shrink the log yet"
    );
    // Pops of the window's size (the credits): each takes exactly what the window holds.
    for _ in 0..10 {
        let batch = h.pop(consumer, "jobs", 4);
        assert_eq!(batch.len(), 4);
        h.ack(consumer, batch.iter().map(Delivery::receipt).collect());
    }
    assert_eq!(
        count(),
        1,
        "40 of 50 deleted: the log is more than twice the live state"
    );
    // One more is leased and held across the next checkpoint.
    let held = h.pop(consumer, "jobs", 1).remove(0);
    let kept = h.push(producer, "jobs", &[0, 0]);
    h.advance(Duration::from_millis(999));
    assert_eq!(count(), 1);
    h.advance(Duration::from_millis(2));
    assert_eq!(
        count(),
        2,
        "the time trigger fires after checkpoint_interval_ms"
    );

    let operations = crate::machine::replay(&log.lock().unwrap());
    let config = LeafConfig {
        name: "leaf-1".into(),
        id: LeafId(1),
        settings: leaf_settings,
        token_key: token_key_from_seed(2),
        first_seq: 1,
    };
    let rebuilt = Leaf::recover(config, h.now, operations);
    assert_eq!(
        rebuilt.stats().messages,
        12,
        "10 left of the first 50, and 2 more"
    );
    let mut h2 = Harness::new();
    let root2 = h2.add(root_node(settings(4), vec![LeafId(1)]));
    let node2 = h2.add(Box::new(rebuilt));
    h2.link(node2, root2);
    let consumer2 = h2.client(root2, PeerKind::Consumer);
    let first_two: Vec<MessageId> = h2.pop(consumer2, "jobs", 2).iter().map(|d| d.id).collect();
    assert_eq!(
        first_two, kept,
        "the priority-0 messages pushed after the first checkpoint come first"
    );
    assert_eq!(
        h2.ack(consumer2, vec![held.receipt()]),
        vec![Ok(())],
        "the lease held across the checkpoint is in it: its receipt settles it"
    );
}

/// Wraps a leaf whose log refuses every append while `full` is set, as a full disk does.
struct Refusing {
    inner: Box<dyn Machine>,
    full: std::sync::Arc<std::sync::atomic::AtomicBool>,
    now: Time,
}

impl Machine for Refusing {
    inputs_noting_now!();
    fn handle_storage_done(&mut self, now: Time, done: StorageDone) {
        self.inner.handle_storage_done(now, done)
    }
    fn poll_storage(&mut self) -> Option<crate::machine::StorageOp> {
        loop {
            let op = self.inner.poll_storage()?;
            match op.token() {
                Some(token) if self.full.load(std::sync::atomic::Ordering::SeqCst) => {
                    let reason = "No space left on device (os error 28)";
                    self.inner.handle_storage_failed(self.now, token, reason);
                }
                _ => return Some(op),
            }
        }
    }
    pass_through!();
}

#[test]
fn an_ack_or_nack_the_log_refuses_changes_nothing_and_a_retry_settles_it() {
    // Goal: a settlement answered `Unavailable` did nothing, so that the consumer's retry
    // (once the disk has room) does what the first one meant, exactly once. Method: a leaf
    // whose log refuses appends, an ack and a nack refused, then retried with room again.
    let mut h = Harness::new();
    let root = h.add(root_node(settings(4), vec![LeafId(1)]));
    let full = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let node = h.add(Box::new(Refusing {
        inner: leaf(1, 4),
        full: full.clone(),
        now: h.now,
    }));
    h.link(node, root);
    let producer = h.client(node, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    let ids = h.push(producer, "jobs", &[1, 2, 3]);
    let deliveries = h.pop(consumer, "jobs", 2);
    let (acked, nacked) = (deliveries[0].receipt(), deliveries[1].receipt());
    assert_eq!((acked.id, nacked.id), (ids[0], ids[1]));

    full.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        h.ack(consumer, vec![acked]),
        vec![Err(ReceiptError::Unavailable)]
    );
    let nack = Settle::Nack {
        delay_ms: 0,
        reason: None,
    };
    assert_eq!(
        h.settle(consumer, nack.clone(), vec![nacked]),
        vec![Err(ReceiptError::Unavailable)]
    );
    let stats = h.nodes[node].stats();
    assert_eq!(
        (stats.messages, stats.leased),
        (3, 2),
        "both are still held and leased"
    );
    // The leases go on: an extend (answered without waiting for its record) is still accepted.
    let extend = Settle::Extend { lease_ms: 60_000 };
    assert_eq!(
        h.settle(consumer, extend, vec![acked, nacked]),
        vec![Ok(()), Ok(())]
    );
    let rest = h.pop(consumer, "jobs", 10);
    assert_eq!(
        rest.iter().map(|d| d.id).collect::<Vec<_>>(),
        vec![ids[2]],
        "the nacked message is not available again"
    );

    full.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(h.ack(consumer, vec![acked]), vec![Ok(())]);
    assert_eq!(h.settle(consumer, nack, vec![nacked]), vec![Ok(())]);
    assert_eq!(
        h.ack(consumer, vec![acked]),
        vec![Err(ReceiptError::Settled)],
        "acked once"
    );
    let again = h.pop(consumer, "jobs", 10);
    assert_eq!(
        again.iter().map(|d| (d.id, d.attempt)).collect::<Vec<_>>(),
        vec![(ids[1], 2)],
        "the nacked message comes back once, on its second attempt"
    );
    assert_eq!(h.nodes[node].stats().messages, 2);
}
