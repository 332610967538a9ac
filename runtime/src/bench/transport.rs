//! Transport throughput: QUIC (mutual TLS, loopback) against plain TCP loopback and memcpy,
//! moving the same 4 MiB frames, beside the cost of sealing and opening those bytes with
//! AES-128-GCM that QUIC cannot avoid; and the receive-side cost of validating a frame and
//! viewing its payload against copying it.

use std::sync::Arc;
use std::time::Instant;

use rkyv::util::AlignedVec;
use rudra_transport::frame::{Frame, HEADER_LEN};
use rudra_transport::quic::{Peer, QuicEndpoint, QuicSettings};
use rudra_transport::tls::CertDir;
use rudra_transport::{Clock, Inbound, Kind, LearnerId, Msg, ShardId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{BenchRow, median};
use crate::RuntimeError;

/// Floats in one payload: 4 MiB.
const FLOATS: usize = 1 << 20;

fn io(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Config(format!("transport benchmark: {e}"))
}

fn mb_per_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

fn memcpy(frame: &[u8], frames: usize) -> f64 {
    let mut dst = vec![0u8; frame.len()];
    let start = Instant::now();
    for _ in 0..frames {
        dst.copy_from_slice(std::hint::black_box(frame));
        std::hint::black_box(&mut dst);
    }
    mb_per_s(frame.len() * frames, start.elapsed().as_secs_f64())
}

/// Bytes of QUIC headers and tag in a packet, about.
const PACKET_OVERHEAD: usize = 100;

/// What QUIC must do to every byte it moves, and TCP need not: seal it with the transport's
/// AES-128-GCM packet keys in packet-sized pieces, then open it again, on one core. MB/s of
/// payload.
fn seal_and_open(frame: &[u8], frames: usize) -> Result<f64, RuntimeError> {
    use rustls::quic::{Keys, Version};
    let (suite, quic) = rudra_transport::tls::provider()
        .cipher_suites
        .iter()
        .find_map(|s| match s {
            rustls::SupportedCipherSuite::Tls13(s)
                if s.common.suite == rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 =>
            {
                Some((*s, s.quic?))
            }
            _ => None,
        })
        .ok_or_else(|| io("the transport offers no AES-128-GCM for QUIC"))?;
    let sender = Keys::initial(Version::V1, suite, quic, &[7; 8], rustls::Side::Client).local.packet;
    let receiver = Keys::initial(Version::V1, suite, quic, &[7; 8], rustls::Side::Server).remote.packet;
    // A short header's bytes (flags, connection id, packet number) are the associated data.
    let header = [0x40; 13];
    // Packets as large as loopback carries by default.
    let size = usize::from(QuicSettings::default().max_udp_payload) - PACKET_OVERHEAD;
    let mut packet = Vec::with_capacity(size + sender.tag_len());
    let mut n = 0;
    let start = Instant::now();
    for _ in 0..frames {
        for piece in frame.chunks(size) {
            packet.clear();
            packet.extend_from_slice(piece);
            let tag = sender.encrypt_in_place(n, &header, &mut packet).map_err(io)?;
            packet.extend_from_slice(tag.as_ref());
            receiver.decrypt_in_place(n, &header, &mut packet).map_err(io)?;
            n += 1;
        }
    }
    Ok(mb_per_s(frame.len() * frames, start.elapsed().as_secs_f64()))
}

/// TCP: one-way stream of frames (push), and request/response round trips (pull).
async fn tcp(frame: &[u8], frames: usize) -> Result<(f64, f64), RuntimeError> {
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    let len = frame.len();
    let server = tokio::spawn({
        let frame = frame.to_vec();
        async move {
            let (mut s, _) = listener.accept().await?;
            s.set_nodelay(true)?;
            let mut buf = vec![0u8; len];
            for _ in 0..frames {
                s.read_exact(&mut buf).await?;
            }
            let mut req = [0u8; HEADER_LEN];
            for _ in 0..frames {
                s.read_exact(&mut req).await?;
                s.write_all(&frame).await?;
            }
            Ok::<_, std::io::Error>(())
        }
    });
    let mut c = TcpStream::connect(addr).await.map_err(io)?;
    c.set_nodelay(true).map_err(io)?;
    let start = Instant::now();
    for _ in 0..frames {
        c.write_all(frame).await.map_err(io)?;
    }
    // The server reads every push before it answers the first pull.
    let mut buf = vec![0u8; len];
    c.write_all(&[0u8; HEADER_LEN]).await.map_err(io)?;
    c.read_exact(&mut buf).await.map_err(io)?;
    let push = mb_per_s(len * frames, start.elapsed().as_secs_f64());
    let start = Instant::now();
    for _ in 1..frames {
        c.write_all(&[0u8; HEADER_LEN]).await.map_err(io)?;
        c.read_exact(&mut buf).await.map_err(io)?;
    }
    let pull = mb_per_s(len * (frames - 1), start.elapsed().as_secs_f64());
    server.await.map_err(io)?.map_err(io)?;
    Ok((push, pull))
}

/// Frames pushed, and answered by one pull, before anything is timed: the connection's
/// congestion window and path MTU start small and grow as data flows, and a node's
/// connections run warm.
const WARM_UP: usize = 16;

/// QUIC between a learner and a shard, once warm: pushes one way, then pull round trips.
async fn quic(
    certs: &CertDir,
    push: &Frame,
    weights: &Frame,
    frames: usize,
) -> Result<(f64, f64), RuntimeError> {
    let bind = "127.0.0.1:0".parse().map_err(io)?;
    let shard = QuicEndpoint::bind(bind, certs.identity("shard-0")?, QuicSettings::default())?;
    let learner = QuicEndpoint::bind(bind, certs.identity("learner-0")?, QuicSettings::default())?;
    let addr = shard.local_addr()?;
    let server = tokio::spawn({
        let weights = weights.clone();
        async move {
            let peer: Peer = shard.accept().await.ok_or_else(|| io("endpoint closed"))??;
            let mut rx = peer.incoming(64);
            // The warm-up's pull and the first timed one are answered once every push before
            // them is in (control overtakes payloads), so the push figure covers their arrival.
            let due = |pulls: usize| match pulls {
                0 => WARM_UP,
                1 => WARM_UP + frames,
                _ => 0,
            };
            let (mut pushes, mut pulls, mut asked) = (0, 0, 0);
            while pulls < frames + 1 {
                match rx.recv().await.ok_or_else(|| io("the learner left"))? {
                    Inbound::Push { values, .. } => {
                        std::hint::black_box(&values[..].len());
                        pushes += 1;
                    }
                    Inbound::Control(Msg::Pull { .. }) => asked += 1,
                    _ => {}
                }
                while asked > pulls && pushes >= due(pulls) {
                    peer.send_encoded(Kind::Weights, weights.clone()).await?;
                    pulls += 1;
                }
            }
            Ok::<_, RuntimeError>(pushes)
        }
    });
    let peer = learner.connect(addr, "shard-0").await?;
    let mut rx = peer.incoming(4);
    let pull = Msg::Pull { learner: LearnerId(0), seq: 1, last: false };
    for _ in 0..WARM_UP {
        peer.send_encoded(Kind::Push, push.clone()).await?;
    }
    peer.send(&pull).await?;
    rx.recv().await.ok_or_else(|| io("no weights"))?;
    let start = Instant::now();
    for _ in 0..frames {
        peer.send_encoded(Kind::Push, push.clone()).await?;
    }
    // Control travels on its own stream, so this pull may overtake pushes still in flight;
    // the shard answers it once they are all in.
    peer.send(&pull).await?;
    rx.recv().await.ok_or_else(|| io("no weights"))?;
    let push_rate = mb_per_s(push.len() * frames, start.elapsed().as_secs_f64());
    let stats = peer.stats();
    tracing::debug!(
        mtu = peer.path_mtu(),
        lost = stats.path.lost_packets,
        sent = stats.path.sent_packets,
        congestion_events = stats.path.congestion_events,
        cwnd = stats.path.cwnd,
        "after the pushes"
    );
    let start = Instant::now();
    for _ in 1..frames {
        peer.send(&pull).await?;
        match rx.recv().await {
            Some(Inbound::Weights { values, .. }) => std::hint::black_box(&values[..].len()),
            other => return Err(io(format!("expected weights, got {other:?}"))),
        };
    }
    let pull_rate = mb_per_s(weights.len() * (frames - 1), start.elapsed().as_secs_f64());
    let pushes = server.await.map_err(io)??;
    if pushes != frames + WARM_UP {
        return Err(io(format!("the shard received {pushes} of {} pushes", frames + WARM_UP)));
    }
    peer.close("done");
    learner.close();
    Ok((push_rate, pull_rate))
}

/// Nanoseconds to validate a `floats`-float push body and view its payload, and to copy it.
fn view_and_copy(floats: usize) -> Result<(f64, f64), RuntimeError> {
    let frame = Msg::Push {
        learner: LearnerId(0),
        seq: 1,
        computed_on: Clock(0),
        values: vec![1.5; floats].into(),
        examples: 1,
        next_seq: 0,
        last: false,
    }
    .encode()?
    .to_bytes();
    let mut body = AlignedVec::new();
    body.extend_from_slice(&frame[HEADER_LEN..]);
    let body = Arc::new(body);
    let rounds = 2000;
    let start = Instant::now();
    for _ in 0..rounds {
        let inbound = Inbound::decode_shared(Kind::Push, std::hint::black_box(&body), u32::MAX)?;
        if let Inbound::Push { values, .. } = inbound {
            std::hint::black_box(&values[..].as_ptr());
        }
    }
    let view = start.elapsed().as_secs_f64() * 1e9 / f64::from(rounds);
    let rounds = 50;
    let start = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(std::hint::black_box(&body[..]).to_vec());
    }
    let copy = start.elapsed().as_secs_f64() * 1e9 / f64::from(rounds);
    Ok((view, copy))
}

