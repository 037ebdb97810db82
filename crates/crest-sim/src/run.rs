//! One simulation from start to report: the tree and its clients built from the topology and
//! the workload, the faults scheduled, the event loop run to the end of the drain.

use super::*;
use crest_core::aggregator::AggregatorConfig;
use crest_core::leaf::{LeafConfig, token_key_from_seed};
use crest_core::machine::StorageDone;
use crest_core::rng::SplitMix64 as Rng;
use crest_core::root::RootConfig;
use crest_core::time::Time;
use crest_core::topology::Topology;
use crest_core::wire::Role;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// When the phases of a run begin and end, in virtual time.
struct Plan {
    /// The first event: nodes start and link.
    start: Time,
    /// Producers and consumers start (after the warm-up).
    begin: Time,
    /// Producers stop (at the latest).
    end: Time,
    /// Nothing is simulated past this (the end of the drain).
    finish: Time,
    /// When each producer stops.
    producer_ends: Vec<Time>,
}

impl Plan {
    fn new(start: Time, workload: &Workload) -> Plan {
        let begin = start + Duration::from_millis(workload.warmup_ms);
        let end = begin + Duration::from_millis(workload.duration_ms);
        let producer_ends = workload
            .producers
            .iter()
            .map(|spec| {
                let stop = spec.stop_ms.unwrap_or(workload.duration_ms);
                begin + Duration::from_millis(stop.min(workload.duration_ms))
            })
            .collect();
        Plan {
            start,
            begin,
            end,
            finish: end + Duration::from_millis(workload.drain_ms),
            producer_ends,
        }
    }
}

/// Runs `workload` on `topology` with `seed` and reports what it measured.
///
/// # Errors
/// [`SimError::Workload`] if the workload is invalid or names nodes the topology does not have.
pub fn run(topology: &Topology, workload: &Workload, seed: u64) -> Result<SimReport, SimError> {
    workload.validate().map_err(SimError::Workload)?;
    if topology.roots().count() > 1 {
        return Err(SimError::Topology(
            "roots standing by are not simulated: give the simulator one root".into(),
        ));
    }
    let plan = Plan::new(Time::from_millis(1_000_000), workload);
    let mut sim = Sim::new(topology, workload, seed, plan.start);
    sim.load_end = plan.end;
    let (index, bound) = sim.add_nodes(topology, seed, workload);
    sim.add_clients(topology, workload, &index, plan.begin)?;
    sim.schedule_faults(workload, &index, seed, plan.begin)?;
    sim.schedule(plan.start + Duration::from_secs(1), Event::Report);
    if !workload.limits.is_empty() || !workload.topics.is_empty() {
        // Halfway through the warm-up: the clients' connections are open, and the leaves
        // have their allowances before the load starts.
        let at = plan.start + Duration::from_millis(workload.warmup_ms / 2);
        sim.schedule(at, Event::Configure);
    }
    sim.schedule(
        plan.begin + Duration::from_millis(workload.sample_ms),
        Event::Sample,
    );
    sim.run_events(&plan, workload);
    Ok(sim.report(seed, workload, bound, plan.begin))
}

impl Sim {
    /// A simulation with no node yet.
    fn new(topology: &Topology, workload: &Workload, seed: u64, start: Time) -> Sim {
        Sim {
            now: start,
            start,
            seq: 0,
            events: BTreeMap::new(),
            rng: Rng::new(seed),
            link: workload.link,
            disk: workload.disk,
            nodes: Vec::new(),
            roles: Vec::new(),
            armed: Vec::new(),
            lives: Vec::new(),
            up: Vec::new(),
            logs: Vec::new(),
            configs: Vec::new(),
            parents: Vec::new(),
            unconfirmed: std::collections::BTreeSet::new(),
            exposed: std::collections::HashSet::new(),
            crashes: 0,
            partition_specs: Vec::new(),
            cuts: Vec::new(),
            partitions: 0,
            partition_disconnects: 0,
            packets_lost: 0,
            disk_failures: 0,
            torn_records: 0,
            replication: workload.replication,
            groups: Vec::new(),
            election_timeout: Duration::from_millis(
                topology.root().settings.replica_election_timeout_ms,
            ),
            failovers: 0,
            corrupt_logs: 0,
            group_violations: 0,
            group_violation: None,
            idle_timeout: Duration::from_millis(topology.root().settings.link_idle_timeout_ms),
            root: 0,
            leaf_ids: topology.nodes.iter().map(|n| n.leaf_id).collect(),
            direct: topology
                .direct_leaves()
                .map(|leaf| topology.nodes.iter().position(|n| n.name == leaf.name))
                .map(|index| index.expect("a node of the topology"))
                .collect(),
            leases: HashMap::new(),
            lease_violations: 0,
            lease_violation: None,
            ends: HashMap::new(),
            last_arrival: HashMap::new(),
            next_conn: 1,
            next_request: 0,
            producers: Vec::new(),
            consumers: Vec::new(),
            pushes: HashMap::new(),
            truth: BTreeMap::new(),
            by_topic: BTreeMap::new(),
            load_end: Time::MAX,
            pushed: 0,
            push_errors: 0,
            rank_error: histogram(),
            inversion: histogram(),
            bubble_aggregator: histogram(),
            bubble_root: histogram(),
            pop_latency: histogram(),
            push_ack: histogram(),
            window_max: 0,
            processed: 0,
            series: Vec::new(),
            current: Sample::default(),
        }
    }

