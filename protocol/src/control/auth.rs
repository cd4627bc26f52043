//! Connection authentication for every control-plane connection (tarpc over TCP or Unix sockets).
//!
//! Before any call is served, both ends prove they hold the cluster key, without sending it:
//!
//! ```text
//! server -> client  ServerChallenge: "FLYTAUTH" | version u8 | server_nonce [32]
//! client -> server  ClientProof:     service u8 | client_nonce [32] | HMAC(key, "client" ...) [32]
//! server -> client  ServerProof:     HMAC(key, "server" ...) [32]      (or the server closes)
//! ```
//!
//! Both MACs cover the version, the service and both nonces, so a proof can neither be replayed on
//! another connection nor moved to another service. Fixed-size messages: nothing to parse, nothing
//! to bound.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Opens every challenge, so a stray peer is recognised at once.
pub const AUTH_MAGIC: [u8; 8] = *b"FLYTAUTH";
/// Bumped when the handshake changes.
pub const AUTH_VERSION: u8 = 1;
/// Bytes in a nonce and in a MAC.
pub const NONCE_LEN: usize = 32;
/// Bytes in a challenge.
pub const CHALLENGE_LEN: usize = AUTH_MAGIC.len() + 1 + NONCE_LEN;
/// Bytes in a client proof.
pub const CLIENT_PROOF_LEN: usize = 1 + NONCE_LEN + NONCE_LEN;
/// Bytes in a server proof.
pub const SERVER_PROOF_LEN: usize = NONCE_LEN;

/// The service a connection asks for; one listener may serve several.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServiceName {
    /// [`super::cluster::ClusterNode`]: node managers.
    ClusterNode = 1,
    /// [`super::cluster::ClusterClient`]: client managers.
    ClusterClient = 2,
    /// [`super::cluster::ClusterAdmin`]: flytctl, on the admin socket only.
    ClusterAdmin = 3,
    /// [`super::node::NodeManagerControl`]: the cluster manager calling a node manager.
    NodeManager = 4,
    /// [`super::rpc_server::RpcServerControl`]: a node manager calling the rpc-server it spawned,
    /// on the server's `--control unix:/path` socket (owner-only). The rpc-server serves it with
    /// `flyt_daemon_kit::rpc` (`ControlListener::bind(.., 0o600)`, `accept_loop` with this
    /// service, `serve_connection`), the same handshake and postcard framing as every other
    /// control connection.
    RpcServerControl = 5,
}

impl ServiceName {
    /// Parses the service byte of a client proof.
    pub fn from_u8(value: u8) -> Option<Self> {
        match value {
            1 => Some(Self::ClusterNode),
            2 => Some(Self::ClusterClient),
            3 => Some(Self::ClusterAdmin),
            4 => Some(Self::NodeManager),
            5 => Some(Self::RpcServerControl),
            _ => None,
        }
    }

    /// A name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClusterNode => "cluster-node",
            Self::ClusterClient => "cluster-client",
            Self::ClusterAdmin => "cluster-admin",
            Self::NodeManager => "node-manager",
            Self::RpcServerControl => "rpc-server-control",
        }
    }
}

/// Why a handshake message was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error, displaydoc::Display)]
pub enum AuthProtocolError {
    /// the peer is not a Flyt control endpoint (bad magic)
    BadMagic,
    /// the peer speaks control handshake version {0}, this build speaks version 1
    UnsupportedVersion(u8),
    /// the peer asked for unknown service number {0}
    UnknownService(u8),
    /// the peer's proof does not match the cluster key
    BadProof,
}

fn mac(key: &[u8], role: &[u8], service: ServiceName, server_nonce: &[u8; NONCE_LEN], client_nonce: &[u8; NONCE_LEN]) -> HmacSha256 {
    // HMAC takes keys of any length; the fallback only exists to avoid a panic path.
    let mut mac = HmacSha256::new_from_slice(key).unwrap_or_else(|_| HmacSha256::new_from_slice(&[0]).expect("1-byte key"));
    mac.update(b"flyt-control|");
    mac.update(&[AUTH_VERSION]);
    mac.update(role);
    mac.update(&[service as u8]);
    mac.update(server_nonce);
    mac.update(client_nonce);
    mac
}

/// The challenge a server sends first.
pub fn encode_challenge(server_nonce: &[u8; NONCE_LEN]) -> [u8; CHALLENGE_LEN] {
    let mut bytes = [0u8; CHALLENGE_LEN];
    bytes[..8].copy_from_slice(&AUTH_MAGIC);
    bytes[8] = AUTH_VERSION;
    bytes[9..].copy_from_slice(server_nonce);
    bytes
}

