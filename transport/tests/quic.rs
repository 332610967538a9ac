//! Real QUIC connections on loopback with mutual TLS: messages arrive intact and in order,
//! strangers are refused, and bad frames close only their own stream.

use std::time::Duration;

use rudra_transport::frame::Header;
use rudra_transport::quic::{Ended, Goodbye, QuicEndpoint, QuicSettings};
use rudra_transport::tls::CertDir;
use rudra_transport::{Clock, Inbound, Kind, LearnerId, Msg, ShardId};

fn cluster(names: &[&str]) -> (tempfile::TempDir, CertDir) {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertDir::new(dir.path());
    certs.init().unwrap();
    for n in names {
        certs.issue(n).unwrap();
    }
    (dir, certs)
}

fn endpoint(certs: &CertDir, name: &str, settings: QuicSettings) -> QuicEndpoint {
    QuicEndpoint::bind("127.0.0.1:0".parse().unwrap(), certs.identity(name).unwrap(), settings).unwrap()
}

async fn next(rx: &mut tokio::sync::mpsc::Receiver<Inbound>) -> Inbound {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a message in time")
        .expect("open channel")
}

#[tokio::test]
async fn messages_arrive_intact_and_control_stays_in_order() {
    let (_d, certs) = cluster(&["shard-0", "learner-0"]);
    let shard = endpoint(&certs, "shard-0", QuicSettings::default());
    let learner = endpoint(&certs, "learner-0", QuicSettings::default());
    let addr = shard.local_addr().unwrap();
    let received = shard.traffic();
    let accept = tokio::spawn(async move { shard.accept().await.unwrap().unwrap() });
    let to_shard = learner.connect(addr, "shard-0").await.unwrap();
    assert_eq!(to_shard.name(), "shard-0");
    to_shard.send(&Msg::Hello { learner: LearnerId(0), shard: ShardId(0) }).await.unwrap();
    let from_learner = accept.await.unwrap();
    assert_eq!(from_learner.name(), "learner-0", "the name comes from the certificate");
    let mut rx = from_learner.incoming(16);
    assert!(matches!(
        next(&mut rx).await,
        Inbound::Control(Msg::Hello { learner: LearnerId(0), shard: ShardId(0) })
    ));
    let grad: Vec<f32> = (0..1 << 20).map(|i| i as f32).collect();
    to_shard
        .send(&Msg::Push {
            learner: LearnerId(0),
            seq: 1,
            computed_on: Clock(7),
            values: grad.clone().into(),
            examples: 1,
            next_seq: 0,
            last: false,
        })
        .await
        .unwrap();
    match next(&mut rx).await {
        Inbound::Push { learner, seq, computed_on, values, .. } => {
            assert_eq!((learner.0, seq, computed_on.0), (0, 1, 7));
            assert_eq!(&values[..], &grad[..]);
        }
        other => panic!("expected the push, got {other:?}"),
    }
    for i in 0..50u32 {
        to_shard.send(&Msg::Pull { learner: LearnerId(i), seq: 1, last: false }).await.unwrap();
    }
    for i in 0..50u32 {
        assert!(
            matches!(next(&mut rx).await, Inbound::Control(Msg::Pull { learner, .. }) if learner == LearnerId(i))
        );
    }
    // Every frame is counted once on each side, header and body.
    let pulls = 50 * Msg::Pull { learner: LearnerId(0), seq: 1, last: false }.encode().unwrap().len() as u64;
    let hello = Msg::Hello { learner: LearnerId(0), shard: ShardId(0) }.encode().unwrap().len() as u64;
    let push = Msg::Push {
        learner: LearnerId(0),
        seq: 1,
        computed_on: Clock(7),
        values: grad.into(),
        examples: 1,
        next_seq: 0,
        last: false,
    }
    .encode()
    .unwrap()
    .len() as u64;
    assert_eq!(learner.traffic().sent(), hello + push + pulls);
    assert_eq!(received.received(), learner.traffic().sent());
    assert_eq!(learner.traffic().received(), 0);
}

