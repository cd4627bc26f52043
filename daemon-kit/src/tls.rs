//! TLS on the control plane's TCP hops (node manager <-> cluster manager, client manager ->
//! cluster manager), mutual: each daemon presents a certificate signed by the cluster's CA and
//! accepts only peers whose certificate the CA signed. The cluster key is still proved inside
//! the TLS session ([`crate::auth`]). Unix sockets never use TLS.
//!
//! Each daemon reads `[tls]` from its config ([`TlsConfig`]) and [`install`]s it once at start;
//! [`crate::rpc`] then wraps every TCP connection it makes or accepts. [`generate`] makes a CA and
//! a certificate for a set of host names (`flytctl tls-init`, `tools/local-cluster --tls`).

use std::{
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
};

pub use flyt_ring::tls::server_name;
use flyt_ring::tls::{certificates, private_key, provider, roots};
use rustls::{ClientConfig, ServerConfig, server::WebPkiClientVerifier};
use serde::{Deserialize, Serialize};

/// `[tls]` in a daemon's config. All empty: TLS off.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file of the cluster's CA: a peer's certificate must be signed by it. Empty: TLS off.
    pub ca_file: String,
    /// This daemon's certificate (PEM, signed by the CA), for both ends of its connections.
    pub cert_file: String,
    /// Its private key (PEM); keep it 0600.
    pub key_file: String,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum TlsError {
    /// [tls] {0}
    Files(String),
    /// [tls] ca_file is set, so cert_file and key_file must be too (every daemon proves itself to its peers)
    Incomplete,
    /// [tls] {0}
    Invalid(String),
    /// TLS was already set up in this process
    AlreadyInstalled,
}

/// A daemon's TLS: how it connects and how it accepts.
#[derive(Clone)]
pub struct Tls {
    pub client: Arc<ClientConfig>,
    pub server: Arc<ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Tls { .. }")
    }
}

static INSTALLED: OnceLock<Option<Tls>> = OnceLock::new();

impl Tls {
    /// Reads the files `config` names; `Ok(None)` when TLS is off.
    pub fn load(config: &TlsConfig) -> Result<Option<Self>, TlsError> {
        if config.ca_file.is_empty() {
            return Ok(None);
        }
        if config.cert_file.is_empty() || config.key_file.is_empty() {
            return Err(TlsError::Incomplete);
        }
        let roots = Arc::new(roots(Path::new(&config.ca_file)).map_err(TlsError::Files)?);
        let chain = certificates(Path::new(&config.cert_file)).map_err(TlsError::Files)?;
        let key = private_key(Path::new(&config.key_file)).map_err(TlsError::Files)?;
        let invalid = |error: rustls::Error| TlsError::Invalid(error.to_string());
        let client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(invalid)?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(invalid)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|error| TlsError::Invalid(format!("client verifier: {error}")))?;
        let server = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(invalid)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(invalid)?;
        Ok(Some(Self { client: Arc::new(client), server: Arc::new(server) }))
    }
}

/// Sets this process's TLS from its config (once, at start); returns whether TLS is on.
pub fn install(config: &TlsConfig) -> Result<bool, TlsError> {
    let tls = Tls::load(config)?;
    let on = tls.is_some();
    INSTALLED.set(tls).map_err(|_| TlsError::AlreadyInstalled)?;
    Ok(on)
}

/// This process's TLS, if it installed one.
pub fn installed() -> Option<&'static Tls> {
    INSTALLED.get().and_then(Option::as_ref)
}

/// The files [`generate`] writes, by name.
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";
pub const CERT: &str = "cert.pem";
pub const KEY: &str = "key.pem";

