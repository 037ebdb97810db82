//! The aggregator state machine: merges its children's offers and offers upward in turn.
//!
//! # Contract
//! Implements [`Machine`]; see [`crate::machine`] for the polling order and time rules.
//!
//! # State (all soft)
//! Per topic, a [`Window`](crate::window::Window) of what its children offered (each child within its credit) and an
//! [`OfferSet`] over the same entries that keeps the parent holding the most urgent ones
//! within the credit the parent granted. The frontier it reports upward is the lower of its own
//! most urgent unoffered entry and its children's frontiers, so the root can tell whether its
//! best entry is the best of the whole tree.
//!
//! `Reserve`, `Confirm`, `Release` and `LeafAdmin` from the parent are routed to the child
//! leading to the named leaf; `Reserved`, `Confirmed` and `LeafAdminReply` from children go to
//! the parent unchanged. A reserved
//! entry leaves the window and the offered set as the `Reserve` passes, which returns credit
//! both below and above.
//!
//! With the root's direct pop path (`direct_pop_path`), the root sends reserves, settles and
//! admin requests to the leaf on its own link; the aggregator gets each reserve as a notice
//! ([`Reserve::direct`]): it takes the entries and refills its parent, and forwards nothing.
//! The leaf retracts what the root took from it, which the aggregator finds already gone.

use crate::config::Settings;
use crate::downstream::{Downstream, PeerKindTag, Topic, TopicMap, TopicSet};
use crate::id::LeafId;
use crate::key::Key;
use crate::machine::{ConnId, Link, Machine, NodeStats, Outbox, Transmit};
use crate::metrics::{Metric, OwnReport, Report, Reporter, named};
use crate::offer::{Candidate, FlushPolicy, OfferSet};
use crate::time::Time;
use crate::upstream::Upstream;
use crate::window::Slot;
use crate::wire::{
    Confirm, Confirmed, ErrorCode, LeafAdmin, LeafAdminReply, Offer, Release, Reserve,
    ReserveDenied, ReserveOutcome, Reserved, Role, Stats, Wire,
};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

/// How an aggregator is set up.
#[derive(Clone, Debug)]
pub struct AggregatorConfig {
    /// The aggregator's name in the topology.
    pub name: String,
    /// Bounds and timings.
    pub settings: Settings,
    /// Every leaf below this aggregator, per the topology.
    pub subtree: Vec<LeafId>,
}

/// Requests forwarded to one child and not answered yet: if the child's session ends, the
/// aggregator answers them upward itself (`Unavailable`), so nothing above waits for ever.
/// Bounded by what the root lets be outstanding (`root_pending_pops_max`,
/// `root_pending_requests_max`).
#[derive(Default)]
struct Forwarded {
    /// Reserve items by reservation number.
    reserves: HashMap<u64, crate::key::Key>,
    /// Confirms by tag, with their receipt counts.
    confirms: HashMap<u64, usize>,
    /// Admin requests by tag.
    admins: HashSet<u64>,
}

#[derive(Default)]
struct AggregatorCounters {
    offers: u64,
    entries_added: u64,
    /// Reserves forwarded to a child.
    reserves: u64,
    /// Reserves the root sent its leaf directly, taken here without forwarding.
    reserve_notices: u64,
}

