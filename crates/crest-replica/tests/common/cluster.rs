//! Three replicas of a group on loopback: certificates from a fresh CA, held sockets, a
//! directory each, and the journals a test's factory makes for them.

use crest_core::config::Settings;
use crest_replica::{Group, GroupConfig, Journal, Member, ReplicaId};
use crest_testkit::{eventually, eventually_blocking};
use crest_transport::tls::CertificateAuthority;
use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a test waits for a condition before failing.
pub(crate) const WAIT: Duration = Duration::from_secs(15);

/// Makes replica `id`'s journal over its directory (what a started process has), and what
/// the test keeps of it.
pub(crate) type Factory<J, H> = Box<dyn FnMut(ReplicaId, &Path) -> (J, H) + Send>;

/// See the module doc. `H` is what the test keeps of each replica's latest journal.
pub(crate) struct Cluster<J, H> {
    pub(crate) ca: CertificateAuthority,
    pub(crate) settings: Settings,
    pub(crate) members: Vec<Member>,
    pub(crate) dirs: BTreeMap<ReplicaId, PathBuf>,
    pub(crate) journals: BTreeMap<ReplicaId, H>,
    pub(crate) running: BTreeMap<ReplicaId, Group>,
    make: Factory<J, H>,
    _root: tempfile::TempDir,
}

impl<J: Journal, H> Cluster<J, H> {
    pub(crate) async fn start(settings: Settings, make: Factory<J, H>) -> Cluster<J, H> {
        let ca = CertificateAuthority::generate().unwrap();
        let root = tempfile::tempdir().unwrap();
        let sockets: Vec<UdpSocket> = (0..3)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let members: Vec<Member> = sockets
            .iter()
            .enumerate()
            .map(|(i, socket)| Member {
                id: i as u64 + 1,
                name: format!("leaf-1-{}", i + 1),
                address: socket.local_addr().unwrap(),
            })
            .collect();
        let dirs = members
            .iter()
            .map(|m| (m.id, root.path().join(&m.name)))
            .collect();
        let mut cluster = Cluster {
            ca,
            settings,
            members,
            dirs,
            journals: BTreeMap::new(),
            running: BTreeMap::new(),
            make,
            _root: root,
        };
        for (socket, id) in sockets.into_iter().zip(1..) {
            cluster.run(id, Some(socket)).await;
        }
        cluster
    }

    /// Starts replica `id` with a fresh journal (what a restarted process has in memory).
    pub(crate) async fn run(&mut self, id: ReplicaId, socket: Option<UdpSocket>) {
        let member = &self.members[id as usize - 1];
        // A replica just stopped may still hold its socket while its last tasks end.
        let socket = socket.unwrap_or_else(|| {
            let what = format!("a rebind of {}", member.address);
            eventually_blocking(WAIT, what, || UdpSocket::bind(member.address))
        });
        let config = GroupConfig {
            dir: self.dirs[&id].clone(),
            me: id,
            members: self.members.clone(),
            identity: self
                .ca
                .issue(&member.name, &[], Duration::from_secs(3600))
                .unwrap(),
            ca_pem: self.ca.cert_pem().to_string(),
            settings: self.settings.clone(),
        };
        let (journal, kept) = (self.make)(id, &self.dirs[&id]);
        self.journals.insert(id, kept);
        let group = Group::start(config, journal, Some(socket)).await.unwrap();
        self.running.insert(id, group);
    }

    pub(crate) async fn stop(&mut self, id: ReplicaId) {
        if let Some(group) = self.running.remove(&id) {
            group.shutdown().await;
        }
    }

    /// Waits until the running replicas agree on a leader among them.
    pub(crate) async fn leader(&self) -> ReplicaId {
        eventually(WAIT, "an agreed leader", async || {
            let leaders: Vec<Option<ReplicaId>> =
                self.running.values().map(Group::leader).collect();
            match leaders.first() {
                Some(Some(leader))
                    if leaders.iter().all(|l| *l == Some(*leader))
                        && self.running.contains_key(leader) =>
                {
                    Ok(*leader)
                }
                _ => Err(leaders),
            }
        })
        .await
    }

    pub(crate) async fn shutdown(mut self) {
        for id in self.running.keys().copied().collect::<Vec<_>>() {
            self.stop(id).await;
        }
    }
}
