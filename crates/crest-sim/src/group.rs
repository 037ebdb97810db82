//! Replicated leaves: a leaf of the tree kept by a group of replicas.
//!
//! A group is modelled by what its Raft (openraft in the product) guarantees, not by Raft's
//! own messages: the leader appends each storage operation of its leaf to its log and ships
//! it to every follower it reaches (link latency, plus `slow_follower_us` to the last one); an
//! operation is durable — its leaf hears `Stored` — once a majority holds it durably, in log
//! order. When the leader crashes, or is cut off for an election timeout, the replicas that
//! are up elect the most up-to-date of them if they are a majority (Raft's election
//! restriction); the leaf is rebuilt from the new leader's log, as a replica taking over
//! rebuilds it from its own, and serves once an election timeout, drawn in one to two
//! timeouts, has passed. A follower that crashes keeps what it had made durable; one whose log
//! reads back corrupt rejoins empty and, like the product's replica, still votes.
//!
//! What this tests is crest's side of replication: that acknowledging on a majority,
//! rebuilding the leaf from a log holding every committed entry, and lease grants that wait
//! for the log lose nothing acknowledged and never lease a message twice. Checked at every
//! election: the new leader's log holds every entry committed before it (the completeness
//! crest's rebuild relies on).

use super::*;
use crest_core::leaf::Leaf;

/// One replica of a group.
pub(super) struct Replica {
    up: bool,
    /// When each entry of the leader's log it holds became durable on it (a prefix of the log).
    durable: Vec<Time>,
    /// Extra one-way delay from the leader.
    delay: Duration,
    /// Back with an empty log: it does not vote until it holds this many entries again (the
    /// commit index of the first leader to reach it; `usize::MAX` until one does), as the
    /// product's replica that starts with nothing on disk (`crest-replica`'s `net.rs`).
    recovering: Option<usize>,
}

impl Replica {
    /// What it holds when an election starts at `now`: the copies durable by then (those still
    /// on their way are lost with the leader that sent them); a recovering replica that holds
    /// what it had to catch up to votes again.
    fn settle(&mut self, now: Time) {
        self.durable.retain(|at| *at <= now);
        if self
            .recovering
            .is_some_and(|target| self.durable.len() >= target)
        {
            self.recovering = None;
        }
    }

    /// Whether it takes part in an election (once [`Replica::settle`]d).
    fn votes(&self) -> bool {
        self.up && self.recovering.is_none()
    }
}

/// A replicated leaf's group (see the module doc).
pub(super) struct Group {
    replicas: Vec<Replica>,
    leader: usize,
    /// When each entry of the leader's log committed (`None`: not yet).
    commits: Vec<Option<Time>>,
    /// Entries waiting for a majority, and the storage token their leaf waits on.
    waiting: BTreeMap<usize, Option<u64>>,
    /// No majority was up when the leader went: the next replica back holds the election.
    leaderless: bool,
    /// Leaders deposed while cut off by a partition (partition index, replica): back at the heal.
    isolated: Vec<(usize, usize)>,
    /// Elections held: the leaf starts serving after the latest only.
    elections: u64,
}

impl Group {
    pub(super) fn new(replicas: u32, slow_follower: Duration) -> Group {
        let last = replicas as usize - 1;
        Group {
            replicas: (0..=last)
                .map(|r| Replica {
                    up: true,
                    durable: Vec::new(),
                    delay: if r == last && r > 0 {
                        slow_follower
                    } else {
                        Duration::ZERO
                    },
                    recovering: None,
                })
                .collect(),
            leader: 0,
            commits: Vec::new(),
            waiting: BTreeMap::new(),
            leaderless: false,
            isolated: Vec::new(),
            elections: 0,
        }
    }

    fn majority(&self) -> usize {
        self.replicas.len() / 2 + 1
    }
}

