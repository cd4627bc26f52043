//! The cluster key and the handshake that proves it on every control connection
//! (`flyt_protocol::control::auth` holds the message layout and MACs; this is the I/O).

use std::{
    io,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use flyt_protocol::control::auth::{self, AuthProtocolError, CHALLENGE_LEN, CLIENT_PROOF_LEN, NONCE_LEN, SERVER_PROOF_LEN, ServiceName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Shortest key accepted: 128 bits of a hex or base64 string is at least 16 characters.
pub const MIN_KEY_BYTES: usize = 16;

/// Why a key could not be loaded or a handshake failed.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum AuthError {
    /// cannot read the cluster key file {0}: {1} (set `cluster_key_file` in the config or its env override)
    ReadKey(PathBuf, io::Error),
    /// the cluster key in {0} is shorter than 16 bytes: generate one with `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'`
    KeyTooShort(PathBuf),
    /// the handshake did not finish within {0:?}
    Timeout(Duration),
    /// handshake i/o failed: {0}
    Io(#[from] io::Error),
    /// {0}
    Protocol(#[from] AuthProtocolError),
    /// the peer asked for service {0}, which this endpoint does not serve
    ServiceNotServed(&'static str),
    /// the server closed the connection: it refused this cluster key or this service
    Refused,
    /// the server closed the connection: it refused this cluster key or this service, or it requires TLS (set [tls] in this daemon's config)
    RefusedPlain,
}

/// The shared secret every daemon and `flytctl` of a cluster hold.
#[derive(Clone)]
pub struct ClusterKey(Vec<u8>);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("ClusterKey(..)")
    }
}

impl ClusterKey {
    /// Reads a key file: its contents with surrounding white space trimmed. Warns when others
    /// may read it.
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let bytes = std::fs::read(path).map_err(|error| AuthError::ReadKey(path.to_path_buf(), error))?;
        let key = Self::from_bytes(bytes.trim_ascii()).ok_or_else(|| AuthError::KeyTooShort(path.to_path_buf()))?;
        if let Ok(metadata) = std::fs::metadata(path)
            && metadata.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(path = %path.display(), "the cluster key file is readable by group or others; chmod 600 it");
        }
        Ok(key)
    }

    /// A key from bytes; `None` when shorter than [`MIN_KEY_BYTES`].
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        (bytes.len() >= MIN_KEY_BYTES).then(|| Self(bytes.to_vec()))
    }

    /// The raw key (for token signing).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// How long either side waits for the other's handshake message.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Fresh random bytes from the kernel.
pub fn random_nonce() -> io::Result<[u8; NONCE_LEN]> {
    use std::io::Read;
    let mut nonce = [0u8; NONCE_LEN];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut nonce)?;
    Ok(nonce)
}

/// Server side: challenges the peer and returns the service it proved it may call, if this
/// endpoint serves it. On any failure the caller drops (closes) the connection.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    key: &ClusterKey,
    served: &[ServiceName],
) -> Result<ServiceName, AuthError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let server_nonce = random_nonce()?;
        stream.write_all(&auth::encode_challenge(&server_nonce)).await?;
        let mut proof = [0u8; CLIENT_PROOF_LEN];
        stream.read_exact(&mut proof).await?;
        let (service, client_nonce) = auth::verify_client_proof(key.as_bytes(), &server_nonce, &proof)?;
        if !served.contains(&service) {
            return Err(AuthError::ServiceNotServed(service.as_str()));
        }
        stream.write_all(&auth::encode_server_proof(key.as_bytes(), service, &server_nonce, &client_nonce)).await?;
        Ok(service)
    })
    .await
    .map_err(|_| AuthError::Timeout(HANDSHAKE_TIMEOUT))?
}

/// Client side: answers the challenge for `service` and checks the server's own proof, within
/// [`HANDSHAKE_TIMEOUT`].
pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, key: &ClusterKey, service: ServiceName) -> Result<(), AuthError> {
    connect_within(stream, key, service, HANDSHAKE_TIMEOUT).await
}

/// [`connect`] within `timeout` (a caller's own deadline, e.g. `flytctl --timeout-seconds`).
pub async fn connect_within<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    key: &ClusterKey,
    service: ServiceName,
    timeout: Duration,
) -> Result<(), AuthError> {
    tokio::time::timeout(timeout, async {
        let mut challenge = [0u8; CHALLENGE_LEN];
        stream.read_exact(&mut challenge).await?;
        let server_nonce = auth::decode_challenge(&challenge)?;
        let client_nonce = random_nonce()?;
        stream.write_all(&auth::encode_client_proof(key.as_bytes(), service, &server_nonce, &client_nonce)).await?;
        let mut answer = [0u8; SERVER_PROOF_LEN];
        match stream.read_exact(&mut answer).await {
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Err(AuthError::Refused),
            Err(error) => return Err(error.into()),
        }
        auth::verify_server_proof(key.as_bytes(), service, &server_nonce, &client_nonce, &answer)?;
        Ok(())
    })
    .await
    .map_err(|_| AuthError::Timeout(timeout))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> ClusterKey {
        ClusterKey::from_bytes(text.as_bytes()).unwrap()
    }

    #[tokio::test]
    async fn same_key_connects_and_names_its_service() {
        let (mut client, mut server) = tokio::io::duplex(256);
        let server_key = key("0123456789abcdef-server");
        let served = tokio::spawn(async move { accept(&mut server, &server_key, &[ServiceName::ClusterNode]).await });
        connect(&mut client, &key("0123456789abcdef-server"), ServiceName::ClusterNode).await.unwrap();
        assert_eq!(served.await.unwrap().unwrap(), ServiceName::ClusterNode);
    }

    #[tokio::test]
    async fn wrong_key_or_service_is_refused_on_both_ends() {
        let (mut client, mut server) = tokio::io::duplex(256);
        let served = tokio::spawn(async move {
            let result = accept(&mut server, &key("0123456789abcdef-server"), &[ServiceName::ClusterNode]).await;
            drop(server);
            result
        });
        let client_result = connect(&mut client, &key("0123456789abcdef-other!"), ServiceName::ClusterNode).await;
        assert!(matches!(client_result, Err(AuthError::Refused)), "{client_result:?}");
        assert!(matches!(served.await.unwrap(), Err(AuthError::Protocol(AuthProtocolError::BadProof))));

        let (mut client, mut server) = tokio::io::duplex(256);
        let served = tokio::spawn(async move {
            let result = accept(&mut server, &key("0123456789abcdef-server"), &[ServiceName::ClusterNode]).await;
            drop(server);
            result
        });
        assert!(connect(&mut client, &key("0123456789abcdef-server"), ServiceName::ClusterAdmin).await.is_err());
        assert!(matches!(served.await.unwrap(), Err(AuthError::ServiceNotServed("cluster-admin"))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_times_out() {
        let (_client, mut server) = tokio::io::duplex(256);
        let result = accept(&mut server, &key("0123456789abcdef-server"), &[ServiceName::ClusterNode]).await;
        assert!(matches!(result, Err(AuthError::Timeout(_))));
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(ClusterKey::from_bytes(b"short").is_none());
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("key");
        std::fs::write(&path, "  0123456789abcdef\n").unwrap();
        assert_eq!(ClusterKey::load(&path).unwrap().as_bytes(), b"0123456789abcdef");
        std::fs::write(&path, "tiny\n").unwrap();
        assert!(matches!(ClusterKey::load(&path), Err(AuthError::KeyTooShort(_))));
    }
}
