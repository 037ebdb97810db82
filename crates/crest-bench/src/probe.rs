//! The processor time of a running tree's node processes, read from their `/metrics/process`
//! (`process_cpu_seconds_total`, answered without the node's actor, so a busy node is not
//! missed) at the bench's marks: what each node spends per message, and
//! so how many messages one of its cores could carry. Only with `--connect` to nodes that run
//! as processes of their own (in a tree the bench starts, every node shares its process).

use crate::config::{NodeHttp, Phase};
use crate::report::{CpuMarks, NodeCpu};
use http_body_util::BodyExt;
use std::net::SocketAddr;
use std::time::Duration;

/// How long one node's `/metrics` may take to answer before its figure is left out.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Most bytes of a `/metrics` answer read (one of a tree at its report limits is far less); a
/// longer one is left out.
const METRICS_BYTES_MAX: usize = 64 << 20;

/// Each node's processor seconds now, in the order given (`None`: no answer, or no figure).
pub(crate) async fn cpu_seconds(nodes: &[NodeHttp]) -> Vec<Option<f64>> {
    let texts = futures_util::future::join_all(nodes.iter().map(|(_, addr)| one(*addr))).await;
    texts.iter().map(|text| parse(text.as_deref()?)).collect()
}

/// Which process each node runs in (its id and start time in milliseconds), in the order
/// given: nodes of one `crest local` share it.
pub(crate) async fn processes(nodes: &[NodeHttp]) -> Vec<Option<(u64, u64)>> {
    let texts = futures_util::future::join_all(nodes.iter().map(|(_, addr)| one(*addr))).await;
    texts.iter().map(|text| process(text.as_deref()?)).collect()
}

/// The node's `/metrics/process` text.
async fn one(addr: SocketAddr) -> Option<String> {
    let ask = async {
        let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.ok()?;
        tokio::spawn(connection);
        let request = hyper::Request::get("/metrics/process")
            .header(hyper::header::HOST, addr.to_string())
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .ok()?;
        let response = sender.send_request(request).await.ok()?;
        let body = http_body_util::Limited::new(response.into_body(), METRICS_BYTES_MAX)
            .collect()
            .await
            .ok()?
            .to_bytes();
        Some(String::from_utf8_lossy(&body).into_owned())
    };
    tokio::time::timeout(PROBE_TIMEOUT, ask).await.ok()?
}

/// The value of the unlabelled sample `name` in a Prometheus text.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// `process_cpu_seconds_total` in a Prometheus text.
fn parse(text: &str) -> Option<f64> {
    sample(text, "process_cpu_seconds_total")
}

/// `crest_process_id` and `process_start_time_seconds` (in milliseconds) in a Prometheus text.
fn process(text: &str) -> Option<(u64, u64)> {
    let id = sample(text, "crest_process_id")?;
    let start = sample(text, "process_start_time_seconds")?;
    Some((id as u64, (start * 1000.0).round() as u64))
}

/// Each node's use over the run, from its readings at the three marks (nodes missing any are
/// left out).
pub(crate) fn usage(
    nodes: &[NodeHttp],
    processes: &[Option<(u64, u64)>],
    marks: [&[Option<f64>]; 3],
    phase: Phase,
    pushed: u64,
    popped: u64,
) -> Vec<NodeCpu> {
    let second = |s: f64| Duration::from_secs_f64(s.max(0.0));
    nodes
        .iter()
        .enumerate()
        .filter_map(|(i, (name, _))| {
            let [start, done, end] = marks.map(|m| m.get(i).copied().flatten());
            let cpu = CpuMarks {
                start: second(start?),
                producers_done: second(done?),
                end: second(end?),
            }
            .usage(phase, pushed, popped);
            Some(NodeCpu {
                name: name.clone(),
                process: processes.get(i).copied().flatten(),
                seconds: cpu.seconds,
                us_per_message: cpu.us_per_message,
                fill_us_per_message: cpu.fill_us_per_message,
                drain_us_per_message: cpu.drain_us_per_message,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_s_processor_time_is_found_in_its_metrics_and_spread_over_the_phases() {
        let text = "# TYPE crest_pushed_total counter\ncrest_pushed_total{node=\"a\"} 9\n\
                    # TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.500000\n";
        assert_eq!(parse(text), Some(12.5));
        assert_eq!(parse("crest_pushed_total 9\n"), None);
        let ids = "crest_process_id 4242\nprocess_start_time_seconds 1700000000.25\n";
        assert_eq!(process(ids), Some((4242, 1_700_000_000_250)));
        assert_eq!(process("crest_process_id 4242\n"), None);
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let nodes = vec![("root".to_string(), addr), ("leaf".to_string(), addr)];
        let start = [Some(10.0), Some(1.0)];
        let done = [Some(10.5), None];
        let end = [Some(12.5), Some(3.0)];
        let used = usage(
            &nodes,
            &[Some((7, 1)), None],
            [&start, &done, &end],
            Phase::FillThenDrain,
            1000,
            500,
        );
        assert_eq!(used.len(), 1, "a node without every reading is left out");
        assert_eq!(
            (used[0].name.as_str(), used[0].process),
            ("root", Some((7, 1)))
        );
        assert!((used[0].seconds - 2.5).abs() < 1e-9);
        assert!((used[0].fill_us_per_message.unwrap() - 500.0).abs() < 1e-6);
        assert!((used[0].drain_us_per_message.unwrap() - 4000.0).abs() < 1e-6);
    }

    #[tokio::test]
    async fn a_node_that_does_not_answer_has_no_figure() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        assert_eq!(cpu_seconds(&[("gone".into(), addr)]).await, vec![None]);
    }
}
