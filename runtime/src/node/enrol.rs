//! A node's identity, and the scheduler's enrolment service.
//!
//! A node uses the certificate in its `--certs` directory when it has one (issued by hand with
//! `rudra-node cert issue`, or kept from an earlier enrolment). A shard or learner without one
//! enrols: it makes a key, presents its join token to the scheduler over TLS (checking the
//! scheduler's certificate against the CA it was given), and receives a certificate for the
//! name the scheduler assigns; it keeps it in `--certs` so that a restart needs no new token.
//! The scheduler, holding the CA key, issues its own certificate when it has none.
//!
//! The scheduler's side ([`Registrar`]) checks each token's MAC, expiry and role, counts its
//! uses (in memory and in `enrolments.log` in the run directory, so a restarted scheduler still
//! refuses a replayed token), assigns names, and logs every refusal with its reason.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write as _;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rudra_actors::InvalidSetting;
use rudra_transport::enrol::{self, EnrolRequest, NodeKey};
use rudra_transport::tls::{Authority, CertDir, Identity, check_name};
use rudra_transport::token::TokenRefusal;
use rudra_transport::{Role, TransportError};

use super::{NodeOptions, resolve, retry, scheduler_addr};
use crate::RuntimeError;

/// How long one whole enrolment exchange may take, the TLS handshake included: the scheduler
/// cuts it off then, and a node waits no longer for any one read or write.
const EXCHANGE: Duration = Duration::from_secs(5);
/// Enrolments served at once. A newcomer past it cuts off the oldest exchange still going, so
/// slow clients cannot hold the port: a real node's exchange takes milliseconds.
const CONCURRENT: usize = 16;
/// Enrolments one address may have going at once; a newcomer past it cuts off that address's
/// oldest.
const PER_ADDRESS: usize = 4;
/// The file, in the scheduler's run directory, that records every enrolment.
const LEDGER: &str = "enrolments.log";

/// The file in which an enrolled node remembers the name it was assigned.
fn assigned_file(certs: &Path, role: Role) -> PathBuf {
    certs.join(format!("{}.name", role.as_str()))
}

/// This node's identity: its certificate in `--certs`, or (the scheduler) one it issues
/// itself with the CA, or (a shard or learner with a join token) one the scheduler signs.
pub(super) async fn identity(opts: &NodeOptions, role: Role) -> Result<Identity, RuntimeError> {
    let certs = CertDir::new(&opts.certs);
    if role == Role::Scheduler {
        let name = opts.name.clone().unwrap_or_else(|| "scheduler".into());
        if certs.has_identity(&name) || !certs.has_ca_key() {
            return Ok(certs.identity(&name)?);
        }
        let identity = certs.authority()?.identity(&name)?;
        if let Err(e) = certs.save(&identity) {
            tracing::info!("keeping the certificate this scheduler issued itself in memory only: {e}");
        }
        return Ok(identity);
    }
    let remembered = || std::fs::read_to_string(assigned_file(&opts.certs, role)).ok();
    let known = opts.name.clone().or_else(|| remembered().map(|n| n.trim().to_owned()));
    if let Some(name) = &known
        && certs.has_identity(name)
    {
        return Ok(certs.identity(name)?);
    }
    let Some(token) = opts.token.as_deref().filter(|t| !t.is_empty()) else {
        // Hand-issued certificates: the name the node was given, or the role's first.
        let name = known.unwrap_or_else(|| format!("{}-0", role.as_str()));
        if !certs.has_identity(&name) {
            return Err(RuntimeError::Invalid(InvalidSetting::new(
                "--token",
                format!(
                    "no certificate for {name} ({name}.pem, {name}.key) in {} and no join token: enrol with \
                     --token (RUDRA_TOKEN) from `rudra-node cert token`, or issue one with `rudra-node cert issue`",
                    opts.certs.display()
                ),
            )));
        }
        return Ok(certs.identity(&name)?);
    };
    // Text that is not a token is refused here: no scheduler could take it. (A token for
    // another role goes to the scheduler, which refuses it and logs the attempt.)
    rudra_transport::token::parse(token)
        .map_err(|e| RuntimeError::Invalid(InvalidSetting::new("--token", e.to_string())))?;
    let ca_path = opts.ca.clone().unwrap_or_else(|| opts.certs.join("ca.pem"));
    let ca_pem = std::fs::read_to_string(&ca_path).map_err(|e| {
        RuntimeError::Invalid(InvalidSetting::new(
            "--ca",
            format!("cannot read the CA certificate {}: {e}; enrolling needs it", ca_path.display()),
        ))
    })?;
    let key = NodeKey::generate()?;
    let request =
        EnrolRequest { role, name: opts.name.clone(), token: token.to_owned(), csr: key.request()? };
    let target = scheduler_addr(opts)?;
    let (name, cert) =
        retry(&format!("the scheduler at {target} (enrolling)"), opts.connect_timeout, || async {
            let addr = resolve(target).await?;
            let (ca, req) = (ca_pem.clone(), request.clone());
            match tokio::task::spawn_blocking(move || enrol::enrol(addr, &ca, &req, EXCHANGE)).await {
                Ok(Err(TransportError::Connection(why))) => Err(why),
                // Refused, or a certificate: either is final.
                Ok(done) => Ok(done),
                Err(e) => Err(e.to_string()),
            }
        })
        .await??;
    let identity = Identity::from_pem(&name, &ca_pem, &cert, &key.pem())?;
    tracing::info!(name, "enrolled: the scheduler signed a certificate for this node");
    let keep = certs.save(&identity).and_then(|()| {
        let file = assigned_file(&opts.certs, role);
        std::fs::write(&file, &name).map_err(|e| TransportError::Tls(format!("{}: {e}", file.display())))
    });
    if let Err(e) = keep {
        tracing::warn!(
            "cannot keep the certificate in {} ({e}); a restart enrols again",
            opts.certs.display()
        );
    }
    Ok(identity)
}