/// See the module doc.
pub struct Aggregator {
    /// `offer_swap` of the settings.
    swap: bool,
    flush_policy: FlushPolicy,
    /// When offer changes that were held back must go (`None`: none are waiting).
    offer_due: Option<Time>,
    name: String,
    reporter: Reporter,
    counters: AggregatorCounters,
    upstream: Upstream,
    children: Downstream,
    offers: TopicMap<OfferSet>,
    /// Requests forwarded to each child and not answered yet.
    forwarded: HashMap<ConnId, Forwarded>,
    /// Entries taken on a notice (the root reserved them on its direct link to the leaf)
    /// whose child has not retracted them yet: the leaf retracts an entry when the reserve
    /// reaches it. If the root is lost before its reserve reached the leaf, the leaf never
    /// hears of it and still counts the entry as offered here: when the parent session ends,
    /// these go back into the window, to be offered to the next root.
    noticed: HashMap<Key, (Topic, Slot)>,
    /// The parent session's first report is still to come. It waits until every leaf below
    /// is known (or waited for long enough: `absent_child_wait_ms`): the parent counts this
    /// subtree as unknown until that report, so it is not served a part of it as the whole.
    /// The `Hello` goes at once, so the parent drops what a predecessor reported as soon as
    /// this node is back.
    unreported: bool,
    dirty: TopicSet,
    outbox: Outbox,
    violations: u64,
}

impl Aggregator {
    /// Creates an aggregator with no children connected.
    pub fn new(config: AggregatorConfig) -> Aggregator {
        let reporter = Reporter::new(&config.settings);
        let swap = config.settings.offer_swap;
        let flush_policy = FlushPolicy::new(&config.settings);
        let name = config.name.clone();
        let upstream = Upstream::new(
            config.name.clone(),
            Role::Aggregator,
            config.subtree.clone(),
        );
        let children = Downstream::new(
            config.name,
            Role::Aggregator,
            config.settings,
            config.subtree,
        );
        Aggregator {
            swap,
            flush_policy,
            offer_due: None,
            name,
            reporter,
            counters: AggregatorCounters::default(),
            upstream,
            children,
            offers: Default::default(),
            forwarded: HashMap::default(),
            noticed: HashMap::default(),
            unreported: false,
            dirty: Default::default(),
            outbox: Outbox::default(),
            violations: 0,
        }
    }

    fn send(&mut self, conn: ConnId, msg: Wire) {
        self.outbox.send(conn, msg);
    }

    fn handle_offer(&mut self, now: Time, child: ConnId, offer: Offer) {
        self.counters.offers += 1;
        let topic = self.children.topic(&offer.topic);
        let credits = self.children.credit(&topic);
        let window = self
            .children
            .windows
            .get_mut(&topic)
            .expect("created above");
        let delta = window.apply(child, &offer, credits);
        for key in &offer.retracts {
            self.noticed.remove(key);
        }
        let offers = self.offers.entry(topic.clone()).or_default();
        for key in &delta.removed {
            offers.remove(key);
        }
        self.counters.entries_added += delta.added.len() as u64;
        for entry in delta.added {
            self.reporter
                .recorder
                .record_since(now, Metric::BubbleToAggregator, entry.since);
            offers.insert(
                entry.key,
                Candidate {
                    size: entry.size,
                    since: entry.since,
                    entered: now,
                },
            );
        }
        if delta.refused > 0 {
            self.violations += 1;
        }
        self.dirty.insert(topic);
    }

    fn handle_reserve(&mut self, now: Time, mut reserve: Reserve) {
        let route = self.children.route(reserve.leaf);
        // What the child below has told us, for it to judge our takes by (see `offer`).
        let mut applied_below = 0;
        if let Some((topic, _)) = self.children.windows.get_key_value(reserve.topic.as_str()) {
            let topic = topic.clone();
            let window = self.children.windows.get_mut(&topic).expect("present");
            if let Ok(child) = route {
                applied_below = window.applied(child);
            }
            let mut offers = self.offers.get_mut(&topic);
            for item in &reserve.items {
                let taken = window.take(&item.key);
                if let (Some(slot), true) = (taken, reserve.direct) {
                    self.noticed.insert(item.key, (topic.clone(), slot));
                }
                if let Some(offers) = offers.as_deref_mut() {
                    offers.take(&item.key, reserve.offer_seq);
                }
            }
            self.dirty.insert(topic);
        }
        reserve.offer_seq = applied_below;
        // The freed credit above is refilled at once: the parent's next pop sees it.
        self.flush_offers(now, true);
        if reserve.direct {
            // The root sent the reserve to the leaf itself.
            self.counters.reserve_notices += 1;
            return;
        }
        self.counters.reserves += 1;
        match route {
            Ok(child) => {
                let forwarded = self.forwarded.entry(child).or_default();
                for item in &reserve.items {
                    forwarded.reserves.insert(item.reservation, item.key);
                }
                self.send(child, Wire::Reserve(reserve));
            }
            Err(_) => {
                let items = reserve
                    .items
                    .iter()
                    .map(|item| ReserveOutcome {
                        reservation: item.reservation,
                        key: item.key,
                        result: Err(ReserveDenied::Unavailable),
                    })
                    .collect();
                self.send_up(Wire::Reserved(Reserved { items }));
            }
        }
    }

