//! Enrolment: a node that has the cluster's CA certificate and a join token, but no
//! certificate of its own, gets one from the scheduler.
//!
//! The node makes a key, connects over TCP with TLS 1.3 to the scheduler's port (the port its
//! QUIC endpoint uses for UDP), checks that the server's certificate names `scheduler` and
//! comes from the CA it was given, and sends its role, the name it asks for (none: the
//! scheduler assigns one), its token and a certificate signing request. The scheduler, which
//! holds the CA key, checks the token ([`crate::token`]) and answers with a certificate for
//! the name it assigns, or the reason it refuses. One request per connection; both sides are
//! bounded in size and time.
//!
//! ```text
//! → rudra-enrol 1\nrole ROLE\nname NAME\ntoken TOKEN\n\n<CSR PEM>
//! ← ok NAME\n\n<certificate PEM>      or      ← refused REASON\n
//! ```

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{CertificateParams, KeyPair};
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;

use crate::tls::{check_name, provider, tls_err};
use crate::{Role, TransportError};

/// ALPN protocol id of enrolment connections.
pub const ALPN: &[u8] = b"rudra-enrol/1";
/// The largest request or answer read.
pub const MAX_MESSAGE: u64 = 16 << 10;
/// The first line of a request.
const HELLO: &str = "rudra-enrol 1";

/// What a node sends to enrol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnrolRequest {
    /// The role it will run as.
    pub role: Role,
    /// The name it asks for; `None`: the scheduler assigns one.
    pub name: Option<String>,
    /// Its join token (may be empty: the scheduler then refuses it, saying so).
    pub token: String,
    /// A certificate signing request for its key, PEM.
    pub csr: String,
}

impl EnrolRequest {
    fn encode(&self) -> String {
        let name = self.name.as_deref().unwrap_or("");
        format!("{HELLO}\nrole {}\nname {name}\ntoken {}\n\n{}", self.role.as_str(), self.token, self.csr)
    }

    fn decode(text: &str) -> Result<Self, String> {
        let (head, csr) = text.split_once("\n\n").ok_or("a request without a blank line")?;
        let mut lines = head.lines();
        if lines.next() != Some(HELLO) {
            return Err(format!("a request that does not start with {HELLO:?}"));
        }
        let mut field = |key: &str| {
            lines
                .next()
                .and_then(|l| l.strip_prefix(key))
                .and_then(|l| l.strip_prefix(' ').or(if l.is_empty() { Some("") } else { None }))
                .map(str::to_owned)
                .ok_or(format!("a request without its {key} line"))
        };
        let role = match field("role")?.as_str() {
            "shard" => Role::Shard,
            "learner" => Role::Learner,
            "aggregator" => Role::Aggregator,
            other => {
                return Err(format!(
                    "a request to enrol as {other:?}: only shards, learners and aggregators enrol"
                ));
            }
        };
        let name = Some(field("name")?).filter(|n| !n.is_empty());
        let token = field("token")?;
        Ok(Self { role, name, token, csr: csr.to_owned() })
    }
}

/// A node's fresh key, and what it asks the scheduler to certify.
pub struct NodeKey(KeyPair);

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeKey(..)")
    }
}

impl NodeKey {
    /// A new key pair.
    pub fn generate() -> Result<Self, TransportError> {
        KeyPair::generate().map(Self).map_err(|e| tls_err("node key", e))
    }

    /// A certificate signing request for this key (it names nothing: the scheduler names the
    /// node).
    pub fn request(&self) -> Result<String, TransportError> {
        let params = CertificateParams::new(Vec::<String>::new()).map_err(|e| tls_err("request", e))?;
        params.serialize_request(&self.0).and_then(|r| r.pem()).map_err(|e| tls_err("request", e))
    }

    /// The key, PEM.
    #[must_use]
    pub fn pem(&self) -> String {
        self.0.serialize_pem()
    }
}

fn read_bounded(stream: &mut impl Read, what: &str) -> Result<String, TransportError> {
    let mut text = String::new();
    stream
        .take(MAX_MESSAGE + 1)
        .read_to_string(&mut text)
        .map_err(|e| TransportError::Connection(format!("reading {what}: {e}")))?;
    if text.len() as u64 > MAX_MESSAGE {
        return Err(TransportError::Connection(format!("{what} is over {MAX_MESSAGE} bytes")));
    }
    Ok(text)
}

