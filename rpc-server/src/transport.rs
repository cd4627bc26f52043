//! The outbox that serializes replies, over a session's connection (`flyt_ring::Link`).

use std::io;
use std::sync::Mutex;

use flyt_protocol::CudaError;
use flyt_protocol::frame::write_all_vectored;
use flyt_protocol::ops::{OpClass, encode_reply};
use serde::Serialize;

/// One client connection (a socket, or a half of the shared-memory rings).
pub use flyt_ring::Link as Connection;

/// Locks `mutex`, polling for a while (`flyt_ring::spin_budget`) before sleeping: replies of a
/// large copy follow each other from different waiter threads, and a sleeping thread's wake-up
/// (hundreds of microseconds on the GPU VMs) would leave the socket idle between chunks
/// (measured: 64 MiB device-to-host copies reached 61-78% of a raw stream with a 0.5 ms poll).
pub fn lock_spinning<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    let spin_until = std::time::Instant::now() + flyt_ring::spin_budget();
    loop {
        match mutex.try_lock() {
            Ok(guard) => return guard,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if std::time::Instant::now() < spin_until => std::hint::spin_loop(),
            Err(std::sync::TryLockError::WouldBlock) => {
                return mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
    }
}

/// Everything that answers the client: the write half of the connection and the session's
/// deferred error (the first failure of an asynchronous op, delivered at the next sync point).
pub struct Outbox {
    writer: Mutex<Connection>,
    deferred: Mutex<Option<CudaError>>,
}

impl Outbox {
    pub fn new(writer: Connection) -> Self {
        Self { writer: Mutex::new(writer), deferred: Mutex::new(None) }
    }

    /// Records an asynchronous op's failure; like CUDA, the first one is the one reported.
    pub fn defer(&self, error: CudaError) {
        let mut deferred = self.deferred.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        deferred.get_or_insert(error);
    }

    fn take_deferred(&self) -> Option<CudaError> {
        self.deferred.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }

    /// Sends one reply. For `NoReply` ops nothing is sent: an error is deferred instead.
    pub fn reply<T: Serialize>(&self, seq: u32, class: OpClass, result: Result<&T, CudaError>, bulk: &[u8]) {
        let deferred = match class {
            OpClass::NoReply => {
                if let Err(error) = result {
                    self.defer(error);
                }
                return;
            }
            OpClass::Reply => None,
            OpClass::SyncPoint => self.take_deferred(),
        };
        let mut message = Vec::with_capacity(64);
        encode_reply(result, deferred, &mut message);
        self.send_frame(seq, &message, bulk);
    }

    /// Writes a whole frame; a dead client is noticed by the reader, so a failed write is
    /// only logged here.
    pub fn send_frame(&self, seq: u32, message: &[u8], bulk: &[u8]) {
        let header = flyt_protocol::frame::FrameHeader {
            message_len: u32::try_from(message.len()).unwrap_or(u32::MAX),
            seq,
            bulk_len: bulk.len() as u64,
        }
        .encode();
        let mut writer = lock_spinning(&self.writer);
        let mut slices = [io::IoSlice::new(&header), io::IoSlice::new(message), io::IoSlice::new(bulk)];
        if let Err(error) = write_all_vectored(&mut *writer, &mut slices) {
            tracing::debug!(%error, "reply not delivered");
        }
    }
}