    fn handle_confirm(&mut self, confirm: Confirm) {
        match self.children.route(confirm.leaf) {
            Ok(child) => {
                let forwarded = self.forwarded.entry(child).or_default();
                forwarded
                    .confirms
                    .insert(confirm.tag, confirm.receipts.len());
                self.send(child, Wire::Confirm(confirm));
            }
            Err(error) => {
                let results = vec![Err(error); confirm.receipts.len()];
                self.send_up(Wire::Confirmed(Confirmed {
                    tag: confirm.tag,
                    results,
                }));
            }
        }
    }

    fn handle_leaf_admin(&mut self, admin: LeafAdmin) {
        match self.children.route(admin.leaf) {
            Ok(child) => {
                let forwarded = self.forwarded.entry(child).or_default();
                forwarded.admins.insert(admin.tag);
                self.send(child, Wire::LeafAdmin(admin));
            }
            Err(_) => self.send_up(Wire::LeafAdminReply(LeafAdminReply {
                tag: admin.tag,
                result: None,
                more: false,
            })),
        }
    }

    fn handle_release(&mut self, release: Release) {
        // A release that cannot be routed is dropped: the lease then simply expires.
        if let Ok(child) = self.children.route(release.leaf) {
            self.send(child, Wire::Release(release));
        }
    }

    /// A child's session ended: what was forwarded to it will never be answered by it, so the
    /// aggregator answers upward in its place (the leases, if granted, expire at the leaf).
    fn answer_forwarded(&mut self, child: ConnId) {
        let Some(forwarded) = self.forwarded.remove(&child) else {
            return;
        };
        if !forwarded.reserves.is_empty() {
            let mut items: Vec<ReserveOutcome> = forwarded
                .reserves
                .into_iter()
                .map(|(reservation, key)| ReserveOutcome {
                    reservation,
                    key,
                    result: Err(ReserveDenied::Unavailable),
                })
                .collect();
            items.sort_by_key(|outcome| outcome.reservation);
            self.send_up(Wire::Reserved(Reserved { items }));
        }
        let mut confirms: Vec<(u64, usize)> = forwarded.confirms.into_iter().collect();
        confirms.sort_unstable();
        for (tag, count) in confirms {
            let results = vec![Err(crate::wire::ReceiptError::Unavailable); count];
            self.send_up(Wire::Confirmed(Confirmed { tag, results }));
        }
        let mut admins: Vec<u64> = forwarded.admins.into_iter().collect();
        admins.sort_unstable();
        for tag in admins {
            self.send_up(Wire::LeafAdminReply(LeafAdminReply {
                tag,
                result: None,
                more: false,
            }));
        }
    }

    /// Tells the parent at once which leaves below are waited for, after every offer (the
    /// parent takes a leaf no longer absent as known, offers included); the session's first
    /// report waits until no leaf below is waited for.
    fn report_absent(&mut self, now: Time) {
        if self.unreported && self.children.awaiting(now) {
            return;
        }
        self.unreported = false;
        self.flush_offers(now, true);
        self.report_tick(now);
    }

