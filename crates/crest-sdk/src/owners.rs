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
}

/// The consumer's leaves (see the module doc).
pub(crate) struct Owners {
    /// Each leaf's addresses and its link: one leaf being dialed holds up no other's.
    leaves: HashMap<LeafId, (Vec<String>, tokio::sync::Mutex<Option<Owner>>)>,
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
                    let link = tokio::sync::Mutex::new(None);
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
        let mut owner = owner.lock().await;
        let first = match &*owner {
            Some(Owner::Up(link, _)) if !link.is_closed() => return Some(link.clone()),
            // A replica that led may have been deposed: the next one is tried first.
            Some(Owner::Up(_, index)) => index + 1,
            Some(Owner::Avoided { until, .. }) if Instant::now() < *until => return None,
            Some(Owner::Avoided { tried, .. }) => tried + 1,
            None => 0,
        };
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
                let made = Arc::new(made);
                *owner = Some(Owner::Up(made.clone(), index));
                return Some(made);
            }
        }
        *owner = Some(Owner::Avoided {
            until: Instant::now() + self.avoid,
            tried: first + addresses.len() - 1,
        });
        None
    }

    /// A request to `leaf` failed on `link`: its settlements go through the root until it
    /// is reached again.
    pub(crate) async fn failed(&self, leaf: LeafId, link: &Arc<Link>) {
        let Some((_, owner)) = self.leaves.get(&leaf) else {
            return;
        };
        let mut owner = owner.lock().await;
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
            if let Ok(owner) = owner.try_lock()
                && let Some(Owner::Up(link, _)) = &*owner
            {
                link.close();
            }
        }
    }
}
