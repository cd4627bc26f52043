//! The session handshake as the listener reads it (a hello frame, then its token checked), the
//! client's view of the answer, the client manager's locate messages, the listener-worker messages, the control plane's challenge and
//! proofs, and cluster keys read from files.
#![no_main]

use flyt_protocol::control::auth::{
    CHALLENGE_LEN, CLIENT_PROOF_LEN, NONCE_LEN, SERVER_PROOF_LEN, ServiceName, decode_challenge, verify_client_proof, verify_server_proof,
};
use flyt_protocol::frame::{FrameLimits, decode_exact, read_value};
use flyt_protocol::handshake::{Hello, HelloReply};
use flyt_protocol::worker::{FromWorker, ToWorker};

const KEY: &[u8] = b"a cluster key of thirty-two bytes or more, for fuzzing";

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    match selector % 6 {
        0 => {
            let limits = FrameLimits { max_message: 64 << 10, max_bulk: 0 };
            let mut stream = rest;
            if let Ok((_, hello)) = read_value::<Hello>(&mut stream, &limits)
                && let Some(token) = hello.token.as_deref()
            {
                drop(flyt_protocol::token::verify(KEY, token, 1_000, Some("alloc-1")));
            }
        }
        1 => {
            if let Ok(text) = std::str::from_utf8(rest) {
                drop(flyt_protocol::token::verify(KEY, text, 1_000, None));
            }
        }
        2 => {
            drop(decode_exact::<HelloReply>(rest));
            drop(decode_exact::<flyt_protocol::locate::LocateRequest>(rest));
            drop(decode_exact::<flyt_protocol::locate::LocateReply>(rest));
            drop(decode_exact::<ToWorker>(rest));
            drop(decode_exact::<FromWorker>(rest));
        }
        3 => {
            if let Some(challenge) = rest.first_chunk::<CHALLENGE_LEN>() {
                drop(decode_challenge(challenge));
            }
        }
        4 => {
            if let Some((nonce, proof)) = rest.split_first_chunk::<NONCE_LEN>()
                && let Some(proof) = proof.first_chunk::<CLIENT_PROOF_LEN>()
            {
                drop(verify_client_proof(KEY, nonce, proof));
            }
            if let Some((nonces, proof)) = rest.split_first_chunk::<{ 2 * NONCE_LEN }>()
                && let Some(proof) = proof.first_chunk::<SERVER_PROOF_LEN>()
                && let (Some(server), Some(client)) = (nonces[..NONCE_LEN].first_chunk(), nonces[NONCE_LEN..].first_chunk())
            {
                for service in (0..=u8::MAX).filter_map(ServiceName::from_u8) {
                    drop(verify_server_proof(KEY, service, server, client, proof));
                }
            }
        }
        _ => drop(flyt_daemon_kit::auth::ClusterKey::from_bytes(rest)),
    }
});