    /// Puts the entries taken on notices back into their windows and offered sets (see
    /// [`Aggregator::noticed`]). One whose reserve did reach its leaf is retracted by it soon
    /// after, and a reserve of it in between is refused by the leaf: no message is lost or
    /// leased twice either way.
    fn restore_noticed(&mut self, now: Time) {
        let mut noticed: Vec<(Key, (Topic, Slot))> = self.noticed.drain().collect();
        // In key order, so that runs repeat whatever the hashing.
        noticed.sort_by_key(|(key, _)| *key);
        for (key, (topic, slot)) in noticed {
            // The window may have gone idle and been dropped meanwhile.
            let topic = self.children.topic(&topic);
            let window = self.children.windows.get_mut(&topic).expect("made above");
            if !window.restore(key, slot) {
                continue;
            }
            self.offers.entry(topic.clone()).or_default().insert(
                key,
                Candidate {
                    size: slot.size,
                    since: slot.since,
                    entered: now,
                },
            );
            self.dirty.insert(topic);
        }
    }

    fn send_up(&mut self, msg: Wire) {
        // Answers for a parent session that ended are dropped: the root that asked is gone,
        // and the leases they carry expire at their leaves.
        if let Some(parent) = self.upstream.session() {
            self.send(parent, msg);
        }
    }

    /// Sends each dirty topic's offer diff upward when the flush policy says so (or `force`);
    /// diffs that may wait stay dirty until the linger deadline (`offer_due`).
    fn flush_offers(&mut self, now: Time, force: bool) {
        let (per_topic, per_key) = (self.upstream.credits(), self.upstream.key_credits());
        let session = self.upstream.session();
        let force = force || self.offer_due.is_some_and(|due| due <= now);
        let mut lingering = TopicSet::default();
        for topic in std::mem::take(&mut self.dirty) {
            let Some(offers) = self.offers.get_mut(&topic) else {
                continue;
            };
            let window = self.children.windows.get(&topic);
            if let Some(parent) = session {
                let credits = crate::lanes::credit(&topic, per_topic, per_key);
                offers.rebalance(credits, self.swap, now);
                let below = window.and_then(|window| window.min_frontier());
                let frontier = match (offers.best_unoffered(), below) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                if !self.flush_policy.due(offers, frontier, force) {
                    lingering.insert(topic);
                    continue;
                }
                if let Some(offer) = offers.poll(&topic, frontier) {
                    self.outbox.push(Transmit {
                        conn: parent,
                        msg: Wire::Offer(offer),
                    });
                }
            }
            if offers.is_idle() && window.is_none_or(|window| window.is_idle()) {
                self.offers.remove(&topic);
                self.children.remove_window(&topic);
            }
        }
        // A forced flush leaves nothing waiting, so a deadline still set is in the future.
        self.offer_due = (!lingering.is_empty()).then(|| {
            self.offer_due
                .unwrap_or_else(|| self.flush_policy.deadline(now))
        });
        self.dirty = lingering;
    }

    fn reject_unexpected(&mut self, conn: ConnId, msg: &Wire) {
        self.violations += 1;
        let text = format!("aggregator does not accept {} messages here", msg.name());
        self.send(conn, Wire::error(None, ErrorCode::UnexpectedMessage, text));
    }

