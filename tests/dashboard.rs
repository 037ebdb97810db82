//! HTTP on every node and the dashboard, on the default tree over real sockets: `/metrics`
//! parses as Prometheus text, `/stats` depths match what was pushed and popped, `/healthz`
//! answers on every node, and headless Chromium renders the dashboard's histograms with data
//! (a screenshot is saved under `target/test-artifacts/`).

use crest::core::topology::Topology;
use crest::node::LocalTree;
use crest::sdk::{ClientTls, Consumer, ConsumerConfig, Message, Producer, ProducerConfig};
use crest_testkit::eventually;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

#[path = "common/browser.rs"]
mod browser;

use browser::{chromium, headless};

/// A plain HTTP/1.1 GET: (status, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8(response).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
}

async fn tree() -> LocalTree {
    tree_in(None).await
}

/// The default tree; with `data`, durable leaves logging under it.
async fn tree_in(data: Option<&std::path::Path>) -> LocalTree {
    let topology = Topology::parse(crest::DEFAULT_TOPOLOGY)
        .unwrap()
        .with_ephemeral_ports();
    let tree = LocalTree::start_with(&topology, data).await.unwrap();
    assert!(tree.wait_connected(Duration::from_secs(10)).await);
    tree
}

fn http(tree: &LocalTree, name: &str) -> SocketAddr {
    tree.node(name).unwrap().http_addr().expect("http address")
}

/// A strict reading of the Prometheus text format: every sample belongs to a family declared
/// by one `# TYPE` line before it, values are numbers, histogram buckets are cumulative and
/// end with `+Inf` = `_count`. Returns (family → type, samples as (name with labels, value)).
fn parse_prometheus(text: &str) -> (BTreeMap<String, String>, Vec<(String, f64)>) {
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    let mut buckets: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut counts: BTreeMap<String, f64> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert!(
                types.insert(family.to_string(), kind.to_string()).is_none(),
                "family {family} declared twice"
            );
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample: series value");
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("value in {line}"));
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{line}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
            }
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                name.strip_suffix(suffix)
                    .filter(|base| types.get(*base).is_some_and(|k| k == "histogram"))
            })
            .unwrap_or(name);
        assert!(types.contains_key(family), "sample before its TYPE: {line}");
        // A histogram series: its name and labels but `le`.
        let series_of = |labels: &str| {
            let kept: Vec<&str> = labels
                .trim_matches(['{', '}'])
                .split(',')
                .filter(|l| !l.starts_with("le=") && !l.is_empty())
                .collect();
            format!("{family}{{{}}}", kept.join(","))
        };
        let labels = series.strip_prefix(name).unwrap_or_default();
        if name.ends_with("_bucket") {
            buckets.entry(series_of(labels)).or_default().push(value);
        }
        if name.ends_with("_count") && types.get(family).is_some_and(|k| k == "histogram") {
            counts.insert(series_of(labels), value);
        }
        samples.push((series.to_string(), value));
    }
    for (series, count) in &counts {
        let cumulative = &buckets[series];
        assert!(
            cumulative.windows(2).all(|w| w[0] <= w[1]),
            "{series} buckets"
        );
        assert_eq!(cumulative.last(), Some(count), "{series}: +Inf = count");
    }
    assert_eq!(counts.len(), buckets.len(), "every histogram has its count");
    (types, samples)
}

