//! QUIC endpoints (quinn) with mutual TLS, carrying framed messages.
//!
//! Endpoints run on network threads of their own, one per core, shared by the process:
//! sealing, opening and copying packets never waits for an actor's work, and a node with many
//! peers spreads its connections over every core. Callers await sends and receives from any
//! runtime (an actix System is one thread). [`QuicEndpoint::abort`] stops an endpoint's work
//! there at once, without a word to its peers, as a crash would.
//!
//! Between two nodes there is one connection. Control messages travel in order on one
//! long-lived stream per direction; every weights, gradient or snapshot payload gets a stream
//! of its own, so control never waits behind a large payload. Flow-control windows bound what
//! a sender may have in flight: a slow receiver pushes back instead of buffering without bound.

use std::future::Future;
use std::net::{SocketAddr, UdpSocket};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{IdleTimeout, TokioRuntime, TransportConfig, VarInt};
use rustls::pki_types::CertificateDer;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use crate::TransportError;
use crate::frame::{Frame, HEADER_LEN};
use crate::reader::{Accepts, FrameSource, read_frame};
use crate::tls::{Identity, peer_name};
use crate::{Inbound, Kind, Msg, Role};

/// The process's network threads: a multi-threaded tokio runtime with a worker per core,
/// started by the first endpoint and shared by every endpoint after it.
fn network() -> Result<&'static tokio::runtime::Runtime, TransportError> {
    static NETWORK: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    NETWORK
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .thread_name("rudra-net")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| TransportError::Io(format!("cannot start the network threads: {e}")))
}

/// One endpoint's tasks on the network threads: quinn's drivers and the frame readers. They
/// all end, without a word to the peers, when `stop` is cancelled ([`QuicEndpoint::abort`]).
#[derive(Clone, Debug)]
struct NetworkRuntime {
    handle: tokio::runtime::Handle,
    stop: CancellationToken,
}

