//! TLS 1.3 for every crest link: a cluster CA, node certificates, rustls/quinn configs.
//!
//! One crypto provider is compiled in (ring); rustls panics at start when two are. Each node
//! holds a certificate signed by the cluster CA whose name is the node's own name (plus the
//! hosts it is reached at), for a limited time. Tree links are mutual: a node dials its parent
//! (or the root a leaf) asking for that node's name and presents its own certificate, which
//! the accepting node checks against the name the peer's `Hello` claims ([`peer_is`]).
//! Producers and consumers trust the CA and take any node of the cluster ([`Verify::AnyNode`]).
//! `crest local` makes an ephemeral CA in memory; `crest certs` writes one to files.

use crate::TransportError;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use std::sync::Arc;
use std::time::Duration;

/// The TLS server name clients ask for when they take any node of the cluster (it is not
/// checked: [`Verify::AnyNode`]).
pub const SERVER_NAME: &str = "crest";
/// How long `crest certs` makes node certificates valid unless told otherwise.
pub const CERT_VALIDITY_DEFAULT: Duration = Duration::from_secs(365 * 24 * 3600);
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

    /// Issues a node certificate made out to `name` and `hosts` (DNS names or IP addresses),
    /// valid from a minute ago (clocks differ) for `valid_for`, as a server and as a client
    /// (nodes dial each other).
    ///
    /// # Errors
    /// [`TransportError::Tls`] if the name or a host is not a valid subject name or signing
    /// fails.
    pub fn issue(
        &self,
        name: &str,
        hosts: &[String],
        valid_for: Duration,
    ) -> Result<CertifiedKey, TransportError> {
        let now = std::time::SystemTime::now();
        self.issue_between(name, hosts, now - Duration::from_secs(60), now + valid_for)
    }

    /// As [`CertificateAuthority::issue`], valid from `not_before` to `not_after`.
    ///
    /// # Errors
    /// As [`CertificateAuthority::issue`].
    pub fn issue_between(
        &self,
        name: &str,
        hosts: &[String],
        not_before: std::time::SystemTime,
        not_after: std::time::SystemTime,
    ) -> Result<CertifiedKey, TransportError> {
        ServerName::try_from(name.to_string()).map_err(|_| {
            tls_error(format!(
                "node name {name:?} cannot be a certificate's name (letters, digits, '-', '.')"
            ))
        })?;
        let mut names = vec![name.to_string()];
        names.extend(hosts.iter().cloned());
        names.sort();
        names.dedup();
        let mut params = CertificateParams::new(names).map_err(tls_error)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let key = KeyPair::generate().map_err(tls_error)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(tls_error)?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Issues a client certificate for principal `name`, valid for `valid_for`. It names the
    /// principal only as [`CLIENT_URI_PREFIX`]`NAME` (no DNS name) and allows client
    /// authentication only, so it can never pass as a node's certificate.
    ///
    /// # Errors
    /// [`TransportError::Tls`] if the name is not a principal's name or signing fails.
    pub fn issue_client(
        &self,
        name: &str,
        valid_for: Duration,
    ) -> Result<CertifiedKey, TransportError> {
        crest_core::access::check_principal_name(name).map_err(tls_error)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(tls_error)?;
        let uri = format!("{CLIENT_URI_PREFIX}{name}");
        params.subject_alt_names = vec![rcgen::SanType::URI(
            uri.as_str().try_into().map_err(tls_error)?,
        )];
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let now = std::time::SystemTime::now();
        params.not_before = (now - Duration::from_secs(60)).into();
        params.not_after = (now + valid_for).into();
        let key = KeyPair::generate().map_err(tls_error)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(tls_error)?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// How a client certificate names its principal: a URI subject alternative name.
pub const CLIENT_URI_PREFIX: &str = "urn:crest:client:";

/// The principal named by the client certificate the peer of `connection` presented (`None`:
/// no certificate, or a node's).
pub fn client_name(connection: &quinn::Connection) -> Option<String> {
    let der = peer_certificate(connection)?;
    client_name_of(&der)
}

/// The principal a certificate (DER) names, if it is a client certificate.
pub fn client_name_of(der: &[u8]) -> Option<String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let names = cert.subject_alternative_name().ok()??;
    names
        .value
        .general_names
        .iter()
        .find_map(|name| match name {
            GeneralName::URI(uri) => uri.strip_prefix(CLIENT_URI_PREFIX).map(str::to_string),
            _ => None,
        })
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

/// ring's provider with AES-128-GCM preferred: every byte between nodes and clients is
/// sealed and opened once per hop (three times over for a replicated leaf's entries), and
/// AES-128 takes 10 rounds a block where AES-256 takes 14. AES-128-GCM is TLS 1.3's suite
/// every implementation must offer and what QUIC's own initial packets use; the other suites
/// stay on offer for peers that do not take it.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(provider)
}

/// A certified key as rustls takes it.
fn chain_and_key(
    node: &CertifiedKey,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TransportError> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(node.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| tls_error(format!("node certificate: {e}")))?;
    if certs.is_empty() {
        return Err(tls_error("node certificate: no certificate in PEM"));
    }
    let key = PrivateKeyDer::from_pem_slice(node.key_pem.as_bytes())
        .map_err(|e| tls_error(format!("node key: {e}")))?;
    Ok((certs, key))
}

/// The CA certificates in `ca_pem`.
fn roots(ca_pem: &str) -> Result<Arc<rustls::RootCertStore>, TransportError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| tls_error(format!("CA certificate: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| tls_error(format!("CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(tls_error("CA certificate: no certificate in PEM"));
    }
    Ok(Arc::new(roots))
}

/// Builds the quinn server configuration of a node: it presents `node`'s certificate and asks
/// its peers for theirs, signed by the CA in `ca_pem`; a peer may present none (producers and
/// consumers), but then it cannot claim to be a node ([`peer_is`]).
///
/// # Errors
/// [`TransportError::Tls`] if the certificate, key or CA does not parse.
pub fn server_crypto(
    node: &CertifiedKey,
    ca_pem: &str,
) -> Result<quinn::crypto::rustls::QuicServerConfig, TransportError> {
    let (certs, key) = chain_and_key(node)?;
    let peers = WebPkiClientVerifier::builder_with_provider(roots(ca_pem)?, provider())
        .allow_unauthenticated()
        .build()
        .map_err(tls_error)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error)?
        .with_client_cert_verifier(peers)
        .with_single_cert(certs, key)
        .map_err(tls_error)?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    quinn::crypto::rustls::QuicServerConfig::try_from(config).map_err(tls_error)
}