fn sum_of(samples: &[(String, f64)], prefix: &str) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| series.starts_with(prefix))
        .map(|(_, value)| value)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_stats_and_health_over_http_match_what_was_pushed_and_popped() {
    let tree = tree().await;
    let tls = ClientTls::new(tree.ca_pem.clone()).with_token(tree.admin_token.clone());
    let producer = Producer::connect(ProducerConfig::from_topology(&tree.topology, tls.clone()))
        .await
        .unwrap();
    for i in 0..40u32 {
        producer
            .push("jobs", i % 5, format!("m{i}").into_bytes())
            .await
            .unwrap();
    }
    let consumer = Consumer::connect(ConsumerConfig::from_topology(&tree.topology, tls))
        .await
        .unwrap();
    let mut popped = Vec::new();
    while popped.len() < 15 {
        popped.extend(
            consumer
                .pop("jobs", 15 - popped.len() as u32, Duration::from_secs(1))
                .await
                .unwrap(),
        );
    }
    let receipts: Vec<_> = popped[..5].iter().map(|d| d.receipt()).collect();
    assert!(
        consumer
            .ack_many(&receipts)
            .await
            .unwrap()
            .iter()
            .all(Result::is_ok)
    );

    // Reports climb a level per interval (1 s): wait until the root's view is complete.
    let root = http(&tree, "root");
    let stats = eventually(
        Duration::from_secs(15),
        "the root to see the whole tree",
        async || {
            let (status, body) = get(root, "/stats").await;
            assert_eq!(status, 200, "{body}");
            let stats: Value = serde_json::from_str(&body).unwrap();
            let jobs = stats["stats"]["topics"]
                .as_array()
                .and_then(|topics| topics.iter().find(|t| t["topic"] == "jobs").cloned());
            let ready: u64 = jobs
                .as_ref()
                .map(|t| {
                    t["ready"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|r| r[1].as_u64().unwrap())
                        .sum()
                })
                .unwrap_or(0);
            let in_flight = jobs
                .as_ref()
                .map_or(0, |t| t["in_flight"].as_u64().unwrap());
            let acked: u64 = stats["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|n| n["counters"]["acked"].as_u64())
                .sum();
            if stats["nodes"].as_array().unwrap().len() == 7
                && (ready, in_flight, acked) == (25, 10, 5)
            {
                Ok(stats)
            } else {
                Err(stats.to_string())
            }
        },
    )
    .await;
    let names: HashSet<&str> = stats["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    let expected: HashSet<&str> = tree.nodes.iter().map(|n| n.name()).collect();
    assert_eq!(names, expected);
    assert!(
        stats["histograms"]["BubbleToRoot"]
            .as_array()
            .is_some_and(|h| !h.is_empty())
    );
    assert!(
        stats["histograms"]["BubbleToAggregator"]
            .as_array()
            .is_some_and(|h| !h.is_empty())
    );

    let (status, text) = get(root, "/metrics").await;
    assert_eq!(status, 200);
    let (types, samples) = parse_prometheus(&text);
    assert_eq!(types["crest_deliveries_total"], "counter");
    assert_eq!(types["crest_bubble_up_to_root_seconds"], "histogram");
    // Every node serves every histogram of its own, empty ones too: the root syncs no log.
    assert_eq!(types["crest_log_sync_seconds"], "histogram");
    assert_eq!(sum_of(&samples, "crest_log_sync_seconds_count"), 0.0);
    // Each node serves its own counters: the root pushes nothing.
    assert_eq!(sum_of(&samples, "crest_pushed_total{"), 0.0);
    assert_eq!(sum_of(&samples, "crest_deliveries_total{"), 15.0);
    assert_eq!(
        sum_of(&samples, "crest_consumer_lag_seconds_count{topic=\"jobs\""),
        15.0
    );
    assert_eq!(sum_of(&samples, "crest_topic_ready{topic=\"jobs\""), 25.0);
    assert_eq!(
        sum_of(&samples, "crest_topic_in_flight{topic=\"jobs\"}"),
        10.0
    );
    assert!(sum_of(&samples, "crest_bubble_up_to_root_seconds_count") >= 15.0);
    assert_eq!(sum_of(&samples, "crest_protocol_violations_total{"), 0.0);
    assert_eq!(sum_of(&samples, "crest_direct_links{"), 4.0);
    // The root's own QUIC links: one to each leaf for the pop path, and the aggregators' and
    // the consumer's coming in.
    assert_eq!(types["crest_quic_links"], "gauge");
    assert_eq!(
        sum_of(&samples, "crest_quic_links{node=\"root\",kind=\"leaf\"}"),
        4.0
    );
    assert!(
        sum_of(
            &samples,
            "crest_quic_links{node=\"root\",kind=\"incoming\"}"
        ) >= 3.0
    );
    assert!(sum_of(&samples, "crest_quic_sent_packets{") > 0.0);
    assert!(sum_of(&samples, "crest_quic_rtt_max_seconds{") > 0.0);
    // The process the tree runs in: it has worked and holds memory.
    assert_eq!(types["process_cpu_seconds_total"], "counter");
    assert!(
        sum_of(&samples, "process_cpu_seconds_total") > 0.0,
        "{text}"
    );
    assert_eq!(types["process_resident_memory_bytes"], "gauge");
    assert!(
        sum_of(&samples, "process_resident_memory_bytes") > 1e6,
        "{text}"
    );
    let listed = stats["links"]["listed"].as_array().unwrap();
    let to_leaves: Vec<&Value> = listed.iter().filter(|l| l["kind"] == "leaf").collect();
    assert_eq!(to_leaves.len(), 4, "{listed:?}");
    for link in to_leaves {
        assert!(link["rtt_us"].as_u64().unwrap() > 0, "{link}");
        assert!(link["mtu_bytes"].as_u64().unwrap() >= 1200, "{link}");
        assert!(link["cwnd_bytes"].as_u64().unwrap() > 0, "{link}");
        assert!(link["sent_packets"].as_u64().unwrap() > 0, "{link}");
    }
    assert_eq!(stats["links"]["omitted"], 0);

    // Every node answers on its own; a leaf's subtree is itself; the leaves pushed.
    let mut pushed = 0.0;
    for node in &tree.nodes {
        let addr = node.http_addr().unwrap();
        let (status, body) = get(addr, "/healthz").await;
        assert_eq!(status, 200, "{body}");
        let health: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(health["status"], "ok");
        assert_eq!(health["node"], node.name());
        let (status, text) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        let (_, samples) = parse_prometheus(&text);
        pushed += sum_of(&samples, "crest_pushed_total{");
        // Tree-wide series come from the root alone.
        if node.role().to_string() != "root" {
            assert_eq!(sum_of(&samples, "crest_topic_"), 0.0, "{text}");
            assert!(!text.contains("crest_topic_ready{"), "{text}");
        }
    }
    assert_eq!(pushed, 40.0);
    let (_, leaf) = get(http(&tree, "leaf-1"), "/stats").await;
    let leaf: Value = serde_json::from_str(&leaf).unwrap();
    assert_eq!(leaf["nodes"].as_array().unwrap().len(), 1);
    let kinds: Vec<&str> = leaf["links"]["listed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "parent").count(),
        1,
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&"incoming"),
        "the root's direct link: {kinds:?}"
    );
    let (status, page) = get(root, "/").await;
    assert_eq!(status, 200);
    assert!(page.contains("<canvas id=\"bubble\""));
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "self-contained page"
    );
    let (status, _) = get(root, "/nope").await;
    assert_eq!(status, 404);
    tree.shutdown().await;
}

