//! A UDP relay between two nodes that applies seeded link faults to what it forwards.
//!
//! Clients send to the relay's listening address instead of the upstream node. Each client
//! source address gets a session with its own socket towards upstream, so many clients can
//! share one relay and replies find their way back. Every datagram, in both directions,
//! takes a [`Fate`] from [`FaultDice`] under the rules for its direction; a
//! [`RelayControl`] cuts the link altogether (a partition) until it is healed. With a
//! [`rate`](RelayRules::rate) each direction is also a link of that bandwidth, buffering a
//! round trip's worth of backlog (at least [`MIN_BUFFER`]) and dropping beyond it.
//!
//! ```no_run
//! # async fn example() -> Result<(), rudra_transport::TransportError> {
//! use rudra_transport::{LinkFaults, Relay, RelayRules};
//! let lossy = LinkFaults { drop: 0.05, ..LinkFaults::default() };
//! let rules = RelayRules { to_upstream: lossy.clone(), to_client: lossy, ..RelayRules::default() };
//! let relay = Relay::bind("127.0.0.1:7000".parse().unwrap(), "127.0.0.1:5000".parse().unwrap(), rules, 42)?;
//! let control = relay.control();
//! let handle = relay.spawn();
//! control.set_down(true); // partition
//! control.set_down(false); // heal
//! handle.shutdown().await;
//! # Ok(())
//! # }
//! ```

use std::cmp::Ordering as CmpOrdering;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinHandle, JoinSet};
use tokio::time::{Instant, MissedTickBehavior};

use crate::TransportError;
use crate::faults::{Fate, FaultDice, FaultWindow, LinkFaults};
pub use pacing::MIN_BUFFER;
use pacing::Pacer;

mod pacing;

/// The largest datagram the relay forwards whole.
pub const MAX_DATAGRAM: usize = 65_535;

/// The kernel buffers asked for each relay socket, each way. A QUIC sender bursts up to its
/// congestion window at once (64 KiB per segmentation-offloaded send); with the kernel's
/// default 208 KiB a relay overflows and drops, and the endpoints' congestion control then
/// runs the link at a twentieth of its speed.
pub const SOCKET_BUFFER: usize = 4 << 20;

/// The fault rules of both directions and when they apply.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelayRules {
    /// Faults on datagrams from clients to the upstream node.
    pub to_upstream: LinkFaults,
    /// Faults on datagrams from the upstream node back to clients.
    pub to_client: LinkFaults,
    /// When the faults apply, from the start of [`Relay::run`]; outside it the relay is clean.
    pub window: FaultWindow,
    /// Bandwidth of each direction in bytes per second (0: unlimited). It applies always,
    /// inside the fault window or not: it is the link, not a fault.
    pub rate: f64,
}

impl RelayRules {
    /// Check both directions and the window.
    pub fn validate(&self) -> Result<(), TransportError> {
        self.to_upstream.validate()?;
        self.to_client.validate()?;
        if !(self.rate.is_finite() && self.rate >= 0.0) {
            let problem = format!("{} is not a bandwidth; use bytes per second, 0 for unlimited", self.rate);
            return Err(TransportError::FaultRule { field: "rate", problem });
        }
        self.window.validate()
    }

    /// Each direction's pacer: a round trip of backlog, the two delays together.
    fn pacers(&self) -> [Mutex<Option<Pacer>>; 2] {
        let round_trip = self.to_upstream.delay + self.to_client.delay;
        [(); 2].map(|()| Mutex::new(Pacer::new(self.rate, round_trip)))
    }
}

/// Bounds on what the relay holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayLimits {
    /// Most client sessions at once; datagrams from further clients are dropped. Each session
    /// holds a socket and a 64 KiB receive buffer.
    pub max_sessions: usize,
    /// Most bytes of delayed datagrams held at once; datagrams beyond it are dropped.
    pub max_queued_bytes: usize,
    /// A session without traffic either way for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for RelayLimits {
    fn default() -> Self {
        Self { max_sessions: 1024, max_queued_bytes: 32 << 20, idle_timeout: Duration::from_secs(60) }
    }
}

