use super::*;
use crest_core::metrics::NodeReport;
use crest_core::quota::{Amount, Limits, Rate, Refused};
use crest_core::time::Time;
use crest_core::wire::{Stats, TopicStats};

fn limited(scope: &str, over_quota: u64, rate_limited: u64) -> ScopeStats {
    ScopeStats {
        scope: scope.into(),
        limits: Limits {
            messages_max: Some(100),
            push_rate: Some(Rate {
                per_second: 10,
                burst: 20,
            }),
            ..Limits::default()
        },
        used: Amount::default(),
        bound: Amount::default(),
        pushed: Amount {
            messages: 40,
            bytes: 400,
        },
        pushed_per_second: Amount::default(),
        refused: Refused {
            over_quota,
            rate_limited,
            ..Refused::default()
        },
        popped: 0,
        popped_per_second: 0,
        in_flight: 0,
        topics: 0,
    }
}

/// Principal `name`'s pop rate of 50/s, with `popped` delivered and 2 pops refused.
fn principal(name: &str, popped: u64) -> ScopeStats {
    let limits = Limits {
        pop_rate: Some(Rate {
            per_second: 50,
            burst: 50,
        }),
        ..Limits::default()
    };
    ScopeStats {
        limits,
        popped,
        refused: Refused {
            pops_rate_limited: 2,
            ..Refused::default()
        },
        ..limited(&format!("@{name}"), 0, 0)
    }
}

fn root_scrape() -> Scrape {
    let node = |name: &str, role: &str, pushed: u64| NodeReport {
        name: name.into(),
        role: role.into(),
        connected: true,
        counters: [("pushed".to_string(), pushed)].into(),
        gauges: [("messages".to_string(), 3)].into(),
        ..NodeReport::default()
    };
    let report = Report {
        nodes: vec![node("root", "root", 5), node("le\"af\\2", "leaf", 7)],
        totals: [
            (Metric::Pop, Hist(vec![(300, 2), (2_000, 1)])),
            (Metric::PopBatch, Hist(vec![(1, 4), (3, 1)])),
        ]
        .into(),
        stats: Stats {
            topics: vec![
                TopicStats {
                    topic: "jobs".into(),
                    ready: vec![(0, 4), (9, 1)],
                    oldest_enqueued_at: Some(Time(1_000_000)),
                    oldest_ready: vec![(0, Time(2_500_000)), (9, Time(1_000_000))],
                    ..TopicStats::default()
                },
                TopicStats {
                    topic: "orders/eu".into(),
                    ready: vec![(0, 2)],
                    in_flight: 1,
                    bytes: 30,
                    ..TopicStats::default()
                },
                TopicStats {
                    topic: "orders/us".into(),
                    delayed: 4,
                    bytes: 40,
                    ..TopicStats::default()
                },
            ],
            limits: vec![
                limited("orders/", 3, 1),
                limited("jobs", 0, 0),
                principal("alice", 9),
            ],
            dead_lettered: 6,
            ..Stats::default()
        },
        consumer_lag: vec![LagSeries {
            topic: "jobs".into(),
            priority: 9,
            buckets: {
                let mut b = [0; LAG_BOUNDS_MS.len() + 1];
                b[0] = 2;
                b[4] = 1;
                b
            },
            sum_micros: 1_500_000,
            count: 3,
        }],
        ..Report::default()
    };
    Scrape {
        node: "root".into(),
        role: "root".into(),
        report: Some(report),
        now_micros: 3_000_000,
        process: ProcessUse {
            cpu_seconds: Some(3.25),
            resident_bytes: Some(8 << 20),
            id: 4242,
            start_seconds: Some(1_700_000_000.5),
        },
        ..Scrape::default()
    }
}