impl NetworkRuntime {
    fn spawn_until_stopped(&self, future: impl Future<Output = ()> + Send + 'static) {
        let stop = self.stop.clone();
        self.handle.spawn(async move {
            tokio::select! {
                () = future => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

impl quinn::Runtime for NetworkRuntime {
    fn new_timer(&self, at: std::time::Instant) -> Pin<Box<dyn quinn::AsyncTimer>> {
        let _in = self.handle.enter();
        TokioRuntime.new_timer(at)
    }

    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        self.spawn_until_stopped(future);
    }

    fn wrap_udp_socket(&self, socket: UdpSocket) -> std::io::Result<Arc<dyn quinn::AsyncUdpSocket>> {
        let _in = self.handle.enter();
        TokioRuntime.wrap_udp_socket(socket)
    }

    fn now(&self) -> std::time::Instant {
        TokioRuntime.now()
    }
}

/// Ack-eliciting packets a receiver may take in before it must acknowledge them (QUIC's
/// default is 1: an acknowledgement every second packet).
const ACK_AFTER: u32 = 8;

/// QUIC's recommended initial congestion window: 10 packets of 1472 bytes (RFC 9002).
const INITIAL_WINDOW: u64 = 14_720;

/// Transport settings (the `[transport]` configuration section).
#[derive(Clone, Debug, PartialEq)]
pub struct QuicSettings {
    /// Largest frame body accepted, in bytes; checked before anything is allocated.
    pub max_frame_bytes: u32,
    /// UDP socket send and receive buffer size requested from the kernel (which caps it at
    /// `net.core.rmem_max` and `wmem_max`; a smaller grant is logged as a warning).
    pub socket_buffer: usize,
    /// Per-stream receive window.
    pub stream_window: u32,
    /// Per-connection receive and send window: what a sender may have in flight. A window
    /// larger than the receiver's socket buffer (with the kernel's bookkeeping, twice
    /// `socket_buffer`) lets a burst overflow it on a fast path such as loopback, and every
    /// lost packet costs a retransmission and a halved congestion window. 8 MiB keeps 8 GB/s
    /// in flight at a 1 ms round trip.
    pub connection_window: u32,
    /// Largest UDP payload this endpoint accepts and MTU discovery probes for. Packets start
    /// at QUIC's safe 1200 bytes and grow to what the path carries: about 1450 on Ethernet,
    /// 9000 with jumbo frames, up to this bound on loopback. Every packet costs a pass through
    /// quinn and the kernel whatever its size, so bigger packets move more bytes per core.
    pub max_udp_payload: u16,
    /// Keep-alive interval.
    pub keep_alive: Duration,
    /// A connection silent for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for QuicSettings {
    fn default() -> Self {
        Self {
            max_frame_bytes: 256 << 20,
            socket_buffer: 4 << 20,
            stream_window: 8 << 20,
            connection_window: 8 << 20,
            max_udp_payload: 65_000,
            keep_alive: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

impl QuicSettings {
    fn transport(&self) -> Result<Arc<TransportConfig>, TransportError> {
        let mut t = TransportConfig::default();
        // Probe for paths larger than Ethernet's 1500 bytes (loopback, jumbo frames): fewer,
        // larger packets are most of QUIC's throughput. Packets start at the safe default.
        let mut mtu = quinn::MtuDiscoveryConfig::default();
        mtu.upper_bound(self.max_udp_payload);
        t.mtu_discovery_config(Some(mtu));
        // A connection's first window holds an MTU probe of the largest size beside a packet
        // of the size found so far. Under QUIC's 10-packet default one probe in flight fills
        // it, and quinn 0.11 then holds back even the packet that closes the connection while
        // other frames are pending (quinn-rs/quinn#2785): a node that said goodbye right after
        // its handshake never sent it, and its peer found the connection reset instead of
        // closed with the reason.
        let mut cubic = quinn::congestion::CubicConfig::default();
        cubic.initial_window(INITIAL_WINDOW.max(3 * u64::from(self.max_udp_payload)));
        t.congestion_controller_factory(Arc::new(cubic));
        // Ask the peer to acknowledge every few packets rather than every other one: each
        // acknowledgement is a datagram to send, receive, decrypt and process. Packets more
        // than one out of order are still acknowledged at once (the extension's default), so
        // loss is detected about as quickly as before.
        let mut ack = quinn::AckFrequencyConfig::default();
        ack.ack_eliciting_threshold(VarInt::from_u32(ACK_AFTER));
        t.ack_frequency_config(Some(ack));
        // Payloads go out whole, one stream after the other, as they were written, rather than
        // interleaved packet by packet: a receiver assembles one payload at a time, and the
        // first payload is complete as soon as its bytes could be. Control messages are not
        // held up: their stream has a higher priority than every payload's.
        t.send_fairness(false);
        t.stream_receive_window(VarInt::from_u32(self.stream_window))
            .receive_window(VarInt::from_u32(self.connection_window))
            .send_window(u64::from(self.connection_window))
            .max_concurrent_uni_streams(VarInt::from_u32(256))
            .max_concurrent_bidi_streams(VarInt::from_u32(0))
            .keep_alive_interval(Some(self.keep_alive))
            .max_idle_timeout(Some(
                IdleTimeout::try_from(self.idle_timeout)
                    .map_err(|e| TransportError::Tls(format!("idle timeout: {e}")))?,
            ));
        Ok(Arc::new(t))
    }
}

/// Bytes of frames (header and body) an endpoint's connections have sent and received: two
/// relaxed atomic additions per frame, read by whoever watches the node.
#[derive(Debug, Default)]
pub struct Traffic {
    sent: AtomicU64,
    received: AtomicU64,
}

impl Traffic {
    /// Frame bytes sent so far.
    #[must_use]
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Frame bytes received so far (valid frames and rejected ones alike).
    #[must_use]
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

/// The send priority of the control stream, above the payload streams' (0).
const CONTROL_PRIORITY: i32 = 1;

/// Error code sent when closing a stream that carried a bad frame.
const BAD_FRAME: u32 = 1;

/// Why a node closes a connection: the code of its QUIC close, which the peer reads with the
/// reason beside it ([`Peer::ended`]). Every node that exits says goodbye this way, so its
/// peers know at once, and why, rather than after the idle timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Goodbye {
    /// The node stops as asked, or the run is over.
    Stopped,
    /// The node failed; the reason says why.
    Failed,
    /// The scheduler stopped the run because of a failure; the reason says which.
    RunFailed,
    /// The scheduler refused this node for good: not a member of the job, another role, a
    /// join that does not match its certificate.
    Refused,
    /// Another live process holds this node's name; a node may try again, and is taken once
    /// that process is declared lost.
    Duplicate,
}

impl Goodbye {
    const ALL: [Self; 5] = [Self::Stopped, Self::Failed, Self::RunFailed, Self::Refused, Self::Duplicate];

    fn code(self) -> VarInt {
        VarInt::from_u32(self as u32)
    }
}

/// How a connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The peer closed it on purpose, saying why (`None`: a code this build does not know).
    Closed {
        /// Its goodbye.
        goodbye: Option<Goodbye>,
        /// Its reason.
        reason: String,
    },
    /// It was lost: timed out, reset by a restarted peer, or closed here.
    Lost(String),
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Closed { reason, .. } => f.write_str(reason),
            Self::Lost(why) => f.write_str(why),
        }
    }
}

/// This node's QUIC endpoint: accepts peers and connects to them.
#[derive(Clone)]
pub struct QuicEndpoint {
    endpoint: quinn::Endpoint,
    identity: Arc<Identity>,
    settings: QuicSettings,
    traffic: Arc<Traffic>,
    network: NetworkRuntime,
}

impl QuicEndpoint {
    /// Bind to `addr` with `identity`.
    pub fn bind(
        addr: SocketAddr,
        identity: Identity,
        settings: QuicSettings,
    ) -> Result<Self, TransportError> {
        let io = |e: std::io::Error| TransportError::Io(format!("cannot bind {addr}: {e}"));
        let socket = UdpSocket::bind(addr).map_err(io)?;
        crate::udp::socket_buffers(&socket, settings.socket_buffer).map_err(io)?;
        let transport = settings.transport()?;
        let server_tls = QuicServerConfig::try_from(identity.server_config()?)
            .map_err(|e| TransportError::Tls(format!("server config: {e}")))?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_tls));
        server.transport_config(Arc::clone(&transport));
        let client_tls = QuicClientConfig::try_from(identity.client_config()?)
            .map_err(|e| TransportError::Tls(format!("client config: {e}")))?;
        let mut client = quinn::ClientConfig::new(Arc::new(client_tls));
        client.transport_config(transport);
        // Connection ids and stateless-reset tokens keyed by secrets derived from the node's
        // key: a node that restarts at the same address recognises the ids its earlier process
        // handed out and resets those connections, so the peers notice at once (rather than
        // after the idle timeout) and connect again.
        let reset = identity.derived_secret("rudra stateless reset");
        let cid_key = identity.derived_secret("rudra connection ids");
        let cid_key = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7].map(|i| cid_key[i]));
        let mut config =
            quinn::EndpointConfig::new(Arc::new(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &reset)));
        config.cid_generator(move || Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key)));
        config
            .max_udp_payload_size(settings.max_udp_payload)
            .map_err(|e| TransportError::Io(format!("max UDP payload {}: {e}", settings.max_udp_payload)))?;
        let network = NetworkRuntime { handle: network()?.handle().clone(), stop: CancellationToken::new() };
        let socket = crate::udp::wrap(&network, socket, settings.max_udp_payload).map_err(io)?;
        let mut endpoint = quinn::Endpoint::new_with_abstract_socket(
            config,
            Some(server),
            socket,
            Arc::new(network.clone()),
        )
        .map_err(io)?;
        endpoint.set_default_client_config(client);
        Ok(Self { endpoint, identity: Arc::new(identity), settings, traffic: Arc::default(), network })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr, TransportError> {
        self.endpoint.local_addr().map_err(|e| TransportError::Io(e.to_string()))
    }

    /// This node's identity.
    #[must_use]
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The bytes every connection of this endpoint has sent and received.
    #[must_use]
    pub fn traffic(&self) -> Arc<Traffic> {
        Arc::clone(&self.traffic)
    }

    /// Connect to node `name` at `addr`; its certificate must name it and come from the CA.
    pub async fn connect(&self, addr: SocketAddr, name: &str) -> Result<Peer, TransportError> {
        let conn = self
            .endpoint
            .connect(addr, name)
            .map_err(|e| TransportError::Connection(format!("{name} at {addr}: {e}")))?
            .await
            .map_err(|e| TransportError::Connection(format!("{name} at {addr}: {e}")))?;
        self.peer(conn)
    }

    /// The next peer that connects and presents a certificate from the cluster CA; `None` once
    /// the endpoint is closed. A peer that fails the handshake is an `Err`; accept again.
    pub async fn accept(&self) -> Option<Result<Peer, TransportError>> {
        let incoming = self.endpoint.accept().await?;
        let addr = incoming.remote_address();
        Some(match incoming.await {
            Ok(conn) => self.peer(conn),
            Err(e) => Err(TransportError::Connection(format!("handshake with {addr} failed: {e}"))),
        })
    }

    fn peer(&self, conn: quinn::Connection) -> Result<Peer, TransportError> {
        let leaf = conn
            .peer_identity()
            .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
            .and_then(|certs| certs.first().cloned())
            .ok_or_else(|| TransportError::Tls("peer presented no certificate".into()))?;
        let name = peer_name(&leaf)?;
        let role = Role::of_name(&name)
            .ok_or_else(|| TransportError::Tls(format!("peer name {name:?} has no role")))?;
        Ok(Peer {
            link: Link {
                conn,
                name,
                role,
                local_role: self.identity.role(),
                max_frame: self.settings.max_frame_bytes,
                traffic: Arc::clone(&self.traffic),
            },
            control: Arc::new(Mutex::new(None)),
            network: self.network.clone(),
        })
    }

    /// Close every connection and stop accepting.
    pub fn close(&self) {
        self.say_goodbye(Goodbye::Stopped, "node stopping");
    }

    /// Close every connection with `goodbye` and `reason`, and stop accepting.
    pub fn say_goodbye(&self, goodbye: Goodbye, reason: &str) {
        self.endpoint.close(goodbye.code(), reason.as_bytes());
    }

    /// Stop at once, as a crashed process would: every connection of this endpoint and every
    /// reader of its frames ends, and nothing is said to the peers. They find the connections
    /// lost when those time out, or at once when a process restarted on the same address
    /// resets them.
    pub fn abort(&self) {
        self.network.stop.cancel();
    }

    /// Wait until every connection has finished closing.
    pub async fn wait_idle(&self) {
        self.endpoint.wait_idle().await;
    }
}

