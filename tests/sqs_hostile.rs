//! Hostile clients of the SQS gateway of a real `crest local`, over raw HTTP: a captured
//! signature cannot carry another body, no request's shape can abort the process, and
//! requests that never prove a key hold bounded memory, connections and time
//! (docs/security.md, "Bad input").

#[path = "common/printing.rs"]
mod printing;

use crest_gateway::client::SqsClient;
use crest_gateway::sigv4;
use crest_testkit::eventually;
use printing::{Process, start_local_sqs};
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// How long any one exchange or wait may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(20);

/// A `crest local` with its SQS API: the process, its address and its key pair.
struct Gateway {
    _local: Process,
    _dir: tempfile::TempDir,
    endpoint: String,
    addr: SocketAddr,
    key: (String, String),
}

impl Gateway {
    fn start(settings: &str) -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let printing::LocalSqs {
            process: local,
            endpoint,
            id,
            secret,
            ..
        } = start_local_sqs(dir.path(), settings, "");
        let addr = endpoint
            .strip_prefix("http://")
            .and_then(|a| a.trim_end_matches('/').parse().ok())
            .unwrap_or_else(|| panic!("endpoint {endpoint}"));
        Gateway {
            _local: local,
            _dir: dir,
            endpoint,
            addr,
            key: (id, secret),
        }
    }

    fn client(&self) -> SqsClient {
        SqsClient::new(&self.endpoint, &self.key.0, &self.key.1, 2).unwrap()
    }

    /// The headers of a query-protocol POST of `body` signed with this gateway's key, and
    /// `extra` headers signed with them.
    fn signed(&self, body: &[u8], extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut headers = vec![
            ("host".to_string(), self.addr.to_string()),
            (
                "content-type".to_string(),
                "application/x-www-form-urlencoded".to_string(),
            ),
        ];
        headers.extend(extra.iter().map(|(n, v)| (n.to_string(), v.to_string())));
        let (date, authorization) = sigv4::sign(
            "POST",
            "/",
            &headers,
            body,
            &self.key.0,
            &self.key.1,
            "us-east-1",
            SystemTime::now(),
        );
        headers.push(("x-amz-date".into(), date));
        headers.push(("authorization".into(), authorization));
        headers
    }

    /// Answers a `crest local` process gives once it is up: retries `ListQueues` (the tree
    /// behind the gateway comes up after the gateway).
    async fn ready(&self) {
        let client = self.client();
        eventually(
            Duration::from_secs(60),
            "the gateway to answer",
            async || client.call("ListQueues", &json!({})).await.map(drop),
        )
        .await;
    }
}

/// A POST of `body` with `headers`, `Content-Length` and `Connection: close`.
fn request(headers: &[(String, String)], body: &[u8]) -> Vec<u8> {
    let mut text = String::from("POST / HTTP/1.1\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str(&format!(
        "content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    ));
    let mut bytes = text.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// Reads what `stream` says until it closes (within [`DEADLINE`]).
async fn read_all(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let read = tokio::time::timeout(DEADLINE, async {
        let mut buf = [0u8; 8192];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the gateway neither answered nor closed within {DEADLINE:?}; it said: {}",
        String::from_utf8_lossy(&answer)
    );
    String::from_utf8_lossy(&answer).into_owned()
}

/// Sends `bytes` on a new connection and reads the answer to the end.
async fn exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // The gateway may answer and close before it has read everything (a refusal).
    let _ = stream.write_all(bytes).await;
    read_all(&mut stream).await
}

/// A connection to `addr` from the loopback address `from`.
async fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

/// A connection from `from` whose unsigned request was answered (`MissingAuthenticationToken`:
/// the gateway admitted it), kept open for more; `None` if it was refused.
async fn admitted(gateway: &Gateway, from: &str) -> Option<TcpStream> {
    let mut stream = connect_from(from, gateway.addr).await;
    let ask = format!(
        "POST / HTTP/1.1\r\nhost: {}\r\ncontent-length: 0\r\n\r\n",
        gateway.addr
    );
    stream.write_all(ask.as_bytes()).await.ok()?;
    // One answer: its head, then as many body bytes as it says.
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(DEADLINE, async {
        loop {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            answer.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&answer);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|l| l.trim().parse().ok())
                    .unwrap_or(0);
                if body.len() >= length {
                    return Some(text.into_owned());
                }
            }
        }
    })
    .await
    .ok()??;
    (status(&read) == 403).then_some(stream)
}

