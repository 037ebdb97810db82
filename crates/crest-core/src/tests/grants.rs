//! `lease_grants_wait_for_log`: a reserve is answered only once its grants' lease records are
//! durable, and grants whose records the log refuses are undone.

use super::*;

/// Wraps a leaf and holds back the completion of appends made of lease records alone (the
/// grants' records) while `hold` is set; the test completes them.
struct Holding {
    inner: Box<dyn Machine>,
    now: Time,
    hold: std::sync::Arc<std::sync::atomic::AtomicBool>,
    held: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
}

impl Machine for Holding {
    inputs_noting_now!();
    fn handle_storage_done(&mut self, now: Time, done: StorageDone) {
        self.inner.handle_storage_done(now, done)
    }
    fn handle_storage_failed(&mut self, now: Time, token: u64, reason: &str) {
        self.inner.handle_storage_failed(now, token, reason)
    }
    fn poll_storage(&mut self) -> Option<crate::machine::StorageOp> {
        loop {
            let op = self.inner.poll_storage()?;
            let grants = matches!(&op, crate::machine::StorageOp::Append { records, .. }
                if records.iter().all(|r| matches!(r, LogRecord::Lease { .. })));
            match op.token() {
                Some(token) if self.hold.load(std::sync::atomic::Ordering::SeqCst) && grants => {
                    self.held.lock().unwrap().push(token)
                }
                _ => return Some(op),
            }
        }
    }
    pass_through!();
}

fn waiting_leaf() -> Box<dyn Machine> {
    Box::new(Leaf::new(LeafConfig {
        name: "leaf-1".into(),
        id: LeafId(1),
        settings: Settings {
            lease_grants_wait_for_log: true,
            ..settings(4)
        },
        token_key: token_key_from_seed(1),
        first_seq: 1,
    }))
}

/// A root and a waiting leaf holding one message, a pop of it sent, its grant's record held.
struct Popping {
    h: Harness,
    node: usize,
    consumer: ConnId,
    held: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
    ids: Vec<MessageId>,
}

fn popping() -> Popping {
    let mut h = Harness::new();
    let root = h.add(root_node(settings(4), vec![LeafId(1)]));
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let node = h.add(Box::new(Holding {
        inner: waiting_leaf(),
        now: h.now,
        hold: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true)),
        held: held.clone(),
    }));
    h.link(node, root);
    let producer = h.client(node, PeerKind::Producer);
    let consumer = h.client(root, PeerKind::Consumer);
    let ids = h.push(producer, "jobs", &[1]);
    let request = h.request();
    h.send(consumer, jobs_pop(request, 1, 0));
    Popping {
        h,
        node,
        consumer,
        held,
        ids,
    }
}

#[test]
fn a_grant_is_answered_once_its_lease_record_is_durable() {
    let Popping {
        mut h,
        node,
        consumer,
        held,
        ids,
    } = popping();
    assert!(
        h.try_recv(consumer).is_none(),
        "no answer while the grant's record is not durable"
    );
    let tokens: Vec<u64> = held.lock().unwrap().drain(..).collect();
    assert_eq!(tokens.len(), 1, "one append of the grant's lease record");
    h.nodes[node].handle_storage_done(h.now, StorageDone::new(tokens[0]));
    h.run();
    let Wire::PopReply(reply) = h.recv(consumer) else {
        panic!("a pop reply")
    };
    let got: Vec<MessageId> = reply.deliveries.iter().map(|d| d.id).collect();
    assert_eq!(got, ids, "delivered once the record is durable");
}

#[test]
fn a_grant_whose_lease_record_the_log_refuses_is_undone() {
    let mut p = popping();
    let (h, node, consumer) = (&mut p.h, p.node, p.consumer);
    let token = p.held.lock().unwrap().pop().expect("the grant's append");
    let reason = "No space left on device (os error 28)";
    let now = h.now;
    h.nodes[node].handle_storage_failed(now, token, reason);
    h.run();
    // The root is told `Unavailable`; the message, offered anew, is reserved again.
    h.advance(Duration::from_millis(10));
    assert!(
        h.try_recv(consumer).is_none(),
        "the pop waits for the new grant"
    );
    let again = p
        .held
        .lock()
        .unwrap()
        .pop()
        .expect("the second grant's append");
    h.nodes[node].handle_storage_done(h.now, StorageDone::new(again));
    h.run();
    let Wire::PopReply(reply) = h.recv(consumer) else {
        panic!("a pop reply")
    };
    let got: Vec<(MessageId, u32)> = reply.deliveries.iter().map(|d| (d.id, d.attempt)).collect();
    assert_eq!(
        got,
        vec![(p.ids[0], 1)],
        "the refused grant was undone: its attempt given back"
    );
    assert_eq!(h.nodes[node].stats().leased, 1);
}