/// Token uses and names given so far.
#[derive(Debug, Default)]
struct Ledger {
    uses: HashMap<String, u32>,
    names: BTreeSet<String>,
    file: Option<PathBuf>,
}

impl Ledger {
    /// The ledger kept in `file`, with what it already records. A line no scheduler writes
    /// (a token id that is not 16 hex digits, a name that is not a node's) is refused, naming
    /// the file and the line: the uses it counts would be wrong.
    fn open(file: Option<PathBuf>) -> Result<Self, RuntimeError> {
        let mut ledger = Self { file, ..Self::default() };
        let Some(path) = ledger.file.clone() else { return Ok(ledger) };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ledger),
            Err(e) => return Err(RuntimeError::Input { path, message: format!("cannot read: {e}") }),
        };
        for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let record = match line.split_whitespace().collect::<Vec<_>>()[..] {
                [id, name]
                    if id.len() == 16
                        && id.bytes().all(|b| b.is_ascii_hexdigit())
                        && check_name(name).is_ok() =>
                {
                    Some((id, name))
                }
                _ => None,
            };
            let Some((id, name)) = record else {
                let message = format!("line {}, {line:?}, is not an enrolment (TOKEN-ID NAME)", n + 1);
                return Err(RuntimeError::Input { path, message });
            };
            *ledger.uses.entry(id.to_owned()).or_default() += 1;
            ledger.names.insert(name.to_owned());
        }
        Ok(ledger)
    }

    /// Count a use of token `id` by `name`.
    fn record(&mut self, id: &str, name: &str) {
        *self.uses.entry(id.to_owned()).or_default() += 1;
        self.names.insert(name.to_owned());
        let Some(file) = &self.file else { return };
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .and_then(|mut f| writeln!(f, "{id} {name}").and_then(|()| f.sync_data()));
        if let Err(e) = written {
            tracing::warn!("cannot record the enrolment in {}: {e}", file.display());
        }
    }
}

/// The scheduler's enrolment service: signs certificates for nodes with valid join tokens.
pub(super) struct Registrar {
    authority: Authority,
    tls: Arc<rustls::ServerConfig>,
    ledger: Mutex<Ledger>,
    exchanges: Mutex<Exchanges>,
}

/// The enrolment exchanges going on, oldest first: each one's address, its socket to cut it
/// off with, and whether its request was read whole and decided (a token use may be recorded:
/// a newcomer does not cut it off).
#[derive(Default)]
struct Exchanges {
    next: u64,
    live: BTreeMap<u64, (IpAddr, TcpStream, bool)>,
}