fn status(answer: &str) -> u16 {
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"))
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Form encoding of a parameter value.
fn form(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A captured signed `ListQueues` with an `x-amz-content-sha256` header of its own body's
/// hash carried another body (a `DeleteQueue`) and was obeyed: the gateway took the header's
/// word for the body. It hashes the body now and refuses a header that differs.
#[tokio::test]
async fn a_captured_signature_cannot_carry_another_body() {
    let gateway = Gateway::start("");
    gateway.ready().await;
    let client = gateway.client();
    let created = client
        .call("CreateQueue", &json!({ "QueueName": "keep" }))
        .await
        .unwrap();
    let url = created["QueueUrl"].as_str().unwrap().to_string();

    let listed = b"Action=ListQueues&Version=2012-11-05";
    let hash = sha256_hex(listed);
    let delete = format!(
        "Action=DeleteQueue&QueueUrl={}&Version=2012-11-05",
        form(&url)
    );

    // As signed, with its own hash beside it: served.
    let mut headers = gateway.signed(listed, &[]);
    headers.push(("x-amz-content-sha256".into(), hash.clone()));
    let answer = exchange(gateway.addr, &request(&headers, listed)).await;
    assert_eq!(status(&answer), 200, "{answer}");
    assert!(answer.contains("<ListQueuesResponse"), "{answer}");

    // The same headers over another body: refused, the queue kept.
    let answer = exchange(gateway.addr, &request(&headers, delete.as_bytes())).await;
    assert_eq!(status(&answer), 400, "{answer}");
    assert!(
        answer.contains("<Code>XAmzContentSHA256Mismatch</Code>"),
        "{answer}"
    );

    // The hash header signed too: the body is still checked against it.
    let headers = gateway.signed(listed, &[("x-amz-content-sha256", &hash)]);
    let answer = exchange(gateway.addr, &request(&headers, delete.as_bytes())).await;
    assert!(answer.contains("XAmzContentSHA256Mismatch"), "{answer}");

    // Without the header, the signature covers the body's own hash.
    let headers = gateway.signed(listed, &[]);
    let answer = exchange(gateway.addr, &request(&headers, delete.as_bytes())).await;
    assert_eq!(status(&answer), 403, "{answer}");
    assert!(answer.contains("SignatureDoesNotMatch"), "{answer}");

    let kept = client
        .call("GetQueueUrl", &json!({ "QueueName": "keep" }))
        .await
        .unwrap();
    assert_eq!(kept["QueueUrl"], url.as_str());
}

/// Query-protocol requests shaped to break the parser: batch entries nested 5,000 deep (the
/// parser recursed once per level and overflowed the stack, aborting every node of the
/// process), a parameter given both plainly and as members (a panic), a percent sign before
/// a multi-byte character (a panic), more parameters than the bound. Each is answered with
/// a typed error and the process serves on.
#[tokio::test]
async fn no_request_shape_aborts_the_process() {
    let gateway = Gateway::start("");
    gateway.ready().await;
    let client = gateway.client();
    let created = client
        .call("CreateQueue", &json!({ "QueueName": "shapes" }))
        .await
        .unwrap();
    let url = form(created["QueueUrl"].as_str().unwrap());

    let nested = format!(
        "Action=SendMessageBatch&QueueUrl={url}&{}Id=x",
        "SendMessageBatchRequestEntry.1.".repeat(5_000)
    );
    let both = format!(
        "Action=SetQueueAttributes&QueueUrl={url}&Attributes=x&Attribute.1.Name=DelaySeconds\
         &Attribute.1.Value=1"
    );
    let many = format!(
        "Action=ListQueues{}",
        (0..1_000).map(|i| format!("&p{i}=1")).collect::<String>()
    );
    let cases: [(&str, &[u8], u16, &str); 4] = [
        (
            "nested",
            nested.as_bytes(),
            400,
            "batch entries do not nest",
        ),
        (
            "both",
            both.as_bytes(),
            400,
            "given both as a value and as numbered members",
        ),
        ("percent", "Action=%aé".as_bytes(), 400, "InvalidAction"),
        (
            "many",
            many.as_bytes(),
            400,
            "gateway_query_params_max = 1000",
        ),
    ];
    for (name, body, expected, says) in cases {
        let headers = gateway.signed(body, &[]);
        let answer = exchange(gateway.addr, &request(&headers, body)).await;
        assert!(
            !answer.is_empty(),
            "{name}: the connection closed unanswered"
        );
        assert_eq!(status(&answer), expected, "{name}: {answer}");
        assert!(answer.contains(says), "{name}: {answer}");
        // Still serving.
        client.call("ListQueues", &json!({})).await.unwrap();
    }
}

/// A connection that sends no request is closed after `gateway_header_timeout_ms`; one
/// whose body does not come is answered `RequestTimeout` after `gateway_body_timeout_ms`
/// (before, both were held open for as long as the client liked).
#[tokio::test]
async fn silent_and_slow_connections_are_closed() {
    let gateway =
        Gateway::start("gateway_header_timeout_ms = 500\ngateway_body_timeout_ms = 500\n");
    gateway.ready().await;

    let mut silent = TcpStream::connect(gateway.addr).await.unwrap();
    assert_eq!(
        read_all(&mut silent).await,
        "",
        "a silent connection is closed"
    );

    let body = vec![b'x'; 1000];
    let headers = gateway.signed(&body, &[]);
    let whole = request(&headers, &body);
    let mut slow = TcpStream::connect(gateway.addr).await.unwrap();
    // The headers and ten bytes of the body, then nothing.
    slow.write_all(&whole[..whole.len() - 990]).await.unwrap();
    let answer = read_all(&mut slow).await;
    assert_eq!(status(&answer), 408, "{answer}");
    assert!(answer.contains("gateway_body_timeout_ms"), "{answer}");
}

/// Bodies not verified yet hold at most `gateway_unauthenticated_bytes_max` (a request
/// past it is refused, its body not kept), a body larger than `gateway_body_bytes_max` is
/// refused from its length, and connections are bounded in all and per client address: past a bound a
/// connection is answered 503 naming it, and the connections already open are served.
#[tokio::test]
async fn unverified_bytes_and_connections_are_bounded() {
    let gateway = Gateway::start(
        "gateway_header_timeout_ms = 60000\ngateway_body_timeout_ms = 60000\n\
         gateway_body_bytes_max = 1048576\ngateway_unauthenticated_bytes_max = 2097152\n\
         gateway_connections_max = 12\ngateway_connections_per_address_max = 8\n",
    );
    gateway.ready().await;

    // Larger than a body may be: refused, and nothing of it kept.
    let mut big = b"Action=ListQueues&Pad=".to_vec();
    big.resize(2 << 20, b'x');
    let answer = exchange(gateway.addr, &request(&gateway.signed(&big, &[]), &big)).await;
    assert_eq!(status(&answer), 413, "{answer}");
    assert!(answer.contains("gateway_body_bytes_max"), "{answer}");

    // Two requests whose 1 MiB bodies never come take the whole budget of 2 MiB.
    let mut body = b"Action=ListQueues&Pad=".to_vec();
    body.resize(1 << 20, b'x');
    let whole = request(&gateway.signed(&body, &[]), &body);
    let head = &whole[..whole.len() - body.len()];
    // A whole request of 1 MiB is then refused. The server takes each request's headers
    // when it gets to them: a holder read while a request of the loop held its share is
    // refused in turn and waits out its body; so each try opens two holders anew, after the
    // last try was answered (and its share given back).
    let mut holders = Vec::new();
    eventually(
        DEADLINE,
        "a refusal for unauthenticated bytes",
        async || {
            holders.clear();
            for _ in 0..2 {
                let mut holder = TcpStream::connect(gateway.addr).await.unwrap();
                holder.write_all(head).await.unwrap();
                holders.push(holder);
            }
            let answer = exchange(gateway.addr, &whole).await;
            if !answer.contains("RequestThrottled") {
                return Err(answer);
            }
            assert!(
                answer.contains("gateway_unauthenticated_bytes_max"),
                "{answer}"
            );
            Ok(())
        },
    )
    .await;
    // One holder gone: its share comes back and the same request is served.
    drop(holders.pop());
    eventually(DEADLINE, "the request served again", async || {
        let answer = exchange(gateway.addr, &whole).await;
        if status(&answer) == 200 {
            Ok(())
        } else {
            Err(answer)
        }
    })
    .await;
    drop(holders);

    // Connections: 8 from one address, each seen served (and kept open), then the ninth
    // from it refused. Connections closed a moment ago may still be counted: a connection
    // refused for them is opened again.
    let served = |answer: &str| status(answer) == 403 && answer.contains("MissingAuthentication");
    let mut open = Vec::new();
    let open_from = async |open: &mut Vec<TcpStream>, from: &str, count: usize| {
        eventually(
            DEADLINE,
            format!("{count} connections served"),
            async || {
                if let Some(kept) = admitted(&gateway, from).await {
                    open.push(kept);
                }
                if open.len() < count {
                    Err(open.len())
                } else {
                    Ok(())
                }
            },
        )
        .await
    };
    open_from(&mut open, "127.0.0.1", 8).await;
    let unsigned = request(&[("host".into(), gateway.addr.to_string())], b"");
    eventually(DEADLINE, "the ninth connection refused", async || {
        let mut ninth = connect_from("127.0.0.1", gateway.addr).await;
        let _ = ninth.write_all(&unsigned).await;
        let answer = read_all(&mut ninth).await;
        if !answer.contains("gateway_connections_per_address_max") {
            return Err(answer);
        }
        assert_eq!(status(&answer), 503, "{answer}");
        Ok(())
    })
    .await;
    // Another address may open 4 more, 12 in all; past that, refused.
    open_from(&mut open, "127.0.0.2", 12).await;
    let mut past = connect_from("127.0.0.3", gateway.addr).await;
    let _ = past.write_all(&unsigned).await;
    let answer = read_all(&mut past).await;
    assert_eq!(status(&answer), 503, "{answer}");
    assert!(answer.contains("gateway_connections_max"), "{answer}");
    // The open connections of both addresses are served.
    for mut held in [open.remove(0), open.pop().unwrap()] {
        held.write_all(&unsigned).await.unwrap();
        let answer = read_all(&mut held).await;
        assert!(served(&answer), "{answer}");
    }
    // All closed: served again.
    drop(open);
    eventually(DEADLINE, "unsigned requests served again", async || {
        let answer = exchange(gateway.addr, &unsigned).await;
        if served(&answer) { Ok(()) } else { Err(answer) }
    })
    .await;
}

/// One access key's requests hold at most `gateway_requests_per_key_max` of the gateway's
/// request slots: with two long polls of a key waiting, its next request is refused naming
/// the bound (before, one key's long polls could take every slot from every other key), and
/// served again once they end.
#[tokio::test]
async fn one_key_holds_at_most_its_share_of_the_request_slots() {
    let gateway = Gateway::start("gateway_requests_per_key_max = 2\n");
    gateway.ready().await;
    let client = gateway.client();
    let created = client
        .call("CreateQueue", &json!({ "QueueName": "idle" }))
        .await
        .unwrap();
    let url = created["QueueUrl"].as_str().unwrap().to_string();
    let poll = || {
        let (client, url) = (gateway.client(), url.clone());
        tokio::spawn(async move {
            let input = json!({ "QueueUrl": url, "WaitTimeSeconds": 10 });
            client.call("ReceiveMessage", &input).await
        })
    };
    // A poll that came while a request of the loop held the key's other slot is refused in
    // turn: it is sent again, until both wait and the loop's request is the one refused.
    let mut polls = vec![poll(), poll()];
    eventually(DEADLINE, "the key's third request refused", async || {
        for slot in polls.iter_mut() {
            if slot.is_finished() {
                *slot = poll();
            }
        }
        match client.call("ListQueues", &json!({})).await {
            Err(crest_gateway::client::CallError::Sqs { code, message, .. })
                if code == "RequestThrottled" =>
            {
                assert!(
                    message.contains("gateway_requests_per_key_max"),
                    "{message}"
                );
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // The long polls end (within their 10 s wait): the key's slots come back.
    for poll in polls {
        let _ = poll.await;
    }
    eventually(DEADLINE, "the key served again", async || {
        client.call("ListQueues", &json!({})).await.map(drop)
    })
    .await;
}