/// An authenticated connection to another node.
#[derive(Clone)]
pub struct Peer {
    link: Link,
    control: Arc<Mutex<Option<quinn::SendStream>>>,
    network: NetworkRuntime,
}

/// A connection and what checking its incoming frames takes: what the readers on the network
/// threads hold.
#[derive(Clone)]
struct Link {
    conn: quinn::Connection,
    name: String,
    role: Role,
    local_role: Role,
    max_frame: u32,
    traffic: Arc<Traffic>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Peer({} at {})", self.link.name, self.link.conn.remote_address())
    }
}

impl Peer {
    /// The peer's node name, from its certificate.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.link.name
    }

    /// The peer's role, from its certificate.
    #[must_use]
    pub fn role(&self) -> Role {
        self.link.role
    }

    /// Send a message: payloads on a stream of their own, control messages in order on the
    /// control stream. Waits while flow control says the peer is behind.
    pub async fn send(&self, msg: &Msg) -> Result<(), TransportError> {
        self.send_encoded(msg.kind(), msg.encode()?).await
    }

    /// Send an already encoded frame of `kind` (see [`Msg::encode`]). The connection takes the
    /// frame's chunks as they are: a payload is not copied before it is packetized.
    pub async fn send_encoded(&self, kind: Kind, frame: Frame) -> Result<(), TransportError> {
        let conn = &self.link.conn;
        let err = |e: &dyn std::fmt::Display| TransportError::Connection(format!("to {}: {e}", self.name()));
        let len = frame.len() as u64;
        let mut chunks = frame.into_chunks();
        if kind.is_payload() {
            let mut s = conn.open_uni().await.map_err(|e| err(&e))?;
            s.write_all_chunks(&mut chunks).await.map_err(|e| err(&e))?;
            s.finish().map_err(|e| err(&e))?;
        } else {
            let mut control = self.control.lock().await;
            if control.is_none() {
                let stream = conn.open_uni().await.map_err(|e| err(&e))?;
                stream.set_priority(CONTROL_PRIORITY).map_err(|e| err(&e))?;
                *control = Some(stream);
            }
            let stream = control.as_mut().expect("opened above");
            if let Err(e) = stream.write_all_chunks(&mut chunks).await {
                *control = None;
                return Err(err(&e));
            }
        }
        self.link.traffic.sent.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    /// Start receiving: every valid frame arrives on the returned channel in per-stream
    /// order. A bad frame closes its stream with a logged reason; the connection and the
    /// other streams carry on. The channel ends when the connection does; dropping it stops
    /// the reading. Frames are read and validated on the network threads.
    #[must_use]
    pub fn incoming(&self, capacity: usize) -> mpsc::Receiver<Inbound> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let (link, network) = (self.link.clone(), self.network.clone());
        self.network.spawn_until_stopped(async move {
            loop {
                let stream = tokio::select! {
                    stream = link.conn.accept_uni() => stream,
                    () = tx.closed() => return,
                };
                let Ok(stream) = stream else { return };
                let (link, tx) = (link.clone(), tx.clone());
                network.spawn_until_stopped(async move { link.read_stream(stream, tx).await });
            }
        });
        rx
    }

    /// The largest UDP payload the path to this peer has been found to carry.
    #[must_use]
    pub fn path_mtu(&self) -> u16 {
        self.link.conn.stats().path.current_mtu
    }

    /// The connection's statistics: packets, losses, congestion events, round-trip time.
    #[must_use]
    pub fn stats(&self) -> quinn::ConnectionStats {
        self.link.conn.stats()
    }

    /// Close the connection with `reason`: this node stops ([`Goodbye::Stopped`]).
    pub fn close(&self, reason: &str) {
        self.say_goodbye(Goodbye::Stopped, reason);
    }

    /// Close the connection with `goodbye` and `reason`.
    pub fn say_goodbye(&self, goodbye: Goodbye, reason: &str) {
        self.link.conn.close(goodbye.code(), reason.as_bytes());
    }

    /// Whether the connection has ended.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.link.conn.close_reason().is_some()
    }

    /// Wait until the connection is closed (by either side or by timeout); returns why.
    pub async fn closed(&self) -> String {
        self.link.conn.closed().await.to_string()
    }

    /// Wait until the connection is closed, and say how: closed by the peer with its goodbye
    /// and reason, or lost.
    pub async fn ended(&self) -> Ended {
        match self.link.conn.closed().await {
            quinn::ConnectionError::ApplicationClosed(close) => Ended::Closed {
                goodbye: Goodbye::ALL.into_iter().find(|g| g.code() == close.error_code),
                reason: String::from_utf8_lossy(&close.reason).into_owned(),
            },
            e => Ended::Lost(e.to_string()),
        }
    }
}