/// Which nodes a dialer accepts at the other end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verify {
    /// Exactly the node whose name the connection asks for (tree links).
    Named,
    /// Any node of the cluster, whatever the name asked for (producers and consumers, which
    /// may know a node only by its address).
    AnyNode,
}

/// Builds the quinn client crypto that trusts exactly the CA in `ca_pem`, checks the peer as
/// `verify` says, and presents `identity`'s certificate when there is one.
///
/// # Errors
/// [`TransportError::Tls`] if the CA or the identity does not parse.
pub fn client_crypto(
    ca_pem: &str,
    verify: Verify,
    identity: Option<&CertifiedKey>,
) -> Result<quinn::crypto::rustls::QuicClientConfig, TransportError> {
    let roots = roots(ca_pem)?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error)?;
    let builder = match verify {
        Verify::Named => builder.with_root_certificates(roots),
        Verify::AnyNode => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyNode { roots })),
    };
    let mut config = match identity {
        Some(identity) => {
            let (certs, key) = chain_and_key(identity)?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(tls_error)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![ALPN.to_vec()];
    quinn::crypto::rustls::QuicClientConfig::try_from(config).map_err(tls_error)
}

/// Accepts a server certificate that chains to the cluster CA and is meant for a server,
/// whatever name it carries: every node of the cluster may serve producers and consumers.
#[derive(Debug)]
struct AnyNode {
    roots: Arc<rustls::RootCertStore>,
}

impl ServerCertVerifier for AnyNode {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            provider().signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // Only TLS 1.3 is offered (`with_protocol_versions`).
        Err(rustls::Error::General("TLS 1.2 is not offered".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The certificate (DER) the peer of `connection` presented, if any.
pub fn peer_certificate(connection: &quinn::Connection) -> Option<Vec<u8>> {
    let chain = connection
        .peer_identity()?
        .downcast::<Vec<CertificateDer<'static>>>()
        .ok()?;
    chain.first().map(|cert| cert.as_ref().to_vec())
}

/// Checks that the peer of `connection` presented a certificate of the cluster (the handshake
/// checked the signature) made out to `name`.
///
/// # Errors
/// Says why not: no certificate, or one for another name.
pub fn peer_is(connection: &quinn::Connection, name: &str) -> Result<(), String> {
    let chain = connection
        .peer_identity()
        .and_then(|identity| identity.downcast::<Vec<CertificateDer<'static>>>().ok());
    let Some(end_entity) = chain.as_ref().and_then(|chain| chain.first()) else {
        return Err(format!(
            "the peer presented no certificate, so it cannot be {name:?}"
        ));
    };
    let cert = ParsedCertificate::try_from(end_entity).map_err(|e| e.to_string())?;
    let server_name = ServerName::try_from(name.to_string())
        .map_err(|_| format!("{name:?} cannot be a certificate's name"))?;
    rustls::client::verify_server_name(&cert, &server_name)
        .map_err(|_| format!("the peer's certificate is not made out to {name:?}"))
}