impl Sim {
    /// One link latency draw for a group's traffic (a group's links lose nothing: Raft's
    /// retries are not modelled, only where its copies are and when they are durable).
    fn group_latency(&mut self) -> Duration {
        Duration::from_micros(self.link_latency_us())
    }

    /// Whether `node`'s leader is cut off (by a partition naming the leaf) from its followers.
    fn leader_cut(&self, node: usize) -> bool {
        self.cuts.iter().any(|cut| cut.nodes.contains(&node))
    }

    /// The last operation of `logs[node]` was appended by the group's leader, durable on it at
    /// `at`: ships it to the followers it reaches and tells the leaf once a majority holds it.
    pub(super) fn group_append(&mut self, node: usize, at: Time, token: Option<u64>) {
        let reachable = !self.leader_cut(node);
        let fsync = Duration::from_micros(self.disk.fsync_us);
        let index = self.logs[node].len() - 1;
        let count = self.groups[node].as_ref().map_or(0, |g| g.replicas.len());
        let latencies: Vec<Duration> = (0..count).map(|_| self.group_latency()).collect();
        let now = self.now;
        let Some(group) = self.groups[node].as_mut() else {
            return;
        };
        let leader = group.leader;
        for (r, replica) in group.replicas.iter_mut().enumerate() {
            if r == leader {
                replica.durable.push(at);
            } else if replica.up && reachable && replica.durable.len() == index {
                let last = replica.durable.last().copied().unwrap_or(Time::ZERO);
                replica
                    .durable
                    .push((now + latencies[r] + replica.delay + fsync).max(last));
            }
        }
        group.commits.push(None);
        group.waiting.insert(index, token);
        self.group_commit(node);
    }

    /// Commits, in order, the waiting entries a majority holds durably by now, and tells the
    /// leaf; if the next could commit later (its copies on their way to disk), checks again
    /// then: a copy lost in between (its replica crashed) keeps it waiting.
    pub(super) fn group_commit(&mut self, node: usize) {
        let now = self.now;
        let life = self.lives[node];
        let Some(group) = self.groups[node].as_mut() else {
            return;
        };
        let need = group.majority();
        let mut done = Vec::new();
        let mut check = None;
        while let Some((&index, &token)) = group.waiting.first_key_value() {
            let mut held: Vec<Time> = group
                .replicas
                .iter()
                .filter_map(|r| r.durable.get(index).copied())
                .collect();
            if held.len() < need {
                break;
            }
            held.sort_unstable();
            if held[need - 1] > now {
                check = Some(held[need - 1]);
                break;
            }
            group.commits[index] = Some(now);
            group.waiting.remove(&index);
            done.extend(token);
        }
        for token in done {
            self.schedule(now, Event::Stored { node, life, token });
        }
        if let Some(at) = check {
            self.schedule(at, Event::GroupCheck { node });
        }
    }

    /// Ships follower `r` of `node`'s group the entries it lacks (it is up and reached).
    fn catch_up(&mut self, node: usize, r: usize) {
        if self.leader_cut(node) {
            return;
        }
        let latency = self.group_latency();
        let fsync = Duration::from_micros(self.disk.fsync_us);
        let now = self.now;
        let len = self.logs[node].len();
        let Some(group) = self.groups[node].as_mut() else {
            return;
        };
        if group.leaderless || r == group.leader {
            return;
        }
        let committed = group.commits.iter().take_while(|c| c.is_some()).count();
        let replica = &mut group.replicas[r];
        if replica.recovering == Some(usize::MAX) {
            replica.recovering = Some(committed);
        }
        let at = now + latency + replica.delay + fsync;
        while replica.durable.len() < len {
            replica.durable.push(at);
        }
        self.group_commit(node);
    }

