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
    // The deadline is read from the clock only once the lock is found taken: the usual,
    // uncontended reply pays no clock read.
    let mut spin_until = None;
    loop {
        match mutex.try_lock() {
            Ok(guard) => return guard,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock)
                if std::time::Instant::now() < *spin_until.get_or_insert_with(|| std::time::Instant::now() + flyt_ring::spin_budget()) =>
            {
                std::hint::spin_loop();
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                return mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
    }
}

/// A device-to-host reply that waits for its copy to finish.
pub trait PendingReply: Send + Sync {
    /// `true` once the reply can go (the copy finished or failed); never blocks.
    fn ready(&self) -> bool;
    /// Sends the reply through `outbox.reply_now`; called once.
    fn send(&self, outbox: &Outbox);
}

/// Everything that answers the client: the write half of the connection, the session's
/// deferred error (the first failure of an asynchronous op, delivered at the next sync point),
/// device-to-host replies whose copies are still running, and what the kernels printed.
///
/// Ordering: every reply first sends the device-to-host replies whose copies have finished. A
/// synchronizing call answers only once the work it waits for is done, so the bytes of every
/// copy that work includes reach the client before the answer, on the same ordered stream: when
/// a synchronize, a query or a blocking copy returns success in the app, its earlier
/// asynchronous copies have landed.
pub struct Outbox {
    writer: Mutex<Connection>,
    deferred: Mutex<Option<CudaError>>,
    pending: Mutex<Vec<std::sync::Arc<dyn PendingReply>>>,
    /// Whether `pending` may hold anything: every reply looks, few find any.
    any_pending: std::sync::atomic::AtomicBool,
    output: Option<std::sync::Arc<crate::output::Capture>>,
    stats: Option<std::sync::Arc<crate::stats::SlotStats>>,
    /// Requests taken up whose replies have not been sent: the client is waiting for them.
    awaited: std::sync::atomic::AtomicU64,
    /// Frames written so far (`keep_alive` tells silence from traffic by it).
    frames_sent: std::sync::atomic::AtomicU64,
}

