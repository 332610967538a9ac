//! The cluster's own certificate authority and each node's identity, for mutual TLS.
//!
//! A certificate directory holds `ca.pem` and `ca.key` (the CA, made once by
//! `rudra-node cert init`) and `NAME.pem` / `NAME.key` per node (`rudra-node cert issue`).
//! A node's name starts with its role (`scheduler`, `shard-0`, `learner-3`); peers are
//! accepted only with a certificate from the same CA, and their role is read from it.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType, ExtendedKeyUsagePurpose,
    IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::token::TokenKey;
use crate::{Role, TransportError};

/// ALPN protocol id of Rudra's QUIC connections.
pub const ALPN: &[u8] = b"rudra/1";

pub(crate) fn tls_err(what: &str, e: impl std::fmt::Display) -> TransportError {
    TransportError::Tls(format!("{what}: {e}"))
}

fn io_err(path: &Path, e: std::io::Error) -> TransportError {
    TransportError::Tls(format!("{}: {e}", path.display()))
}

fn write_private(path: &Path, contents: &str) -> Result<(), TransportError> {
    fs::write(path, contents).map_err(|e| io_err(path, e))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(|e| io_err(path, e))?;
    }
    Ok(())
}

fn read(path: &Path) -> Result<String, TransportError> {
    fs::read_to_string(path).map_err(|e| {
        TransportError::Tls(format!(
            "cannot read {}: {e}; create certificates with `rudra-node cert init` and `rudra-node cert issue`",
            path.display()
        ))
    })
}

/// Check a node name: a role prefix, then letters, digits, `-` or `_`.
pub fn check_name(name: &str) -> Result<Role, TransportError> {
    let ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    match Role::of_name(name) {
        Some(role) if ok => Ok(role),
        _ => Err(TransportError::Tls(format!(
            "node name {name:?} must start with scheduler, shard or learner (e.g. shard-0) and use only letters, digits, - and _"
        ))),
    }
}

/// A directory of cluster certificates.
#[derive(Clone, Debug)]
pub struct CertDir {
    dir: PathBuf,
}

impl CertDir {
    /// The certificates in `dir`.
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// Create the cluster CA (`ca.pem`, `ca.key`). Refuses to replace an existing CA.
    pub fn init(&self) -> Result<(), TransportError> {
        fs::create_dir_all(&self.dir).map_err(|e| io_err(&self.dir, e))?;
        if self.path("ca.key").exists() {
            return Err(TransportError::Tls(format!(
                "{} already holds a CA; remove it first to start a new cluster",
                self.dir.display()
            )));
        }
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| tls_err("CA parameters", e))?;
        params.distinguished_name.push(DnType::CommonName, "Rudra cluster CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().map_err(|e| tls_err("CA key", e))?;
        let cert = params.self_signed(&key).map_err(|e| tls_err("CA certificate", e))?;
        write_private(&self.path("ca.key"), &key.serialize_pem())?;
        fs::write(self.path("ca.pem"), cert.pem()).map_err(|e| io_err(&self.path("ca.pem"), e))
    }

    /// Issue `NAME.pem` / `NAME.key` for node `name`, signed by the CA.
    pub fn issue(&self, name: &str) -> Result<(), TransportError> {
        let (cert, key) = self.authority()?.issue(name)?;
        write_private(&self.path(&format!("{name}.key")), &key)?;
        let pem = self.path(&format!("{name}.pem"));
        fs::write(&pem, cert).map_err(|e| io_err(&pem, e))
    }

    /// The CA, ready to sign: needs `ca.pem` and `ca.key`.
    pub fn authority(&self) -> Result<Authority, TransportError> {
        let ca_pem = read(&self.path("ca.pem"))?;
        Authority::new(&ca_pem, &read(&self.path("ca.key"))?)
    }

    /// Whether the directory holds the CA's key (this node can sign certificates).
    #[must_use]
    pub fn has_ca_key(&self) -> bool {
        self.path("ca.key").is_file()
    }

    /// Whether node `name`'s certificate and key are here.
    #[must_use]
    pub fn has_identity(&self, name: &str) -> bool {
        self.path(&format!("{name}.pem")).is_file() && self.path(&format!("{name}.key")).is_file()
    }

    /// The CA certificate (`ca.pem`).
    pub fn ca_pem(&self) -> Result<String, TransportError> {
        read(&self.path("ca.pem"))
    }

