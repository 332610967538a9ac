//! The fault-injecting UDP relay on loopback: an echo server behind it, then a real QUIC
//! connection through it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use rudra_transport::quic::{QuicEndpoint, QuicSettings};
use rudra_transport::tls::CertDir;
use rudra_transport::{
    Clock, FaultWindow, Inbound, LearnerId, LinkFaults, Msg, Relay, RelayHandle, RelayLimits, RelayRules,
    ShardId,
};
use tokio::net::UdpSocket;
use tokio::time::{Instant, timeout};

const QUIET: Duration = Duration::from_millis(300);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A UDP server that sends every datagram back to its sender.
async fn echo_server() -> SocketAddr {
    let socket = UdpSocket::bind(loopback()).await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        while let Ok((len, from)) = socket.recv_from(&mut buf).await {
            let _ = socket.send_to(&buf[..len], from).await;
        }
    });
    addr
}

/// A relay in front of a fresh echo server; returns it and the address clients send to.
async fn relay(rules: RelayRules, limits: RelayLimits) -> (RelayHandle, SocketAddr) {
    let relay = Relay::bind(loopback(), echo_server().await, rules, 11).unwrap().with_limits(limits);
    let addr = relay.local_addr().unwrap();
    (relay.spawn(), addr)
}

fn both_ways(faults: LinkFaults) -> RelayRules {
    RelayRules { to_upstream: faults.clone(), to_client: faults, ..RelayRules::default() }
}

async fn client(relay: SocketAddr) -> UdpSocket {
    let socket = UdpSocket::bind(loopback()).await.unwrap();
    socket.connect(relay).await.unwrap();
    socket
}

/// Every datagram that arrives until none has for `QUIET`.
async fn drain(socket: &UdpSocket) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65_535];
    while let Ok(Ok(len)) = timeout(QUIET, socket.recv(&mut buf)).await {
        got.push(buf[..len].to_vec());
    }
    got
}

/// Datagram `i`, `len` bytes long.
fn datagram(i: u32, len: usize) -> Vec<u8> {
    (0..len).map(|b| (b as u32).wrapping_mul(31).wrapping_add(i) as u8).chain(i.to_le_bytes()).collect()
}

#[tokio::test]
async fn a_clean_relay_returns_every_datagram_intact() {
    let (_relay, addr) = relay(RelayRules::default(), RelayLimits::default()).await;
    let socket = client(addr).await;
    let mut buf = vec![0u8; 65_535];
    for (i, len) in [0, 1, 100, 1200, 9000, 65_000, 65_503].into_iter().cycle().take(40).enumerate() {
        let sent = datagram(i as u32, len);
        socket.send(&sent).await.unwrap();
        let n = timeout(Duration::from_secs(5), socket.recv(&mut buf)).await.unwrap().unwrap();
        assert_eq!(&buf[..n], &sent[..], "datagram {i} of {} bytes", sent.len());
    }
    assert!(drain(&socket).await.is_empty(), "nothing extra");
}

#[tokio::test]
async fn dropping_everything_returns_nothing() {
    let (_relay, addr) =
        relay(both_ways(LinkFaults { drop: 1.0, ..LinkFaults::default() }), RelayLimits::default()).await;
    let socket = client(addr).await;
    for i in 0..20 {
        socket.send(&datagram(i, 10)).await.unwrap();
    }
    assert!(drain(&socket).await.is_empty());
}

#[tokio::test]
async fn duplicating_both_ways_returns_each_datagram_four_times() {
    let (_relay, addr) =
        relay(both_ways(LinkFaults { duplicate: 1.0, ..LinkFaults::default() }), RelayLimits::default())
            .await;
    let socket = client(addr).await;
    for i in 0..10 {
        socket.send(&datagram(i, 50)).await.unwrap();
    }
    let mut counts: HashMap<Vec<u8>, usize> = HashMap::new();
    for d in drain(&socket).await {
        *counts.entry(d).or_default() += 1;
    }
    assert_eq!(counts.len(), 10);
    assert!(counts.values().all(|&n| n == 4), "{:?}", counts.values().collect::<Vec<_>>());
}