/// Reads a challenge: the server's nonce.
pub fn decode_challenge(bytes: &[u8; CHALLENGE_LEN]) -> Result<[u8; NONCE_LEN], AuthProtocolError> {
    if bytes[..8] != AUTH_MAGIC {
        return Err(AuthProtocolError::BadMagic);
    }
    if bytes[8] != AUTH_VERSION {
        return Err(AuthProtocolError::UnsupportedVersion(bytes[8]));
    }
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&bytes[9..]);
    Ok(nonce)
}

/// The client's answer to a challenge.
pub fn encode_client_proof(
    key: &[u8],
    service: ServiceName,
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
) -> [u8; CLIENT_PROOF_LEN] {
    let tag = mac(key, b"client", service, server_nonce, client_nonce).finalize().into_bytes();
    let mut bytes = [0u8; CLIENT_PROOF_LEN];
    bytes[0] = service as u8;
    bytes[1..1 + NONCE_LEN].copy_from_slice(client_nonce);
    bytes[1 + NONCE_LEN..].copy_from_slice(&tag);
    bytes
}

/// Checks a client proof; returns the service asked for and the client's nonce.
pub fn verify_client_proof(
    key: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    bytes: &[u8; CLIENT_PROOF_LEN],
) -> Result<(ServiceName, [u8; NONCE_LEN]), AuthProtocolError> {
    let service = ServiceName::from_u8(bytes[0]).ok_or(AuthProtocolError::UnknownService(bytes[0]))?;
    let mut client_nonce = [0u8; NONCE_LEN];
    client_nonce.copy_from_slice(&bytes[1..1 + NONCE_LEN]);
    mac(key, b"client", service, server_nonce, &client_nonce)
        .verify_slice(&bytes[1 + NONCE_LEN..])
        .map_err(|_| AuthProtocolError::BadProof)?;
    Ok((service, client_nonce))
}

/// The server's proof that it holds the key too.
pub fn encode_server_proof(
    key: &[u8],
    service: ServiceName,
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
) -> [u8; SERVER_PROOF_LEN] {
    mac(key, b"server", service, server_nonce, client_nonce).finalize().into_bytes().into()
}

/// Checks the server's proof.
pub fn verify_server_proof(
    key: &[u8],
    service: ServiceName,
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    bytes: &[u8; SERVER_PROOF_LEN],
) -> Result<(), AuthProtocolError> {
    mac(key, b"server", service, server_nonce, client_nonce).verify_slice(bytes).map_err(|_| AuthProtocolError::BadProof)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"a cluster key for tests";

    #[test]
    fn both_proofs_verify_with_the_same_key() {
        let server_nonce = [7u8; NONCE_LEN];
        let client_nonce = [9u8; NONCE_LEN];
        let challenge = encode_challenge(&server_nonce);
        assert_eq!(decode_challenge(&challenge), Ok(server_nonce));
        let proof = encode_client_proof(KEY, ServiceName::ClusterClient, &server_nonce, &client_nonce);
        assert_eq!(verify_client_proof(KEY, &server_nonce, &proof), Ok((ServiceName::ClusterClient, client_nonce)));
        let answer = encode_server_proof(KEY, ServiceName::ClusterClient, &server_nonce, &client_nonce);
        assert_eq!(verify_server_proof(KEY, ServiceName::ClusterClient, &server_nonce, &client_nonce, &answer), Ok(()));
    }

    #[test]
    fn wrong_key_replay_and_service_swap_are_refused() {
        let server_nonce = [1u8; NONCE_LEN];
        let client_nonce = [2u8; NONCE_LEN];
        let proof = encode_client_proof(b"other key", ServiceName::ClusterNode, &server_nonce, &client_nonce);
        assert_eq!(verify_client_proof(KEY, &server_nonce, &proof), Err(AuthProtocolError::BadProof));
        let proof = encode_client_proof(KEY, ServiceName::ClusterNode, &server_nonce, &client_nonce);
        assert_eq!(verify_client_proof(KEY, &[3u8; NONCE_LEN], &proof), Err(AuthProtocolError::BadProof));
        let mut swapped = proof;
        swapped[0] = ServiceName::ClusterAdmin as u8;
        assert_eq!(verify_client_proof(KEY, &server_nonce, &swapped), Err(AuthProtocolError::BadProof));
        swapped[0] = 200;
        assert_eq!(verify_client_proof(KEY, &server_nonce, &swapped), Err(AuthProtocolError::UnknownService(200)));
        let mut challenge = encode_challenge(&server_nonce);
        challenge[8] = 9;
        assert_eq!(decode_challenge(&challenge), Err(AuthProtocolError::UnsupportedVersion(9)));
        challenge[0] = b'X';
        assert_eq!(decode_challenge(&challenge), Err(AuthProtocolError::BadMagic));
    }
}
