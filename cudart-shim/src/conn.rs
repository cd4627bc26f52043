//! The shim's side of a session's connection.
//!
//! - Asynchronous requests (launches, memsets, host-to-device copies...) are encoded into an
//!   outgoing buffer and written by a flusher thread in batches, so an async call costs an
//!   encode and a lock, not a system call.
//! - A synchronous call appends its request and flushes the buffer itself, in one write, so
//!   everything sent before it reaches the server first.
//! - A receiver thread reads every reply: it writes device-to-host bytes straight into the
//!   app's buffer and wakes the thread waiting for that reply. It always drains the socket, so
//!   the server never blocks on us.
//! - If the connection breaks, every waiting call and every later call fails with
//!   `cudaErrorDevicesUnavailable`: no hang.
//!
//! A synchronous reply crosses one thread more than it must: the receiver hands it to the
//! waiting app thread. Over the shared-memory rings that hop is most of what separates the null
//! call (3.1 us p50 on an H200 VM) from the 3 us target; letting the waiting thread read the ring
//! itself while no other thread is reading would remove it.

use std::collections::HashMap;
use std::io::{self, BufReader, IoSlice};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use flyt_protocol::CudaError;
use flyt_protocol::device::DeviceInfo;
use flyt_protocol::error::CudaResult;
use flyt_protocol::frame::{FrameHeader, FrameLimits, HEADER_LEN, discard, read_full, read_message, write_all_vectored};
use flyt_protocol::handshake::Notice;
use flyt_protocol::ops::Request;

/// Bulk bytes above this are written straight from the app's buffer instead of being copied
/// into the outgoing buffer.
const ZERO_COPY_BULK: usize = 64 << 10;
/// The outgoing buffer is written at once (by the caller) when it grows past this.
const FLUSH_AT: usize = 1 << 20;
/// How long the flusher keeps looking for more work before it sleeps.
const FLUSHER_SPIN: Duration = Duration::from_micros(100);

/// A socket to the server, or one half of the shared-memory rings.
pub use flyt_ring::Link as Wire;

/// Where the bulk bytes of a device-to-host reply go: an app buffer.
#[derive(Clone, Copy)]
pub struct HostDestination {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is an app buffer that the CUDA contract keeps valid and untouched by the
// app until the copy completes (the calling thread waits for it, or the app synchronizes before
// reading it); only the receiver thread writes it, once.
unsafe impl Send for HostDestination {}
// SAFETY: as above; the value is only read to find the buffer.
unsafe impl Sync for HostDestination {}

impl HostDestination {
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes until the reply arrives or the
    /// connection fails, and nothing else may access it meanwhile.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        Self { ptr, len }
    }
}

/// One expected reply.
pub struct ReplySlot {
    done: AtomicBool,
    reply: Mutex<Option<CudaResult<Vec<u8>>>>,
    waiter: Mutex<Option<Thread>>,
    destination: Option<HostDestination>,
}

impl ReplySlot {
    fn new(destination: Option<HostDestination>) -> Self {
        Self { done: AtomicBool::new(false), reply: Mutex::new(None), waiter: Mutex::new(None), destination }
    }

    fn complete(&self, reply: CudaResult<Vec<u8>>) {
        *self.reply.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(reply);
        self.done.store(true, Ordering::Release);
        if let Some(thread) = self.waiter.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
            thread.unpark();
        }
    }

    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Waits for the reply message (its bytes after the frame header).
    pub fn wait(&self) -> CudaResult<Vec<u8>> {
        if !self.is_done() {
            let started = Instant::now();
            let spin_until = started + flyt_ring::spin_budget();
            while !self.is_done() && Instant::now() < spin_until {
                std::hint::spin_loop();
            }
            while !self.is_done() {
                *self.waiter.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(std::thread::current());
                if self.is_done() {
                    break;
                }
                std::thread::park_timeout(Duration::from_millis(100));
            }
            crate::stats::add_blocked(started.elapsed());
        }
        self.reply.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take().unwrap_or(Err(CudaError::UNKNOWN))
    }
}

/// Sequence numbers are already well spread: hash them as themselves (the pending map is on every
/// synchronous call's path).
#[derive(Clone, Copy, Default)]
struct SeqHasher(u64);

impl std::hash::Hasher for SeqHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 << 8) | u64::from(*byte);
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.0 = u64::from(value);
    }
}

type PendingMap = HashMap<u32, Arc<ReplySlot>, std::hash::BuildHasherDefault<SeqHasher>>;

struct Outgoing {
    buf: Vec<u8>,
    next_seq: u32,
}

struct WireHalf {
    wire: Wire,
    /// The batch being written, swapped with the outgoing buffer so appends never wait for a
    /// write to finish.
    batch: Vec<u8>,
}

