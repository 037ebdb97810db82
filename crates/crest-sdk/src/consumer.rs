//! The consumer: pops deliveries from the root and settles them (ack, nack, extend).
//!
//! Delivery is at-least-once: a delivery is leased to this consumer until its visibility
//! timeout; acknowledge it with its receipt before then, or it is delivered again (and the late
//! acknowledgement is refused as stale). A handler that needs longer extends the lease, by
//! hand ([`Consumer::extend`]) or with a [`Heartbeat`] that extends it until dropped. A
//! handler that fails nacks, optionally with a delay and a reason; after the topic's
//! `max_attempts` deliveries the message moves to the topic's dead-letter queue (see
//! [`crate::Admin`]).
//!
//! Acks, nacks and extends go to the leaf that owns the delivery (its id is in the receipt)
//! when the consumer has the leaves' addresses ([`ConsumerConfig::from_topology`], or
//! [`ConsumerConfig::leaves`]): the root carries none of them, and they succeed while the root
//! is down. A leaf the consumer cannot reach is settled with through the root instead, for
//! `leaf_retry_after`; a link to a leaf that went quiet (its host vanished, a replicated
//! leaf's leader was killed) is given up after `leaf_idle_timeout` (1 s), and what it carried
//! is tried again. The lease is the leaf's alone either way.
//!
//! A consumer rides through failures of the tree by itself. Its connection to the root is
//! made again when it ended (the root restarted, a network cut). A request whose connection
//! failed under it, and the receipts of a settlement answered `Unavailable` (the leaf is out
//! of reach, or its disk is full) or `TimedOut` (the leaf did not answer in time), are tried
//! again, up to `tries_max` times in all, `retry_initial` apart and doubling (at most
//! 1 s). Each is safe to repeat: a pop whose connection ended gave its deliveries back
//! (or their leases expire), and an ack repeated after an uncertain outcome that finds the
//! message already gone (`Settled`) reports success — the first one was applied. Only when
//! the tries are spent is the error returned.

use crate::link::Link;
use crate::owners::{LeafAddresses, Owners};
use crate::{ClientError, ClientTls};
use crest_core::id::{LeafId, Receipt};
use crest_core::topology::Topology;
use crest_core::wire::{Ack, Delivery, ErrorCode, PeerKind, Pop, ReceiptError, Settle, Wire};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Extra time beyond a pop's wait before the consumer gives up on the root.
const ANSWER_MARGIN: Duration = Duration::from_secs(10);

/// Longest pause between two tries of a request (see the module doc).
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(1);

/// How a consumer connects.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// The root's address (`host:port`), then those of the roots standing by for it: a
    /// consumer that cannot reach the one it uses moves on to the next. `NAME@host:port`
    /// takes only the certificate of node NAME there ([`ConsumerConfig::from_topology`] names
    /// every node); a bare address takes any node of the cluster.
    pub roots: Vec<String>,
    /// Trust.
    pub tls: ClientTls,
    /// Requests in flight at once on the connection.
    pub requests_in_flight_max: usize,
    /// Most times a request is tried, the first included (at least 1; see the module doc).
    pub tries_max: u32,
    /// Pause before the second try; doubled for each further one, up to 1 s.
    pub retry_initial: Duration,
    /// A connection to a root that stays silent this long is given up (keep-alives go every
    /// fifth of it): what bounds the time a consumer takes to notice a root whose host
    /// vanished, and move on to one standing by. Default: 1 s, as the tree's own links.
    pub idle_timeout: Duration,
    /// A root whose connection went silent is dialed after the others for this long: the
    /// next connection goes to a root standing by rather than waiting out
    /// `connect_timeout_ms` on a host that is gone.
    pub root_retry_after: Duration,
    /// The leaves' addresses: acks, nacks and extends of a delivery go to the leaf that owns
    /// it directly, not through the root (see the module doc). Empty (the default of
    /// [`ConsumerConfig::new`]): all go through the root.
    pub leaves: Vec<LeafAddresses>,
    /// How long a leaf that could not be reached is settled with through the root before it
    /// is dialed again.
    pub leaf_retry_after: Duration,
    /// A link to a leaf with no traffic for this long is given up (keep-alives go every fifth
    /// of it): how long a settlement sent to a leaf whose host vanished (a replicated leaf's
    /// leader killed) waits before it goes through the root to the leaf's next leader.
    pub leaf_idle_timeout: Duration,
}