    /// Keep `identity` here (`ca.pem`, `NAME.pem`, `NAME.key`) so that the node finds it when
    /// it starts again.
    pub fn save(&self, identity: &Identity) -> Result<(), TransportError> {
        fs::create_dir_all(&self.dir).map_err(|e| io_err(&self.dir, e))?;
        let pem = |ders: &[CertificateDer<'_>]| -> String {
            ders.iter().map(|d| pem_block("CERTIFICATE", d.as_ref())).collect()
        };
        let name = identity.name();
        write_private(
            &self.path(&format!("{name}.key")),
            &pem_block("PRIVATE KEY", identity.key.secret_der()),
        )?;
        for (file, contents) in
            [(format!("{name}.pem"), pem(&identity.chain)), ("ca.pem".into(), pem(&identity.ca))]
        {
            let path = self.path(&file);
            fs::write(&path, contents).map_err(|e| io_err(&path, e))?;
        }
        Ok(())
    }

    /// Load node `name`'s identity.
    pub fn identity(&self, name: &str) -> Result<Identity, TransportError> {
        let key_file = format!("{name}.key");
        Identity::from_pem(
            name,
            &read(&self.path("ca.pem"))?,
            &read(&self.path(&format!("{name}.pem")))?,
            &read(&self.path(&key_file))?,
        )
    }
}

/// `der` as a PEM block of `label`.
fn pem_block(label: &str, der: &[u8]) -> String {
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    pem::encode_config(&pem::Pem::new(label, der), config)
}

/// The cluster CA, able to sign: what the scheduler enrols nodes with.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    tokens: TokenKey,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Authority(..)")
    }
}

/// The certificate parameters of node `name`: named by its one DNS name, for client and
/// server authentication.
fn node_params(name: &str) -> Result<CertificateParams, TransportError> {
    check_name(name)?;
    let mut params =
        CertificateParams::new(vec![name.to_owned()]).map_err(|e| tls_err("node parameters", e))?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages =
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    Ok(params)
}

impl Authority {
    /// The CA of `ca_pem` with its key `ca_key_pem`.
    pub fn new(ca_pem: &str, ca_key_pem: &str) -> Result<Self, TransportError> {
        let key = KeyPair::from_pem(ca_key_pem).map_err(|e| tls_err("CA key", e))?;
        let tokens = TokenKey::from_ca_key(&key.serialize_der());
        let issuer = Issuer::from_ca_cert_pem(ca_pem, key).map_err(|e| tls_err("CA", e))?;
        Ok(Self { issuer, ca_pem: ca_pem.to_owned(), tokens })
    }

    /// The CA certificate.
    #[must_use]
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The key that mints and checks this cluster's join tokens.
    #[must_use]
    pub fn tokens(&self) -> &TokenKey {
        &self.tokens
    }

    /// A new key and a certificate for node `name`: `(certificate PEM, key PEM)`.
    pub fn issue(&self, name: &str) -> Result<(String, String), TransportError> {
        let key = KeyPair::generate().map_err(|e| tls_err("node key", e))?;
        let cert =
            node_params(name)?.signed_by(&key, &self.issuer).map_err(|e| tls_err("node certificate", e))?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Node `name`'s identity, issued now and held in memory.
    pub fn identity(&self, name: &str) -> Result<Identity, TransportError> {
        let (cert, key) = self.issue(name)?;
        Identity::from_pem(name, &self.ca_pem, &cert, &key)
    }

    /// A certificate for the key of `csr_pem` (whose signature proves the requester holds it),
    /// naming node `name`: whatever names the request asked for are ignored.
    pub fn sign_request(&self, csr_pem: &str, name: &str) -> Result<String, TransportError> {
        let mut csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| tls_err("certificate signing request", e))?;
        csr.params = node_params(name)?;
        Ok(csr.signed_by(&self.issuer).map_err(|e| tls_err("node certificate", e))?.pem())
    }
}

/// A node's TLS identity: its name and role, its certificate chain and key, the cluster CA.
#[derive(Clone, Debug)]
pub struct Identity {
    name: String,
    role: Role,
    ca: Vec<CertificateDer<'static>>,
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
}

/// The cryptography of every connection between nodes: aws-lc's TLS 1.3 suites (its AES-GCM
/// uses the widest vector AES the processor has, AVX-512 included), AES-128-GCM first: every
/// byte between nodes is sealed and opened once, and ten AES rounds cost less than AES-256's
/// fourteen.
#[must_use]
pub fn provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.cipher_suites.sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(provider)
}