/// A live connection.
pub struct Conn {
    writer: Mutex<WireHalf>,
    outgoing: Mutex<Outgoing>,
    pending: Mutex<PendingMap>,
    failure: OnceLock<String>,
    server: String,
    flush_wanted: AtomicBool,
    flusher_asleep: Mutex<bool>,
    flusher_wake: Condvar,
    /// The session's devices as the server last described them after a resize.
    pub resized_devices: Mutex<Option<Vec<DeviceInfo>>>,
}

fn put_header(buf: &mut [u8], header: FrameHeader) {
    buf[..HEADER_LEN].copy_from_slice(&header.encode());
}

impl Conn {
    /// Starts the receiver and flusher threads on a handshaken connection's two halves.
    pub fn start(reader: Wire, wire: Wire, server: String) -> io::Result<Arc<Self>> {
        let conn = Arc::new(Self {
            writer: Mutex::new(WireHalf { wire, batch: Vec::with_capacity(64 << 10) }),
            outgoing: Mutex::new(Outgoing { buf: Vec::with_capacity(64 << 10), next_seq: 1 }),
            pending: Mutex::new(PendingMap::default()),
            failure: OnceLock::new(),
            server,
            flush_wanted: AtomicBool::new(false),
            flusher_asleep: Mutex::new(false),
            flusher_wake: Condvar::new(),
            resized_devices: Mutex::new(None),
        });
        let receiver = conn.clone();
        std::thread::Builder::new().name("flyt-receiver".into()).spawn(move || receiver.receive(reader))?;
        let flusher = conn.clone();
        std::thread::Builder::new().name("flyt-flusher".into()).spawn(move || flusher.flush_loop())?;
        Ok(conn)
    }

    fn check_alive(&self) -> CudaResult<()> {
        match self.failure.get() {
            Some(_) => Err(CudaError::DEVICES_UNAVAILABLE),
            None => Ok(()),
        }
    }