/// The `data-NAME="…"` attribute of the element with `id`, in a dumped DOM.
fn attribute(dom: &str, id: &str, name: &str) -> String {
    let start = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("#{id}"));
    let tag_end = start + dom[start..].find('>').unwrap();
    let tag = &dom[start..tag_end];
    let key = format!("data-{name}=\"");
    let at = tag
        .find(&key)
        .unwrap_or_else(|| panic!("#{id} {name}: {tag}"))
        + key.len();
    tag[at..at + tag[at..].find('"').unwrap()].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_renders_bubble_up_histograms_with_data_in_headless_chromium() {
    let Some(browser) = chromium() else {
        panic!(
            "headless Chromium is needed (Debian: apt-get install chromium); .ci/run installs it"
        );
    };
    // Durable leaves, so the page has the leaves' log syncs to draw too.
    let data = tempfile::tempdir().unwrap();
    let tree = tree_in(Some(data.path())).await;
    // A quota and a push rate the load stays under: the page shows usage against them.
    let admin = crest::sdk::Admin::connect(ConsumerConfig::from_topology(
        &tree.topology,
        common::tls(&tree),
    ))
    .await
    .unwrap();
    let limits = crest::sdk::Limits {
        messages_max: Some(1_000_000),
        push_rate: Some(crest::sdk::Rate {
            per_second: 100_000,
            burst: 100_000,
        }),
        ..crest::sdk::Limits::default()
    };
    let scope = format!("{}/", crest::sdk::namespace("jobs"));
    let config = crest::sdk::TopicConfig {
        limits,
        ..crest::sdk::TopicConfig::default()
    };
    admin.configure(&scope, config).await.unwrap();
    // Load: a producer and a consumer running while the page is open.
    let (producer, consumer) = common::clients(&tree).await;
    let load = tokio::spawn(async move {
        let mut i = 0u32;
        loop {
            let mut handles = Vec::new();
            for _ in 0..50 {
                i += 1;
                let message = Message::new("jobs", format!("m{i}").into_bytes()).priority(i % 10);
                handles.push(producer.send(message).await.unwrap());
            }
            for handle in handles {
                handle.acked().await.unwrap();
            }
            let got = consumer.pop("jobs", 30, Duration::ZERO).await.unwrap();
            let receipts: Vec<_> = got.iter().map(|d| d.receipt()).collect();
            consumer.ack_many(&receipts).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    // Reports climb a level per interval: wait until the root holds every node and every
    // level's histograms, which is what the page draws.
    let root = http(&tree, "root");
    let what = "the root to hold every level's histograms";
    eventually(Duration::from_secs(20), what, async || {
        let (status, body) = get(root, "/stats").await;
        assert_eq!(status, 200, "{body}");
        let stats: Value = serde_json::from_str(&body).unwrap();
        let has = |metric: &str| {
            stats["histograms"][metric]
                .as_array()
                .is_some_and(|h| !h.is_empty())
        };
        let levels = [
            "BubbleToAggregator",
            "HopToRoot",
            "BubbleToRoot",
            "PushAck",
            "Pop",
        ];
        let limited = &stats["stats"]["limits"][0];
        let metered = limited["scope"] == scope.as_str()
            && limited["pushed"]["messages"].as_u64() > Some(0)
            && limited["pushed_per_second"]["messages"].as_u64() > Some(0);
        if stats["nodes"].as_array().is_some_and(|n| n.len() == 7)
            && levels.iter().all(|m| has(m))
            && metered
        {
            Ok(())
        } else {
            Err(stats.to_string())
        }
    })
    .await;
    let url = format!("http://{root}/");
    let profile = tempfile::tempdir().unwrap();
    let mut dump = headless(&browser, profile.path());
    dump.arg("--dump-dom").arg(&url);
    let output = tokio::task::spawn_blocking(move || dump.output())
        .await
        .unwrap()
        .unwrap();
    let dom = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let refreshes: u32 = attribute(&dom, "bubble", "points").parse().unwrap_or(0);
    assert!(refreshes > 0, "bubble-up plot has no points:\n{dom}");
    let series = attribute(&dom, "bubble", "series");
    assert!(
        series.contains("bubble_up_to_aggregator")
            && series.contains("hop_to_root")
            && series.contains("bubble_up_to_root"),
        "every level plotted: {series}"
    );
    let per_node = attribute(&dom, "bubble-nodes", "series");
    for node in ["root", "agg-1", "agg-2"] {
        assert!(
            per_node.split(',').any(|s| s == node),
            "{node} plotted: {per_node}"
        );
    }
    let client = attribute(&dom, "client", "series");
    assert!(
        client.contains("push_ack") && client.contains("pop") && client.contains("log_sync"),
        "{client}"
    );
    assert!(
        dom.contains("leaf-4") && dom.contains("agg-2"),
        "the tree and node table"
    );
    assert!(
        dom.contains("direct links to 4 leaves"),
        "the root's direct pop path in the tree"
    );
    let limits_row = dom
        .find(&format!("<td>{scope}</td>"))
        .map(|at| &dom[at..at + dom[at..].find("</tr>").unwrap()])
        .unwrap_or_else(|| panic!("the quota's row:\n{dom}"));
    assert!(limits_row.contains(" / 1000000<"), "{limits_row}");
    assert!(limits_row.contains(" / 100000<"), "{limits_row}");
    // At 1,400 px the quotas table scrolls within its card rather than running out of it.
    assert_eq!(attribute(&dom, "quotas", "overflows"), "false");
    let (_, metrics) = get(root, "/metrics").await;
    let namespace = crest::sdk::namespace("jobs");
    for line in [
        format!("crest_namespace_messages_max{{namespace=\"{namespace}\"}} 1000000\n"),
        format!("crest_namespace_push_rate_max{{namespace=\"{namespace}\"}} 100000\n"),
    ] {
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }

    let artifacts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let screenshot = artifacts.join("dashboard.png");
    let _ = std::fs::remove_file(&screenshot);
    let profile = tempfile::tempdir().unwrap();
    let mut shot = headless(&browser, profile.path());
    shot.arg(format!("--screenshot={}", screenshot.display()))
        .arg(&url);
    let output = tokio::task::spawn_blocking(move || shot.output())
        .await
        .unwrap()
        .unwrap();
    assert!(output.status.success());
    let size = std::fs::metadata(&screenshot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 10_000, "screenshot of {size} bytes");
    println!("screenshot: {}", screenshot.display());
    load.abort();
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_s_strings_are_shown_as_text_on_the_dashboard() {
    // Goal: whatever a child reports is text on the page, never markup (a node's role
    // carried a stored cross-site script). Method: a peer with agg-2's certificate takes
    // agg-2's place at the root and reports a node whose name and role are markup; the page,
    // rendered by headless Chromium, shows them as text and runs nothing.
    use crest::core::LeafId;
    use crest::core::frame::encode_frame;
    use crest::core::metrics::{NodeReport, Report};
    use crest::core::wire::{Hello, PROTOCOL_VERSION, PeerKind, Role, Wire};
    let Some(browser) = chromium() else {
        panic!("headless Chromium is needed (Debian: apt-get install chromium)");
    };
    let mut tree = tree_in(None).await;
    // The real agg-2 would take its place back at once.
    tree.stop_node("agg-2").await;
    let settings = crest::core::config::Settings::default();
    let identity = tree
        .ca()
        .issue("agg-2", &[], Duration::from_secs(3600))
        .unwrap();
    let client = crest::transport::link_client_config(&tree.ca_pem, &identity, &settings).unwrap();
    let addr: SocketAddr = tree.topology.root().address.parse().unwrap();
    let endpoint = crest::transport::client_endpoint(addr, client, &settings).unwrap();
    let connection = crest::transport::connect(&endpoint, addr, "root")
        .await
        .unwrap();
    let streams = crest::transport::stream::open_streams(&connection)
        .await
        .unwrap();
    let (mut control, answers) = streams.control;
    let (mut data, _) = streams.data;
    let markup = "<img src=x onerror=\"document.title='pwned'\">";
    let report = Report {
        nodes: vec![NodeReport {
            name: "agg-2".into(),
            role: markup.into(),
            connected: true,
            ..NodeReport::default()
        }],
        ..Report::default()
    };
    let frame = |msg: &Wire| {
        let mut bytes = Vec::new();
        encode_frame(msg, settings.frame_bytes_max, &mut bytes).unwrap();
        bytes
    };
    let hello = Wire::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        token: None,
        peer: PeerKind::Node {
            name: "agg-2".into(),
            role: Role::Aggregator,
            leaves: vec![LeafId(3), LeafId(4)],
            replica: None,
        },
    });
    control.write_all(&frame(&hello)).await.unwrap();
    let mut answers = crest::transport::stream::FrameReader::new(answers, settings.frame_bytes_max);
    let welcome = tokio::time::timeout(Duration::from_secs(10), answers.next()).await;
    assert!(
        matches!(
            welcome,
            Ok(Ok(Some(crest::transport::stream::ReadEvent::Frame(
                Wire::Welcome(_)
            ))))
        ),
        "{welcome:?}"
    );
    data.write_all(&frame(&Wire::Report(report))).await.unwrap();
    let root = http(&tree, "root");
    eventually(
        Duration::from_secs(10),
        "the report to arrive",
        async || {
            let (_, body) = get(root, "/stats").await;
            if body.contains("onerror") {
                Ok(())
            } else {
                Err(body)
            }
        },
    )
    .await;
    let profile = tempfile::tempdir().unwrap();
    let mut dump = headless(&browser, profile.path());
    dump.arg("--dump-dom").arg(format!("http://{root}/"));
    let output = tokio::task::spawn_blocking(move || dump.output())
        .await
        .unwrap()
        .unwrap();
    assert!(output.status.success());
    let dom = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        dom.contains("&lt;img src=x onerror="),
        "the role shown as text:\n{dom}"
    );
    assert!(!dom.contains("<img"), "no element made of it:\n{dom}");
    assert!(
        dom.contains("<title>crest dashboard</title>"),
        "nothing of it ran:\n{dom}"
    );
    // A tree with no traffic: the throughput axis still reads five different values.
    let labels = attribute(&dom, "rates", "labels");
    let distinct: std::collections::BTreeSet<&str> = labels.split('|').collect();
    assert_eq!(distinct.len(), 5, "axis labels {labels}");
    drop(connection);
    tree.shutdown().await;
}