    /// Builds the nodes in topology order and links the tree (and the root's direct links).
    /// Returns each node's index by name, and the bound on entries held above the leaves.
    fn add_nodes(
        &mut self,
        topology: &Topology,
        seed: u64,
        workload: &Workload,
    ) -> (HashMap<String, usize>, u64) {
        let replication = workload.replication;
        let mut index = HashMap::new();
        let mut bound = 0u64;
        // Each topic's windows: one of a strict topic, one per tier of a weighted one and one
        // per fairness key and tier (its lanes); a strict topic's reserve-ahead buffer at the
        // root.
        let topics: std::collections::BTreeSet<&str> = workload
            .producers
            .iter()
            .map(|p| p.topic.as_deref().unwrap_or(&workload.topic))
            .collect();
        let (mut lanes, mut key_lanes, mut strict) = (0u64, 0u64, 0u64);
        for topic in topics {
            match workload.topics.get(topic).and_then(|t| t.weighted()) {
                Some(weights) => {
                    let tiers = weights.milli.len() as u64;
                    // Each fairness key may have a lane in every tier.
                    let keys: std::collections::BTreeSet<&str> = workload
                        .producers
                        .iter()
                        .filter(|p| p.topic.as_deref().unwrap_or(&workload.topic) == topic)
                        .filter_map(|p| p.fairness_key.as_deref())
                        .collect();
                    lanes += tiers;
                    key_lanes += tiers * keys.len() as u64;
                }
                None => (lanes, strict) = (lanes + 1, strict + 1),
            }
        }
        for (i, spec) in topology.nodes.iter().enumerate() {
            index.insert(spec.name.clone(), i);
            let subtree = topology.subtree_leaves(&spec.name);
            let mut settings = spec.settings.clone();
            let replicated = spec.role == Role::Leaf && replication.replicas > 1;
            if replicated {
                // As the product's replicated leaves: a lease is granted once logged.
                settings.lease_grants_wait_for_log = true;
            }
            if spec.role == Role::Root
                && replication.replicas > 1
                && settings.reserve_ahead_max == 0
            {
                // As the product's trees with replicated leaves (crest_core::topology), which
                // reserve ahead unless the topology sets otherwise; a simulated topology has no
                // groups to tell, so here it cannot turn it off.
                settings.reserve_ahead_max = crest_core::config::RESERVED_AHEAD_REPLICATED;
            }
            self.groups.push(replicated.then(|| {
                group::Group::new(
                    replication.replicas,
                    Duration::from_micros(replication.slow_follower_us),
                )
            }));
            let config = match spec.role {
                Role::Root => NodeConfig::Root(RootConfig {
                    name: spec.name.clone(),
                    settings: settings.clone(),
                    subtree,
                    standby: false,
                }),
                Role::Aggregator => NodeConfig::Aggregator(AggregatorConfig {
                    name: spec.name.clone(),
                    settings: settings.clone(),
                    subtree,
                }),
                Role::Leaf => NodeConfig::Leaf(LeafConfig {
                    name: spec.name.clone(),
                    id: spec.leaf_id.expect("validated: leaves have ids"),
                    settings: settings.clone(),
                    token_key: token_key_from_seed(seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9)),
                    first_seq: 1,
                }),
            };
            let machine = config.build();
            self.configs.push(config);
            self.lives.push(0);
            self.up.push(true);
            self.logs.push(Vec::new());
            if spec.role != Role::Leaf {
                let children = topology
                    .nodes
                    .iter()
                    .filter(|n| n.parent.as_deref() == Some(&spec.name))
                    .count() as u64;
                let ahead = match spec.role {
                    Role::Root => u64::from(settings.reserve_ahead_max) * strict,
                    _ => 0,
                };
                let per_key = settings.credits_per_key.min(settings.credits_per_topic);
                let windows = (u64::from(settings.credits_per_topic) * lanes
                    + u64::from(per_key) * key_lanes)
                    * children;
                bound = bound.max(windows + ahead);
            }
            self.nodes.push(machine);
            self.roles.push(spec.role);
            self.armed.push(None);
        }
        self.parents = topology
            .nodes
            .iter()
            .map(|n| n.parent.as_ref().map(|p| index[p]))
            .collect();
        for child in 0..self.nodes.len() {
            if let Some(parent) = self.parents[child] {
                self.link(child, parent);
            }
        }
        self.root = topology
            .nodes
            .iter()
            .position(|n| n.role == Role::Root)
            .expect("validated: one root");
        self.link_direct();
        (index, bound)
    }

    /// Connects the workload's producers to their leaves and its consumers to the root, and
    /// schedules their first turns.
    fn add_clients(
        &mut self,
        topology: &Topology,
        workload: &Workload,
        index: &HashMap<String, usize>,
        begin: Time,
    ) -> Result<(), SimError> {
        let leaves: Vec<usize> = topology
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.role == Role::Leaf)
            .map(|(i, _)| i)
            .collect();
        for (p, spec) in workload.producers.iter().enumerate() {
            let targets: Vec<usize> = match &spec.leaf {
                None => leaves.clone(),
                Some(name) => match index.get(name) {
                    Some(&i) if self.roles[i] == Role::Leaf => vec![i],
                    _ => {
                        return Err(SimError::Workload(format!(
                            "producer {p}: {name:?} is not a leaf of the topology"
                        )));
                    }
                },
            };
            let from = begin + Duration::from_millis(spec.start_ms);
            self.producers.push(ProducerState {
                spec: spec.clone(),
                targets: targets.clone(),
                ends: Vec::new(),
                next_end: p,
                owed: 0.0,
                last_tick: from,
                in_flight: HashMap::new(),
                topic: spec.topic.clone().unwrap_or_else(|| workload.topic.clone()),
            });
            for leaf in targets {
                self.connect_producer(p, leaf);
            }
            self.schedule(from, Event::Produce { producer: p });
        }
        for (c, spec) in workload.consumers.iter().enumerate() {
            self.consumers.push(ConsumerState {
                spec: spec.clone(),
                end: 0,
                pending: None,
                acks: HashMap::new(),
                topic: spec.topic.clone().unwrap_or_else(|| workload.topic.clone()),
            });
            self.connect_consumer(c, self.root);
            self.schedule(begin, Event::Consume { consumer: c });
        }
        Ok(())
    }

    /// Schedules the workload's scripted crashes and partitions, and those drawn from the seed.
    fn schedule_faults(
        &mut self,
        workload: &Workload,
        index: &HashMap<String, usize>,
        seed: u64,
        begin: Time,
    ) -> Result<(), SimError> {
        let mut crashes: Vec<(usize, u64, u64, Option<usize>, bool)> = Vec::new();
        for fault in &workload.faults {
            let Some(&node) = index.get(&fault.node) else {
                return Err(SimError::Workload(format!(
                    "fault: {:?} is not a node of the topology",
                    fault.node
                )));
            };
            crashes.push((
                node,
                fault.at_ms,
                fault.restart_after_ms,
                fault.replica.map(|r| r as usize),
                fault.corrupt,
            ));
        }
        let mut partitions: Vec<(Vec<usize>, u64, u64)> = Vec::new();
        for partition in &workload.partitions {
            let mut nodes = Vec::new();
            for name in &partition.nodes {
                let Some(&node) = index.get(name) else {
                    return Err(SimError::Workload(format!(
                        "partition: {name:?} is not a node of the topology"
                    )));
                };
                nodes.push(node);
            }
            partitions.push((nodes, partition.at_ms, partition.heal_after_ms));
        }
        // Faults drawn from the seed, from a generator of their own (the links' draws stay put).
        let random = workload.random_faults;
        let mut chaos = Rng::new(seed ^ 0x5eed_fa17_c0de_0001);
        let nodes = self.nodes.len() as u64;
        let draw = |chaos: &mut Rng| {
            let node = chaos.below(nodes) as usize;
            let at = chaos.below(workload.duration_ms);
            let lasts = 10 + chaos.below(random.down_ms_max.saturating_sub(9));
            (node, at, lasts)
        };
        for _ in 0..random.crashes {
            let (node, at, lasts) = draw(&mut chaos);
            crashes.push((node, at, lasts, None, false));
        }
        for _ in 0..random.partitions {
            let (node, at, lasts) = draw(&mut chaos);
            partitions.push((vec![node], at, lasts));
        }
        for (node, at_ms, down_ms, replica, corrupt) in crashes {
            self.schedule(
                begin + Duration::from_millis(at_ms),
                Event::Crash {
                    node,
                    restart_after: Duration::from_millis(down_ms),
                    replica,
                    corrupt,
                },
            );
        }
        for (index, (nodes, at_ms, lasts_ms)) in partitions.into_iter().enumerate() {
            self.partition_specs
                .push((nodes, Duration::from_millis(lasts_ms)));
            self.schedule(
                begin + Duration::from_millis(at_ms),
                Event::PartitionStart { index },
            );
        }
        Ok(())
    }

    /// Runs events in time order until the drain ends, or earlier once producers are done and
    /// everything acknowledged was delivered.
    fn run_events(&mut self, plan: &Plan, workload: &Workload) {
        while let Some(((at, _), event)) = self.events.pop_first() {
            if at > plan.finish {
                break;
            }
            self.now = self.now.max(at);
            self.processed += 1;
            if !self.handle(at, event, plan, workload) {
                continue;
            }
            if self.now >= plan.end
                && self.waiting_total() == 0
                && self.pushes.is_empty()
                && self.producers.iter().all(|p| p.in_flight.is_empty())
            {
                break;
            }
        }
    }

    /// One event, due at `at`; false if it was for an incarnation of a node that is gone.
    fn handle(&mut self, at: Time, event: Event, plan: &Plan, workload: &Workload) -> bool {
        match event {
            Event::Deliver { to, msg } => self.deliver(to, msg),
            Event::Timer { node, life } => {
                if life != self.lives[node] || !self.up[node] {
                    return false;
                }
                if self.armed[node] == Some(at) {
                    self.armed[node] = None;
                }
                if self.nodes[node]
                    .poll_timeout()
                    .is_some_and(|deadline| deadline <= self.now)
                {
                    let now = self.now;
                    self.nodes[node].handle_timeout(now);
                }
                self.drain(node);
            }
            Event::Stored { node, life, token } => {
                if life != self.lives[node] || !self.up[node] {
                    return false;
                }
                let now = self.now;
                self.nodes[node].handle_storage_done(now, StorageDone::new(token));
                self.drain(node);
            }
            Event::StoreFailed { node, life, token } => {
                if life != self.lives[node] || !self.up[node] {
                    return false;
                }
                let now = self.now;
                self.nodes[node].handle_storage_failed(now, token, "simulated disk failure");
                self.drain(node);
            }
            Event::Crash {
                node,
                restart_after,
                replica,
                corrupt,
            } => {
                if !self.group_crash(node, restart_after, replica, corrupt) {
                    self.crash(node);
                    let at = self.now + restart_after;
                    self.schedule(at, Event::Restart { node });
                }
            }
            Event::Restart { node } => self.restart(node, self.root),
            Event::Elected { node, election } => self.group_elected(node, election),
            Event::GroupCheck { node } => self.group_commit(node),
            Event::Depose { node, index } => self.group_cut_off(node, index),
            Event::ReplicaBack {
                node,
                replica,
                corrupt,
            } => self.replica_back(node, replica, corrupt),
            Event::Reack {
                consumer,
                receipts,
                tries,
            } => self.ack(consumer, receipts, tries),
            Event::PartitionStart { index } => self.partition_start(index),
            Event::PartitionTimeout { index } => self.partition_timeout(index),
            Event::PartitionHeal { index } => self.partition_heal(index),
            Event::Produce { producer } => {
                let until = plan.producer_ends[producer];
                if self.now < until {
                    self.produce(producer, until);
                }
            }
            Event::Consume { consumer } => {
                self.pop(consumer);
                let rate = self.consumers[consumer].spec.rate;
                if rate > 0.0 {
                    let every = Duration::from_secs_f64(1.0 / rate);
                    let next = self.now + every;
                    self.schedule(next, Event::Consume { consumer });
                }
            }
            Event::Report => {
                // Leaves first, then upward: each node reports what it knows.
                let now = self.now;
                let mut order: Vec<usize> = (0..self.nodes.len()).collect();
                order.sort_by_key(|&i| match self.roles[i] {
                    Role::Leaf => 0,
                    Role::Aggregator => 1,
                    Role::Root => 2,
                });
                for node in order {
                    if self.up[node] {
                        self.nodes[node].report_tick(now);
                        self.drain(node);
                    }
                }
                self.schedule(now + Duration::from_secs(1), Event::Report);
            }
            Event::Configure => {
                let end = self.consumers[0].end;
                // One configuration per scope: its topic settings and its limits.
                let mut configs: BTreeMap<String, crest_core::wire::TopicConfig> = workload
                    .topics
                    .iter()
                    .map(|(topic, settings)| {
                        let config = crest_core::wire::TopicConfig {
                            settings: settings.clone(),
                            ..crest_core::wire::TopicConfig::default()
                        };
                        (topic.clone(), config)
                    })
                    .collect();
                for limit in &workload.limits {
                    configs.entry(limit.scope.clone()).or_default().limits = limit.limits();
                }
                for (topic, config) in configs {
                    let op = crest_core::wire::AdminOp::Configure {
                        topic,
                        config: Box::new(config),
                    };
                    let request = self.request();
                    let admin = crest_core::wire::Admin { request, op };
                    self.send(end, Wire::Admin(admin));
                }
            }
            Event::Sample => {
                let mut sample = std::mem::take(&mut self.current);
                sample.at_ms = self.now.saturating_since(plan.begin).as_millis() as u64;
                sample.waiting = self.waiting_total();
                sample.window_entries = (0..self.nodes.len())
                    .filter(|&i| self.roles[i] != Role::Leaf)
                    .map(|i| self.nodes[i].stats().window_entries)
                    .sum();
                self.series.push(sample);
                let next = self.now + Duration::from_millis(workload.sample_ms);
                if next <= plan.finish {
                    self.schedule(next, Event::Sample);
                }
            }
        }
        true
    }

    /// What the run measured.
    fn report(self, seed: u64, workload: &Workload, bound: u64, begin: Time) -> SimReport {
        let waiting = self.waiting_total();
        let truths = self.truth.values();
        let delivered = truths.clone().map(|t| t.delivered.len() as u64).sum();
        let duplicates = truths.clone().map(|t| t.duplicates).sum();
        let unexpected_duplicates = truths
            .flat_map(|t| &t.duplicate_ids)
            .filter(|id| !self.exposed.contains(id))
            .count() as u64;
        let seconds = |d: Duration| d.as_secs_f64().max(1e-9);
        SimReport {
            seed,
            nodes: self.nodes.len(),
            duration_ms: workload.duration_ms,
            simulated_ms: self.now.saturating_since(self.start).as_millis() as u64,
            pushed: self.pushed,
            delivered,
            duplicates,
            undelivered: waiting,
            push_errors: self.push_errors,
            push_rate: self.pushed as f64 / seconds(Duration::from_millis(workload.duration_ms)),
            delivery_rate: delivered as f64 / seconds(self.now.saturating_since(begin)),
            rank_error: Percentiles::of(&self.rank_error),
            inversion_time_us: Percentiles::of(&self.inversion),
            bubble_up_to_aggregator_us: Percentiles::of(&self.bubble_aggregator),
            bubble_up_to_root_us: Percentiles::of(&self.bubble_root),
            pop_latency_us: Percentiles::of(&self.pop_latency),
            push_ack_us: Percentiles::of(&self.push_ack),
            window_entries_max: self.window_max,
            window_entries_bound: bound,
            crashes: self.crashes,
            partitions: self.partitions,
            partition_disconnects: self.partition_disconnects,
            packets_lost: self.packets_lost,
            disk_failures: self.disk_failures,
            torn_records: self.torn_records,
            failovers: self.failovers,
            corrupt_logs: self.corrupt_logs,
            group_violations: self.group_violations,
            group_violation: self.group_violation,
            lease_violations: self.lease_violations,
            lease_violation: self.lease_violation,
            unexpected_duplicates,
            events: self.processed,
            topics: self
                .by_topic
                .iter()
                .map(|(topic, tally)| (topic.clone(), tally.report()))
                .collect(),
            series: self.series,
            by_priority: !workload.topics.is_empty(),
        }
    }
}
