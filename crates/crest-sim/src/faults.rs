//! Faults: nodes that crash and restart (a leaf from the durable prefix of its log), and
//! partitions that start, outlast the idle timeout and heal.

use super::*;
use crest_core::leaf::Leaf;
use crest_core::machine::ConnId;
use std::time::Duration;

impl Sim {
    /// A partition starts: traffic across it waits for the heal (see [`Sim::send`]).
    pub(super) fn partition_start(&mut self, index: usize) {
        let (nodes, lasts) = self.partition_specs[index].clone();
        self.partitions += 1;
        self.cuts.push(Cut {
            index,
            nodes,
            heal_at: self.now + lasts,
            timed_out: false,
        });
        if lasts >= self.idle_timeout {
            let at = self.now + self.idle_timeout;
            self.schedule(at, Event::PartitionTimeout { index });
        }
        let at = self.now + lasts;
        self.schedule(at, Event::PartitionHeal { index });
        self.group_partitioned(index, lasts);
    }

    /// A partition outlasted the idle timeout: every connection across it ends.
    pub(super) fn partition_timeout(&mut self, index: usize) {
        let Some(cut) = self.cuts.iter_mut().find(|cut| cut.index == index) else {
            return;
        };
        cut.timed_out = true;
        let cut = &self
            .cuts
            .iter()
            .find(|cut| cut.index == index)
            .expect("found");
        let mut across: Vec<ConnId> = self
            .ends
            .iter()
            .filter(|(end, (owner, peer))| {
                *end < peer
                    && self
                        .ends
                        .get(peer)
                        .is_some_and(|(o, _)| cut.separates(*owner, *o))
            })
            .map(|(end, _)| *end)
            .collect();
        across.sort_unstable();
        // Deliveries on their way may be lost with their connection: at-least-once may
        // deliver them again. So may answers the ends' nodes send as the connections close
        // (a pop answered on a consumer connection that closes next).
        self.exposed.extend(self.unconfirmed.iter().copied());
        for end in across {
            self.partition_disconnects += 1;
            self.time_out_conn(end);
        }
        self.exposed.extend(self.unconfirmed.iter().copied());
    }

    /// A partition heals: connections it ended are made again.
    pub(super) fn partition_heal(&mut self, index: usize) {
        let cut: Vec<usize> = self
            .cuts
            .iter()
            .filter(|cut| cut.index == index)
            .flat_map(|cut| cut.nodes.iter().copied())
            .collect();
        self.cuts.retain(|cut| cut.index != index);
        self.group_healed(index, &cut);
        for child in 0..self.nodes.len() {
            let Some(parent) = self.parents[child] else {
                continue;
            };
            let (c, p) = (Owner::Node(child), Owner::Node(parent));
            if self.up[child] && self.up[parent] && !self.cut_off(c, p) && !self.connected(c, p) {
                self.link(child, parent);
            }
        }
        for producer in 0..self.producers.len() {
            for leaf in self.producers[producer].targets.clone() {
                let (a, b) = (Owner::Producer(producer), Owner::Node(leaf));
                if self.up[leaf] && !self.cut_off(a, b) && !self.connected(a, b) {
                    self.connect_producer(producer, leaf);
                    self.drain(leaf);
                }
            }
        }
        self.link_direct();
        let root = self.root;
        for consumer in 0..self.consumers.len() {
            let (a, b) = (Owner::Consumer(consumer), Owner::Node(root));
            if self.up[root] && !self.cut_off(a, b) && !self.connected(a, b) {
                self.connect_consumer(consumer, root);
                self.drain(root);
                let at = self.now + Duration::from_millis(1);
                self.schedule(at, Event::Consume { consumer });
            }
        }
    }

    /// A node crashes: its connections drop, a leaf keeps only what its disk made durable.
    pub(super) fn crash(&mut self, node: usize) {
        if !self.up[node] {
            return;
        }
        self.crashes += 1;
        self.exposed.extend(self.unconfirmed.iter().copied());
        self.lives[node] += 1;
        self.up[node] = false;
        self.armed[node] = None;
        let mut ends: Vec<ConnId> = self
            .ends
            .iter()
            .filter(|(_, (owner, _))| *owner == Owner::Node(node))
            .map(|(end, _)| *end)
            .collect();
        ends.sort_unstable();
        for end in ends {
            self.close_conn(end, Some(node));
        }
        // Answers other nodes sent as these connections closed may be lost too.
        self.exposed.extend(self.unconfirmed.iter().copied());
        // Its leases die with it (a leaf's) or stay with their leaf (the others'). A message
        // leased when its leaf crashed comes back available: at-least-once may deliver it
        // again, whether its grant had reached a consumer yet or not.
        if let Some(leaf) = self.leaf_ids[node] {
            let now = self.now;
            for (id, (_, deadline)) in &self.leases {
                if id.leaf() == leaf && *deadline > now {
                    self.exposed.insert(*id);
                }
            }
            self.leases.retain(|id, _| id.leaf() != leaf);
        }
        let now = self.now;
        // What survives: the durable prefix of the log, from its last durable checkpoint.
        let config = self.configs[node].clone();
        self.nodes[node] = match config {
            // A replicated leaf is rebuilt by its group's election (group.rs).
            NodeConfig::Leaf(config) if self.groups[node].is_none() => {
                let torn = self.disk.torn_writes;
                let log = &mut self.logs[node];
                let durable = log.partition_point(|(durable_at, _)| *durable_at <= now);
                let mut ops: Vec<_> = log.drain(..).map(|(_, op)| op).collect();
                let pending = ops.split_off(durable);
                if torn {
                    // The tear falls somewhere in the records written after the last sync.
                    let records: Vec<crest_core::record::LogRecord> = pending
                        .into_iter()
                        .filter_map(|op| match op {
                            crest_core::machine::StorageOp::Append { records, .. } => Some(records),
                            _ => None,
                        })
                        .flatten()
                        .collect();
                    let kept = self.rng.below(records.len() as u64 + 1) as usize;
                    self.torn_records += kept as u64;
                    if kept > 0 {
                        ops.push(crest_core::machine::StorageOp::Append {
                            token: None,
                            records: records.into_iter().take(kept).collect(),
                            wait: crest_core::machine::SyncWait::Now,
                        });
                    }
                }
                let operations = crest_core::machine::replay(&ops);
                // What survives is the log as recovery sees it.
                log.extend(operations.iter().map(|records| {
                    let records = records.clone();
                    (
                        now,
                        crest_core::machine::StorageOp::Append {
                            token: None,
                            records,
                            wait: crest_core::machine::SyncWait::Now,
                        },
                    )
                }));
                Box::new(Leaf::recover(config, now, operations))
            }
            other => other.build(),
        };
    }

    /// A crashed node starts again and reconnects.
    pub(super) fn restart(&mut self, node: usize, root: usize) {
        if self.up[node] {
            return;
        }
        self.up[node] = true;
        if let Some(parent) = self.parents[node]
            && self.up[parent]
        {
            self.link(node, parent);
        }
        let children: Vec<usize> = (0..self.nodes.len())
            .filter(|&c| self.parents[c] == Some(node) && self.up[c])
            .collect();
        for child in children {
            self.link(child, node);
        }
        for p in 0..self.producers.len() {
            if self.producers[p].targets.contains(&node) {
                self.connect_producer(p, node);
            }
        }
        self.link_direct();
        if node == root {
            for c in 0..self.consumers.len() {
                self.connect_consumer(c, root);
                let at = self.now + Duration::from_millis(1);
                self.schedule(at, Event::Consume { consumer: c });
            }
        }
        self.drain(node);
    }
}