impl ConsumerConfig {
    /// Defaults for the given root.
    pub fn new(root: impl Into<String>, tls: ClientTls) -> ConsumerConfig {
        ConsumerConfig {
            roots: vec![root.into()],
            tls,
            requests_in_flight_max: 64,
            tries_max: 4,
            retry_initial: Duration::from_millis(50),
            idle_timeout: Duration::from_secs(1),
            root_retry_after: Duration::from_secs(5),
            leaves: Vec::new(),
            leaf_retry_after: Duration::from_secs(5),
            leaf_idle_timeout: Duration::from_secs(1),
        }
    }

    /// The roots of a topology (the root, then those standing by) and its leaves.
    pub fn from_topology(topology: &Topology, tls: ClientTls) -> ConsumerConfig {
        let leaves = topology
            .leaves()
            .filter(|leaf| leaf.replica.as_ref().is_none_or(|r| r.number == 1))
            .filter_map(|leaf| {
                let addresses = match leaf.replica {
                    Some(_) => topology.members(leaf.tree_name()),
                    None => vec![leaf],
                };
                Some(LeafAddresses {
                    leaf: leaf.leaf_id?,
                    addresses: addresses.iter().map(|m| m.dial_address()).collect(),
                })
            })
            .collect();
        ConsumerConfig {
            roots: topology.roots().map(|root| root.dial_address()).collect(),
            leaves,
            ..ConsumerConfig::new(String::new(), tls)
        }
    }

    /// Adds a root standing by, tried when the ones before it cannot be reached.
    #[must_use]
    pub fn with_standby(mut self, root: impl Into<String>) -> ConsumerConfig {
        self.roots.push(root.into());
        self
    }
}

/// Options of one pop.
#[derive(Clone, Debug)]
pub struct PopOptions {
    /// Most deliveries to return (at least 1).
    pub max: u32,
    /// How long the root may wait for a first message (long-poll; 0: answer at once).
    pub wait: Duration,
    /// Visibility timeout of the deliveries (`None`: the topic's default).
    pub visibility: Option<Duration>,
    /// Only messages with a priority at most this (`None`: any), for consumers dedicated to
    /// urgent work.
    pub max_priority: Option<u32>,
}

impl Default for PopOptions {
    fn default() -> Self {
        PopOptions {
            max: 1,
            wait: Duration::ZERO,
            visibility: None,
            max_priority: None,
        }
    }
}

/// See the module doc. Cloning gives another handle on the same connection.
#[derive(Clone)]
pub struct Consumer {
    inner: Arc<Inner>,
}

struct Inner {
    config: ConsumerConfig,
    /// The current connection and which of the roots it is to, replaced by the first request
    /// after it ended.
    link: tokio::sync::Mutex<(Arc<Link>, usize)>,
    /// When each root's connection last went silent (see
    /// [`ConsumerConfig::root_retry_after`]).
    silent: std::sync::Mutex<Vec<Option<tokio::time::Instant>>>,
    /// Set by [`Consumer::close`]: no reconnection after it.
    closed: std::sync::atomic::AtomicBool,
    /// Links to the leaves, for settlements.
    owners: Owners,
}

impl Consumer {
    /// Connects to the root.
    ///
    /// # Errors
    /// [`ClientError`] if the root cannot be reached or refuses us.
    pub async fn connect(config: ConsumerConfig) -> Result<Consumer, ClientError> {
        let (link, root) = connect_root(&config, &[0]).await?;
        let silent = std::sync::Mutex::new(vec![None; config.roots.len()]);
        let owners = Owners::new(
            &config.leaves,
            config.tls.clone(),
            crate::link::settings_idle_after(config.leaf_idle_timeout),
            config.requests_in_flight_max,
            config.leaf_retry_after,
        );
        Ok(Consumer {
            inner: Arc::new(Inner {
                config,
                link: tokio::sync::Mutex::new((Arc::new(link), root)),
                silent,
                closed: std::sync::atomic::AtomicBool::new(false),
                owners,
            }),
        })
    }

