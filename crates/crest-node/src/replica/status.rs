//! What a replica reports of itself: kept apart from the replica's running parts so that the
//! HTTP endpoints and the exporter that show it need nothing else of them.

/// Where a replica stands in its group (its `/healthz` and `/metrics` say it, and `crest
/// status` gathers it from every replica).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplicaStatus {
    /// Its node name.
    pub name: String,
    /// The group's name: the leaf's name in the tree.
    pub group: String,
    /// Its number in the group.
    pub number: u64,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`, as its Raft says.
    pub state: String,
    /// The group's term as it knows it.
    pub term: u64,
    /// The leader it knows of (a member number).
    pub leader: Option<u64>,
    /// The term it serves the leaf in, if it does.
    pub serving: Option<u64>,
    /// The index of the last entry it applied to its log.
    pub applied: Option<u64>,
    /// The index of the last entry in its Raft log.
    pub last_log: Option<u64>,
    /// On the leader: how far behind each follower is.
    pub followers: Vec<FollowerLag>,
    /// Pre-vote rounds it ran since it started: times it heard no leader for an election
    /// timeout and asked the others whether they would elect it.
    #[serde(default)]
    pub pre_votes: u64,
    /// Of those, the rounds a majority granted (it then stood for election).
    #[serde(default)]
    pub pre_votes_granted: u64,
}

/// How far behind its leader a follower is, as the leader sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FollowerLag {
    /// The follower's number.
    pub number: u64,
    /// Its node name.
    pub name: String,
    /// The last entry the leader knows it holds.
    pub matched: Option<u64>,
    /// Entries of the leader's log it does not hold yet.
    pub lag_entries: u64,
    /// Their bytes, if within the leader's `replica_lag_window_entries`.
    pub lag_bytes: Option<u64>,
}