#[test]
fn a_scrape_is_encoded_under_prometheus_names_with_labels_escaped() {
    let text = render(root_scrape(), false);
    for line in [
        "crest_namespace_messages_max{namespace=\"orders\"} 100\n",
        "crest_namespace_push_rate_max{namespace=\"orders\"} 10\n",
        "crest_namespace_pushed_messages_total{namespace=\"orders\"} 40\n",
        "crest_namespace_refused_messages_total{namespace=\"orders\",reason=\"over_quota\"} 3\n",
        "crest_namespace_refused_messages_total{namespace=\"orders\",reason=\"rate_limited\"} 1\n",
        "crest_topic_messages_max{topic=\"jobs\"} 100\n",
        "crest_principal_pop_rate_max{principal=\"alice\"} 50\n",
        "crest_principal_popped_messages_total{principal=\"alice\"} 9\n",
        "crest_principal_refused_pops_total{principal=\"alice\",reason=\"rate_limited\"} 2\n",
        "crest_principal_refused_pops_total{principal=\"alice\",reason=\"over_in_flight\"} 0\n",
        // The root's own counter; another node's is its own to serve.
        "# TYPE crest_pushed_total counter\ncrest_pushed_total{node=\"root\",role=\"root\"} 5\n",
        "crest_node_connected{node=\"le\\\"af\\\\2\",role=\"leaf\"} 1\n",
        "crest_pop_seconds_bucket{le=\"0.00025\",node=\"root\",role=\"root\"} 0\n",
        "crest_pop_seconds_bucket{le=\"0.0005\",node=\"root\",role=\"root\"} 2\n",
        "crest_pop_seconds_bucket{le=\"+Inf\",node=\"root\",role=\"root\"} 3\n",
        "crest_pop_seconds_count{node=\"root\",role=\"root\"} 3\n",
        "crest_pop_batch_messages_bucket{le=\"2.0\",node=\"root\",role=\"root\"} 4\n",
        "crest_pop_batch_messages_bucket{le=\"4.0\",node=\"root\",role=\"root\"} 5\n",
        "crest_topic_ready{topic=\"jobs\",priority=\"9\"} 1\n",
        "crest_topic_oldest_age_seconds{topic=\"jobs\"} 2.0\n",
        "crest_topic_oldest_ready_age_seconds{topic=\"jobs\",priority=\"0\"} 0.5\n",
        "crest_topic_oldest_ready_age_seconds{topic=\"jobs\",priority=\"9\"} 2.0\n",
        "crest_namespace_messages{namespace=\"orders\"} 7\n",
        "crest_namespace_bytes{namespace=\"orders\"} 70\n",
        "crest_namespace_messages{namespace=\"default\"} 5\n",
        "crest_messages_dead_lettered_total 6\n",
        "crest_consumer_lag_seconds_bucket{le=\"0.001\",topic=\"jobs\",priority=\"9\"} 2\n",
        "crest_consumer_lag_seconds_bucket{le=\"0.5\",topic=\"jobs\",priority=\"9\"} 2\n",
        "crest_consumer_lag_seconds_bucket{le=\"1.0\",topic=\"jobs\",priority=\"9\"} 3\n",
        "crest_consumer_lag_seconds_count{topic=\"jobs\",priority=\"9\"} 3\n",
        "crest_consumer_lag_seconds_sum{topic=\"jobs\",priority=\"9\"} 1.5\n",
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.25\n",
        "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 8388608\n",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    assert!(
        !text.contains("node=\"le\\\"af\\\\2\",role=\"leaf\"} 7"),
        "{text}"
    );
    assert!(!text.contains("crest_namespace_bytes_max"), "no such limit");
    let build = format!(
        "crest_build_info{{node=\"root\",role=\"root\",version=\"{}\",protocol=\"{}\"}} 1\n",
        env!("CARGO_PKG_VERSION"),
        crest_core::wire::PROTOCOL_VERSION
    );
    assert!(text.contains(&build), "{build} in {text}");
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{text}"
    );
    // Each family's TYPE line appears once, and its samples follow it.
    let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
    let mut unique = types.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(types.len(), unique.len());
}

#[test]
fn openmetrics_names_counters_without_total_and_ends_with_eof() {
    let text = render(root_scrape(), true);
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(
        text.contains(
            "# TYPE crest_pushed counter\ncrest_pushed_total{node=\"root\",role=\"root\"} 5\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("# UNIT crest_pop_seconds seconds\n"),
        "{text}"
    );
    assert_eq!(classic(&text), render(root_scrape(), false));
}

#[test]
fn a_leaf_serves_its_own_series_and_no_tree_wide_ones() {
    let mut scrape = root_scrape();
    scrape.node = "leaf-1".into();
    scrape.role = "leaf".into();
    scrape.disk = Some(DiskUse {
        used_bytes: 10,
        free_bytes: 20,
        size_bytes: 30,
    });
    let text = render(scrape, false);
    assert!(!text.contains("crest_topic_"), "{text}");
    assert!(!text.contains("crest_node_connected"), "{text}");
    assert!(text.contains("crest_parent_connected{node=\"leaf-1\",role=\"leaf\"} 1\n"));
    assert!(text.contains("crest_log_disk_free_bytes{node=\"leaf-1\",role=\"leaf\"} 20\n"));
}

#[test]
fn a_histogram_s_values_fall_in_the_buckets_their_scaled_values_fit() {
    let hist = Hist(vec![(100, 1), (101, 2), (30_000_001, 4)]);
    let sample = HistogramSample::of(&hist, &SECONDS_BOUNDS, 1e-6);
    assert_eq!(sample.count, 7);
    assert_eq!(sample.buckets[0], (0.0001, 1));
    assert_eq!(sample.buckets[1], (0.00025, 2));
    assert_eq!(sample.buckets.last(), Some(&(f64::MAX, 4)));
    assert_eq!(sample.buckets.iter().map(|(_, n)| n).sum::<u64>(), 7);
    assert!((sample.sum - 120.000306).abs() < 1e-9, "{}", sample.sum);
}

#[test]
fn the_process_use_is_read_from_proc() {
    let status = "Name:\tcrest\nVmHWM:\t  9000 kB\nVmRSS:\t  8192 kB\nThreads:\t9\n";
    assert_eq!(resident_bytes(status), Some(8 << 20));
    assert_eq!(resident_bytes("Name:\tcrest\n"), None);
    let own = ProcessUse::read();
    assert!(own.cpu_seconds.is_some_and(|s| s > 0.0), "{own:?}");
    assert!(own.resident_bytes.is_some_and(|b| b > 0), "{own:?}");
    assert_eq!(own.id, std::process::id());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        own.start_seconds
            .is_some_and(|s| s <= now + 1.0 && s > now - 3600.0),
        "{own:?} at {now}"
    );
    // A command with spaces and parentheses in it; field 22 is the start, in ticks.
    let stat = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 250 20";
    assert_eq!(started_at(stat, "cpu 1 2\nbtime 1000\n", 100), Some(1002.5));
    assert_eq!(started_at(stat, "cpu 1 2\n", 100), None);
}

#[test]
fn a_directory_s_disk_use_counts_its_files_and_its_subdirectories() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), [0_u8; 100]).unwrap();
    std::fs::create_dir(dir.path().join("log")).unwrap();
    std::fs::write(dir.path().join("log").join("b"), [0_u8; 50]).unwrap();
    let used = DiskUse::read(dir.path()).unwrap();
    assert_eq!(used.used_bytes, 150);
    assert!(
        used.size_bytes >= used.free_bytes && used.free_bytes > 0,
        "{used:?}"
    );
    assert_eq!(DiskUse::read(&dir.path().join("none")), None);
}
