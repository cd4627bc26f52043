//! A TCP session whose connection broke waits for its client to come back (`docs/design/reconnect.md`):
//! the listener hands the returning connection to the session's worker (`ToWorker::Reattach`),
//! which checks the session's secret and gives it to the session's resumable stream
//! (`flyt_ring::resume`); a client that does not come back within the grace period ends the
//! session as a closed connection does.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use flyt_protocol::CudaError;
use flyt_protocol::frame::write_value;
use flyt_protocol::handshake::{HelloReply, Reattach};
use flyt_protocol::stripes::{SECRET_LEN, secrets_equal};
use flyt_ring::resume::Handle;

use crate::transport::Connection;

/// Returning connections of one session, and how long its stream waits for one.
pub struct Returns {
    session_id: u64,
    secret: [u8; SECRET_LEN],
    grace: Duration,
    /// The newest returning connection not yet taken, with the bytes its client has received.
    offered: Mutex<Option<(Connection, u64)>>,
    arrived: Condvar,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn refuse(mut connection: Connection, reason: &str) {
    let _ = write_value(&mut connection, 0, &HelloReply::Refused { error: CudaError::DEVICES_UNAVAILABLE.code(), reason: reason.into() });
}

impl Returns {
    pub fn new(session_id: u64, secret: [u8; SECRET_LEN], grace: Duration) -> Arc<Self> {
        Arc::new(Self { session_id, secret, grace, offered: Mutex::new(None), arrived: Condvar::new() })
    }

    /// What the session's stream asks when its connection breaks.
    pub fn waiter(self: &Arc<Self>) -> Box<dyn flyt_ring::resume::Reattach> {
        Box::new(Waiter(self.clone()))
    }

    /// A client came back (`ToWorker::Reattach`): with the session's secret, its connection
    /// replaces the session's current one (which may still look alive to this side: a broken
    /// path, a rebound address), otherwise it is refused with the reason.
    pub fn offer(&self, connection: Connection, reattach: &Reattach, stream: &Handle) -> Result<(), String> {
        if !secrets_equal(&reattach.secret, &self.secret) {
            // Answered as a session that does not exist: a claim learns nothing of this one.
            let reason = flyt_protocol::control::rpc_server::session_ended(reattach.session_id);
            refuse(connection, &reason);
            return Err("a returning connection presented a wrong secret".into());
        }
        if let Some(ended) = stream.ended() {
            refuse(connection, &format!("the session has ended: {ended}"));
            return Err(format!("a client came back to a session that has ended ({ended})"));
        }
        // The connection this one replaces: a recovery may take this one before the break below,
        // which must then leave it alone.
        let replaced = stream.connection();
        *lock(&self.offered) = Some((connection, reattach.received));
        self.arrived.notify_all();
        stream.break_connection(replaced);
        Ok(())
    }
}

struct Waiter(Arc<Returns>);

impl flyt_ring::resume::Reattach for Waiter {
    fn reattach(&self, received: u64, _ended: &dyn Fn() -> bool) -> Result<(flyt_ring::Link, u64), String> {
        let returns = &self.0;
        let session_id = returns.session_id;
        let grace_ms = returns.grace.as_millis() as u64;
        tracing::info!(session_id, grace_ms, "the client's connection broke: the session waits for it to come back");
        let deadline = Instant::now() + returns.grace;
        let mut offered = lock(&returns.offered);
        loop {
            if let Some((mut connection, client_received)) = offered.take() {
                match write_value(&mut connection, 0, &HelloReply::Reattached { received }) {
                    Ok(()) => {
                        tracing::info!(session_id, received, client_received, "the client came back: the session goes on");
                        return Ok((connection, client_received));
                    }
                    Err(error) => tracing::info!(session_id, %error, "a returning connection broke at once: waiting for another"),
                }
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::info!(session_id, grace_ms, "the client did not come back within the grace period: the session ends");
                return Err(format!("the client did not come back within {grace_ms} ms"));
            }
            offered = returns.arrived.wait_timeout(offered, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}