#[tokio::test]
async fn a_peer_from_another_ca_is_refused_and_the_node_keeps_serving() {
    let (_d, certs) = cluster(&["shard-0", "learner-0"]);
    // The intruder knows our CA certificate, but its own was signed by another CA.
    let (other_dir, other) = cluster(&["learner-0"]);
    std::fs::copy(_d.path().join("ca.pem"), other_dir.path().join("ca.pem")).unwrap();
    let quick = QuicSettings { idle_timeout: Duration::from_secs(2), ..QuicSettings::default() };
    let shard = endpoint(&certs, "shard-0", quick.clone());
    let addr = shard.local_addr().unwrap();
    let intruder = endpoint(&other, "learner-0", quick.clone());
    let attempt = tokio::spawn(async move {
        let peer = intruder.connect(addr, "shard-0").await?;
        // TLS 1.3 checks the client's certificate after the client's side of the handshake.
        peer.send(&Msg::Hello { learner: LearnerId(0), shard: ShardId(0) }).await?;
        Ok::<_, rudra_transport::TransportError>(peer.closed().await)
    });
    let outcome = tokio::time::timeout(Duration::from_secs(10), shard.accept()).await.unwrap().unwrap();
    let refusal = outcome.expect_err("the shard refuses a certificate from another CA").to_string();
    assert!(refusal.contains("handshake"), "{refusal}");
    let closed = attempt.await.unwrap().unwrap_or_else(|e| e.to_string());
    assert!(closed.contains("invalid peer certificate"), "the intruder is told why: {closed}");
    // A stranger that trusts another CA altogether cannot even verify the shard.
    let (_f, stranger) = cluster(&["learner-1"]);
    let stranger = endpoint(&stranger, "learner-1", quick.clone());
    let probe = tokio::spawn(async move { stranger.connect(addr, "shard-0").await.map(|_| ()) });
    // The shard still serves a legitimate learner.
    let learner = endpoint(&certs, "learner-0", quick);
    let accept = tokio::spawn(async move {
        loop {
            if let Ok(peer) = shard.accept().await.unwrap() {
                return peer;
            }
        }
    });
    let peer = learner.connect(addr, "shard-0").await.unwrap();
    peer.send(&Msg::Hello { learner: LearnerId(0), shard: ShardId(0) }).await.unwrap();
    let mut rx = accept.await.unwrap().incoming(4);
    assert!(matches!(next(&mut rx).await, Inbound::Control(Msg::Hello { .. })));
    assert!(probe.await.unwrap().is_err(), "a client that does not trust our CA fails");
}

#[tokio::test]
async fn bad_frames_close_their_stream_only() {
    let (_d, certs) = cluster(&["shard-0", "learner-0"]);
    let settings = QuicSettings { max_frame_bytes: 1 << 20, ..QuicSettings::default() };
    let shard = endpoint(&certs, "shard-0", settings.clone());
    let learner = endpoint(&certs, "learner-0", settings);
    let addr = shard.local_addr().unwrap();
    let accept = tokio::spawn(async move { shard.accept().await.unwrap().unwrap() });
    let to_shard = learner.connect(addr, "shard-0").await.unwrap();
    to_shard.send(&Msg::Heartbeat).await.unwrap();
    let mut rx = accept.await.unwrap().incoming(16);
    assert!(matches!(next(&mut rx).await, Inbound::Control(Msg::Heartbeat)));

    let good = Msg::Push {
        learner: LearnerId(0),
        seq: 1,
        computed_on: Clock(1),
        values: vec![1.0; 8].into(),
        examples: 1,
        next_seq: 0,
        last: false,
    }
    .encode()
    .unwrap()
    .to_bytes()
    .to_vec();
    let header = |kind: Kind, body_len: u32| Header { kind, body_len }.encode().to_vec();
    let mut truncated = good.clone();
    truncated.truncate(good.len() - 5);
    let mut wrong_version = good.clone();
    wrong_version[4] = 0xEE; // a version no node speaks
    let garbage_body = [header(Kind::Push, 64), vec![0xAB; 64]].concat();
    let bad: Vec<(&str, Vec<u8>)> = vec![
        ("random bytes", (0..200u8).map(|b| b.wrapping_mul(37)).collect()),
        ("truncated", truncated),
        ("over the limit", header(Kind::Push, 2 << 20)),
        ("unknown version", wrong_version),
        ("garbage body", garbage_body),
        // A learner may not send weights, and a shard does not accept them.
        (
            "wrong kind for the role",
            Msg::Weights {
                shard: ShardId(0),
                learner: LearnerId(0),
                seq: 1,
                clock: Clock(0),
                values: vec![0.0; 4].into(),
            }
            .encode()
            .unwrap()
            .to_bytes()
            .to_vec(),
        ),
    ];
    for (what, bytes) in bad {
        // Payload kinds get their own stream, so each bad frame is alone on one.
        to_shard
            .send_encoded(Kind::Push, bytes::Bytes::from(bytes).into())
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    // The connection and its control stream still work; nothing bad got through.
    to_shard.send(&Msg::Pull { learner: LearnerId(0), seq: 1, last: false }).await.unwrap();
    to_shard
        .send(&Msg::Push {
            learner: LearnerId(0),
            seq: 1,
            computed_on: Clock(3),
            values: vec![2.0; 8].into(),
            examples: 1,
            next_seq: 0,
            last: false,
        })
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(next(&mut rx).await.kind());
    }
    got.sort_by_key(|k| *k as u16);
    assert_eq!(got, vec![Kind::Pull, Kind::Push]);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), rx.recv()).await.is_err(),
        "no bad frame was delivered"
    );
}