impl Outbox {
    pub fn new(
        writer: Connection,
        output: Option<std::sync::Arc<crate::output::Capture>>,
        stats: Option<std::sync::Arc<crate::stats::SlotStats>>,
    ) -> Self {
        Self {
            writer: Mutex::new(writer),
            deferred: Mutex::new(None),
            pending: Mutex::new(Vec::new()),
            any_pending: std::sync::atomic::AtomicBool::new(false),
            output,
            stats,
            awaited: std::sync::atomic::AtomicU64::new(0),
            frames_sent: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A request that will be answered was taken up.
    pub fn reply_awaited(&self) {
        self.awaited.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts `during` as a wait for a reply (the client hears `Alive` meanwhile): the server's
    /// own wait before a request is taken up (a paged-out session paged in).
    pub fn awaiting<R>(&self, during: impl FnOnce() -> R) -> R {
        use std::sync::atomic::Ordering::Relaxed;
        self.awaited.fetch_add(1, Relaxed);
        let outcome = during();
        let _ = self.awaited.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
        outcome
    }

    /// Sends `Notice::Alive` when the client waits for replies and nothing was sent since the
    /// last look (`frames_seen`, the caller's): called about once a second.
    pub fn keep_alive(&self, frames_seen: &mut u64) {
        let sent = self.frames_sent.load(std::sync::atomic::Ordering::Relaxed);
        if self.awaited.load(std::sync::atomic::Ordering::Relaxed) > 0 && sent == *frames_seen {
            // A writer holding the connection (a client not reading fills the socket) is
            // traffic already; the caller must not block behind it.
            if let Ok(mut writer) = self.writer.try_lock() {
                let mut message = Vec::new();
                flyt_protocol::frame::encode_into(&flyt_protocol::handshake::Notice::Alive, &mut message);
                self.write_frame(&mut writer, 0, &message, &[]);
            }
        }
        *frames_seen = self.frames_sent.load(std::sync::atomic::Ordering::Relaxed);
    }

    /// The worker's counters for the listener's metrics endpoint (none when the page could not be mapped).
    pub fn stats(&self) -> Option<&crate::stats::SlotStats> {
        self.stats.as_deref()
    }

    /// Holds a device-to-host reply until its copy is done (sent by `send_ready`).
    pub fn hold(&self, reply: std::sync::Arc<dyn PendingReply>) {
        let mut pending = self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        pending.push(reply);
        self.any_pending.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Sends every held reply whose copy is done, oldest first. The lock is held while sending,
    /// so a reply that follows this call follows those bytes too.
    pub fn send_ready(&self) {
        // A reply held by a thread that has not yet set the flag is a reply whose copy this
        // caller does not wait for: the flag is set before `hold` returns, and the reader holds
        // a copy before it answers anything that covers it.
        if !self.any_pending.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if pending.is_empty() {
            self.any_pending.store(false, std::sync::atomic::Ordering::Release);
            return;
        }
        pending.retain(|reply| {
            if reply.ready() {
                reply.send(self);
                false
            } else {
                true
            }
        });
    }

    /// Sends what the kernels printed since the last flush (a `Notice::Output`), if anything.
    pub fn send_output(&self) {
        let Some(capture) = &self.output else { return };
        let (stdout, stderr) = capture.take();
        if stdout.is_empty() && stderr.is_empty() {
            return;
        }
        self.send_notice(&flyt_protocol::handshake::Notice::Output { stdout, stderr });
    }

    /// Sends a notice the client did not ask for (a frame with sequence number 0).
    pub fn send_notice(&self, notice: &flyt_protocol::handshake::Notice) {
        self.send_notice_with(notice, &[]);
    }

    /// Sends a notice with bulk bytes after it.
    pub fn send_notice_with(&self, notice: &flyt_protocol::handshake::Notice, bulk: &[u8]) {
        let mut message = Vec::new();
        flyt_protocol::frame::encode_into(notice, &mut message);
        self.send_frame(0, &message, bulk);
    }

    /// Records an asynchronous op's failure; like CUDA, the first one is the one reported.
    pub fn defer(&self, error: CudaError) {
        let mut deferred = self.deferred.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        deferred.get_or_insert(error);
    }

    /// Takes the first deferred error (a device reset drops it with the context it belonged to).
    pub fn take_deferred(&self) -> Option<CudaError> {
        self.deferred.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }

    /// Sends one reply, after the finished device-to-host replies (see the type's doc). For
    /// `NoReply` ops nothing is sent: an error is deferred instead.
    pub fn reply<T: Serialize>(&self, seq: u32, class: OpClass, result: Result<&T, CudaError>, bulk: &[u8]) {
        if class != OpClass::NoReply {
            self.send_ready();
        }
        self.reply_now(seq, class, result, bulk);
    }

    /// Sends one reply as it is (a held device-to-host reply sends itself with this).
    pub fn reply_now<T: Serialize>(&self, seq: u32, class: OpClass, result: Result<&T, CudaError>, bulk: &[u8]) {
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
        let _ = self.awaited.fetch_update(std::sync::atomic::Ordering::Relaxed, std::sync::atomic::Ordering::Relaxed, |n| n.checked_sub(1));
        let mut message = Vec::with_capacity(64);
        encode_reply(result, deferred, &mut message);
        self.send_frame(seq, &message, bulk);
    }

    /// Writes a whole frame; a dead client is noticed by the reader, so a failed write is
    /// only logged here.
    pub fn send_frame(&self, seq: u32, message: &[u8], bulk: &[u8]) {
        let mut writer = lock_spinning(&self.writer);
        self.write_frame(&mut writer, seq, message, bulk);
        flyt_ring::timeline::mark(flyt_ring::timeline::Stage::ReplyWritten);
    }

    /// Writes one frame on the connection `writer` holds.
    fn write_frame(&self, writer: &mut Connection, seq: u32, message: &[u8], bulk: &[u8]) {
        let header = flyt_protocol::frame::FrameHeader {
            message_len: u32::try_from(message.len()).unwrap_or(u32::MAX),
            seq,
            bulk_len: bulk.len() as u64,
        }
        .encode();
        self.frames_sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut slices = [io::IoSlice::new(&header), io::IoSlice::new(message), io::IoSlice::new(bulk)];
        if let Err(error) = write_all_vectored(writer, &mut slices) {
            tracing::debug!(%error, "reply not delivered");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use flyt_protocol::frame::{FrameLimits, read_message};
    use flyt_protocol::ops::OpClass;

    use super::{Connection, Outbox, PendingReply};

    /// A held device-to-host reply whose copy finishes when the test says so.
    struct Held {
        seq: u32,
        done: AtomicBool,
    }

    impl PendingReply for Held {
        fn ready(&self) -> bool {
            self.done.load(Ordering::Acquire)
        }

        fn send(&self, outbox: &Outbox) {
            outbox.reply_now(self.seq, OpClass::SyncPoint, Ok(&()), b"copied bytes");
        }
    }

    fn read_seqs(reader: &mut impl Read, count: usize) -> Vec<(u32, u64)> {
        let mut message = Vec::new();
        (0..count)
            .map(|_| {
                let header = read_message(reader, &FrameLimits::default(), &mut message).unwrap();
                let mut bulk = vec![0u8; usize::try_from(header.bulk_len).unwrap()];
                reader.read_exact(&mut bulk).unwrap();
                (header.seq, header.bulk_len)
            })
            .collect()
    }

    #[test]
    fn a_finished_copy_is_sent_before_the_reply_that_covers_it_and_an_unfinished_one_is_held() {
        let (server, mut client) = UnixStream::pair().unwrap();
        let outbox = Outbox::new(Connection::Unix(server), None, None);
        let first = Arc::new(Held { seq: 7, done: AtomicBool::new(false) });
        let second = Arc::new(Held { seq: 8, done: AtomicBool::new(false) });
        outbox.hold(first.clone());
        outbox.hold(second.clone());
        // The first copy finished; the synchronize that covers it answers after its bytes.
        first.done.store(true, Ordering::Release);
        outbox.reply(9, OpClass::SyncPoint, Ok(&()), &[]);
        assert_eq!(read_seqs(&mut client, 2), vec![(7, 12), (9, 0)]);
        // The second is held until it finishes, then goes ahead of the next reply; never twice.
        second.done.store(true, Ordering::Release);
        outbox.reply(10, OpClass::Reply, Ok(&()), &[]);
        outbox.reply(11, OpClass::Reply, Ok(&()), &[]);
        assert_eq!(read_seqs(&mut client, 3), vec![(8, 12), (10, 0), (11, 0)]);
        // Asynchronous ops send nothing (their errors are deferred), and release nothing early.
        outbox.hold(Arc::new(Held { seq: 12, done: AtomicBool::new(true) }));
        outbox.reply(0, OpClass::NoReply, Ok(&()), &[]);
        outbox.send_ready();
        assert_eq!(read_seqs(&mut client, 1), vec![(12, 12)]);
    }
}