    /// Leaves the root in use for the next one: the next request connects there first,
    /// unless it went silent lately and another did not.
    async fn move_on(&self) {
        let mut link = self.inner.link.lock().await;
        link.0.close();
        let next = (link.1 + 1) % self.inner.config.roots.len();
        link.1 = self.dial_order(next)[0];
    }

    /// The connection to the root, made again if the last one ended.
    async fn link(&self) -> Result<Arc<Link>, ClientError> {
        let mut link = self.inner.link.lock().await;
        if link.0.is_closed() {
            if self.inner.closed.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(ClientError::Closed);
            }
            if link.0.went_silent() {
                self.silent()[link.1] = Some(tokio::time::Instant::now());
            }
            // The root it was using first: it may be back already (a restart). Roots that
            // went silent lately come last.
            let order = self.dial_order(link.1);
            let (made, root) = connect_root(&self.inner.config, &order).await?;
            *link = (Arc::new(made), root);
        }
        Ok(link.0.clone())
    }

    fn silent(&self) -> std::sync::MutexGuard<'_, Vec<Option<tokio::time::Instant>>> {
        self.inner
            .silent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every root, from `first` on in turn, those that went silent within
    /// `root_retry_after` after the others.
    fn dial_order(&self, first: usize) -> Vec<usize> {
        let count = self.inner.config.roots.len();
        let silent = self.silent();
        let lately = |index: usize| {
            silent[index].is_some_and(|at| at.elapsed() < self.inner.config.root_retry_after)
        };
        let turn = (0..count).map(|turn| (first + turn) % count);
        let mut order: Vec<usize> = turn.clone().filter(|&i| !lately(i)).collect();
        order.extend(turn.filter(|&i| lately(i)));
        order
    }

    /// Pops up to `max` deliveries of `topic`, most urgent first, waiting up to `wait` for
    /// the first one. Returns an empty list if none was ready in time. Over a pop rate
    /// (`pop_rate` of the topic, its namespace or the principal), it waits for the rate
    /// within `wait`.
    ///
    /// # Errors
    /// [`ClientError::Rejected`] for invalid arguments (named in the message);
    /// [`ClientError::RetryLater`] (`RateLimited`) over a pop rate that has no token within
    /// `wait`.
    pub async fn pop(
        &self,
        topic: &str,
        max: u32,
        wait: Duration,
    ) -> Result<Vec<Delivery>, ClientError> {
        let options = PopOptions {
            max,
            wait,
            ..PopOptions::default()
        };
        self.pop_with(topic, options).await
    }

    /// Pops with all options.
    ///
    /// # Errors
    /// As [`Consumer::pop`].
    pub async fn pop_with(
        &self,
        topic: &str,
        options: PopOptions,
    ) -> Result<Vec<Delivery>, ClientError> {
        let lease_ms = options.visibility.map(millis);
        let mut tries = Tries::new(&self.inner.config);
        let deadline = tokio::time::Instant::now() + options.wait;
        let mut first = true;
        let answer = loop {
            // The first try asks for the wait as given, so a wait past `pop_wait_max_ms` is
            // refused rather than shortened by the time taken to send it; a retry asks for
            // what is left.
            let wait = if std::mem::take(&mut first) {
                options.wait
            } else {
                deadline.saturating_duration_since(tokio::time::Instant::now())
            };
            let wait_ms = millis(wait);
            let answer = self
                .request(
                    |request| {
                        Wire::Pop(Pop {
                            request,
                            topic: topic.to_string(),
                            max: options.max,
                            wait_ms,
                            lease_ms,
                            max_priority: options.max_priority,
                        })
                    },
                    wait + ANSWER_MARGIN,
                )
                .await;
            match answer {
                Err(error) if retryable(&error) && tries.again().await => {}
                // Over a pop rate: the pop waits for the rate's next tokens as it would for
                // messages, within its own wait.
                Err(ClientError::RetryLater {
                    code: ErrorCode::RateLimited,
                    after,
                    ..
                }) if tokio::time::Instant::now() + after <= deadline => {
                    tokio::time::sleep(after).await;
                }
                // A root standing by that no node is with: the others may have them.
                Err(ClientError::Rejected {
                    code: ErrorCode::Unavailable,
                    ..
                }) if self.inner.config.roots.len() > 1 && tries.again().await => {
                    self.move_on().await;
                }
                answer => break answer?,
            }
        };
        match answer {
            Wire::PopReply(reply) => Ok(reply.deliveries),
            other => Err(unexpected("PopReply", &other)),
        }
    }

    /// Acknowledges one delivery: the message is deleted.
    ///
    /// # Errors
    /// [`ClientError::Receipt`] if the receipt is stale or unknown.
    pub async fn ack(&self, receipt: &Receipt) -> Result<(), ClientError> {
        self.settle_one(Settle::Ack, receipt).await
    }

    /// Acknowledges many deliveries; one result per receipt, in order.
    ///
    /// # Errors
    /// [`ClientError`] if the request as a whole failed.
    pub async fn ack_many(
        &self,
        receipts: &[Receipt],
    ) -> Result<Vec<Result<(), ReceiptError>>, ClientError> {
        self.settle(Settle::Ack, receipts).await
    }

    /// Gives a delivery back as failed: it is delivered again after `delay` (its attempt count
    /// kept), or moves to the dead-letter queue if this was its last attempt; `reason` is kept
    /// with it.
    ///
    /// # Errors
    /// [`ClientError::Receipt`] if the receipt is stale or unknown.
    pub async fn nack(
        &self,
        receipt: &Receipt,
        delay: Duration,
        reason: Option<&str>,
    ) -> Result<(), ClientError> {
        let op = Settle::Nack {
            delay_ms: millis(delay),
            reason: reason.map(str::to_string),
        };
        self.settle_one(op, receipt).await
    }

    /// Moves a delivery's lease deadline to `visibility` from now.
    ///
    /// # Errors
    /// [`ClientError::Receipt`] if the receipt is stale (the lease already ended) or unknown.
    pub async fn extend(&self, receipt: &Receipt, visibility: Duration) -> Result<(), ClientError> {
        let op = Settle::Extend {
            lease_ms: millis(visibility),
        };
        self.settle_one(op, receipt).await
    }

    /// Applies `op` to many deliveries; one result per receipt, in order.
    ///
    /// # Errors
    /// [`ClientError`] if the request as a whole failed.
    pub async fn settle(
        &self,
        op: Settle,
        receipts: &[Receipt],
    ) -> Result<Vec<Result<(), ReceiptError>>, ClientError> {
        if receipts.is_empty() {
            // Nothing to settle (an empty pop's receipts): no round trip.
            return Ok(Vec::new());
        }
        let mut results: Vec<Option<Result<(), ReceiptError>>> = vec![None; receipts.len()];
        // The receipts still to settle (their indexes), and whether an earlier try of each may
        // have been applied.
        let mut pending: Vec<usize> = (0..receipts.len()).collect();
        let mut uncertain = vec![false; receipts.len()];
        let mut tries = Tries::new(&self.inner.config);
        loop {
            let last = tries.spent();
            let mut again = Vec::new();
            for (route, indexes, answer) in self.send_settles(&op, receipts, &pending).await {
                let answers = match answer {
                    Ok(Wire::AckReply(reply)) if reply.results.len() == indexes.len() => {
                        reply.results
                    }
                    Ok(Wire::AckReply(reply)) => {
                        return Err(ClientError::Protocol(format!(
                            "{} results for {} receipts",
                            reply.results.len(),
                            indexes.len()
                        )));
                    }
                    // A leaf that does not settle for consumers (or is overloaded, or gone):
                    // through the root next time, as long as tries are left.
                    Ok(other) if route.is_none() || last => {
                        return Err(unexpected("AckReply", &other));
                    }
                    Err(error) if (route.is_none() && !retryable(&error)) || last => {
                        return Err(error);
                    }
                    failed => {
                        if let Some((leaf, link)) = &route {
                            self.inner.owners.failed(*leaf, link);
                        }
                        // Sent, perhaps applied: its answer was lost.
                        if matches!(failed, Err(ClientError::Disconnected(_))) {
                            for &i in &indexes {
                                uncertain[i] = true;
                            }
                        }
                        again.extend(indexes);
                        continue;
                    }
                };
                for (i, answer) in indexes.into_iter().zip(answers) {
                    match answer {
                        Err(ReceiptError::Unavailable) if !last => again.push(i),
                        Err(ReceiptError::TimedOut) if !last => {
                            uncertain[i] = true;
                            again.push(i);
                        }
                        // An earlier try was applied: the message is gone, as the ack meant.
                        Err(ReceiptError::Settled) if uncertain[i] && op == Settle::Ack => {
                            results[i] = Some(Ok(()));
                        }
                        answer => results[i] = Some(answer),
                    }
                }
            }
            if again.is_empty() {
                break;
            }
            again.sort_unstable();
            pending = again;
            tries.again().await;
        }
        Ok(results
            .into_iter()
            .map(|result| result.expect("every receipt answered"))
            .collect())
    }

    /// Sends `op` for the receipts at `pending`, each to the leaf that owns it where the
    /// consumer has a link to that leaf, the rest through the root, all at once; answers per
    /// request the leaf it went to (`None`: the root), the receipts' indexes and the answer.
    async fn send_settles(
        &self,
        op: &Settle,
        receipts: &[Receipt],
        pending: &[usize],
    ) -> Vec<(
        Option<(LeafId, Arc<Link>)>,
        Vec<usize>,
        Result<Wire, ClientError>,
    )> {
        let mut by_leaf: BTreeMap<LeafId, Vec<usize>> = BTreeMap::new();
        for &i in pending {
            by_leaf.entry(receipts[i].id.leaf()).or_default().push(i);
        }
        let mut routes = Vec::new();
        let mut via_root = Vec::new();
        for (leaf, indexes) in by_leaf {
            match self.inner.owners.link(leaf).await {
                Some(link) => routes.push((Some((leaf, link)), indexes)),
                None => via_root.extend(indexes),
            }
        }
        if !via_root.is_empty() {
            via_root.sort_unstable();
            routes.push((None, via_root));
        }
        let mut sends = tokio::task::JoinSet::new();
        for (position, (route, indexes)) in routes.iter().enumerate() {
            let link = match route {
                Some((_, link)) => Ok(link.clone()),
                None => self.link().await,
            };
            let ack = Ack {
                request: 0,
                op: op.clone(),
                receipts: indexes.iter().map(|&i| receipts[i]).collect(),
            };
            let send = async move {
                let answer = match link {
                    Ok(link) => {
                        let build = |request| Wire::Ack(Ack { request, ..ack });
                        link.request(build, ANSWER_MARGIN).await
                    }
                    Err(error) => Err(error),
                };
                (position, answer)
            };
            // Every receipt one way (the usual case): awaited here, no task to spawn.
            if routes.len() == 1 {
                let (_, answer) = send.await;
                let (route, indexes) = routes.into_iter().next().expect("one route");
                return vec![(route, indexes, answer)];
            }
            sends.spawn(send);
        }
        let mut answers: Vec<Option<Result<Wire, ClientError>>> =
            routes.iter().map(|_| None).collect();
        while let Some(joined) = sends.join_next().await {
            // The tasks only await their request: one ends only by answering.
            let (position, answer) = match joined {
                Ok(answered) => answered,
                Err(error) => std::panic::resume_unwind(error.into_panic()),
            };
            answers[position] = Some(answer);
        }
        routes
            .into_iter()
            .zip(answers)
            .map(|((route, indexes), answer)| {
                (route, indexes, answer.expect("every request answered"))
            })
            .collect()
    }

    /// Sends one request on the connection (made again if it ended).
    async fn request(
        &self,
        make: impl FnOnce(u64) -> Wire,
        timeout: Duration,
    ) -> Result<Wire, ClientError> {
        self.link().await?.request(make, timeout).await
    }

    async fn settle_one(&self, op: Settle, receipt: &Receipt) -> Result<(), ClientError> {
        let results = self.settle(op, std::slice::from_ref(receipt)).await?;
        results
            .into_iter()
            .next()
            .unwrap_or(Err(ReceiptError::Unavailable))
            .map_err(ClientError::Receipt)
    }

    /// Keeps a delivery's lease alive while a handler runs: extends it to `visibility` from
    /// now at once and then every `visibility / 3`, until the returned guard is dropped or
    /// stopped, or an extend is refused (the lease is gone; [`Heartbeat::lost`] then says so).
    pub fn heartbeat(&self, receipt: Receipt, visibility: Duration) -> Heartbeat {
        let consumer = self.clone();
        let (lost_tx, lost_rx) = tokio::sync::watch::channel(None);
        let period = (visibility / 3).max(Duration::from_millis(1));
        let task = tokio::spawn(async move {
            loop {
                if let Err(error) = consumer.extend(&receipt, visibility).await {
                    let _ = lost_tx.send(Some(error));
                    return;
                }
                tokio::time::sleep(period).await;
            }
        });
        Heartbeat {
            task,
            lost: lost_rx,
        }
    }

    /// Closes the connection.
    pub fn close(&self) {
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Ok(link) = self.inner.link.try_lock() {
            link.0.close();
        }
        self.inner.owners.close();
    }
}

