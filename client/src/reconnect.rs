//! A TCP session whose connection breaks (a peer reset, an outage, a rebound address) dials its
//! server again and goes on where it was (`docs/design/reconnect.md`): the session's stream is
//! resumable (`flyt_ring::resume`), and this is how it comes back: with backoff, within
//! `FLYT_RECONNECT_MS`, presenting the session's secret from the first handshake. The app sees
//! nothing; a server that is really gone (it refuses, or never answers in time) is the CUDA error
//! a broken connection always was.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use flyt_protocol::frame::{FrameLimits, read_value, write_value};
use flyt_protocol::handshake::{Hello, HelloReply, Reattach, SessionInfo};

use crate::conn::Wire;

/// The first pause between two attempts; it doubles up to `LONGEST_PAUSE`.
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const LONGEST_PAUSE: Duration = Duration::from_millis(500);

/// How long a broken connection is dialled again (`FLYT_RECONNECT_MS`; 0: a break is an error
/// at once, as before).
pub(crate) fn reconnect_window() -> Duration {
    static WINDOW: OnceLock<Duration> = OnceLock::new();
    *WINDOW.get_or_init(|| {
        let millis = std::env::var("FLYT_RECONNECT_MS").ok().and_then(|value| value.trim().parse::<u64>().ok()).unwrap_or(10_000);
        Duration::from_millis(millis)
    })
}

/// How the session's server is dialled again.
pub(crate) struct Dialer {
    pub address: String,
    pub tls_ca: Option<String>,
    /// A hello as the session's first one (token, identity), without a segment offer.
    pub hello: Hello,
    pub session_id: u64,
    pub secret: [u8; flyt_protocol::stripes::SECRET_LEN],
    pub window: Duration,
}

/// Why one attempt did not bring the session back.
enum Attempt {
    /// The server answered no (the session ended): no point trying again.
    Refused(String),
    /// No answer (yet): try again while the window lasts.
    Failed(String),
}

impl Dialer {
    fn attempt(&self, received: u64, deadline: Instant) -> Result<(Wire, u64), Attempt> {
        // No step may outlast the window (a host that drops packets would hold a connect 10 s).
        let patience = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        let mut wire =
            crate::client::connect_wire_within(&self.address, self.tls_ca.as_deref(), patience, patience).map_err(Attempt::Failed)?;
        let patience = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        wire.set_read_timeout(Some(patience)).map_err(|error| Attempt::Failed(error.to_string()))?;
        let hello = Hello { reattach: Some(Reattach { session_id: self.session_id, secret: self.secret, received }), ..self.hello.clone() };
        write_value(&mut wire, 0, &hello).map_err(|error| Attempt::Failed(error.to_string()))?;
        let limits = FrameLimits { max_message: 64 << 10, max_bulk: 0 };
        match read_value::<HelloReply>(&mut wire, &limits) {
            Ok((_, HelloReply::Reattached { received: server_received })) => {
                wire.set_read_timeout(None).map_err(|error| Attempt::Failed(error.to_string()))?;
                Ok((wire, server_received))
            }
            Ok((_, HelloReply::Refused { reason, .. })) => Err(Attempt::Refused(reason)),
            Ok((_, HelloReply::Accepted(_))) => Err(Attempt::Refused("the server opened a new session instead".into())),
            Err(error) => Err(Attempt::Failed(error.to_string())),
        }
    }
}

impl flyt_ring::resume::Reattach for Dialer {
    fn reattach(&self, received: u64, ended: &dyn Fn() -> bool) -> Result<(flyt_ring::Link, u64), String> {
        let deadline = Instant::now() + self.window;
        let mut pause = FIRST_PAUSE;
        loop {
            if ended() {
                return Err("the connection was given up".into());
            }
            match self.attempt(received, deadline) {
                Ok(attached) => return Ok(attached),
                Err(Attempt::Refused(reason)) => {
                    return Err(format!("it broke, and the server refused to go on with the session: {reason}"));
                }
                Err(Attempt::Failed(reason)) => {
                    if Instant::now() + pause >= deadline {
                        return Err(format!(
                            "it broke and could not be made again within {} ms (FLYT_RECONNECT_MS): {reason}",
                            self.window.as_millis()
                        ));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(LONGEST_PAUSE);
                }
            }
        }
    }
}

/// The two halves of a freshly handshaken session connection: resumable when the server keeps
/// the session for a returning client and the connection is TCP (the shared-memory channel and
/// Unix sockets do not blip), as they are otherwise.
pub(crate) fn halves(wire: Wire, info: &SessionInfo, address: &str, tls_ca: Option<&str>, hello: &Hello) -> std::io::Result<(Wire, Wire)> {
    let window = reconnect_window();
    match info.resume_secret {
        Some(secret) if !window.is_zero() && matches!(wire, Wire::Tcp(_) | Wire::Secured(_)) => {
            let dialer = Dialer {
                address: address.to_string(),
                tls_ca: tls_ca.map(String::from),
                hello: Hello { shm: None, resume: None, stripe: None, reattach: None, ..hello.clone() },
                session_id: info.session_id,
                secret,
                window,
            };
            let (reader, writer, _) = flyt_ring::resume::resumable(wire, Box::new(dialer), flyt_ring::resume::DEFAULT_KEPT)?;
            Ok((reader, writer))
        }
        _ => {
            let reader = wire.try_clone()?;
            Ok((reader, wire))
        }
    }
}