    /// Connection `conn` ended; a child's leaves are waited for from `since` (see
    /// [`Machine::handle_went_silent`]).
    fn connection_gone(&mut self, now: Time, conn: ConnId, since: Time) {
        if self.upstream.disconnected(conn) {
            self.unreported = false;
            for offers in self.offers.values_mut() {
                offers.reset();
            }
            // The root that asked is gone: nobody waits for the answers any more.
            self.forwarded.clear();
            self.restore_noticed(now);
            return;
        }
        self.reporter.child_gone(conn);
        // The child offers everything again on its next session.
        self.noticed.retain(|_, (_, slot)| slot.child != conn);
        let removed = self.children.disconnect(conn, since);
        if removed.is_some() {
            // The parent learns that the leaves below are waited for before it learns that
            // requests to them failed, so it holds pops rather than serve what comes next.
            self.report_tick(now);
        }
        self.answer_forwarded(conn);
        if let Some(removed) = removed {
            for (topic, keys) in removed {
                if let Some(offers) = self.offers.get_mut(&topic) {
                    for key in &keys {
                        offers.remove(key);
                    }
                }
                self.dirty.insert(topic);
            }
            // The child's frontiers left with it.
            self.dirty.extend(self.offers.keys().cloned());
            self.flush_offers(now, true);
        }
    }
}

impl Machine for Aggregator {
    fn check_invariants(&self) {
        // What the aggregator holds from each child is bounded by the credits it granted.
        self.children.check_windows();
    }

    fn handle_connected(&mut self, now: Time, conn: ConnId, link: Link) {
        self.children.clock(now);
        match link {
            Link::Parent => {
                // As at a leaf: a former session whose end was not reported yet ends now.
                if let Some(former) = self.upstream.current() {
                    self.handle_disconnected(now, former);
                }
                let hello = self.upstream.connected(conn);
                self.outbox.push(hello);
            }
            Link::Incoming => {
                self.children.accept(conn);
            }
            Link::Leaf(_) => {
                self.violations += 1;
                self.outbox.close(conn, "only the root connects to leaves");
            }
        }
    }

    fn handle_disconnected(&mut self, now: Time, conn: ConnId) {
        self.connection_gone(now, conn, now);
    }

    fn handle_went_silent(&mut self, now: Time, conn: ConnId) {
        let since = self.children.last_heard_of_silent(now);
        self.connection_gone(now, conn, since);
    }

    fn handle_message(&mut self, now: Time, conn: ConnId, msg: Wire) {
        if self.upstream.is(conn) {
            match msg {
                Wire::Welcome(welcome) => {
                    if self.upstream.welcomed(conn, &welcome) {
                        self.dirty.extend(self.offers.keys().cloned());
                        // Everything offered, then a report once the leaves below are known:
                        // the parent knows this subtree when it arrives (see
                        // `absent_child_wait_ms`).
                        self.flush_offers(now, true);
                        self.unreported = true;
                        self.report_absent(now);
                    }
                }
                Wire::Reserve(reserve) => self.handle_reserve(now, reserve),
                Wire::Confirm(confirm) => self.handle_confirm(confirm),
                Wire::Release(release) => self.handle_release(release),
                Wire::LeafAdmin(admin) => self.handle_leaf_admin(admin),
                Wire::Grant(grant) => {
                    // A leaf out of reach gets the next one: grants are running totals.
                    if let Ok(child) = self.children.route(grant.leaf) {
                        self.send(child, Wire::Grant(grant));
                    }
                }
                Wire::Error(_) => self.violations += 1,
                other => self.reject_unexpected(conn, &other),
            }
        } else if self.children.is_child(conn) {
            match msg {
                Wire::Offer(offer) => match self.children.check_offer(conn, &offer) {
                    Ok(()) => self.handle_offer(now, conn, offer),
                    Err(text) => {
                        self.violations += 1;
                        self.send(conn, Wire::error(None, ErrorCode::InvalidArgument, text));
                    }
                },
                Wire::Report(report) => {
                    let heard = self.children.heard(conn);
                    let changed = self.children.reported_absent(conn, &report.absent, now);
                    self.reporter.child_report(conn, report);
                    if heard || changed {
                        self.report_absent(now);
                    }
                }
                Wire::Reserved(reserved) => {
                    if let Some(forwarded) = self.forwarded.get_mut(&conn) {
                        for outcome in &reserved.items {
                            forwarded.reserves.remove(&outcome.reservation);
                        }
                    }
                    // The child refilled us before answering: pass the refill up first.
                    self.flush_offers(now, true);
                    self.send_up(Wire::Reserved(reserved));
                }
                Wire::Confirmed(confirmed) => {
                    if let Some(forwarded) = self.forwarded.get_mut(&conn) {
                        forwarded.confirms.remove(&confirmed.tag);
                    }
                    self.send_up(Wire::Confirmed(confirmed));
                }
                Wire::LeafAdminReply(reply) => {
                    if let Some(forwarded) = self.forwarded.get_mut(&conn) {
                        forwarded.admins.remove(&reply.tag);
                    }
                    self.send_up(Wire::LeafAdminReply(reply));
                }
                // Only for a leaf of the child's own subtree.
                Wire::Usage(usage) if self.children.route(usage.leaf) == Ok(conn) => {
                    self.send_up(Wire::Usage(usage));
                }
                other => self.reject_unexpected(conn, &other),
            }
        } else {
            match msg {
                Wire::Hello(hello) => {
                    let outcome = self.children.hello(conn, hello, &[PeerKindTag::Node], now);
                    let reason = outcome.close_reason();
                    self.send(conn, outcome.reply);
                    if outcome.close {
                        self.outbox.close(conn, reason);
                    }
                    if let Some(old) = outcome.superseded {
                        self.handle_disconnected(now, old);
                        self.outbox.close(old, "superseded by a new session");
                    }
                }
                other => self.reject_unexpected(conn, &other),
            }
        }
        self.flush_offers(now, false);
    }