/// Run every measurement `repeats` times, interleaved, and report medians and ratios.
pub fn run(frames: usize, repeats: usize) -> Result<Vec<BenchRow>, RuntimeError> {
    let frames = frames.max(2);
    let dir = std::env::temp_dir().join(format!("rudra-bench-certs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let certs = CertDir::new(&dir);
    certs.init()?;
    certs.issue("shard-0")?;
    certs.issue("learner-0")?;
    let push = Msg::Push {
        learner: LearnerId(0),
        seq: 1,
        computed_on: Clock(0),
        values: vec![0.25; FLOATS].into(),
        examples: 1,
        next_seq: 0,
        last: false,
    }
    .encode()?;
    // The pushes go out as the transport sends them, chunks and all; TCP, memcpy and the cipher
    // move the same bytes in one buffer.
    let bytes = push.to_bytes();
    let weights = Msg::Weights {
        shard: ShardId(0),
        learner: LearnerId(0),
        seq: 1,
        clock: Clock(0),
        values: vec![0.5; FLOATS].into(),
    }
    .encode()?;
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(io)?;
    let mut m: [Vec<f64>; 9] = Default::default();
    for round in 0..repeats.max(1) {
        m[0].push(memcpy(&bytes, frames));
        let (tp, tl) = rt.block_on(tcp(&bytes, frames))?;
        let (qp, ql) = rt.block_on(quic(&certs, &push, &weights, frames))?;
        let (view, copy) = view_and_copy(FLOATS)?;
        let (small_view, _) = view_and_copy(1024)?;
        let aead = seal_and_open(&bytes, frames)?;
        for (i, v) in [tp, tl, qp, ql, view, copy, small_view, aead].into_iter().enumerate() {
            m[i + 1].push(v);
        }
        tracing::info!(
            round,
            "tcp {tp:.0}/{tl:.0} MB/s, quic {qp:.0}/{ql:.0} MB/s, view {view:.0} ns, copy {copy:.0} ns"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    let [memcpy, tcp_push, tcp_pull, quic_push, quic_pull, view, copy, small_view, aead] = m.map(median);
    let row = |name: &str, value, unit, ratio: Option<(f64, &str)>| BenchRow {
        name: name.into(),
        value,
        unit,
        ratio: ratio.map(|(r, b)| (r, b.to_owned())),
    };
    Ok(vec![
        row("memcpy of 4 MiB frames", memcpy, "MB/s", None),
        row("TCP loopback push, 4 MiB frames", tcp_push, "MB/s", Some((tcp_push / memcpy, "memcpy"))),
        row(
            "TCP loopback pull (request, 4 MiB reply)",
            tcp_pull,
            "MB/s",
            Some((tcp_pull / memcpy, "memcpy")),
        ),
        row(
            "AES-128-GCM seal + open of the same bytes, 1 core",
            aead,
            "MB/s",
            Some((aead / tcp_push, "TCP push")),
        ),
        row("QUIC push, 4 MiB gradient frames", quic_push, "MB/s", Some((quic_push / tcp_push, "TCP push"))),
        row("QUIC pull, 4 MiB weights", quic_pull, "MB/s", Some((quic_pull / tcp_pull, "TCP pull"))),
        row("copy a 4 MiB received body", copy, "ns", None),
        row("validate + view a 4 MiB body", view, "ns", Some((view / copy, "copy"))),
        row("validate + view a 4 KiB body", small_view, "ns", Some((small_view / view, "4 MiB view"))),
    ])
}
