//! A consumer's links to the leaves that own its deliveries: acks, nacks and extends go to
//! the owning leaf directly, so the root carries no settlement traffic (and a settlement does
//! not need the root to be up). The lease is the leaf's either way; the root's path stays for
//! leaves the consumer has no address of, or cannot reach.

use crate::ClientTls;
use crate::link::Link;
use crest_core::config::Settings;
use crest_core::id::LeafId;
use crest_core::wire::PeerKind;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Where a leaf takes consumers' settlements: its address, or each replica's for a
/// replicated leaf (the one that leads answers; the others refuse connections).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeafAddresses {
    /// The leaf's id: the one its receipts carry.
    pub leaf: LeafId,
    /// Its address (`host:port`), or its replicas'.
    pub addresses: Vec<String>,
}

/// A leaf's link, or why there is none for now.
enum Owner {
    /// Connected to the address at this index of its list.
    Up(Arc<Link>, usize),
    /// Could not be reached: settled through the root until `until`; the next connection
    /// starts with the address after `tried`.
    Avoided { until: Instant, tried: usize },
    /// Being dialed: settlements meanwhile go through the root rather than wait for the
    /// dial.
    Dialing,
}

/// The consumer's leaves (see the module doc).
pub(crate) struct Owners {
    /// Each leaf's addresses and its link. The lock is never held across a dial: a leaf
    /// being dialed holds up neither another leaf's settlements nor its own (they go through
    /// the root meanwhile).
    leaves: HashMap<LeafId, (Vec<String>, std::sync::Mutex<Option<Owner>>)>,
    tls: ClientTls,
    settings: Settings,
    requests_in_flight_max: usize,
    avoid: Duration,
}

impl Owners {
    pub(crate) fn new(
        leaves: &[LeafAddresses],
        tls: ClientTls,
        settings: Settings,
        requests_in_flight_max: usize,
        avoid: Duration,
    ) -> Owners {
        Owners {
            leaves: leaves
                .iter()
                .filter(|leaf| !leaf.addresses.is_empty())
                .map(|leaf| {
                    let link = std::sync::Mutex::new(None);
                    (leaf.leaf, (leaf.addresses.clone(), link))
                })
                .collect(),
            tls,
            settings,
            requests_in_flight_max,
            avoid,
        }
    }

    /// The link to `leaf`, made if there is none; `None` when the consumer has no address of
    /// it, or it could not be reached lately (settle through the root then).
    pub(crate) async fn link(&self, leaf: LeafId) -> Option<Arc<Link>> {
        let (addresses, owner) = self.leaves.get(&leaf)?;
        let first = {
            let mut owner = lock(owner);
            let first = match &*owner {
                Some(Owner::Up(link, _)) if !link.is_closed() => return Some(link.clone()),
                // A replica that led may have been deposed: the next one is tried first.
                Some(Owner::Up(_, index)) => index + 1,
                Some(Owner::Avoided { until, .. }) if Instant::now() < *until => return None,
                Some(Owner::Avoided { tried, .. }) => tried + 1,
                Some(Owner::Dialing) => return None,
                None => 0,
            };
            *owner = Some(Owner::Dialing);
            first
        };
        // A dial whose caller gives up (its future dropped) must not leave the leaf marked
        // as being dialed for ever.
        let mut unfinished = Unfinished(Some(owner));
        let made = self.dial(addresses, first).await;
        unfinished.0 = None;
        let mut owner = lock(owner);
        match made {
            Some((link, index)) => {
                *owner = Some(Owner::Up(link.clone(), index));
                Some(link)
            }
            None => {
                *owner = Some(Owner::Avoided {
                    until: Instant::now() + self.avoid,
                    tried: first + addresses.len() - 1,
                });
                None
            }
        }
    }

    /// A link to the first of `addresses`, from `first` on, that answers, and its index.
    async fn dial(&self, addresses: &[String], first: usize) -> Option<(Arc<Link>, usize)> {
        for turn in 0..addresses.len() {
            let index = (first + turn) % addresses.len();
            let made = Link::connect(
                &addresses[index],
                PeerKind::Consumer,
                &self.tls,
                &self.settings,
                self.requests_in_flight_max,
            )
            .await;
            if let Ok(made) = made {
                return Some((Arc::new(made), index));
            }
        }
        None
    }

    /// A request to `leaf` failed on `link`: its settlements go through the root until it
    /// is reached again.
    pub(crate) fn failed(&self, leaf: LeafId, link: &Arc<Link>) {
        let Some((_, owner)) = self.leaves.get(&leaf) else {
            return;
        };
        let mut owner = lock(owner);
        if let Some(Owner::Up(current, index)) = &*owner
            && Arc::ptr_eq(current, link)
        {
            let tried = *index;
            link.close();
            *owner = Some(Owner::Avoided {
                until: Instant::now() + self.avoid,
                tried,
            });
        }
    }

    /// Closes every link.
    pub(crate) fn close(&self) {
        for (_, owner) in self.leaves.values() {
            if let Some(Owner::Up(link, _)) = &*lock(owner) {
                link.close();
            }
        }
    }
}

/// A dial in progress: if dropped before it ends, its leaf is no longer marked as dialed.
struct Unfinished<'a>(Option<&'a std::sync::Mutex<Option<Owner>>>);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(owner) = self.0 {
            let mut owner = lock(owner);
            if matches!(*owner, Some(Owner::Dialing)) {
                *owner = None;
            }
        }
    }
}

/// A leaf's state, even if a thread panicked holding it: every state is whole between two
/// statements, so the value is as good as any.
fn lock(owner: &std::sync::Mutex<Option<Owner>>) -> std::sync::MutexGuard<'_, Option<Owner>> {
    owner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