    /// A crash of `node`, a replicated leaf: its replica `replica` (drawn at random if `None`)
    /// crashes and comes back after `restart_after`, its log read back corrupt if `corrupt`
    /// (else as the disk model draws). False if `node` is no group.
    pub(super) fn group_crash(
        &mut self,
        node: usize,
        restart_after: Duration,
        replica: Option<usize>,
        corrupt: bool,
    ) -> bool {
        let now = self.now;
        let Some(count) = self.groups[node].as_ref().map(|g| g.replicas.len()) else {
            return false;
        };
        let r = match replica {
            Some(r) => r.min(count - 1),
            None => self.rng.below(count as u64) as usize,
        };
        let Some(group) = self.groups[node].as_mut() else {
            return false;
        };
        if !group.replicas[r].up {
            return true;
        }
        let leads = r == group.leader && !group.leaderless;
        if !leads {
            let replica = &mut group.replicas[r];
            replica.up = false;
            replica.durable.retain(|at| *at <= now);
        }
        self.crashes += 1;
        self.schedule(
            now + restart_after,
            Event::ReplicaBack {
                node,
                replica: r,
                corrupt,
            },
        );
        if leads {
            self.depose(node);
        }
        true
    }

    /// A partition cuts `node` off: if it is a replicated leaf and the cut outlasts an
    /// election timeout, its leader is deposed then.
    pub(super) fn group_partitioned(&mut self, index: usize, lasts: Duration) {
        if lasts <= self.election_timeout {
            return;
        }
        let at = self.now + self.election_timeout;
        let nodes = self.partition_specs[index].0.clone();
        for node in nodes {
            if self.groups[node].is_some() {
                self.schedule(at, Event::Depose { node, index });
            }
        }
    }

    /// `node`'s leader has been cut off by partition `index` for an election timeout: the
    /// followers elect another; the old one rejoins them at the heal.
    pub(super) fn group_cut_off(&mut self, node: usize, index: usize) {
        let Some(cut) = self.cuts.iter_mut().find(|cut| cut.index == index) else {
            return;
        };
        if !cut.nodes.contains(&node) {
            return;
        }
        // The leaf now lives on another host, which the partition does not cut off.
        cut.nodes.retain(|n| *n != node);
        let Some(group) = self.groups[node].as_mut() else {
            return;
        };
        if group.leaderless {
            return;
        }
        let old = group.leader;
        group.isolated.push((index, old));
        self.depose(node);
    }

    /// Partition `index` heals: the leaders it cut off rejoin their groups as followers, and
    /// followers of leaders it cut off (for less than an election timeout) catch up.
    pub(super) fn group_healed(&mut self, index: usize, nodes: &[usize]) {
        for node in 0..self.groups.len() {
            let Some(group) = self.groups[node].as_mut() else {
                continue;
            };
            let back: Vec<usize> = group
                .isolated
                .iter()
                .filter(|(i, _)| *i == index)
                .map(|(_, r)| *r)
                .collect();
            group.isolated.retain(|(i, _)| *i != index);
            for r in back {
                self.replica_back(node, r, false);
            }
            if nodes.contains(&node) {
                let count = self.groups[node].as_ref().map_or(0, |g| g.replicas.len());
                for r in 0..count {
                    self.catch_up(node, r);
                }
            }
        }
    }

    /// The leader of `node`'s group is gone (crashed or cut off): the leaf stops, and the
    /// replicas up elect another if they are a majority.
    fn depose(&mut self, node: usize) {
        let now = self.now;
        if let Some(group) = self.groups[node].as_mut() {
            let old = group.leader;
            let replica = &mut group.replicas[old];
            replica.up = false;
            replica.durable.retain(|at| *at <= now);
        }
        self.crash(node);
        self.elect(node);
    }