/// Cuts and heals a running relay's link. Clones share the switch.
#[derive(Clone, Debug, Default)]
pub struct RelayControl {
    down: Arc<AtomicBool>,
}

impl RelayControl {
    /// Take the link down (`true`): every datagram, including delayed ones still queued, is
    /// dropped until it is brought back up (`false`).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::Relaxed);
        tracing::info!(down, "relay link {}", if down { "cut" } else { "healed" });
    }

    /// Whether the link is down.
    #[must_use]
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }
}

/// A fault-injecting UDP relay, bound and ready to [`run`](Relay::run).
#[derive(Debug)]
pub struct Relay {
    listen: std::net::UdpSocket,
    upstream: SocketAddr,
    rules: RelayRules,
    seed: u64,
    limits: RelayLimits,
    control: RelayControl,
}

impl Relay {
    /// Listen on `listen` and forward to `upstream` under `rules` (validated here), rolling
    /// the dice from `seed`.
    pub fn bind(
        listen: SocketAddr,
        upstream: SocketAddr,
        rules: RelayRules,
        seed: u64,
    ) -> Result<Self, TransportError> {
        rules.validate()?;
        let io = |e: std::io::Error| TransportError::Io(format!("cannot bind the relay to {listen}: {e}"));
        let socket = std::net::UdpSocket::bind(listen).map_err(io)?;
        socket.set_nonblocking(true).map_err(io)?;
        widen(&socket);
        Ok(Self {
            listen: socket,
            upstream,
            rules,
            seed,
            limits: RelayLimits::default(),
            control: RelayControl::default(),
        })
    }