    /// Marks the connection dead, tells the user once, and fails every waiting call.
    fn fail(&self, reason: String) {
        if self.failure.set(reason.clone()).is_ok() {
            crate::diagnostics::once("connection", &format!("flyt: lost the connection to the GPU server {}: {reason}", self.server));
        }
        let slots: Vec<_> = self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner).drain().collect();
        for (_, slot) in slots {
            slot.complete(Err(CudaError::DEVICES_UNAVAILABLE));
        }
        if let Ok(writer) = self.writer.try_lock() {
            writer.wire.shutdown();
        }
    }

    /// Appends one frame to the outgoing buffer; returns its sequence number.
    fn enqueue(out: &mut Outgoing, request: &Request, bulk: &[u8]) -> u32 {
        let seq = out.next_seq;
        // Sequence 0 is reserved for server notices.
        out.next_seq = out.next_seq.wrapping_add(1).max(1);
        let start = out.buf.len();
        out.buf.resize(start + HEADER_LEN, 0);
        request.encode(&mut out.buf);
        let message_len = u32::try_from(out.buf.len() - start - HEADER_LEN).unwrap_or(u32::MAX);
        put_header(&mut out.buf[start..], FrameHeader { message_len, seq, bulk_len: bulk.len() as u64 });
        out.buf.extend_from_slice(bulk);
        seq
    }

    /// Writes everything queued so far (and `tail`, straight from its buffer) in order.
    fn write_batch(&self, tail: &[u8]) -> CudaResult<()> {
        let mut writer = self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let writer = &mut *writer;
        {
            let mut out = self.outgoing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            std::mem::swap(&mut out.buf, &mut writer.batch);
        }
        if writer.batch.is_empty() && tail.is_empty() {
            return Ok(());
        }
        let result = write_all_vectored(&mut writer.wire, &mut [IoSlice::new(&writer.batch), IoSlice::new(tail)]);
        writer.batch.clear();
        match result {
            Ok(()) => Ok(()),
            Err(error) => {
                self.fail(format!("send failed: {error}"));
                Err(CudaError::DEVICES_UNAVAILABLE)
            }
        }
    }

    /// Sends everything queued now, from the calling thread.
    pub fn flush(&self) -> CudaResult<()> {
        self.check_alive()?;
        self.write_batch(&[])
    }

    /// Queues an asynchronous request (no reply expected).
    pub fn send_async(&self, request: &Request, bulk: &[u8]) -> CudaResult<()> {
        self.check_alive()?;
        if bulk.len() > ZERO_COPY_BULK {
            return self.send_with_bulk(request, bulk, None).map(|_| ());
        }
        let queued = {
            let mut out = self.outgoing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            Self::enqueue(&mut out, request, bulk);
            out.buf.len()
        };
        if queued >= FLUSH_AT {
            self.flush()
        } else {
            self.wake_flusher();
            Ok(())
        }
    }

    /// Sends a request whose reply will be collected through the returned slot.
    pub fn send_for_reply(&self, request: &Request, destination: Option<HostDestination>) -> CudaResult<Arc<ReplySlot>> {
        self.check_alive()?;
        let slot = Arc::new(ReplySlot::new(destination));
        {
            let mut out = self.outgoing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // Register before the bytes can reach the server: the reply may come back at once.
            let seq = out.next_seq;
            self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(seq, slot.clone());
            Self::enqueue(&mut out, request, &[]);
        }
        Ok(slot)
    }

    /// Sends a request with a large bulk payload written straight from `bulk`; the call returns
    /// once the kernel has the bytes, so the app may reuse its buffer.
    pub fn send_with_bulk(&self, request: &Request, bulk: &[u8], reply: Option<()>) -> CudaResult<Option<Arc<ReplySlot>>> {
        self.check_alive()?;
        let slot = reply.map(|()| Arc::new(ReplySlot::new(None)));
        let mut writer = self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let writer = &mut *writer;
        {
            let mut out = self.outgoing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(slot) = &slot {
                self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(out.next_seq, slot.clone());
            }
            // Header and message now, bulk bytes straight from the app's buffer after them.
            let start = out.buf.len();
            Self::enqueue(&mut out, request, &[]);
            let bulk_len = bulk.len() as u64;
            let message_len = u32::try_from(out.buf.len() - start - HEADER_LEN).unwrap_or(u32::MAX);
            let seq = u32::from_le_bytes([out.buf[start + 4], out.buf[start + 5], out.buf[start + 6], out.buf[start + 7]]);
            put_header(&mut out.buf[start..], FrameHeader { message_len, seq, bulk_len });
            std::mem::swap(&mut out.buf, &mut writer.batch);
        }
        let result = write_all_vectored(&mut writer.wire, &mut [IoSlice::new(&writer.batch), IoSlice::new(bulk)]);
        writer.batch.clear();
        match result {
            Ok(()) => Ok(slot),
            Err(error) => {
                self.fail(format!("send failed: {error}"));
                Err(CudaError::DEVICES_UNAVAILABLE)
            }
        }
    }

    /// Sends a request and waits for its reply message.
    pub fn call(&self, request: &Request) -> CudaResult<Vec<u8>> {
        let slot = self.send_for_reply(request, None)?;
        self.flush()?;
        slot.wait()
    }

    fn wake_flusher(&self) {
        if self.flush_wanted.swap(true, Ordering::AcqRel) {
            return;
        }
        let asleep = self.flusher_asleep.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *asleep {
            self.flusher_wake.notify_one();
        }
    }

    fn flush_loop(self: Arc<Self>) {
        loop {
            if self.failure.get().is_some() {
                return;
            }
            // Spin briefly: during a burst of launches the next one is microseconds away, and
            // a flusher that is awake costs the app no wake-up call.
            let spin_until = Instant::now() + FLUSHER_SPIN;
            while !self.flush_wanted.load(Ordering::Acquire) && Instant::now() < spin_until {
                std::hint::spin_loop();
            }
            if !self.flush_wanted.load(Ordering::Acquire) {
                let mut asleep = self.flusher_asleep.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                *asleep = true;
                while !self.flush_wanted.load(Ordering::Acquire) && self.failure.get().is_none() {
                    asleep = self.flusher_wake.wait_timeout(asleep, Duration::from_millis(200)).unwrap_or_else(|e| e.into_inner()).0;
                }
                *asleep = false;
            }
            self.flush_wanted.store(false, Ordering::Release);
            if self.write_batch(&[]).is_err() {
                return;
            }
        }
    }

    fn receive(self: Arc<Self>, reader: Wire) {
        let mut reader = BufReader::with_capacity(256 << 10, reader);
        let limits = FrameLimits::default();
        let mut message = Vec::with_capacity(4096);
        loop {
            let header = match read_message(&mut reader, &limits, &mut message) {
                Ok(header) => header,
                Err(error) => return self.fail(error.to_string()),
            };
            if header.seq == 0 {
                if discard(&mut reader, header.bulk_len).is_err() {
                    return self.fail("connection ended inside a notice".into());
                }
                match flyt_protocol::frame::decode_exact::<Notice>(&message) {
                    Ok(Notice::Limits { devices }) => {
                        *self.resized_devices.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(devices);
                    }
                    Err(error) => return self.fail(format!("undecodable notice: {error}")),
                }
                continue;
            }
            let slot = self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&header.seq);
            let Some(slot) = slot else {
                return self.fail(format!("reply to unknown request {}", header.seq));
            };
            if header.bulk_len > 0 {
                let Some(destination) = slot.destination.filter(|d| d.len as u64 == header.bulk_len) else {
                    return self.fail(format!("reply {} carries {} unexpected bytes", header.seq, header.bulk_len));
                };
                // SAFETY: the destination is the app's buffer of exactly `bulk_len` bytes, kept
                // valid and exclusive for this copy (see `HostDestination::new`).
                let target = unsafe { std::slice::from_raw_parts_mut(destination.ptr, destination.len) };
                if let Err(error) = read_full(&mut reader, target, false) {
                    slot.complete(Err(CudaError::DEVICES_UNAVAILABLE));
                    return self.fail(error.to_string());
                }
            }
            slot.complete(Ok(std::mem::replace(&mut message, Vec::with_capacity(256))));
        }
    }
}