/// Makes a cluster CA (unless `dir` holds one already) and a certificate signed by it for
/// `names` (host names and IP addresses; for serving and for connecting), writing them into
/// `dir` (keys 0600). Returns the paths of the CA, the certificate and its key.
pub fn generate(dir: &Path, names: &[String]) -> Result<(PathBuf, PathBuf, PathBuf), String> {
    use std::os::unix::fs::OpenOptionsExt;

    use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    std::fs::create_dir_all(dir).map_err(|error| format!("{}: {error}", dir.display()))?;
    let write = |name: &str, text: &str, secret: bool| -> Result<PathBuf, String> {
        let path = dir.join(name);
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true).mode(if secret { 0o600 } else { 0o644 });
        std::io::Write::write_all(&mut options.open(&path).map_err(|error| format!("{}: {error}", path.display()))?, text.as_bytes())
            .map_err(|error| format!("{}: {error}", path.display()))?;
        Ok(path)
    };
    let (ca_cert_path, ca_key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
    let ca_params = || {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, "Flyt cluster CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
    };
    let ca_key = match std::fs::read_to_string(&ca_key_path) {
        Ok(pem) if ca_cert_path.exists() => KeyPair::from_pem(&pem).map_err(|error| format!("{}: {error}", ca_key_path.display()))?,
        _ => {
            let key = KeyPair::generate().map_err(|error| error.to_string())?;
            let certificate = ca_params().self_signed(&key).map_err(|error| error.to_string())?;
            write(CA_KEY, &key.serialize_pem(), true)?;
            write(CA_CERT, &certificate.pem(), false)?;
            key
        }
    };
    let issuer = Issuer::new(ca_params(), ca_key);
    let mut params = CertificateParams::new(names.to_vec()).map_err(|error| format!("names {names:?}: {error}"))?;
    params.distinguished_name.push(DnType::CommonName, names.first().map_or("flyt", String::as_str));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    let key = KeyPair::generate().map_err(|error| error.to_string())?;
    let certificate = params.signed_by(&key, &issuer).map_err(|error| error.to_string())?;
    let key_path = write(KEY, &key.serialize_pem(), true)?;
    let cert_path = write(CERT, &certificate.pem(), false)?;
    Ok((ca_cert_path, cert_path, key_path))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use flyt_protocol::control::auth::ServiceName;

    use super::*;
    use crate::{
        auth::ClusterKey,
        rpc::{self, ControlListener, Endpoint, RpcError},
    };

    fn tls_in(dir: &Path, names: &[&str]) -> Tls {
        let (ca, cert, key) = generate(dir, &names.iter().map(|name| name.to_string()).collect::<Vec<_>>()).unwrap();
        let config =
            TlsConfig { ca_file: ca.display().to_string(), cert_file: cert.display().to_string(), key_file: key.display().to_string() };
        Tls::load(&config).unwrap().unwrap()
    }

    async fn listen(tls: Option<Tls>, key: &ClusterKey) -> Endpoint {
        let listener = ControlListener::bind_with(&Endpoint::Tcp("127.0.0.1:0".into()), 0o600, tls).await.unwrap();
        let endpoint = listener.local_endpoint();
        tokio::spawn(rpc::accept_loop(listener, key.clone(), vec![ServiceName::ClusterAdmin], |_, _stream| async {}));
        endpoint
    }

    async fn connect(endpoint: &Endpoint, key: &ClusterKey, tls: Option<&Tls>) -> Result<(), RpcError> {
        rpc::connect_with(endpoint, key, ServiceName::ClusterAdmin, Duration::from_secs(5), tls).await.map(|_| ())
    }

    #[tokio::test]
    async fn tls_connects_peers_of_one_ca_and_refuses_plain_tcp_and_strangers() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = tls_in(&dir.path().join("cluster"), &["127.0.0.1", "localhost"]);
        let stranger = tls_in(&dir.path().join("other"), &["127.0.0.1"]);
        let key = ClusterKey::from_bytes(b"0123456789abcdef0123").unwrap();
        let secured = listen(Some(cluster.clone()), &key).await;
        let plain = listen(None, &key).await;

        connect(&secured, &key, Some(&cluster)).await.expect("TLS with a certificate of the cluster's CA");
        connect(&plain, &key, None).await.expect("plain TCP where TLS is off");
        let refused = connect(&secured, &key, None).await.unwrap_err().to_string();
        assert!(refused.contains("requires TLS"), "{refused}");
        let refused = connect(&plain, &key, Some(&cluster)).await.unwrap_err().to_string();
        assert!(refused.contains("TLS with 127.0.0.1") && refused.contains("is TLS on there"), "{refused}");
        // Another CA's certificate: the client refuses the server's, whichever end notices first.
        assert!(connect(&secured, &key, Some(&stranger)).await.is_err());
    }

    #[test]
    fn a_half_set_up_config_is_an_error_and_an_empty_one_is_off() {
        assert!(Tls::load(&TlsConfig::default()).unwrap().is_none());
        let half = TlsConfig { ca_file: "/nonexistent/ca.pem".into(), ..TlsConfig::default() };
        assert!(Tls::load(&half).unwrap_err().to_string().contains("cert_file and key_file"));
        let missing = TlsConfig { ca_file: "/nonexistent/ca.pem".into(), cert_file: "c".into(), key_file: "k".into() };
        assert!(Tls::load(&missing).unwrap_err().to_string().contains("/nonexistent/ca.pem"));
    }
}