impl Identity {
    /// Node `name`'s identity from PEM text: the CA certificate, its certificate chain, its key.
    pub fn from_pem(
        name: &str,
        ca_pem: &str,
        chain_pem: &str,
        key_pem: &str,
    ) -> Result<Self, TransportError> {
        let role = check_name(name)?;
        let certs = |what: &str, pem: &str| -> Result<Vec<CertificateDer<'static>>, TransportError> {
            CertificateDer::pem_slice_iter(pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| tls_err(what, e))
        };
        let ca = certs("ca.pem", ca_pem)?;
        let chain = certs(&format!("{name}.pem"), chain_pem)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| tls_err(&format!("{name}.key"), e))?;
        Ok(Identity { name: name.to_owned(), role, ca, chain, key: Arc::new(key) })
    }

    /// TLS 1.3 server settings for enrolment: this node's certificate, no client certificate
    /// asked (the client has none yet; it proves itself with a join token), ALPN `alpn`.
    pub fn enrol_server_config(&self, alpn: &[u8]) -> Result<rustls::ServerConfig, TransportError> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| tls_err("TLS versions", e))?
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| tls_err("server certificate", e))?;
        cfg.alpn_protocols = vec![alpn.to_vec()];
        Ok(cfg)
    }

    /// A secret of this node's own, the same in every process that runs with its certificate
    /// and key, and telling nothing about the key: the key's SHA-256 under a label of its own.
    #[must_use]
    pub fn derived_secret(&self, label: &str) -> [u8; 32] {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(label.as_bytes());
        ctx.update(&[0]);
        ctx.update(self.key.secret_der());
        let mut out = [0; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }

    /// The node name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node role.
    #[must_use]
    pub fn role(&self) -> Role {
        self.role
    }

    fn roots(&self) -> Result<Arc<RootCertStore>, TransportError> {
        let mut roots = RootCertStore::empty();
        for c in &self.ca {
            roots.add(c.clone()).map_err(|e| tls_err("CA certificate", e))?;
        }
        Ok(Arc::new(roots))
    }

    /// TLS 1.3 server settings that require a client certificate from the cluster CA.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, TransportError> {
        let verifier = WebPkiClientVerifier::builder_with_provider(self.roots()?, provider())
            .build()
            .map_err(|e| tls_err("client verifier", e))?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| tls_err("TLS versions", e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| tls_err("server certificate", e))?;
        cfg.alpn_protocols = vec![ALPN.to_vec()];
        Ok(cfg)
    }

    /// TLS 1.3 client settings that trust only the cluster CA and present this node's certificate.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TransportError> {
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| tls_err("TLS versions", e))?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| tls_err("client certificate", e))?;
        cfg.alpn_protocols = vec![ALPN.to_vec()];
        Ok(cfg)
    }
}

/// The node name in a peer's (already CA-verified) leaf certificate: its first DNS name.
pub fn peer_name(leaf: &CertificateDer<'_>) -> Result<String, TransportError> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).map_err(|e| tls_err("peer certificate", e))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| tls_err("peer certificate names", e))?
        .ok_or_else(|| TransportError::Tls("peer certificate has no subject alternative name".into()))?;
    san.value
        .general_names
        .iter()
        .find_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some((*d).to_owned()),
            _ => None,
        })
        .ok_or_else(|| TransportError::Tls("peer certificate names no node".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_load_and_read_back_names() {
        let dir = tempfile::tempdir().unwrap();
        let certs = CertDir::new(dir.path());
        certs.init().unwrap();
        assert!(certs.init().is_err(), "never overwrite a CA");
        certs.issue("shard-0").unwrap();
        assert!(certs.issue("mallory").is_err(), "names carry a role");
        assert!(certs.issue("shard-0/../x").is_err());
        let id = certs.identity("shard-0").unwrap();
        assert_eq!((id.name(), id.role()), ("shard-0", Role::Shard));
        assert_eq!(peer_name(&id.chain[0]).unwrap(), "shard-0");
        id.server_config().unwrap();
        id.client_config().unwrap();
        let missing = certs.identity("learner-9").unwrap_err().to_string();
        assert!(missing.contains("learner-9.pem") && missing.contains("cert issue"), "{missing}");
    }
}
