//! Session tokens: the cluster manager issues one per allocation, signed with the cluster key;
//! the rpc-server checks it offline (no call back to the cluster manager on the session path).
//!
//! Format: `flyt1.<allocation>.<expires_at unix seconds>.<hex HMAC-SHA256>` over
//! `flyt1|<allocation>|<expires_at>`.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

const PREFIX: &str = "flyt1";

/// What a valid token says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionClaims {
    /// The allocation (rpc-server) the token opens sessions on.
    pub allocation: String,
    /// Unix seconds after which the token is refused.
    pub expires_at: u64,
}

/// Why a token was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error, displaydoc::Display)]
pub enum TokenError {
    /// the token is malformed
    Malformed,
    /// the token's signature does not match the cluster key
    BadSignature,
    /// the token expired at {0} (unix seconds)
    Expired(u64),
    /// the token is for allocation {0}, not this server's
    WrongAllocation(String),
    /// allocation ids may hold only letters, digits, '-' and '_'
    BadAllocationId,
}

fn mac(key: &[u8], allocation: &str, expires_at: u64) -> HmacSha256 {
    // HMAC accepts keys of any length, so this cannot fail; an empty MAC would only fail to verify.
    let mut mac = HmacSha256::new_from_slice(key).unwrap_or_else(|_| HmacSha256::new_from_slice(&[0]).expect("1-byte key"));
    mac.update(format!("{PREFIX}|{allocation}|{expires_at}").as_bytes());
    mac
}

fn valid_allocation_id(allocation: &str) -> bool {
    !allocation.is_empty() && allocation.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Signs a token for `claims`.
pub fn issue(key: &[u8], claims: &SessionClaims) -> Result<String, TokenError> {
    if !valid_allocation_id(&claims.allocation) {
        return Err(TokenError::BadAllocationId);
    }
    let tag = mac(key, &claims.allocation, claims.expires_at).finalize().into_bytes();
    let hex: String = tag.iter().map(|byte| format!("{byte:02x}")).collect();
    Ok(format!("{PREFIX}.{}.{}.{hex}", claims.allocation, claims.expires_at))
}

/// Checks a token's signature and expiry, and (when given) that it names `allocation`.
pub fn verify(key: &[u8], token: &str, now: u64, allocation: Option<&str>) -> Result<SessionClaims, TokenError> {
    let mut parts = token.split('.');
    let (Some(PREFIX), Some(id), Some(expires), Some(hex), None) = (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    let expires_at: u64 = expires.parse().map_err(|_| TokenError::Malformed)?;
    // ASCII only: the signature is sliced by byte pairs below, which must not split a character.
    if !valid_allocation_id(id) || hex.len() != 64 || !hex.is_ascii() {
        return Err(TokenError::Malformed);
    }
    let tag: Vec<u8> =
        (0..32).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)).collect::<Result<_, _>>().map_err(|_| TokenError::Malformed)?;
    mac(key, id, expires_at).verify_slice(&tag).map_err(|_| TokenError::BadSignature)?;
    if now >= expires_at {
        return Err(TokenError::Expired(expires_at));
    }
    if let Some(expected) = allocation
        && expected != id
    {
        return Err(TokenError::WrongAllocation(id.to_string()));
    }
    Ok(SessionClaims { allocation: id.to_string(), expires_at })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"cluster key for tests";

    fn claims() -> SessionClaims {
        SessionClaims { allocation: "alloc-7".into(), expires_at: 2_000 }
    }

    #[test]
    fn a_signature_with_non_ascii_characters_is_malformed_not_a_panic() {
        // 64 bytes, but two-byte characters off the pairs' boundaries: slicing it by byte
        // pairs would split one.
        let token = format!("{PREFIX}.alloc-1.99.a{}b", "\u{e9}".repeat(31));
        assert_eq!(verify(b"key", &token, 1, None), Err(TokenError::Malformed));
    }

    #[test]
    fn issued_tokens_verify() {
        let token = issue(KEY, &claims()).unwrap();
        assert_eq!(verify(KEY, &token, 1_000, Some("alloc-7")), Ok(claims()));
        assert_eq!(verify(KEY, &token, 1_000, None), Ok(claims()));
    }

    #[test]
    fn tampering_expiry_and_wrong_allocation_are_refused() {
        let token = issue(KEY, &claims()).unwrap();
        assert_eq!(verify(b"other key", &token, 1_000, None), Err(TokenError::BadSignature));
        assert_eq!(verify(KEY, &token, 2_000, None), Err(TokenError::Expired(2_000)));
        assert_eq!(verify(KEY, &token, 1_000, Some("alloc-8")), Err(TokenError::WrongAllocation("alloc-7".into())));
        let forged = token.replace(".2000.", ".9000.");
        assert_eq!(verify(KEY, &forged, 1_000, None), Err(TokenError::BadSignature));
        for junk in ["", "flyt1", "flyt1.a.b.c", "flyt1.a.1.zz", "flyt2.a.1.00", "flyt1.a.1.00.extra"] {
            assert_eq!(verify(KEY, junk, 0, None), Err(TokenError::Malformed), "{junk}");
        }
        assert_eq!(issue(KEY, &SessionClaims { allocation: "a.b".into(), expires_at: 1 }), Err(TokenError::BadAllocationId));
    }
}