impl Link {
    async fn read_stream(&self, mut stream: quinn::RecvStream, tx: mpsc::Sender<Inbound>) {
        loop {
            let accepts = Accepts {
                from_name: &self.name,
                from: self.role,
                to: self.local_role,
                max_body: self.max_frame,
            };
            match read_frame(&mut Counted { stream: &mut stream, traffic: &self.traffic }, &accepts).await {
                Ok(Some(inbound)) => {
                    if tx.send(inbound).await.is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(peer = %self.name, "{e}; closing the stream");
                    let _ = stream.stop(VarInt::from_u32(BAD_FRAME));
                    return;
                }
            }
        }
    }
}

/// A QUIC receive stream as a frame source, counting the bytes it yields.
struct Counted<'a> {
    stream: &'a mut quinn::RecvStream,
    traffic: &'a Traffic,
}

impl FrameSource for Counted<'_> {
    async fn read_header(&mut self, header: &mut [u8; HEADER_LEN]) -> Result<bool, TransportError> {
        match self.stream.read_exact(header).await {
            Ok(()) => {}
            // A clean end of stream, or the connection closing, between two frames.
            Err(quinn::ReadExactError::FinishedEarly(0))
            | Err(quinn::ReadExactError::ReadError(quinn::ReadError::ConnectionLost(
                quinn::ConnectionError::ApplicationClosed(_) | quinn::ConnectionError::LocallyClosed,
            ))) => return Ok(false),
            Err(e) => return Err(TransportError::BadFrame(format!("reading a header: {e}"))),
        }
        self.traffic.received.fetch_add(HEADER_LEN as u64, Ordering::Relaxed);
        Ok(true)
    }

    async fn read_chunk(&mut self, max: usize) -> Result<Option<Bytes>, TransportError> {
        let chunk = (self.stream.read_chunk(max, true).await)
            .map_err(|e| TransportError::BadFrame(format!("reading a body: {e}")))?;
        Ok(chunk.map(|c| {
            self.traffic.received.fetch_add(c.bytes.len() as u64, Ordering::Relaxed);
            c.bytes
        }))
    }
}
