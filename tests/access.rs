//! Client identity and permissions over real QUIC: tokens and client certificates prove a
//! principal of the access file; leaves check `produce`, the root `consume` and `admin`;
//! receipts settle only for the principal they were delivered to.
//!
//! Each test runs `topology/local.toml` in this process with ephemeral ports; [`LocalTree`]
//! creates an access file whose `admin` principal may do everything, and each test adds the
//! principals it needs with [`LocalTree::reload_access`], as `SIGHUP` does for `crest launch`.

use crest::core::access::Grants;
use crest::node::LocalTree;
use crest::node::access::AccessFile;
use crest::sdk::{
    Admin, ClientError, ClientTls, Consumer, ConsumerConfig, Credential, ErrorCode, Producer,
    ProducerConfig, ReceiptError, Settle,
};
use crest::transport::tls::CertificateAuthority;
use crest_testkit::eventually;
use std::time::Duration;

mod common;

use common::{WAIT, start_tree};

/// Adds principal `name` with `grants` (`NAMESPACE:PERM,...`) to `file`; returns a token.
fn add(file: &mut AccessFile, name: &str, grants: &[&str]) -> String {
    let mut all = Grants::default();
    for grant in grants {
        let (namespace, permissions) = Grants::parse_one(grant).unwrap();
        all.add(&namespace, &permissions);
    }
    file.grant(name, &all).unwrap();
    file.create_token(name, 0).unwrap()
}

fn tls(tree: &LocalTree, credential: Credential) -> ClientTls {
    ClientTls::new(tree.ca_pem.clone()).with_credential(credential)
}

async fn producer(tree: &LocalTree, credential: Credential) -> Result<Producer, ClientError> {
    let leaf = tree.topology.node("leaf-1").unwrap().address.clone();
    Producer::connect(ProducerConfig::new(vec![leaf], tls(tree, credential))).await
}

async fn consumer(tree: &LocalTree, credential: Credential) -> Result<Consumer, ClientError> {
    Consumer::connect(ConsumerConfig::from_topology(
        &tree.topology,
        tls(tree, credential),
    ))
    .await
}

fn admin_token(tree: &LocalTree) -> Credential {
    Credential::Token(tree.admin_token.clone())
}

/// The code of a refusal, with its text.
fn refused<T>(result: Result<T, ClientError>) -> (ErrorCode, String) {
    match result {
        Err(ClientError::Rejected { code, message }) => (code, message),
        Err(other) => panic!("expected a refusal, got {other:?}"),
        Ok(_) => panic!("expected a refusal, got success"),
    }
}