#[tokio::test]
async fn delays_each_way_add_up_and_keep_the_order() {
    let delay = LinkFaults { delay: Duration::from_millis(50), ..LinkFaults::default() };
    let (_relay, addr) = relay(both_ways(delay), RelayLimits::default()).await;
    let socket = client(addr).await;
    let start = Instant::now();
    for i in 0..20 {
        socket.send(&datagram(i, 10)).await.unwrap();
    }
    let mut buf = [0u8; 64];
    let n = timeout(Duration::from_secs(5), socket.recv(&mut buf)).await.unwrap().unwrap();
    let rtt = start.elapsed();
    assert!(rtt >= Duration::from_millis(100), "round trip {rtt:?}");
    assert!(rtt < Duration::from_secs(2), "round trip {rtt:?}");
    let rest = drain(&socket).await;
    let order: Vec<Vec<u8>> = std::iter::once(buf[..n].to_vec()).chain(rest).collect();
    assert_eq!(order, (0..20).map(|i| datagram(i, 10)).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_partition_stops_traffic_until_healed() {
    let (relay, addr) = relay(RelayRules::default(), RelayLimits::default()).await;
    let socket = client(addr).await;
    socket.send(b"before").await.unwrap();
    assert_eq!(drain(&socket).await, vec![b"before".to_vec()]);
    relay.control().set_down(true);
    assert!(relay.control().is_down());
    socket.send(b"during").await.unwrap();
    assert!(drain(&socket).await.is_empty(), "a cut link carries nothing");
    relay.control().set_down(false);
    socket.send(b"after").await.unwrap();
    assert_eq!(drain(&socket).await, vec![b"after".to_vec()]);
    relay.shutdown().await;
    socket.send(b"stopped").await.unwrap();
    assert!(drain(&socket).await.is_empty(), "a stopped relay forwards nothing");
}

#[tokio::test]
async fn a_partition_also_drops_datagrams_already_delayed() {
    let delay = LinkFaults { delay: Duration::from_millis(100), ..LinkFaults::default() };
    let (relay, addr) = relay(both_ways(delay), RelayLimits::default()).await;
    let socket = client(addr).await;
    socket.send(b"in flight").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    relay.control().set_down(true);
    assert!(drain(&socket).await.is_empty());
}

#[tokio::test]
async fn faults_apply_only_inside_their_window() {
    let window = FaultWindow { from: Duration::ZERO, until: Some(Duration::from_millis(400)) };
    let rules = RelayRules { window, ..both_ways(LinkFaults { drop: 1.0, ..LinkFaults::default() }) };
    let (_relay, addr) = relay(rules, RelayLimits::default()).await;
    let socket = client(addr).await;
    socket.send(b"inside").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    socket.send(b"after").await.unwrap();
    assert_eq!(drain(&socket).await, vec![b"after".to_vec()]);
}

#[tokio::test]
async fn clients_get_their_own_replies_up_to_the_session_limit() {
    let limits = RelayLimits { max_sessions: 2, ..RelayLimits::default() };
    let (_relay, addr) = relay(RelayRules::default(), limits).await;
    let clients = [client(addr).await, client(addr).await, client(addr).await];
    for (i, c) in clients.iter().enumerate() {
        c.send(format!("client {i}").as_bytes()).await.unwrap();
        // One at a time, so the first two are the ones with sessions.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(drain(&clients[0]).await, vec![b"client 0".to_vec()]);
    assert_eq!(drain(&clients[1]).await, vec![b"client 1".to_vec()]);
    assert!(drain(&clients[2]).await.is_empty(), "a third session is refused");
}

#[tokio::test]
async fn idle_sessions_are_closed_and_make_room() {
    let limits =
        RelayLimits { max_sessions: 1, idle_timeout: Duration::from_millis(100), ..RelayLimits::default() };
    let (_relay, addr) = relay(RelayRules::default(), limits).await;
    let (first, second) = (client(addr).await, client(addr).await);
    first.send(b"first").await.unwrap();
    assert_eq!(drain(&first).await, vec![b"first".to_vec()]);
    second.send(b"second").await.unwrap();
    assert_eq!(drain(&second).await, vec![b"second".to_vec()], "the idle first session made room");
}

#[tokio::test]
async fn bad_rules_are_refused() {
    let rules = both_ways(LinkFaults { reorder: 2.0, ..LinkFaults::default() });
    let err = Relay::bind(loopback(), loopback(), rules, 0).unwrap_err().to_string();
    assert!(err.contains("reorder"), "{err}");
}

#[tokio::test]
async fn quic_works_through_a_lossy_relay() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertDir::new(dir.path());
    certs.init().unwrap();
    let settings = QuicSettings::default();
    let endpoint = |name: &str| {
        certs.issue(name).unwrap();
        QuicEndpoint::bind(loopback(), certs.identity(name).unwrap(), settings.clone()).unwrap()
    };
    let (shard, learner) = (endpoint("shard-0"), endpoint("learner-0"));
    let lossy = LinkFaults { drop: 0.05, ..LinkFaults::default() };
    let relay = Relay::bind(loopback(), shard.local_addr().unwrap(), both_ways(lossy), 5).unwrap();
    let via = relay.local_addr().unwrap();
    let _relay = relay.spawn();

    let accept = tokio::spawn(async move { shard.accept().await.unwrap().unwrap() });
    let to_shard = timeout(Duration::from_secs(20), learner.connect(via, "shard-0")).await.unwrap().unwrap();
    let grad: Vec<f32> = (0..1 << 18).map(|i| i as f32).collect();
    to_shard.send(&Msg::Hello { learner: LearnerId(0), shard: ShardId(0) }).await.unwrap();
    to_shard
        .send(&Msg::Push {
            learner: LearnerId(0),
            seq: 1,
            computed_on: Clock(1),
            values: grad.clone().into(),
            examples: 1,
            next_seq: 0,
            last: false,
        })
        .await
        .unwrap();
    for i in 0..20 {
        to_shard.send(&Msg::Pull { learner: LearnerId(i), seq: 1, last: false }).await.unwrap();
    }
    let from_learner = accept.await.unwrap();
    assert_eq!(from_learner.name(), "learner-0");
    let mut rx = from_learner.incoming(64);
    let (mut pulls, mut pushed) = (Vec::new(), None);
    for _ in 0..22 {
        match timeout(Duration::from_secs(20), rx.recv()).await.unwrap().unwrap() {
            Inbound::Control(Msg::Hello { learner: LearnerId(0), shard: ShardId(0) }) => {}
            Inbound::Control(Msg::Pull { learner, .. }) => pulls.push(learner),
            Inbound::Push { values, .. } => pushed = Some(values),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(pulls, (0..20).map(LearnerId).collect::<Vec<_>>(), "control stays in order");
    assert_eq!(&pushed.expect("the push")[..], &grad[..]);
}

/// Every datagram that arrives until none has for `QUIET`, with the time since `start` the
/// last arrived.
async fn drain_timed(socket: &UdpSocket, start: Instant) -> (usize, Duration) {
    let (mut count, mut last) = (0, Duration::ZERO);
    let mut buf = vec![0u8; 65_535];
    while let Ok(Ok(_)) = timeout(QUIET, socket.recv(&mut buf)).await {
        (count, last) = (count + 1, start.elapsed());
    }
    (count, last)
}

#[tokio::test]
async fn a_rated_link_spaces_datagrams_by_their_size_and_drops_past_its_buffer() {
    // 1 MB/s each way: a 1,000-byte datagram takes 1 ms to leave; 10 ms of delay each way, so
    // the link buffers a 20 ms round trip of backlog.
    let delay = LinkFaults { delay: Duration::from_millis(10), ..LinkFaults::default() };
    let rules = RelayRules { rate: 1e6, ..both_ways(delay) };
    let (_relay, addr) = relay(rules, RelayLimits::default()).await;
    let socket = client(addr).await;
    let start = Instant::now();
    for i in 0..100 {
        socket.send(&datagram(i, 996)).await.unwrap();
    }
    let (count, last) = drain_timed(&socket, start).await;
    // About 21 fit (20 ms of backlog and the one leaving); the burst may spread a little.
    assert!((15..100).contains(&count), "a burst of 100 at 1 ms each into 20 ms of buffer: {count} back");
    // They cannot come back faster than the rate lets them out, plus the two delays.
    let least = Duration::from_millis(count as u64) + Duration::from_millis(20);
    assert!(last >= least, "{count} datagrams back after {last:?}, sooner than the rate allows ({least:?})");
}

#[test]
fn a_rate_that_is_no_bandwidth_is_refused() {
    for rate in [-1.0, f64::NAN, f64::INFINITY] {
        let rules = RelayRules { rate, ..RelayRules::default() };
        let e = Relay::bind(loopback(), loopback(), rules, 1).unwrap_err().to_string();
        assert!(e.contains("rate"), "{rate}: {e}");
    }
}