/// Endpoints run on the process's network threads: they can be bound outside any runtime,
/// and a runtime that used them can stop without taking their connections down.
#[test]
fn endpoints_outlive_the_runtimes_that_use_them() {
    let (_d, certs) = cluster(&["shard-0", "learner-0"]);
    let shard = endpoint(&certs, "shard-0", QuicSettings::default());
    let learner = endpoint(&certs, "learner-0", QuicSettings::default());
    let addr = shard.local_addr().unwrap();
    let runtime = || tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (to_shard, from_learner) = runtime().block_on(async {
        let accept = tokio::spawn(async move { shard.accept().await.unwrap().unwrap() });
        let to_shard = learner.connect(addr, "shard-0").await.unwrap();
        to_shard.send(&Msg::Hello { learner: LearnerId(0), shard: ShardId(0) }).await.unwrap();
        (to_shard, accept.await.unwrap())
    });
    // The runtime that connected is gone; a new one sends and receives on the same connection.
    runtime().block_on(async {
        let mut rx = from_learner.incoming(4);
        assert!(matches!(
            next(&mut rx).await,
            Inbound::Control(Msg::Hello { learner: LearnerId(0), shard: ShardId(0) })
        ));
        to_shard
            .send(&Msg::Push {
                learner: LearnerId(0),
                seq: 1,
                computed_on: Clock(2),
                values: vec![0.5; 4096].into(),
                examples: 1,
                next_seq: 0,
                last: false,
            })
            .await
            .unwrap();
        match next(&mut rx).await {
            Inbound::Push { values, .. } => assert_eq!(&values[..], &[0.5; 4096][..]),
            other => panic!("expected the push, got {other:?}"),
        }
    });
}

/// An aborted endpoint falls silent, as a crashed node would: the other side finds the
/// connection lost, not closed.
#[tokio::test]
async fn an_aborted_endpoint_goes_silent_like_a_crashed_node() {
    let (_d, certs) = cluster(&["shard-0", "learner-0"]);
    let quick = QuicSettings { idle_timeout: Duration::from_secs(1), ..QuicSettings::default() };
    let shard = endpoint(&certs, "shard-0", quick.clone());
    let learner = endpoint(&certs, "learner-0", quick);
    let addr = shard.local_addr().unwrap();
    let accept = tokio::spawn(async move { (shard.accept().await.unwrap().unwrap(), shard) });
    let to_shard = learner.connect(addr, "shard-0").await.unwrap();
    to_shard.send(&Msg::Hello { learner: LearnerId(0), shard: ShardId(0) }).await.unwrap();
    let (from_learner, _shard) = accept.await.unwrap();
    let _rx = to_shard.incoming(4);
    learner.abort();
    let ended = tokio::time::timeout(Duration::from_secs(10), from_learner.ended()).await;
    let ended = ended.expect("the connection ends once its peer is silent");
    let Ended::Lost(why) = ended else { panic!("lost, not closed: {ended:?}") };
    assert!(why.contains("timed out"), "{why}");
}

/// A node that leaves says goodbye: its peer reads the goodbye and the reason at once.
#[tokio::test]
async fn a_goodbye_reaches_the_peer_with_its_reason() {
    let (_dir, certs) = cluster(&["shard-0", "learner-0"]);
    let shard = endpoint(&certs, "shard-0", QuicSettings::default());
    let learner = endpoint(&certs, "learner-0", QuicSettings::default());
    let addr = shard.local_addr().unwrap();
    let accept = tokio::spawn(async move { (shard.accept().await.unwrap().unwrap(), shard) });
    let to_shard = learner.connect(addr, "shard-0").await.unwrap();
    to_shard.send(&Msg::Hello { learner: LearnerId(0), shard: ShardId(0) }).await.unwrap();
    let (from_learner, _shard) = accept.await.unwrap();
    learner.say_goodbye(Goodbye::Failed, "training.data_dir: no such directory");
    let ended = tokio::time::timeout(Duration::from_secs(5), from_learner.ended()).await.expect("at once");
    let want = Ended::Closed {
        goodbye: Some(Goodbye::Failed),
        reason: "training.data_dir: no such directory".into(),
    };
    assert_eq!(ended, want);
    assert!(from_learner.is_closed());
}
