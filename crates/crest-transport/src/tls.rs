//! TLS 1.3 for every crest link: a cluster CA, node certificates, rustls/quinn configs.
//!
//! One crypto provider is compiled in (ring); rustls panics at start when two are. Nodes present
//! a certificate signed by the cluster CA whose subject names include [`SERVER_NAME`]; clients
//! (child nodes, producers, consumers) connect with that server name and trust only the CA, so
//! a peer is authenticated as a member of the cluster whatever address it is reached at.
//! `crest local` makes an ephemeral CA in memory; `crest certs` writes one to files.

use crate::TransportError;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;

/// The TLS server name every node certificate carries and every client asks for.
pub const SERVER_NAME: &str = "crest";
/// The ALPN protocol of crest links.
pub const ALPN: &[u8] = b"crest/1";

/// A certificate and its private key, PEM encoded.
#[derive(Clone, Debug)]
pub struct CertifiedKey {
    /// The certificate chain (PEM).
    pub cert_pem: String,
    /// The private key (PEM).
    pub key_pem: String,
}

/// A cluster certificate authority that signs node certificates.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
}

impl CertificateAuthority {
    /// Makes a new CA with a fresh key.
    ///
    /// # Errors
    /// [`TransportError::Tls`] if key generation or signing fails.
    pub fn generate() -> Result<CertificateAuthority, TransportError> {
        let key = KeyPair::generate().map_err(tls_error)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(tls_error)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "crest cluster CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).map_err(tls_error)?;
        let key_pem = key.serialize_pem();
        Ok(CertificateAuthority {
            cert_pem: cert.pem(),
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads a CA written by [`CertificateAuthority::cert_pem`] and [`CertificateAuthority::key_pem`].
    ///
    /// # Errors
    /// [`TransportError::Tls`] if either PEM does not parse.
    pub fn load(cert_pem: &str, key_pem: &str) -> Result<CertificateAuthority, TransportError> {
        let key = KeyPair::from_pem(key_pem).map_err(tls_error)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(tls_error)?;
        Ok(CertificateAuthority {
            issuer,
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
        })
    }

    /// The CA certificate (PEM): what clients trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key (PEM): keep it off the nodes.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Issues a node certificate for `name`, valid for [`SERVER_NAME`], `name` and `hosts`
    /// (DNS names or IP addresses).
    ///
    /// # Errors
    /// [`TransportError::Tls`] if a host is not a valid subject name or signing fails.
    pub fn issue(&self, name: &str, hosts: &[String]) -> Result<CertifiedKey, TransportError> {
        let mut names = vec![
            SERVER_NAME.to_string(),
            name.to_string(),
            "localhost".to_string(),
        ];
        names.extend(hosts.iter().cloned());
        names.sort();
        names.dedup();
        let mut params = CertificateParams::new(names).map_err(tls_error)?;
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().map_err(tls_error)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(tls_error)?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn tls_error(error: impl std::fmt::Display) -> TransportError {
    TransportError::Tls(error.to_string())
}

/// What a node's stateless resets are made with, derived from its private key, so that a
/// node restarted with the same key answers a packet of its predecessor's connections with a
/// reset its peer recognises, and the peer ends that connection at once instead of at its
/// idle timeout. No one without the node's private key can derive them (RFC 9000, 10.3).
#[derive(Clone)]
pub struct StatelessReset {
    /// The key of the reset tokens.
    pub key: Arc<dyn quinn::crypto::HmacKey>,
    /// The key of the connection ids the node issues: an endpoint answers only packets whose
    /// id it could have issued, so the restarted node must recognise its predecessor's.
    pub cid_key: u64,
}

impl StatelessReset {
    /// Derived from `node`'s private key.
    pub fn for_node(node: &CertifiedKey) -> StatelessReset {
        use ring::hmac;
        let derive = |label: &[u8]| {
            let label = hmac::Key::new(hmac::HMAC_SHA256, label);
            hmac::sign(&label, node.key_pem.as_bytes())
        };
        let key = derive(b"crest stateless reset key v1");
        let cid = derive(b"crest connection id key v1");
        let mut cid_key = [0u8; 8];
        cid_key.copy_from_slice(&cid.as_ref()[..8]);
        StatelessReset {
            key: Arc::new(hmac::Key::new(hmac::HMAC_SHA256, key.as_ref())),
            cid_key: u64::from_le_bytes(cid_key),
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the quinn server configuration of a node.
///
/// # Errors
/// [`TransportError::Tls`] if the certificate or key does not parse.
pub fn server_crypto(
    node: &CertifiedKey,
) -> Result<quinn::crypto::rustls::QuicServerConfig, TransportError> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(node.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| tls_error(format!("node certificate: {e}")))?;
    if certs.is_empty() {
        return Err(tls_error("node certificate: no certificate in PEM"));
    }
    let key = PrivateKeyDer::from_pem_slice(node.key_pem.as_bytes())
        .map_err(|e| tls_error(format!("node key: {e}")))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(tls_error)?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    quinn::crypto::rustls::QuicServerConfig::try_from(config).map_err(tls_error)
}

/// Builds the quinn client crypto that trusts exactly the CA in `ca_pem`.
///
/// # Errors
/// [`TransportError::Tls`] if the CA does not parse.
pub fn client_crypto(
    ca_pem: &str,
) -> Result<quinn::crypto::rustls::QuicClientConfig, TransportError> {
    let mut roots = rustls::RootCertStore::empty();
    let mut found = false;
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| tls_error(format!("CA certificate: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| tls_error(format!("CA certificate: {e}")))?;
        found = true;
    }
    if !found {
        return Err(tls_error("CA certificate: no certificate in PEM"));
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN.to_vec()];
    quinn::crypto::rustls::QuicClientConfig::try_from(config).map_err(tls_error)
}