/// Whether a request that failed with `error` may be tried again: its connection failed or
/// could not be made. Not one the root refused, nor one it left unanswered for the whole of
/// its time (trying again would only wait as long once more).
fn retryable(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::Connect(_) | ClientError::Disconnected(_)
    )
}

/// The tries of one request (see the module doc).
struct Tries {
    left: u32,
    pause: Duration,
}

impl Tries {
    fn new(config: &ConsumerConfig) -> Tries {
        Tries {
            left: config.tries_max.max(1) - 1,
            pause: config.retry_initial,
        }
    }

    /// Whether no try is left after the current one.
    fn spent(&self) -> bool {
        self.left == 0
    }

    /// Waits before the next try; `false` (at once) if none is left.
    async fn again(&mut self) -> bool {
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(RETRY_MAX);
        true
    }
}

/// A running lease extension (see [`Consumer::heartbeat`]); dropping it stops extending.
pub struct Heartbeat {
    task: tokio::task::JoinHandle<()>,
    lost: tokio::sync::watch::Receiver<Option<ClientError>>,
}

impl Heartbeat {
    /// Why the lease could not be extended, if that happened: the delivery may then be
    /// redelivered to someone else, and acking it will be refused as stale.
    pub fn lost(&self) -> Option<ClientError> {
        self.lost.borrow().clone()
    }