async fn depth(tree: &LocalTree, topic: &str) -> u64 {
    let admin = Admin::connect(ConsumerConfig::from_topology(
        &tree.topology,
        tls(tree, admin_token(tree)),
    ))
    .await
    .unwrap();
    let stats = admin.stats(Some(topic)).await.unwrap().value;
    stats
        .topic(topic)
        .map_or(0, |t| t.ready_total() + t.delayed + t.in_flight)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_a_valid_credential_are_refused_as_unauthenticated() {
    // Goal: no credential, a malformed or wrong token, and a certificate from another CA are
    // each refused before anything is done, with a typed error that says why.
    let tree = start_tree().await;
    let (code, text) = refused(producer(&tree, Credential::None).await);
    assert_eq!(code, ErrorCode::Unauthenticated, "{text}");
    assert!(text.contains("requires a credential"), "{text}");
    let (code, text) = refused(consumer(&tree, Credential::None).await);
    assert_eq!(code, ErrorCode::Unauthenticated, "{text}");

    let malformed = Credential::Token("hunter2".into());
    let (code, text) = refused(consumer(&tree, malformed).await);
    assert_eq!(code, ErrorCode::Unauthenticated);
    assert!(text.contains("malformed"), "{text}");
    // The admin token's id with another secret.
    let id = tree.admin_token.split('_').nth(1).unwrap();
    let wrong = Credential::Token(format!("crest_{id}_{}", "0".repeat(64)));
    let (code, text) = refused(producer(&tree, wrong).await);
    assert_eq!(code, ErrorCode::Unauthenticated);
    assert!(text.contains("wrong secret"), "{text}");

    // A client certificate from a CA the tree does not trust fails the TLS handshake.
    let stranger = CertificateAuthority::generate()
        .unwrap()
        .issue_client("admin", Duration::from_secs(3600))
        .unwrap();
    let foreign = Credential::Certificate {
        cert_pem: stranger.cert_pem,
        key_pem: stranger.key_pem,
    };
    match consumer(&tree, foreign).await {
        Err(ClientError::Connect(text)) => {
            assert!(text.contains("certificate"), "{text}");
        }
        other => panic!("a foreign certificate was not refused: {:?}", other.err()),
    }
    // Nothing was pushed by any of them, and the admin token works.
    assert_eq!(depth(&tree, "jobs").await, 0);
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_principal_may_do_only_what_it_is_granted_in_each_namespace() {
    // Goal: pushes need `produce` on the message's namespace (refused at the leaf), pops
    // `consume`, dead-letter operations `admin` (refused at the root); each refusal is
    // `Forbidden`, names the namespace and the permission, and changes nothing.
    let tree = start_tree().await;
    let mut file = tree.access_file().clone();
    let writer = add(&mut file, "writer", &["orders:produce"]);
    let reader = add(&mut file, "reader", &["orders:consume"]);
    let mut tree = tree;
    tree.reload_access(file);

    let writer = producer(&tree, Credential::Token(writer)).await.unwrap();
    writer.push("orders/eu", 1, "ok").await.unwrap();
    let (code, text) = refused(writer.push("billing/eu", 1, "no").await);
    assert_eq!(code, ErrorCode::Forbidden, "{text}");
    assert!(
        text.contains("\"writer\"") && text.contains("produce") && text.contains("\"billing\""),
        "{text}"
    );
    let (code, _) = refused(writer.push("jobs", 1, "no").await);
    assert_eq!(
        code,
        ErrorCode::Forbidden,
        "the default namespace was not granted"
    );

    let reader_token = Credential::Token(reader);
    let reader = consumer(&tree, reader_token.clone()).await.unwrap();
    let (code, text) = refused(reader.pop("billing/eu", 1, Duration::ZERO).await);
    assert_eq!(code, ErrorCode::Forbidden);
    assert!(
        text.contains("consume") && text.contains("\"billing\""),
        "{text}"
    );
    let admin = Admin::connect(ConsumerConfig::from_topology(
        &tree.topology,
        tls(&tree, reader_token),
    ))
    .await
    .unwrap();
    let (code, text) = refused(admin.purge("orders/eu", &[]).await);
    assert_eq!(code, ErrorCode::Forbidden);
    assert!(
        text.contains("admin") && text.contains("\"orders\""),
        "{text}"
    );
    // Its stats list only the namespaces it holds something in.
    producer(&tree, admin_token(&tree))
        .await
        .unwrap()
        .push("billing/eu", 1, "by admin")
        .await
        .unwrap();
    let stats = admin.stats(None).await.unwrap().value;
    let topics: Vec<&str> = stats.topics.iter().map(|t| t.topic.as_str()).collect();
    assert_eq!(topics, ["orders/eu"]);

    // Nothing refused changed anything: one message in each namespace, and the reader
    // gets the one it may.
    assert_eq!(depth(&tree, "orders/eu").await, 1);
    assert_eq!(depth(&tree, "billing/eu").await, 1);
    assert_eq!(depth(&tree, "jobs").await, 0);
    let popped = reader.pop("orders/eu", 10, WAIT).await.unwrap();
    assert_eq!(popped.len(), 1);
    reader.ack(&popped[0].receipt()).await.unwrap();
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_settle_only_for_the_principal_they_were_delivered_to() {
    // Goal: a receipt obtained by another principal (both may consume the namespace) cannot
    // ack, nack or extend the delivery; the message stays leased to its holder, who acks it.
    let mut tree = start_tree().await;
    let mut file = tree.access_file().clone();
    let alice = add(&mut file, "alice", &["jobs:consume"]);
    let mallory = add(&mut file, "mallory", &["jobs:consume"]);
    tree.reload_access(file);
    producer(&tree, admin_token(&tree))
        .await
        .unwrap()
        .push("jobs/a", 1, "for alice")
        .await
        .unwrap();
    let alice = consumer(&tree, Credential::Token(alice)).await.unwrap();
    let mallory = consumer(&tree, Credential::Token(mallory)).await.unwrap();
    let delivered = alice.pop("jobs/a", 1, WAIT).await.unwrap();
    let receipt = delivered[0].receipt();
    let stale = |result: Result<(), ClientError>| {
        assert!(
            matches!(result, Err(ClientError::Receipt(ReceiptError::Stale))),
            "{result:?}"
        );
    };
    stale(mallory.extend(&receipt, Duration::from_secs(60)).await);
    stale(mallory.nack(&receipt, Duration::ZERO, None).await);
    stale(mallory.ack(&receipt).await);
    assert!(
        mallory
            .pop("jobs/a", 1, Duration::from_millis(200))
            .await
            .unwrap()
            .is_empty(),
        "still leased to alice"
    );
    alice.ack(&receipt).await.unwrap();
    assert_eq!(depth(&tree, "jobs/a").await, 0);
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_held_when_consume_is_revoked_settle_nothing() {
    // Goal: once the access file no longer grants a principal `consume` in a namespace, the
    // receipts it still holds there extend, nack and ack nothing (`Forbidden`), however its
    // consumer routes them; granted again, its ack holds.
    let mut tree = start_tree().await;
    let mut file = tree.access_file().clone();
    let token = add(&mut file, "alice", &["jobs:consume"]);
    tree.reload_access(file.clone());
    producer(&tree, admin_token(&tree))
        .await
        .unwrap()
        .push("jobs/a", 1, "leased")
        .await
        .unwrap();
    let alice = consumer(&tree, Credential::Token(token)).await.unwrap();
    let receipt = alice.pop("jobs/a", 1, WAIT).await.unwrap()[0].receipt();
    let set = |file: &mut AccessFile, grant: &str| {
        let (namespace, permissions) = Grants::parse_one(grant).unwrap();
        let mut grants = Grants::default();
        grants.add(&namespace, &permissions);
        file.principals.get_mut("alice").unwrap().grants = grants;
    };
    set(&mut file, "jobs:produce");
    tree.reload_access(file.clone());
    let forbidden = |result: Result<(), ClientError>| {
        matches!(result, Err(ClientError::Receipt(ReceiptError::Forbidden)))
    };
    // The nodes take the file as it reaches them: an extend goes through until then.
    eventually(WAIT, "an extend forbidden", async || {
        forbidden(alice.extend(&receipt, Duration::from_secs(12 * 3600)).await)
    })
    .await;
    let nacked = alice.nack(&receipt, Duration::ZERO, None).await;
    assert!(forbidden(nacked.clone()), "{nacked:?}");
    let acked = alice.ack(&receipt).await;
    assert!(forbidden(acked.clone()), "{acked:?}");
    assert_eq!(depth(&tree, "jobs/a").await, 1);
    set(&mut file, "jobs:consume");
    tree.reload_access(file);
    eventually(WAIT, "an ack allowed", async || {
        !forbidden(alice.ack(&receipt).await)
    })
    .await;
    assert_eq!(depth(&tree, "jobs/a").await, 0);
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_settles_a_lease_whoever_holds_it_and_a_consumer_may_not() {
    // Goal: a principal with `admin` in the namespace releases, then acks, leases delivered
    // to another principal, by message id; a consumer without `admin` is refused and changes
    // nothing; the holder's receipt is stale once the admin settled its lease.
    let mut tree = start_tree().await;
    let mut file = tree.access_file().clone();
    let alice = add(&mut file, "alice", &["jobs:consume"]);
    let ops = add(&mut file, "ops", &["jobs:admin"]);
    tree.reload_access(file);
    producer(&tree, admin_token(&tree))
        .await
        .unwrap()
        .push("jobs/a", 1, "stuck")
        .await
        .unwrap();
    let alice_consumer = consumer(&tree, Credential::Token(alice.clone()))
        .await
        .unwrap();
    let config = |token: &str| {
        ConsumerConfig::from_topology(
            &tree.topology,
            tls(&tree, Credential::Token(token.to_string())),
        )
    };
    let first = alice_consumer.pop("jobs/a", 1, WAIT).await.unwrap();
    let id = first[0].id;
    let consumer_only = Admin::connect(config(&alice)).await.unwrap();
    let (code, text) = refused(consumer_only.settle("jobs/a", Settle::Ack, &[id]).await);
    assert_eq!(code, ErrorCode::Forbidden, "{text}");
    assert!(text.contains("admin"), "{text}");

    let ops = Admin::connect(config(&ops)).await.unwrap();
    let release = Settle::Nack {
        delay_ms: 0,
        reason: Some("consumer hangs".into()),
    };
    // Another topic's name settles nothing.
    assert_eq!(
        ops.settle("jobs/b", release.clone(), &[id])
            .await
            .unwrap()
            .value,
        0
    );
    assert_eq!(ops.settle("jobs/a", release, &[id]).await.unwrap().value, 1);
    assert!(matches!(
        alice_consumer.ack(&first[0].receipt()).await,
        Err(ClientError::Receipt(ReceiptError::Stale))
    ));
    let second = alice_consumer.pop("jobs/a", 1, WAIT).await.unwrap();
    assert_eq!(
        (second[0].id, second[0].attempt),
        (id, 2),
        "delivered again"
    );
    assert_eq!(
        ops.settle("jobs/a", Settle::Ack, &[id])
            .await
            .unwrap()
            .value,
        1
    );
    assert_eq!(depth(&tree, "jobs/a").await, 0);
    // Settled: nothing left to settle.
    assert_eq!(
        ops.settle("jobs/a", Settle::Ack, &[id])
            .await
            .unwrap()
            .value,
        0
    );
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_closes_its_connections_and_is_refused_after() {
    // Goal: revoking a token and reloading the access file closes the connections that
    // proved it, refuses new ones, and leaves other principals' alone.
    let mut tree = start_tree().await;
    let mut file = tree.access_file().clone();
    let token = add(&mut file, "temp", &["*:produce,consume"]);
    tree.reload_access(file.clone());
    let temp = consumer(&tree, Credential::Token(token.clone()))
        .await
        .unwrap();
    assert!(
        temp.pop("jobs", 1, Duration::ZERO)
            .await
            .unwrap()
            .is_empty()
    );
    let admin = consumer(&tree, admin_token(&tree)).await.unwrap();

    let id = token.split('_').nth(1).unwrap();
    assert!(file.revoke(id));
    tree.reload_access(file);
    // Its open connection is closed (the consumer's reconnect is refused in turn).
    eventually(WAIT, "the revoked token refused", async || {
        match temp.pop("jobs", 1, Duration::ZERO).await {
            Ok(_) => Err("still served".to_string()),
            Err(ClientError::Rejected { code, message }) => {
                assert_eq!(code, ErrorCode::Unauthenticated, "{message}");
                Ok(())
            }
            Err(other) => Err(other.to_string()),
        }
    })
    .await;
    let (code, text) = refused(consumer(&tree, Credential::Token(token)).await);
    assert_eq!(code, ErrorCode::Unauthenticated);
    assert!(text.contains("unknown or revoked"), "{text}");
    assert!(admin.pop("jobs", 1, Duration::ZERO).await.is_ok());
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_proves_its_principal_and_cannot_pass_as_a_node() {
    // Goal: `crest certs --client NAME`'s certificate authenticates principal NAME without a
    // token; the same certificate cannot claim a node's place in the tree.
    let mut tree = start_tree().await;
    let mut file = tree.access_file().clone();
    file.grant("carol", &{
        let mut grants = Grants::default();
        let (namespace, permissions) = Grants::parse_one("orders:produce,consume").unwrap();
        grants.add(&namespace, &permissions);
        grants
    })
    .unwrap();
    tree.reload_access(file);
    let issued = tree
        .ca()
        .issue_client("carol", Duration::from_secs(3600))
        .unwrap();
    // As `crest certs --client` writes it: certificate and key in one file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("carol.pem");
    std::fs::write(&path, format!("{}{}", issued.cert_pem, issued.key_pem)).unwrap();
    let credential = Credential::from_file(&path).unwrap();
    let carol = producer(&tree, credential.clone()).await.unwrap();
    carol.push("orders/x", 1, "by cert").await.unwrap();
    let (code, _) = refused(carol.push("jobs", 1, "no").await);
    assert_eq!(code, ErrorCode::Forbidden);
    let consumer = consumer(&tree, credential).await.unwrap();
    assert_eq!(consumer.pop("orders/x", 1, WAIT).await.unwrap().len(), 1);

    // A principal's certificate the access file does not know.
    let stranger = tree
        .ca()
        .issue_client("dave", Duration::from_secs(3600))
        .unwrap();
    let stranger = Credential::Certificate {
        cert_pem: stranger.cert_pem,
        key_pem: stranger.key_pem,
    };
    let (code, text) = refused(producer(&tree, stranger).await);
    assert_eq!(code, ErrorCode::Unauthenticated);
    assert!(text.contains("\"dave\""), "{text}");
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_principal_cannot_take_more_than_its_share_of_a_node_s_connections() {
    // Goal: `principal_connections_max` bounds the connections one principal holds to a node;
    // the next is refused `Overloaded` naming the setting, another principal still connects,
    // and a slot given back can be taken again.
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/topology/local.toml"))
        .unwrap()
        .replace(
            "[settings]\n",
            "[settings]\nprincipal_connections_max = 2\n",
        );
    let topology = crest::core::topology::Topology::parse(&text)
        .unwrap()
        .with_ephemeral_ports();
    let mut tree = LocalTree::start(&topology).await.unwrap();
    assert!(tree.wait_connected(WAIT).await);
    let mut file = tree.access_file().clone();
    let other = add(&mut file, "other", &["*:consume"]);
    tree.reload_access(file);
    let first = consumer(&tree, admin_token(&tree)).await.unwrap();
    let _second = consumer(&tree, admin_token(&tree)).await.unwrap();
    let (code, text) = refused(consumer(&tree, admin_token(&tree)).await);
    assert_eq!(code, ErrorCode::Overloaded);
    assert!(text.contains("principal_connections_max"), "{text}");
    let _other = consumer(&tree, Credential::Token(other)).await.unwrap();
    drop(first);
    eventually(WAIT, "a connection once one closed", async || {
        consumer(&tree, admin_token(&tree)).await.map(drop)
    })
    .await;
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_takes_only_the_certificate_of_the_node_it_names() {
    // Goal: a node holding another node's key (an impostor with leaf-1's certificate) cannot
    // stand in for the root to a client that names the root, as clients configured from a
    // topology do: the handshake fails before the client's Hello, and its token, go out.
    // Named leaf-1 there, the same client completes the handshake and sends its Hello: what
    // a bare address still allows, and what the impostor would have seen.
    let tree = start_tree().await;
    let stolen = tree
        .ca()
        .issue("leaf-1", &["127.0.0.1".into()], Duration::from_secs(3600))
        .unwrap();
    let settings = crest::core::config::Settings::default();
    let server = crest::transport::server_config(&stolen, &tree.ca_pem, &settings).unwrap();
    let impostor = quinn::Endpoint::server(server, "127.0.0.1:0".parse().unwrap()).unwrap();
    let at = impostor.local_addr().unwrap();
    // Every stream opened to the impostor, with the first bytes read from it.
    let (heard, mut hellos) = tokio::sync::mpsc::unbounded_channel();
    let listener = tokio::spawn(async move {
        while let Some(incoming) = impostor.accept().await {
            let Ok(connection) = incoming.await else {
                continue;
            };
            let heard = heard.clone();
            tokio::spawn(async move {
                while let Ok((_send, mut recv)) = connection.accept_bi().await {
                    let mut first = [0u8; 16];
                    if recv.read_exact(&mut first).await.is_ok() {
                        let _ = heard.send(first);
                    }
                }
            });
        }
    });
    let mut config = ConsumerConfig::new(format!("root@{at}"), tls(&tree, admin_token(&tree)));
    let error = Consumer::connect(config.clone())
        .await
        .err()
        .expect("refused");
    let text = error.to_string();
    assert!(
        text.contains("certificate") || text.contains("Certificate"),
        "{text}"
    );
    assert!(
        hellos.try_recv().is_err(),
        "nothing was sent to the impostor"
    );
    config.roots = vec![format!("leaf-1@{at}")];
    assert!(
        Consumer::connect(config).await.is_err(),
        "the impostor sends no Welcome"
    );
    assert!(
        hellos.recv().await.is_some(),
        "the Hello reached the impostor"
    );
    listener.abort();
    tree.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_namespace_cannot_take_every_topic_or_configuration_a_leaf_may_hold() {
    // Goal: the topics and topic configurations a leaf may hold are shared out by namespace
    // (`namespace_topics_max`, `namespace_topic_configs_max`): one that filled its share is
    // refused more, with `TopicLimit` naming the setting, or a configuration no leaf keeps,
    // while another namespace still creates and configures its own.
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/topology/local.toml"))
        .unwrap();
    let mut topology = crest::core::topology::Topology::parse(&text)
        .unwrap()
        .with_ephemeral_ports();
    for node in &mut topology.nodes {
        node.settings.topics_max = 4;
        node.settings.namespace_topics_max = 2;
        node.settings.topic_configs_max = 4;
        node.settings.namespace_topic_configs_max = 2;
    }
    let tree = LocalTree::start(&topology).await.unwrap();
    assert!(tree.wait_connected(WAIT).await);
    let producer = producer(&tree, admin_token(&tree)).await.unwrap();
    for topic in ["noisy/a", "noisy/b"] {
        producer.push(topic, 1, "x").await.unwrap();
    }
    let (code, text) = refused(producer.push("noisy/c", 1, "x").await);
    assert_eq!(code, ErrorCode::TopicLimit, "{text}");
    assert!(text.contains("namespace_topics_max"), "{text}");
    producer.push("quiet/a", 1, "x").await.unwrap();

    let admin = Admin::connect(ConsumerConfig::from_topology(
        &tree.topology,
        tls(&tree, admin_token(&tree)),
    ))
    .await
    .unwrap();
    let leaves = tree.topology.leaves().count() as u64;
    let configure = |topic: &'static str| {
        let admin = &admin;
        async move {
            admin
                .configure(topic, crest::sdk::TopicConfig::default())
                .await
                .unwrap()
                .value
        }
    };
    assert_eq!(configure("noisy/a").await, leaves);
    assert_eq!(configure("noisy/b").await, leaves);
    assert_eq!(configure("noisy/c").await, 0, "no leaf keeps a third");
    assert_eq!(configure("quiet/a").await, leaves);
    tree.shutdown().await;
}