/// Enrol at the scheduler at `addr`, trusting only the CA of `ca_pem`: returns the name it
/// assigned and the certificate, or [`TransportError::Refused`] with its reason. Blocks for at
/// most about `timeout`.
pub fn enrol(
    addr: SocketAddr,
    ca_pem: &str,
    request: &EnrolRequest,
    timeout: Duration,
) -> Result<(String, String), TransportError> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(ca.map_err(|e| tls_err("CA certificate", e))?).map_err(|e| tls_err("CA certificate", e))?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| tls_err("TLS versions", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN.to_vec()];
    let server = ServerName::try_from("scheduler").map_err(|e| tls_err("server name", e))?;
    let conn =
        rustls::ClientConnection::new(Arc::new(config), server).map_err(|e| tls_err("enrolment", e))?;
    let net = |e: std::io::Error| TransportError::Connection(format!("enrolling at {addr}: {e}"));
    let tcp = TcpStream::connect_timeout(&addr, timeout).map_err(net)?;
    tcp.set_read_timeout(Some(timeout)).map_err(net)?;
    tcp.set_write_timeout(Some(timeout)).map_err(net)?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(request.encode().as_bytes()).map_err(net)?;
    tls.conn.send_close_notify();
    tls.flush().map_err(net)?;
    let answer = read_bounded(&mut tls, "the scheduler's answer")?;
    let (first, cert) = answer.split_once('\n').unwrap_or((&answer, ""));
    if let Some(name) = first.strip_prefix("ok ") {
        check_name(name)?;
        Ok((name.to_owned(), cert.trim_start_matches('\n').to_owned()))
    } else if let Some(why) = first.strip_prefix("refused ") {
        Err(TransportError::Refused(why.to_owned()))
    } else {
        Err(TransportError::Connection(format!(
            "the scheduler at {addr} answered the enrolment with {first:?}"
        )))
    }
}

/// Serve one enrolment connection on `tcp` (blocking, each read and write bounded by
/// `timeout`): read the request, let `decide` answer it (`Ok((name, certificate PEM))` or
/// `Err(reason)`), send the answer. Returns what was asked and how it was answered, for the
/// log; `Err` when the connection failed or the request was not one.
pub fn serve(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    timeout: Duration,
    decide: impl FnOnce(&EnrolRequest) -> Result<(String, String), String>,
) -> Result<(EnrolRequest, Result<String, String>), TransportError> {
    let peer = tcp.peer_addr().map_or_else(|_| "a node".to_owned(), |a| a.to_string());
    let net = |e: std::io::Error| TransportError::Connection(format!("enrolment from {peer}: {e}"));
    tcp.set_read_timeout(Some(timeout)).map_err(net)?;
    tcp.set_write_timeout(Some(timeout)).map_err(net)?;
    let conn = rustls::ServerConnection::new(config).map_err(|e| tls_err("enrolment", e))?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let text = read_bounded(&mut tls, "an enrolment request")?;
    let request = match EnrolRequest::decode(&text) {
        Ok(r) => r,
        Err(why) => {
            let _ = tls.write_all(format!("refused {why}\n").as_bytes());
            tls.conn.send_close_notify();
            let _ = tls.flush();
            return Err(TransportError::Connection(format!("enrolment from {peer}: {why}")));
        }
    };
    let outcome = decide(&request);
    let answer = match &outcome {
        Ok((name, cert)) => format!("ok {name}\n\n{cert}"),
        Err(why) => format!("refused {}\n", why.replace('\n', " ")),
    };
    tls.write_all(answer.as_bytes()).map_err(net)?;
    tls.conn.send_close_notify();
    tls.flush().map_err(net)?;
    Ok((request, outcome.map(|(name, _)| name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{Authority, Identity};
    use rcgen::KeyUsagePurpose;

    #[test]
    fn requests_read_back_and_bad_ones_are_named() {
        let r = EnrolRequest {
            role: Role::Learner,
            name: None,
            token: "t".into(),
            csr: "-----BEGIN CERTIFICATE REQUEST-----\nx\n".into(),
        };
        assert_eq!(EnrolRequest::decode(&r.encode()), Ok(r.clone()));
        let named = EnrolRequest { name: Some("learner-3".into()), token: String::new(), ..r.clone() };
        assert_eq!(EnrolRequest::decode(&named.encode()), Ok(named));
        assert!(EnrolRequest::decode("hello").unwrap_err().contains("blank line"));
        let as_scheduler = r.encode().replace("role learner", "role scheduler");
        assert!(
            EnrolRequest::decode(&as_scheduler)
                .unwrap_err()
                .contains("only shards, learners and aggregators")
        );
        let no_token = r.encode().replace("token t\n", "");
        assert!(EnrolRequest::decode(&no_token).unwrap_err().contains("token"));
    }

    #[test]
    fn a_signed_request_names_the_node_the_authority_chose() {
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca = params.self_signed(&ca_key).unwrap();
        let authority = Authority::new(&ca.pem(), &ca_key.serialize_pem()).unwrap();
        let key = NodeKey::generate().unwrap();
        let cert = authority.sign_request(&key.request().unwrap(), "learner-7").unwrap();
        let id = Identity::from_pem("learner-7", authority.ca_pem(), &cert, &key.pem()).unwrap();
        assert_eq!((id.name(), id.role()), ("learner-7", Role::Learner));
        id.client_config().unwrap();
        assert!(authority.sign_request("not a request", "learner-7").is_err());
        assert!(authority.sign_request(&key.request().unwrap(), "mallory").is_err());
    }
}