    /// Stops extending.
    pub fn stop(self) {}
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Connects to the first of the roots that answers, trying them in `order` and then any
/// not in it; says which. A root that refuses us (a credential, a protocol version) is not
/// passed over: the others would say the same.
pub(crate) async fn connect_root(
    config: &ConsumerConfig,
    order: &[usize],
) -> Result<(Link, usize), ClientError> {
    let settings = crate::link::settings_idle_after(config.idle_timeout);
    let count = config.roots.len();
    if count == 0 {
        return Err(ClientError::InvalidArgument("no root address".into()));
    }
    let rest = (0..count).filter(|index| !order.contains(index));
    let mut failure = None;
    for index in order.iter().copied().filter(|&i| i < count).chain(rest) {
        let made = Link::connect(
            &config.roots[index],
            PeerKind::Consumer,
            &config.tls,
            &settings,
            config.requests_in_flight_max,
        )
        .await;
        match made {
            Ok(link) => return Ok((link, index)),
            Err(error @ (ClientError::Connect(_) | ClientError::Disconnected(_))) => {
                failure = Some(error);
            }
            Err(error) => return Err(error),
        }
    }
    Err(failure.expect("at least one root was tried"))
}

pub(crate) fn unexpected(expected: &str, got: &Wire) -> ClientError {
    if let Wire::Error(error) = got {
        return ClientError::Rejected {
            code: error.code,
            message: error.message.clone(),
        };
    }
    ClientError::Protocol(format!("expected {expected}, got {}", got.name()))
}

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