    /// Replace the default [`RelayLimits`].
    #[must_use]
    pub fn with_limits(mut self, limits: RelayLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The address clients send to.
    pub fn local_addr(&self) -> Result<SocketAddr, TransportError> {
        self.listen.local_addr().map_err(|e| TransportError::Io(e.to_string()))
    }

    /// The switch that cuts and heals this relay's link.
    #[must_use]
    pub fn control(&self) -> RelayControl {
        self.control.clone()
    }

    /// Run the relay in a task of its own. Must be called inside a tokio runtime.
    #[must_use]
    pub fn spawn(self) -> RelayHandle {
        let control = self.control();
        RelayHandle { control, task: tokio::spawn(self.run()) }
    }

    /// Forward datagrams until a socket fails. Dropping the future stops the relay and every
    /// task it started. Must run inside a tokio runtime.
    pub async fn run(self) -> Result<(), TransportError> {
        let listen =
            UdpSocket::from_std(self.listen).map_err(|e| TransportError::Io(format!("relay socket: {e}")))?;
        let local = listen.local_addr().map_err(|e| TransportError::Io(e.to_string()))?;
        let (queue, queued) = mpsc::unbounded_channel();
        let link = Arc::new(Link {
            listen,
            pacers: self.rules.pacers(),
            rules: self.rules,
            started: Instant::now(),
            control: self.control,
            queue,
            queued_bytes: AtomicUsize::new(0),
            max_queued_bytes: self.limits.max_queued_bytes,
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(deliver_delayed(Arc::clone(&link), queued));
        let mut sessions = Sessions {
            map: HashMap::new(),
            opened: 0,
            upstream: self.upstream,
            seed: self.seed,
            limits: self.limits,
        };
        let mut sweep =
            tokio::time::interval((sessions.limits.idle_timeout / 4).max(Duration::from_millis(10)));
        sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut buf = vec![0u8; MAX_DATAGRAM];
        tracing::info!(%local, upstream = %self.upstream, "relay forwarding");
        loop {
            tokio::select! {
                received = link.listen.recv_from(&mut buf) => {
                    let (len, client) = match received {
                        Ok(received) => received,
                        Err(e) if transient(&e) => {
                            tracing::debug!("relay: {e}");
                            continue;
                        }
                        Err(e) => return Err(TransportError::Io(format!("relay on {local}: {e}"))),
                    };
                    let Some(session) = sessions.get_or_open(client, &link, &mut tasks) else { continue };
                    session.touch(&link);
                    let route = Route::Upstream(Arc::clone(&session.socket));
                    link.forward(&mut session.dice, &link.rules.to_upstream, route, &buf[..len]).await;
                }
                _ = sweep.tick() => {
                    sessions.expire(&link);
                    // Forget the tasks of closed sessions.
                    while tasks.try_join_next().is_some() {}
                }
            }
        }
    }
}

/// A running relay.
#[derive(Debug)]
pub struct RelayHandle {
    control: RelayControl,
    task: JoinHandle<Result<(), TransportError>>,
}

impl RelayHandle {
    /// The switch that cuts and heals the link.
    #[must_use]
    pub fn control(&self) -> RelayControl {
        self.control.clone()
    }

    /// Stop the relay and wait until it has stopped. Dropping the handle stops it too.
    pub async fn shutdown(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What every forwarding task shares.
struct Link {
    listen: UdpSocket,
    rules: RelayRules,
    /// With a rate: the pacing of each direction (upstream, back to clients).
    pacers: [Mutex<Option<Pacer>>; 2],
    started: Instant,
    control: RelayControl,
    queue: mpsc::UnboundedSender<Delayed>,
    queued_bytes: AtomicUsize,
    max_queued_bytes: usize,
}

impl Link {
    /// Roll the fate of `bytes` under `rules` and carry it out.
    async fn forward(&self, dice: &mut FaultDice, rules: &LinkFaults, route: Route, bytes: &[u8]) {
        if self.control.is_down() {
            tracing::trace!(len = bytes.len(), "relay: link down, datagram dropped");
            return;
        }
        let fate = if self.rules.window.contains(self.started.elapsed()) {
            dice.roll(rules)
        } else {
            Fate::Deliver { delay: Duration::ZERO, copies: 1 }
        };
        let Fate::Deliver { delay, copies } = fate else {
            return tracing::trace!(len = bytes.len(), "relay: datagram dropped");
        };
        let Some(delay) = self.pace(&route, bytes.len()).map(|wait| delay + wait) else {
            return tracing::trace!(len = bytes.len(), "relay: link buffer full, datagram dropped");
        };
        if delay.is_zero() {
            route.send(self, bytes, copies).await;
        } else {
            self.delay(delay, copies, route, bytes);
        }
    }

    /// How long `len` bytes wait for the link's bandwidth on `route`'s direction (nothing
    /// without a rate), or `None` when its buffer is full.
    fn pace(&self, route: &Route, len: usize) -> Option<Duration> {
        let direction = usize::from(matches!(route, Route::Client(_)));
        let mut pacer = self.pacers[direction].lock().unwrap_or_else(PoisonError::into_inner);
        match pacer.as_mut() {
            Some(p) => p.admit(self.started.elapsed(), len),
            None => Some(Duration::ZERO),
        }
    }

    /// Queue `bytes` for sending after `delay`, within the memory bound.
    fn delay(&self, delay: Duration, copies: u8, route: Route, bytes: &[u8]) {
        let Some(at) = Instant::now().checked_add(delay) else { return };
        let held = self.queued_bytes.fetch_add(bytes.len(), Ordering::Relaxed);
        if held + bytes.len() > self.max_queued_bytes {
            tracing::debug!(held, limit = self.max_queued_bytes, "relay: delay queue full, datagram dropped");
            self.unqueue(bytes.len());
            return;
        }
        if self.queue.send(Delayed { at, copies, route, bytes: bytes.to_vec() }).is_err() {
            self.unqueue(bytes.len());
        }
    }

    fn unqueue(&self, len: usize) {
        self.queued_bytes.fetch_sub(len, Ordering::Relaxed);
    }

    /// Milliseconds since the relay started, the clock of session activity.
    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// Where a datagram goes.
enum Route {
    /// Upstream, through a session's socket.
    Upstream(Arc<UdpSocket>),
    /// Back to a client, from the listening socket.
    Client(SocketAddr),
}

impl Route {
    async fn send(&self, link: &Link, bytes: &[u8], copies: u8) {
        for _ in 0..copies {
            let sent = match self {
                Route::Upstream(socket) => socket.send(bytes).await,
                Route::Client(client) => link.listen.send_to(bytes, client).await,
            };
            if let Err(e) = sent {
                tracing::debug!("relay: cannot forward a datagram: {e}");
            }
        }
    }
}

/// A datagram waiting for its time.
struct Delayed {
    at: Instant,
    copies: u8,
    route: Route,
    bytes: Vec<u8>,
}

/// A queued datagram, earliest first, ties in the order they were queued.
struct Queued {
    at: Instant,
    seq: u64,
    datagram: Delayed,
}

impl Ord for Queued {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Queued {}

/// Send delayed datagrams when they are due.
async fn deliver_delayed(link: Arc<Link>, mut queued: mpsc::UnboundedReceiver<Delayed>) {
    let mut heap = BinaryHeap::new();
    let mut seq = 0u64;
    loop {
        let next = heap.peek().map(|q: &Queued| q.at);
        let due = async move {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            datagram = queued.recv() => match datagram {
                Some(datagram) => {
                    heap.push(Queued { at: datagram.at, seq, datagram });
                    seq += 1;
                }
                None => return,
            },
            () = due => {
                let now = Instant::now();
                while heap.peek().is_some_and(|q| q.at <= now) {
                    let Some(Queued { datagram, .. }) = heap.pop() else { break };
                    link.unqueue(datagram.bytes.len());
                    if link.control.is_down() {
                        tracing::trace!(len = datagram.bytes.len(), "relay: link down, delayed datagram dropped");
                    } else {
                        datagram.route.send(&link, &datagram.bytes, datagram.copies).await;
                    }
                }
            }
        }
    }
}

/// One client's path through the relay.
struct Session {
    socket: Arc<UdpSocket>,
    dice: FaultDice,
    last_active: Arc<AtomicU64>,
    replies: AbortHandle,
}

impl Session {
    fn touch(&self, link: &Link) {
        self.last_active.store(link.now_ms(), Ordering::Relaxed);
    }
}

/// The open sessions, by client address.
struct Sessions {
    map: HashMap<SocketAddr, Session>,
    opened: u64,
    upstream: SocketAddr,
    seed: u64,
    limits: RelayLimits,
}

impl Sessions {
    /// The session of `client`, opened if new; `None` if it cannot be opened.
    fn get_or_open(
        &mut self,
        client: SocketAddr,
        link: &Arc<Link>,
        tasks: &mut JoinSet<()>,
    ) -> Option<&mut Session> {
        let open = self.map.len();
        let entry = match self.map.entry(client) {
            Entry::Occupied(e) => return Some(e.into_mut()),
            Entry::Vacant(e) => e,
        };
        if open >= self.limits.max_sessions {
            tracing::debug!(%client, limit = self.limits.max_sessions, "relay: too many sessions, datagram dropped");
            return None;
        }
        let socket = match upstream_socket(self.upstream) {
            Ok(socket) => Arc::new(socket),
            Err(e) => {
                tracing::warn!(%client, "relay: cannot open a session: {e}");
                return None;
            }
        };
        // Two dice streams per session, one per direction, so each stays reproducible.
        let n = self.opened;
        self.opened += 1;
        let last_active = Arc::new(AtomicU64::new(link.now_ms()));
        let replies = tasks.spawn(relay_replies(
            Arc::clone(link),
            Arc::clone(&socket),
            client,
            FaultDice::with_stream(self.seed, 2 * n + 1),
            Arc::clone(&last_active),
        ));
        tracing::debug!(%client, session = n, "relay: session opened");
        Some(entry.insert(Session {
            socket,
            dice: FaultDice::with_stream(self.seed, 2 * n),
            last_active,
            replies,
        }))
    }

    /// Close sessions idle for longer than the limit.
    fn expire(&mut self, link: &Link) {
        let now = link.now_ms();
        let idle = u64::try_from(self.limits.idle_timeout.as_millis()).unwrap_or(u64::MAX);
        self.map.retain(|client, session| {
            let alive = now.saturating_sub(session.last_active.load(Ordering::Relaxed)) < idle;
            if !alive {
                session.replies.abort();
                tracing::debug!(%client, "relay: idle session closed");
            }
            alive
        });
    }
}

/// A socket connected to `upstream`, from an ephemeral port.
fn upstream_socket(upstream: SocketAddr) -> std::io::Result<UdpSocket> {
    let any = match upstream.ip() {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let socket = std::net::UdpSocket::bind(SocketAddr::new(any, 0))?;
    socket.connect(upstream)?;
    socket.set_nonblocking(true)?;
    widen(&socket);
    UdpSocket::from_std(socket)
}

/// Ask for [`SOCKET_BUFFER`] bytes of kernel buffer on `socket` each way; the kernel caps the
/// request at `net.core.rmem_max` / `wmem_max`, and a cap below it is logged once, with the
/// setting that raises it.
fn widen(socket: &std::net::UdpSocket) {
    static SAID: std::sync::Once = std::sync::Once::new();
    let s = socket2::SockRef::from(socket);
    let _ = (s.set_recv_buffer_size(SOCKET_BUFFER), s.set_send_buffer_size(SOCKET_BUFFER));
    // Linux reports twice what it grants (the rest is its bookkeeping).
    let got = s.recv_buffer_size().unwrap_or(0).min(s.send_buffer_size().unwrap_or(0)) / 2;
    if got < SOCKET_BUFFER {
        SAID.call_once(|| {
            tracing::warn!(
                "the relay's sockets got {got} bytes of buffer of the {SOCKET_BUFFER} asked: fast links will \
                 drop datagrams; raise net.core.rmem_max and net.core.wmem_max"
            );
        });
    }
}

/// Forward what upstream sends on a session's socket back to its client.
async fn relay_replies(
    link: Arc<Link>,
    socket: Arc<UdpSocket>,
    client: SocketAddr,
    mut dice: FaultDice,
    last_active: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        match socket.recv(&mut buf).await {
            Ok(len) => {
                last_active.store(link.now_ms(), Ordering::Relaxed);
                link.forward(&mut dice, &link.rules.to_client, Route::Client(client), &buf[..len]).await;
            }
            Err(e) if transient(&e) => tracing::debug!(%client, "relay: {e}"),
            Err(e) => {
                tracing::warn!(%client, "relay: session socket failed: {e}");
                return;
            }
        }
    }
}

/// Errors a UDP socket reports for an earlier datagram (an ICMP port unreachable) and
/// carries on after.
fn transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionRefused, ConnectionReset, Interrupted};
    matches!(e.kind(), ConnectionRefused | ConnectionReset | Interrupted)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's cap on a socket's buffer, from `/proc` (Linux).
    fn cap(name: &str) -> usize {
        let path = format!("/proc/sys/net/core/{name}");
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")).trim().parse().unwrap()
    }

    #[test]
    fn relay_sockets_ask_for_buffers_a_quic_burst_fits_in() {
        let (rmem, wmem) = (cap("rmem_max"), cap("wmem_max"));
        let relay = Relay::bind(
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.1:9".parse().unwrap(),
            RelayRules::default(),
            1,
        )
        .unwrap();
        let upstream = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        widen(&upstream);
        for socket in [&relay.listen, &upstream] {
            let s = socket2::SockRef::from(socket);
            // Linux reports twice what it grants.
            assert!(s.recv_buffer_size().unwrap() / 2 >= SOCKET_BUFFER.min(rmem));
            assert!(s.send_buffer_size().unwrap() / 2 >= SOCKET_BUFFER.min(wmem));
        }
    }
}