impl Exchanges {
    /// Make room for an exchange from `ip` over `socket` (a handle on it), cutting off the
    /// oldest undecided exchange of its address past [`PER_ADDRESS`], else the oldest
    /// undecided of all past [`CONCURRENT`]; returns the new exchange's number.
    fn admit(&mut self, ip: IpAddr, socket: TcpStream) -> u64 {
        let mine = self.live.values().filter(|(a, ..)| *a == ip).count();
        if mine >= PER_ADDRESS || self.live.len() >= CONCURRENT {
            let ours = |a: &IpAddr| mine < PER_ADDRESS || *a == ip;
            let oldest = (self.live.iter()).find(|(_, (a, _, decided))| !decided && ours(a)).map(|(&n, _)| n);
            if let Some(n) = oldest {
                self.cut(n, "cut off for a newer enrolment");
            }
        }
        let n = self.next;
        self.next += 1;
        self.live.insert(n, (ip, socket, false));
        n
    }

    /// Exchange `n` read its request whole and is being answered: no newcomer cuts it off.
    fn decided(&mut self, n: u64) {
        if let Some((.., decided)) = self.live.get_mut(&n) {
            *decided = true;
        }
    }

    /// End exchange `n` if it is still going: its socket is shut down, so the next read or
    /// write of the thread serving it fails at once.
    fn cut(&mut self, n: u64, why: &str) {
        if let Some((ip, socket, _)) = self.live.remove(&n) {
            tracing::debug!(%ip, "enrolment {why}");
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

impl Registrar {
    /// The service of a scheduler whose `--certs` hold the CA key (`None` otherwise: nodes
    /// then need hand-issued certificates), recording enrolments in `run_dir`.
    pub(super) fn open(opts: &NodeOptions, identity: &Identity) -> Result<Option<Arc<Self>>, RuntimeError> {
        let certs = CertDir::new(&opts.certs);
        if !certs.has_ca_key() {
            tracing::info!("no CA key in {}: nodes need certificates of their own", opts.certs.display());
            return Ok(None);
        }
        let authority = certs.authority()?;
        let tls = Arc::new(identity.enrol_server_config(enrol::ALPN)?);
        let ledger = Ledger::open(opts.run_dir.as_ref().map(|d| d.join(LEDGER)))?;
        let (ledger, exchanges) = (Mutex::new(ledger), Mutex::default());
        Ok(Some(Arc::new(Self { authority, tls, ledger, exchanges })))
    }

    /// Answer one request: a certificate for the name asked for (or the next free one of the
    /// role), or why not.
    fn decide(&self, request: &EnrolRequest) -> Result<(String, String), String> {
        if request.token.is_empty() {
            return Err(
                "no join token: start the node with --token (RUDRA_TOKEN) from `rudra-node cert token`"
                    .into(),
            );
        }
        let token = self.authority.tokens().check(&request.token, request.role).map_err(|e| e.to_string())?;
        let mut ledger = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        if ledger.uses.get(&token.id).copied().unwrap_or(0) >= token.uses {
            return Err(TokenRefusal::Replayed { uses: token.uses }.to_string());
        }
        let role = request.role.as_str();
        let name = match &request.name {
            Some(name) => match check_name(name) {
                Ok(r) if r == request.role => name.clone(),
                _ => return Err(format!("{name:?} is not a {role} name (e.g. {role}-0)")),
            },
            None => {
                (0..).map(|n| format!("{role}-{n}")).find(|n| !ledger.names.contains(n)).unwrap_or_default()
            }
        };
        let cert = self.authority.sign_request(&request.csr, &name).map_err(|e| e.to_string())?;
        ledger.record(&token.id, &name);
        Ok((name, cert))
    }

    /// Serve enrolments over TCP on `listen` (the port the scheduler's QUIC endpoint uses for
    /// UDP) until the runtime stops.
    pub(super) fn serve(self: Arc<Self>, listen: SocketAddr) -> Result<(), RuntimeError> {
        let listener = std::net::TcpListener::bind(listen)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .and_then(tokio::net::TcpListener::from_std)
            .map_err(|e| {
                RuntimeError::Invalid(InvalidSetting::new(
                    "--listen",
                    format!("cannot serve enrolment on TCP {listen}: {e}; choose a free port"),
                ))
            })?;
        tracing::info!("enrolling nodes with join tokens on TCP {listen}");
        actix::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, peer)) => Arc::clone(&self).start(stream, peer),
                    // Out of file descriptors and the like: let the moment pass.
                    Err(e) => {
                        tracing::warn!("enrolment: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
        Ok(())
    }

    /// Serve the enrolment on `stream` on a thread of its own, cut off after [`EXCHANGE`]. A
    /// plain thread: nothing waits for it when the scheduler exits.
    fn start(self: Arc<Self>, stream: tokio::net::TcpStream, peer: SocketAddr) {
        let stream = stream.into_std().and_then(|s| s.set_nonblocking(false).map(|()| s));
        let Ok((stream, handle)) = stream.and_then(|s| s.try_clone().map(|h| (s, h))) else {
            return tracing::warn!(%peer, "enrolment: the connection failed as it was accepted");
        };
        let n = self.exchanges().admit(peer.ip(), handle);
        let registrar = Arc::clone(&self);
        let thread = std::thread::Builder::new().name("enrolment".into()).spawn(move || {
            registrar.answer(stream, peer, n);
            registrar.exchanges().live.remove(&n);
        });
        if let Err(e) = thread {
            tracing::warn!(%peer, "enrolment: {e}");
            return self.exchanges().cut(n, "not served: no thread");
        }
        actix::spawn(async move {
            tokio::time::sleep(EXCHANGE).await;
            self.exchanges().cut(n, &format!("cut off after {EXCHANGE:?}"));
        });
    }

    fn exchanges(&self) -> std::sync::MutexGuard<'_, Exchanges> {
        self.exchanges.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Answer exchange `n` on `stream`.
    fn answer(&self, stream: TcpStream, peer: SocketAddr, n: u64) {
        let decide = |r: &EnrolRequest| {
            self.exchanges().decided(n);
            self.decide(r)
        };
        let served = enrol::serve(stream, Arc::clone(&self.tls), EXCHANGE, decide);
        match served {
            Ok((request, Ok(name))) => {
                tracing::info!(%peer, role = request.role.as_str(), name, "enrolled a node");
            }
            Ok((request, Err(why))) => tracing::warn!(
                %peer,
                role = request.role.as_str(),
                asked = request.name.as_deref().unwrap_or("any name"),
                "refused enrolment: {why}"
            ),
            Err(e) => tracing::warn!(%peer, "refused enrolment: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected socket over loopback (its peer is kept open beside it).
    fn socket(listener: &std::net::TcpListener) -> (TcpStream, TcpStream) {
        let s = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (s, listener.accept().unwrap().0)
    }

    #[test]
    fn a_newcomer_cuts_off_the_oldest_undecided_exchange_of_its_address() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (here, elsewhere) = (IpAddr::from([127, 0, 0, 1]), IpAddr::from([10, 0, 0, 1]));
        let mut ex = Exchanges::default();
        let mut peers = Vec::new();
        let mut admit = |ex: &mut Exchanges, ip| {
            let (s, peer) = socket(&listener);
            peers.push(peer);
            ex.admit(ip, s)
        };
        let first: Vec<u64> = (0..PER_ADDRESS).map(|_| admit(&mut ex, here)).collect();
        let other = admit(&mut ex, elsewhere);
        // The oldest has read its request and is being answered: a token use may be recorded,
        // so the next newcomer of its address cuts off the one after it.
        ex.decided(first[0]);
        let newcomer = admit(&mut ex, here);
        let live: Vec<u64> = ex.live.keys().copied().collect();
        assert_eq!(live, [first[0], first[2], first[3], other, newcomer]);
        // Past the total, the oldest undecided of any address goes.
        let more: Vec<u64> =
            (0..CONCURRENT).map(|i| admit(&mut ex, IpAddr::from([10, 1, 0, i as u8]))).collect();
        assert_eq!(ex.live.len(), CONCURRENT);
        assert!(ex.live.contains_key(&first[0]), "a decided exchange is never cut off");
        assert!(ex.live.contains_key(more.last().unwrap()));
        assert!(!ex.live.contains_key(&other));
    }

    #[test]
    fn a_ledger_line_no_scheduler_writes_is_refused_naming_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(LEDGER);
        std::fs::write(
            &file,
            "0123456789abcdef learner-0
0123456789abcdef shard-1
",
        )
        .unwrap();
        let ledger = Ledger::open(Some(file.clone())).unwrap();
        assert_eq!(ledger.uses["0123456789abcdef"], 2);
        assert!(ledger.names.contains("shard-1"));
        for bad in ["0123456789abcdef ../../etc\n", "xyz learner-0\n", "0123456789abcdef learner-0 extra\n"] {
            std::fs::write(&file, format!("0123456789abcdef learner-0\n{bad}")).unwrap();
            let e = Ledger::open(Some(file.clone())).expect_err("refused").to_string();
            assert!(e.contains(LEDGER) && e.contains("line 2"), "{e}");
        }
        assert!(Ledger::open(Some(dir.path().join("absent"))).is_ok(), "no ledger yet: nothing enrolled");
    }
}