    /// Replica `r` of `node`'s group is back (restarted, or its partition healed).
    pub(super) fn replica_back(&mut self, node: usize, r: usize, corrupt: bool) {
        let corrupt = corrupt
            || self.replication.corrupt_reads > 0.0
                && self.rng.unit() < self.replication.corrupt_reads;
        let len = self.logs[node].len();
        let Some(group) = self.groups[node].as_mut() else {
            return;
        };
        // A group of n survives ⌊(n − 1) / 2⌋ lost logs at a time, as a majority quorum does
        // (more, and what only the lost copies held is gone): the model loses no more.
        let losing = group
            .replicas
            .iter()
            .filter(|r| r.recovering.is_some())
            .count();
        let corrupt = corrupt && losing < (group.replicas.len() - 1) / 2;
        let replica = &mut group.replicas[r];
        if replica.up {
            return;
        }
        replica.up = true;
        if corrupt {
            replica.durable.clear();
            if !self.replication.votes_when_empty {
                replica.recovering = Some(usize::MAX);
            }
            self.corrupt_logs += 1;
        }
        replica.durable.truncate(len);
        if group.leaderless {
            self.elect(node);
        } else {
            self.catch_up(node, r);
        }
    }

    /// The replicas of `node`'s group that are up elect the most up-to-date of them, if they
    /// are a majority; the leaf is rebuilt from its log and serves after the election.
    fn elect(&mut self, node: usize) {
        let now = self.now;
        let Some(group) = self.groups[node].as_mut() else {
            return;
        };
        for replica in &mut group.replicas {
            replica.settle(now);
        }
        let up: Vec<usize> = (0..group.replicas.len())
            .filter(|&r| group.replicas[r].votes())
            .collect();
        if up.len() < group.majority() {
            group.leaderless = true;
            return;
        }
        group.leaderless = false;
        let new = up
            .iter()
            .copied()
            .max_by_key(|&r| (group.replicas[r].durable.len(), std::cmp::Reverse(r)))
            .expect("a majority is up");
        let kept = group.replicas[new].durable.len();
        if let Some(lost) =
            (kept..group.commits.len()).find(|&i| group.commits[i].is_some_and(|at| at <= now))
        {
            self.group_violations += 1;
            self.group_violation.get_or_insert_with(|| {
                format!(
                    "node {node}: replica {new} elected without committed entry {lost} \
                     (it holds {kept} of {})",
                    group.commits.len()
                )
            });
        }
        let durable = group.replicas[new].durable.clone();
        for replica in &mut group.replicas {
            replica.durable.truncate(kept);
        }
        group.commits.truncate(kept);
        for commit in &mut group.commits {
            commit.get_or_insert(now);
        }
        group.waiting.clear();
        group.leader = new;
        group.elections += 1;
        let election = group.elections;
        let log = &mut self.logs[node];
        log.truncate(kept);
        for (entry, at) in log.iter_mut().zip(durable) {
            entry.0 = at;
        }
        self.failovers += 1;
        // The new leader is on another host than the one a partition may have cut off.
        for cut in &mut self.cuts {
            cut.nodes.retain(|n| *n != node);
        }
        let ops: Vec<_> = log.iter().map(|(_, op)| op.clone()).collect();
        let operations = crest_core::machine::replay(&ops);
        if let NodeConfig::Leaf(config) = self.configs[node].clone() {
            self.nodes[node] = Box::new(Leaf::recover(config, now, operations));
        }
        let count = self.groups[node].as_ref().map_or(0, |g| g.replicas.len());
        for r in 0..count {
            self.catch_up(node, r);
        }
        // As a replica stands: 1.2 to 2.2 election timeouts after it last heard the leader
        // (crest-replica's pre-vote timing).
        let timeout = self.election_timeout.as_micros() as u64;
        let wait = timeout + timeout / 5 + self.rng.below(timeout + 1);
        let elected = now + Duration::from_micros(wait);
        self.schedule(elected, Event::Elected { node, election });
    }

    /// The leader of `node`'s group elected in `election` serves the leaf, unless it has lost
    /// its place since.
    pub(super) fn group_elected(&mut self, node: usize, election: u64) {
        if self.groups[node]
            .as_ref()
            .is_some_and(|g| g.elections == election && !g.leaderless)
        {
            self.restart(node, self.root);
        }
    }
}