    fn handle_timeout(&mut self, now: Time) {
        if self.children.stop_waiting(now) {
            self.report_absent(now);
        }
        self.flush_offers(now, false);
    }

    fn report_tick(&mut self, now: Time) {
        if self.unreported {
            return;
        }
        if let Some(parent) = self.upstream.session() {
            let report = self.report(now);
            self.send(parent, Wire::Report(report));
        }
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.outbox.poll_transmit()
    }

    fn poll_close(&mut self) -> Option<(ConnId, String)> {
        self.outbox.poll_close()
    }

    fn poll_timeout(&self) -> Option<Time> {
        let report = self
            .unreported
            .then(|| self.children.next_wait_end())
            .flatten();
        self.offer_due.into_iter().chain(report).min()
    }

    fn histogram_totals(&self) -> std::collections::BTreeMap<Metric, crate::metrics::Hist> {
        self.reporter.recorder.totals()
    }

    fn report(&mut self, now: Time) -> Report {
        let stats = self.stats();
        let swaps = self.offers.values().map(|o| o.swaps).sum();
        let credit_stalls = self.offers.values().map(|o| o.credit_stalls).sum();
        let counters = [
            ("offers_received", self.counters.offers),
            ("entries_added", self.counters.entries_added),
            ("reserves_forwarded", self.counters.reserves),
            ("reserve_notices", self.counters.reserve_notices),
            ("swaps", swaps),
            ("credit_stalls", credit_stalls),
            ("protocol_violations", stats.violations),
        ];
        let gauges = [
            ("window_entries", stats.window_entries),
            ("offered", stats.offered),
            ("children", stats.children),
            ("topics", self.offers.len() as u64),
        ];
        let own = OwnReport {
            name: self.name.clone(),
            role: "aggregator",
            parent: self.upstream.parent_name(),
            connected: stats.parent_connected,
            counters: named(&counters),
            gauges: named(&gauges),
            stats: Stats::default(),
            absent: self.children.absent(now),
            group: None,
        };
        self.reporter.report(now, own)
    }

    fn stats(&self) -> NodeStats {
        NodeStats {
            window_entries: self.children.window_entries() as u64,
            offered: self.offers.values().map(|o| o.offered_len() as u64).sum(),
            children: self.children.children() as u64,
            parent_connected: self.upstream.session().is_some(),
            violations: self.violations,
            ..NodeStats::default()
        }
    }
}
