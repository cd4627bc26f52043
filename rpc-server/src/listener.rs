//! The listening server: accepts sessions on TCP and Unix sockets, checks each client's hello
//! (protocol, ABI, token) and hands the connection to a warm worker process, which talks to the
//! client directly from then on. It never touches the GPU itself.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use flyt_protocol::CudaError;
use flyt_protocol::frame::{FrameLimits, encode_into, read_value, write_value};
use flyt_protocol::handshake::{CUDA_ABI_MAJOR, Hello, HelloReply, MAGIC, PROTOCOL_VERSION};
use flyt_protocol::worker::{FromWorker, ToWorker};
use nix::sys::socket::{AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, recv, sendmsg, socketpair};

use crate::backend::BackendKind;
use crate::budget::{BUDGET_SLOTS, MemoryBudget, SharedBudget};
use crate::config::ServerArgs;
use crate::transport::Connection;
use flyt_protocol::control::rpc_server::{RpcServerStatus, SessionStatus, SnapshotInfo};

/// Handshakes in progress at once; more connections are closed at once (a flood of idle
/// connections must not pin threads).
const MAX_PENDING_HANDSHAKES: usize = 128;
/// How long a restore (or a checkpoint's writing) may take: device memory by the tens of GiB.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a restored session waits for its app: one that never comes back (it died, or its
/// move was called off) frees its worker and memory after this.
const RESTORED_CLAIM_TIMEOUT: Duration = Duration::from_secs(900);

struct WarmWorker {
    pid: u32,
    channel: Arc<OwnedFd>,
}

struct SessionRecord {
    hello: Hello,
    worker_pid: u32,
    slot: usize,
    started_at: u64,
    channel: Arc<OwnedFd>,
}

/// Shared state of the listening server.
pub struct Server {
    args: ServerArgs,
    /// The SM share new workers get (resizable).
    sm_percentage: std::sync::atomic::AtomicU32,
    /// What the last worker reported of the device: (bytes a session sees, SMs).
    device_facts: Mutex<(u64, u32)>,
    announced: Mutex<Vec<String>>,
    backend: Mutex<BackendKind>,
    budget_fd: OwnedFd,
    budget: SharedBudget,
    stats_fd: OwnedFd,
    /// Every worker's counters, and what retired workers counted (the sums only grow).
    stats: crate::stats::StatsPage,
    retired: Mutex<crate::stats::Counts>,
    free_slots: Mutex<Vec<usize>>,
    warm: Mutex<VecDeque<WarmWorker>>,
    warm_changed: Condvar,
    last_worker_failure: Mutex<Option<String>>,
    starting: AtomicUsize,
    /// Held while topping the warm pool up, so two refills never both count the same gap.
    refilling: Mutex<()>,
    sessions: Mutex<HashMap<u64, SessionRecord>>,
    workers: Mutex<HashMap<u32, usize>>,
    next_session: AtomicU64,
    pending_handshakes: AtomicUsize,
    shutting_down: AtomicBool,
    cluster_key: Option<Vec<u8>>,
    /// TLS every TCP session must use (`--tls-cert`, `--tls-key`).
    tls: Option<Arc<flyt_ring::tls::rustls::ServerConfig>>,
    unix_paths: Mutex<Vec<PathBuf>>,
    /// The module image cache folder every worker opens, when on.
    image_cache: Option<PathBuf>,
    /// Where the metrics endpoint listens, once bound.
    metrics_address: Mutex<Option<String>>,
    /// Who waits for a worker's answer to a checkpoint or restore, by worker pid.
    worker_answers: Mutex<HashMap<u32, std::sync::mpsc::Sender<FromWorker>>>,
    /// Workers holding a restored session until its app reconnects, by snapshot name.
    restored: Mutex<HashMap<String, WarmWorker>>,
    /// The `CUDA_VISIBLE_DEVICES` of workers of a backend (the server's GPUs by UUID) and their
    /// NVLinks, learnt once (`crate::visible`).
    visible: Mutex<Option<(BackendKind, Probe)>>,
    /// Oversubscription's coordinator (`--oversubscribe`).
    paging: Option<crate::paging::Coordinator>,
}

/// Asks a worker process to end (SIGTERM).
fn stop_worker(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sends one command to a worker (no descriptor with it).
fn send_command(channel: &OwnedFd, command: &ToWorker) -> nix::Result<usize> {
    let mut bytes = Vec::new();
    encode_into(command, &mut bytes);
    nix::sys::socket::send(channel.as_raw_fd(), &bytes, MsgFlags::empty())
}

/// Sends one command to a worker with a client's connection, which the worker then owns.
fn send_command_with(channel: &OwnedFd, command: &ToWorker, connection: &Connection) -> nix::Result<usize> {
    let mut bytes = Vec::new();
    encode_into(command, &mut bytes);
    let fds = [std::os::fd::AsFd::as_fd(connection).as_raw_fd()];
    sendmsg::<()>(channel.as_raw_fd(), &[std::io::IoSlice::new(&bytes)], &[ControlMessage::ScmRights(&fds)], MsgFlags::empty(), None)
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}

/// What the listener's GPU probe found, for every worker (`crate::visible::run_probe`).
#[derive(Clone)]
struct Probe {
    /// The workers' `CUDA_VISIBLE_DEVICES`.
    devices: String,
    /// The GPUs' NVLink table, with a real driver.
    nvlinks: Option<String>,
}

impl Server {
    fn take_slot(&self) -> Option<usize> {
        lock(&self.free_slots).pop()
    }

    /// What every worker of `backend` is started with: its `CUDA_VISIBLE_DEVICES`, exactly the
    /// server's GPUs by UUID, so a session's driver cannot name another tenant's GPU; and their
    /// NVLinks, asked of NVML once by the same probe.
    fn worker_visible_devices(&self, backend: BackendKind) -> anyhow::Result<Probe> {
        let mut visible = lock(&self.visible);
        if let Some((known, value)) = &*visible
            && *known == backend
        {
            return Ok(value.clone());
        }
        let executable = std::env::current_exe().context("own executable")?;
        let (devices, nvlinks) =
            crate::visible::run_probe(&executable, backend, &self.args.gpu).map_err(|reason| anyhow::anyhow!(reason))?;
        tracing::info!(gpu = %gpu_list(&self.args.gpu), visible = %devices, nvlinks = nvlinks.as_deref().unwrap_or("-"), "workers see only these GPUs");
        let value = Probe { devices, nvlinks };
        *visible = Some((backend, value.clone()));
        Ok(value)
    }

    /// Starts one warm worker; its monitor thread adds it to the pool once its device is open.
    fn spawn_worker(self: &Arc<Self>) -> anyhow::Result<()> {
        let slot = self.take_slot().context("too many workers alive")?;
        let (listener_end, worker_end) =
            socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).context("socketpair")?;
        let backend = *lock(&self.backend);
        let visible = match self.worker_visible_devices(backend) {
            Ok(visible) => visible,
            Err(error) => {
                lock(&self.free_slots).push(slot);
                return Err(error.context("finding the server's GPUs"));
            }
        };
        let args = &self.args;
        // Inside the worker the server's GPUs are all it sees, numbered from 0.
        let inside: Vec<u32> = (0..args.gpu.len() as u32).collect();
        let mut command = Command::new(std::env::current_exe().context("own executable")?);
        command
            .arg("worker")
            .args(["--backend", if backend == BackendKind::Emulated { "emulated" } else { "cuda" }])
            .args(["--gpu", &gpu_list(&inside)])
            .args(["--gpu-uuids", &visible.devices])
            .args(visible.nvlinks.iter().flat_map(|table| ["--nvlinks", table.as_str()]))
            .env(crate::visible::VARIABLE, &visible.devices)
            .args(["--budget-slot", &slot.to_string()])
            .args(["--copy-chunk", &args.copy_chunk.0.to_string()])
            .args(["--staging-slots", &args.staging_slots.to_string()])
            .args(["--emulated-memory", &args.emulated_memory.0.to_string()])
            .args(["--emulated-sms", &args.emulated_sms.to_string()])
            .args(["--sm-percentage", &self.sm_percentage.load(Ordering::Acquire).to_string()])
            .args(["--inline-wait-us", &args.inline_wait_us.to_string()])
            .args(["--reconnect-grace-ms", &args.reconnect_grace_ms.to_string()])
            .args(["--image-cache-size", &args.image_cache_size.0.to_string()])
            .args(args.metrics_listen.is_some().then_some("--time-calls"))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        if let Some(dir) = &self.image_cache {
            command.arg("--image-cache").arg(dir);
        }
        if let Some(dir) = &args.ivshmem_dir {
            command.arg("--ivshmem-dir").arg(dir);
        }
        if let Some(paging) = &self.paging {
            let settings = paging.settings;
            command.arg("--paging").args([settings.idle, settings.resident_min, settings.wait].map(|d| d.as_millis().to_string()));
            command.args(["--page-chunk", &args.page_chunk.0.to_string()]);
        }
        let sm_percentage = self.sm_percentage.load(Ordering::Acquire);
        if sm_percentage < 100 {
            command.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", sm_percentage.to_string());
        }
        let (channel_raw, budget_raw, stats_raw) = (worker_end.as_raw_fd(), self.budget_fd.as_raw_fd(), self.stats_fd.as_raw_fd());
        // No PR_SET_PDEATHSIG: it fires when the spawning *thread* exits, which here is any
        // short-lived handshake thread. A waiting worker exits when the listener's end of its
        // channel closes; a serving one finishes its session.
        // SAFETY: between fork and exec only async-signal-safe calls run (fcntl, dup2,
        // personality, sigprocmask), on descriptors this process owns. The descriptors are first
        // copied above 10 so that placing them at 3 and 4 cannot overwrite one with the other, and
        // dup2 clears close-on-exec on the copies the worker keeps (3, 4 and 5).
        unsafe {
            command.pre_exec(move || {
                let channel = libc::fcntl(channel_raw, libc::F_DUPFD_CLOEXEC, 10);
                let budget = libc::fcntl(budget_raw, libc::F_DUPFD_CLOEXEC, 10);
                let stats = libc::fcntl(stats_raw, libc::F_DUPFD_CLOEXEC, 10);
                if channel < 0
                    || budget < 0
                    || stats < 0
                    || libc::dup2(channel, crate::worker::CHANNEL_FD) < 0
                    || libc::dup2(budget, crate::worker::BUDGET_FD) < 0
                    || libc::dup2(stats, crate::worker::STATS_FD) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                // Device addresses away from where apps map their libraries (`address_space`);
                // where it is refused (the listener said so at start) the worker runs anyway.
                let _ = crate::address_space::bottom_up_layout_after_exec();
                // The listener blocks termination signals to take them on one thread; the worker
                // must receive them.
                let mut none: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut none);
                libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
                Ok(())
            });
        }
        self.starting.fetch_add(1, Ordering::AcqRel);
        let child = match command.spawn() {
            Ok(child) => child,
            Err(error) => {
                self.starting.fetch_sub(1, Ordering::AcqRel);
                lock(&self.free_slots).push(slot);
                return Err(error).context("spawning a worker");
            }
        };
        drop(worker_end);
        let pid = child.id();
        lock(&self.workers).insert(pid, slot);
        let server = self.clone();
        std::thread::Builder::new()
            .name(format!("flyt-worker-{pid}"))
            .spawn(move || server.monitor_worker(child, Arc::new(listener_end), slot))
            .context("worker monitor thread")?;
        Ok(())
    }

    /// Follows one worker from start to exit, then cleans up after it.
    fn monitor_worker(self: Arc<Self>, mut child: std::process::Child, channel: Arc<OwnedFd>, slot: usize) {
        let pid = child.id();
        let mut buf = vec![0u8; 64 << 10];
        let first = recv(channel.as_raw_fd(), &mut buf, MsgFlags::empty())
            .ok()
            .filter(|len| *len > 0)
            .and_then(|len| flyt_protocol::frame::decode_exact::<FromWorker>(&buf[..len]).ok());
        // A ready worker joins the warm pool before it stops counting as starting, so a refill
        // meanwhile never sees it in neither and starts one too many.
        if let Some(FromWorker::Ready { total_mem, sm_count, .. }) = &first {
            *lock(&self.device_facts) = (*total_mem, *sm_count);
            if let Some(paging) = &self.paging {
                paging.set_capacity(&self.budget, *total_mem);
            }
            lock(&self.warm).push_back(WarmWorker { pid, channel: channel.clone() });
        }
        self.starting.fetch_sub(1, Ordering::AcqRel);
        match first {
            Some(FromWorker::Ready { .. }) => {}
            Some(FromWorker::Checkpointed(_) | FromWorker::Restored(_) | FromWorker::NeedMemory { .. }) => {
                *lock(&self.last_worker_failure) = Some("worker answered out of turn during start-up".into());
            }
            Some(FromWorker::Failed { reason }) => {
                tracing::error!(worker = pid, %reason, "worker could not open the device");
                *lock(&self.last_worker_failure) = Some(reason);
            }
            None => {
                *lock(&self.last_worker_failure) = Some("worker exited during start-up".into());
            }
        }
        self.warm_changed.notify_all();
        // Until the worker exits (its end of the channel closes), pass its answers on.
        while let Ok(len) = recv(channel.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            if len == 0 {
                break;
            }
            match flyt_protocol::frame::decode_exact::<FromWorker>(&buf[..len]) {
                Ok(FromWorker::NeedMemory { bytes }) => self.page_out_for(slot, bytes),
                Ok(answer) => match lock(&self.worker_answers).get(&pid) {
                    Some(waiting) => {
                        let _ = waiting.send(answer);
                    }
                    None => tracing::warn!(worker = pid, ?answer, "an answer nobody waits for"),
                },
                Err(error) => tracing::warn!(worker = pid, %error, "undecodable message from a worker"),
            }
        }
        lock(&self.worker_answers).remove(&pid);
        lock(&self.restored).retain(|_, worker| worker.pid != pid);
        let status = child.wait().map(|status| status.to_string()).unwrap_or_else(|error| error.to_string());
        let was_warm = {
            let mut warm = lock(&self.warm);
            let before = warm.len();
            warm.retain(|worker| worker.pid != pid);
            warm.len() < before
        };
        lock(&self.workers).remove(&pid);
        let ended: Vec<u64> = lock(&self.sessions).iter().filter(|(_, record)| record.worker_pid == pid).map(|(id, _)| *id).collect();
        for session_id in ended {
            if let Some(record) = lock(&self.sessions).remove(&session_id) {
                let held = self.budget.slot_used(record.slot);
                tracing::info!(
                    session_id,
                    worker = pid,
                    %status,
                    program = %record.hello.client.program,
                    leaked_bytes_reclaimed = held,
                    "session {session_id} closed"
                );
            }
        }
        self.budget.reclaim(slot);
        {
            let mut retired = lock(&self.retired);
            let counts = self.stats.take(slot);
            retired.add(&counts);
        }
        lock(&self.free_slots).push(slot);
        // A warm worker that died unused (killed, or its GPU failed) is replaced now, not when
        // a session next takes one; a worker that failed to start is not, or a broken device
        // would be retried without end.
        if was_warm {
            tracing::warn!(worker = pid, %status, "a warm worker exited; starting another");
            self.refill();
        }
    }

    /// Oversubscription: asks idle sessions to page out so that `bytes` more fit for the session
    /// in `slot` (`crate::paging::Coordinator`).
    fn page_out_for(&self, slot: usize, bytes: u64) {
        let Some(paging) = &self.paging else { return };
        let live: HashMap<usize, (u64, Arc<OwnedFd>)> =
            lock(&self.sessions).iter().map(|(id, record)| (record.slot, (*id, record.channel.clone()))).collect();
        let slots: Vec<usize> = live.keys().copied().collect();
        let asker = live.get(&slot).map_or(0, |(id, _)| *id);
        for victim in paging.victims(&self.budget, slot, bytes, &slots) {
            if let Some((_, channel)) = live.get(&victim) {
                let reason = format!("session {asker} needs {bytes} bytes of device memory");
                let _ = send_command(channel, &ToWorker::PageOut { reason });
            }
        }
    }

    /// Takes a warm worker, starting one when none is ready or starting; `Err` explains why none
    /// is available. The caller calls `refill` once the worker has its work: spawning the
    /// replacement (fork and exec, a fraction of a millisecond) is no part of a session's handshake.
    fn take_warm(self: &Arc<Self>, timeout: Duration) -> Result<WarmWorker, String> {
        let asked = Instant::now();
        let deadline = asked + timeout;
        let mut warm = lock(&self.warm);
        let mut waited = false;
        loop {
            if let Some(worker) = warm.pop_front() {
                drop(warm);
                if waited {
                    // Sessions coming faster than workers open their devices: more warm workers
                    // (`--warm-workers`) take this wait away.
                    tracing::info!(waited_ms = asked.elapsed().as_millis() as u64, "a session waited for a worker to open its device");
                }
                return Ok(worker);
            }
            waited = true;
            if self.starting.load(Ordering::Acquire) == 0 {
                drop(warm);
                if let Err(error) = self.spawn_worker() {
                    return Err(format!("{error:#}"));
                }
                warm = lock(&self.warm);
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                let failure = lock(&self.last_worker_failure).clone();
                return Err(failure.unwrap_or_else(|| "no worker became ready in time".into()));
            }
            warm = self.warm_changed.wait_timeout(warm, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
            if let Some(failure) = lock(&self.last_worker_failure).take()
                && warm.is_empty()
                && self.starting.load(Ordering::Acquire) == 0
            {
                return Err(failure);
            }
        }
    }

    /// Keeps the configured number of workers warm.
    fn refill(self: &Arc<Self>) {
        if self.shutting_down.load(Ordering::Acquire) {
            return;
        }
        let _one_at_a_time = lock(&self.refilling);
        let have = lock(&self.warm).len() + self.starting.load(Ordering::Acquire);
        for _ in have..self.args.warm_workers {
            if let Err(error) = self.spawn_worker() {
                tracing::warn!("{error:#}");
                break;
            }
        }
    }

    fn refuse(connection: &mut Connection, peer: &str, error: CudaError, reason: String) {
        tracing::warn!(%peer, %reason, "session refused");
        let _ = write_value(connection, 0, &HelloReply::Refused { error: error.code(), reason });
    }

    /// Checks a hello; `Err` is the error and reason the client is given.
    fn check_hello(&self, hello: &Hello) -> Result<(), (CudaError, String)> {
        if hello.magic != MAGIC {
            return Err((CudaError::DEVICES_UNAVAILABLE, "not a Flyt client".into()));
        }
        if hello.protocol_version != PROTOCOL_VERSION {
            return Err((
                CudaError::INSUFFICIENT_DRIVER,
                format!("protocol version {} is not this server's ({PROTOCOL_VERSION}): upgrade the older side", hello.protocol_version),
            ));
        }
        if hello.cuda_abi_major != CUDA_ABI_MAJOR {
            return Err((
                CudaError::INSUFFICIENT_DRIVER,
                format!("the app uses CUDA {}, this server serves CUDA {CUDA_ABI_MAJOR}", hello.cuda_abi_major),
            ));
        }
        if let Some(key) = &self.cluster_key {
            let token = hello.token.as_deref().ok_or((CudaError::NOT_PERMITTED, "this server needs a session token".into()))?;
            flyt_protocol::token::verify(key, token, unix_now(), self.args.allocation.as_deref())
                .map_err(|error| (CudaError::NOT_PERMITTED, format!("session token refused: {error}")))?;
        }
        Ok(())
    }

    /// With TLS on, makes a TCP connection's TLS handshake and starts its pump (the session then
    /// goes through the pump's local end).
    fn secure(&self, connection: Connection, peer: &str) -> Secured {
        let Some(tls) = &self.tls else { return Secured::Ready(connection) };
        let Connection::Tcp(stream) = connection else { return Secured::Ready(connection) };
        let timeout = Duration::from_secs(self.args.handshake_timeout_secs);
        let _ = stream.set_read_timeout(Some(timeout));
        // A Flyt client speaks first: a TLS one with a handshake record, a plain one with its hello.
        let mut first = [0u8; 1];
        if !matches!(stream.peek(&mut first), Ok(1) if first[0] == flyt_ring::tls::HANDSHAKE_RECORD) {
            return Secured::PlainRefused(Connection::Tcp(stream));
        }
        match flyt_ring::tls::accept(tls.clone(), stream, timeout) {
            Ok(local) => Secured::Ready(Connection::Secured(local)),
            Err(reason) => {
                tracing::warn!(%peer, %reason, "TLS handshake failed");
                Secured::Failed
            }
        }
    }

    /// Runs one client's handshake and hands the connection to a worker.
    fn admit(self: &Arc<Self>, connection: Connection, peer: String) {
        let (mut connection, plain_refused) = match self.secure(connection, &peer) {
            Secured::Ready(connection) => (connection, false),
            Secured::PlainRefused(connection) => (connection, true),
            Secured::Failed => return,
        };
        let _ = connection.set_read_timeout(Some(Duration::from_secs(self.args.handshake_timeout_secs)));
        let limits = FrameLimits { max_message: 64 << 10, max_bulk: 0 };
        let hello: Hello = match read_value(&mut connection, &limits) {
            Ok((_, hello)) => hello,
            Err(flyt_protocol::frame::FrameError::Io(error))
                if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
            {
                tracing::info!("client {peer} idle for {} s without a hello, closed", self.args.handshake_timeout_secs);
                return;
            }
            Err(error) => {
                tracing::warn!(%peer, %error, "connection closed before a valid hello");
                return;
            }
        };
        if plain_refused {
            let reason = "this server requires TLS on TCP: give the app the cluster's CA (FLYT_TLS_CA=ca.pem, or flyt run --tls-ca)";
            return Self::refuse(&mut connection, &peer, CudaError::NOT_PERMITTED, reason.into());
        }
        if let Err((error, reason)) = self.check_hello(&hello) {
            return Self::refuse(&mut connection, &peer, error, reason);
        }
        if let Some(join) = hello.stripe {
            return self.join_stripe(connection, &peer, join);
        }
        if let Some(reattach) = hello.reattach {
            return self.reattach(connection, &peer, reattach);
        }
        let worker = match &hello.resume {
            None => self.take_warm(Duration::from_secs(60)).map_err(|reason| format!("no GPU worker: {reason}")),
            Some(name) => self.resumed_worker(name),
        };
        let worker = match worker {
            Ok(worker) => worker,
            Err(reason) => return Self::refuse(&mut connection, &peer, CudaError::DEVICES_UNAVAILABLE, reason),
        };
        let _ = connection.set_read_timeout(None);
        let session_id = self.next_session.fetch_add(1, Ordering::AcqRel);
        let (tcp, secured) = (connection.is_tcp(), connection.is_secured());
        let client = hello.client.clone();
        let command = ToWorker::Serve { session_id, hello: Box::new(hello.clone()), tcp, peer: peer.clone(), secured };
        // Record the session before the worker can answer the client, so a status call that
        // follows the client's handshake always sees it.
        let slot = lock(&self.workers).get(&worker.pid).copied().unwrap_or(0);
        let record = SessionRecord { hello, worker_pid: worker.pid, slot, started_at: unix_now(), channel: worker.channel.clone() };
        lock(&self.sessions).insert(session_id, record);
        if let Err(error) = send_command_with(&worker.channel, &command, &connection) {
            lock(&self.sessions).remove(&session_id);
            Self::refuse(&mut connection, &peer, CudaError::DEVICES_UNAVAILABLE, format!("worker unavailable: {error}"));
            self.refill();
            return;
        }
        tracing::info!(
            "session {session_id} opened: program={} pid={} host={} transport={} peer={peer} worker={}",
            client.program,
            client.pid,
            client.hostname,
            if secured {
                "tls"
            } else if tcp {
                "tcp"
            } else {
                "unix"
            },
            worker.pid
        );
        // The session is the worker's now: its replacement starts while the two talk.
        self.refill();
    }

    /// Hands a data connection (`flyt_protocol::stripes`) to the worker of the session it names,
    /// which checks its secret and answers it.
    fn join_stripe(&self, connection: Connection, peer: &str, join: flyt_protocol::stripes::StripeJoin) {
        let (session_id, tcp, secured) = (join.session_id, connection.is_tcp(), connection.is_secured());
        let unknown = (CudaError::NOT_PERMITTED, "a data connection for no session of this server".to_string());
        self.hand_to_session(connection, peer, session_id, ToWorker::Stripe { join, tcp, secured }, unknown);
    }

    /// Hands a client's connection back to the worker of its session (`crate::reconnect`), which
    /// checks its secret and answers it.
    fn reattach(&self, connection: Connection, peer: &str, reattach: flyt_protocol::handshake::Reattach) {
        let (session_id, tcp, secured) = (reattach.session_id, connection.is_tcp(), connection.is_secured());
        let unknown = (CudaError::DEVICES_UNAVAILABLE, flyt_protocol::control::rpc_server::session_ended(session_id));
        self.hand_to_session(connection, peer, session_id, ToWorker::Reattach { reattach, tcp, secured }, unknown);
    }

    /// Sends `command` with `connection` to the worker of session `session_id`; refuses the
    /// connection with `unknown` when there is no such session.
    fn hand_to_session(&self, mut connection: Connection, peer: &str, session_id: u64, command: ToWorker, unknown: (CudaError, String)) {
        let Ok((_, channel)) = self.session_worker(session_id) else {
            return Self::refuse(&mut connection, peer, unknown.0, unknown.1);
        };
        let _ = connection.set_read_timeout(None);
        if let Err(error) = send_command_with(&channel, &command, &connection) {
            Self::refuse(&mut connection, peer, CudaError::DEVICES_UNAVAILABLE, format!("worker unavailable: {error}"));
        }
    }

    /// The worker that holds (or now restores) snapshot `name` for its app, which reconnected.
    fn resumed_worker(self: &Arc<Self>, name: &str) -> Result<WarmWorker, String> {
        if !crate::session::valid_snapshot_name(name) {
            return Err("not a snapshot name".into());
        }
        if let Some(worker) = lock(&self.restored).remove(name) {
            return Ok(worker);
        }
        match &self.args.snapshot_dir {
            Some(dir) if crate::session::snapshot_path(dir, name).exists() => {
                self.restore_into_worker(&crate::session::snapshot_path(dir, name))
            }
            _ => Err(format!("no snapshot {name} on this server")),
        }
    }

    /// Sends a command to a worker and waits for its answer.
    fn ask_worker(&self, pid: u32, channel: &OwnedFd, command: &ToWorker, timeout: Duration) -> Result<FromWorker, String> {
        let (answer, answers) = std::sync::mpsc::channel();
        lock(&self.worker_answers).insert(pid, answer);
        let outcome = match send_command(channel, command) {
            Ok(_) => answers.recv_timeout(timeout).map_err(|_| "the worker did not answer (it ended, or timed out)".to_string()),
            Err(error) => Err(format!("the worker is gone: {error}")),
        };
        lock(&self.worker_answers).remove(&pid);
        outcome
    }

    /// Restores the snapshot at `path` into a warm worker, which then waits for its app.
    fn restore_into_worker(self: &Arc<Self>, path: &std::path::Path) -> Result<WarmWorker, String> {
        let worker = self.take_warm(Duration::from_secs(60)).map_err(|reason| format!("no GPU worker: {reason}"))?;
        self.refill();
        let command = ToWorker::Restore { path: path.display().to_string() };
        match self.ask_worker(worker.pid, &worker.channel, &command, RESTORE_TIMEOUT) {
            Ok(FromWorker::Restored(Ok(()))) => {
                tracing::info!(worker = worker.pid, snapshot = %path.display(), "session restored");
                Ok(worker)
            }
            outcome => {
                stop_worker(worker.pid);
                Err(match outcome {
                    Ok(FromWorker::Restored(Err(reason))) | Err(reason) => format!("restoring {}: {reason}", path.display()),
                    Ok(other) => format!("restoring {}: unexpected answer {other:?}", path.display()),
                })
            }
        }
    }

    /// Pauses a session and writes its snapshot into `dir` (the `checkpoint` control call).
    pub fn checkpoint(&self, session_id: u64, dir: &str, timeout_ms: u64, on_device: bool) -> Result<SnapshotInfo, String> {
        if !std::path::Path::new(dir).is_absolute() {
            return Err(format!("the snapshot folder {dir:?} is not an absolute path"));
        }
        let (pid, channel) = self.session_worker(session_id)?;
        let command = ToWorker::Checkpoint { dir: dir.to_string(), timeout_ms, on_device };
        // A capture under way ends soon (an app captures a graph in a moment): the checkpoint is
        // asked again until it has or the timeout passed.
        let deadline = std::time::Instant::now() + Duration::from_millis(timeout_ms);
        loop {
            let result = match self.ask_worker(pid, &channel, &command, Duration::from_millis(timeout_ms) + RESTORE_TIMEOUT)? {
                FromWorker::Checkpointed(result) => result.map(|info| SnapshotInfo { session_id, ..info }),
                other => return Err(format!("unexpected answer {other:?}")),
            };
            match result {
                Err(reason) if reason.ends_with(crate::session::graphs::CAPTURE_UNDER_WAY) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                result => return result,
            }
        }
    }

    /// Restores snapshot `name` from `dir` ahead of its app's reconnection (`restore`).
    pub fn restore(self: &Arc<Self>, dir: &str, name: &str) -> Result<(), String> {
        if !crate::session::valid_snapshot_name(name) {
            return Err(format!("{name:?} is not a snapshot name"));
        }
        let path = crate::session::snapshot_path(std::path::Path::new(dir), name);
        if !path.is_file() {
            return Err(format!("no snapshot {} here", path.display()));
        }
        let worker = self.restore_into_worker(&path)?;
        let pid = worker.pid;
        if let Some(old) = lock(&self.restored).insert(name.to_string(), worker) {
            stop_worker(old.pid);
        }
        let (listener, snapshot) = (Arc::downgrade(self), name.to_string());
        let spawned = std::thread::Builder::new().name("flyt-restored".into()).spawn(move || {
            std::thread::sleep(RESTORED_CLAIM_TIMEOUT);
            let Some(listener) = listener.upgrade() else { return };
            let mut restored = lock(&listener.restored);
            if restored.get(&snapshot).is_some_and(|worker| worker.pid == pid) {
                restored.remove(&snapshot);
                drop(restored);
                tracing::warn!(%snapshot, worker = pid, "no app came back for the restored session: its worker stops");
                stop_worker(pid);
            }
        });
        if spawned.is_err() {
            tracing::warn!(snapshot = %name, "no timer for the restored session: it waits for its app until the server stops");
        }
        Ok(())
    }

    /// Ends a checkpoint's pause (`release`).
    pub fn release(&self, session_id: u64, to: Option<String>) -> Result<(), String> {
        let (_, channel) = self.session_worker(session_id)?;
        send_command(&channel, &ToWorker::Release { to }).map_err(|error| format!("the session's worker is gone: {error}"))?;
        Ok(())
    }

    fn session_worker(&self, session_id: u64) -> Result<(u32, Arc<OwnedFd>), String> {
        lock(&self.sessions)
            .get(&session_id)
            .map(|record| (record.worker_pid, record.channel.clone()))
            .ok_or_else(|| flyt_protocol::control::rpc_server::session_ended(session_id))
    }

    fn accept_connection(self: &Arc<Self>, connection: Connection, peer: String) {
        if self.pending_handshakes.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING_HANDSHAKES {
            self.pending_handshakes.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(%peer, "too many pending handshakes: connection dropped");
            return;
        }
        let server = self.clone();
        let spawned = std::thread::Builder::new().name("flyt-handshake".into()).spawn(move || {
            server.admit(connection, peer);
            server.pending_handshakes.fetch_sub(1, Ordering::AcqRel);
        });
        if spawned.is_err() {
            self.pending_handshakes.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Kills every worker and removes socket files.
    fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        for pid in lock(&self.workers).keys() {
            stop_worker(*pid);
        }
        for path in lock(&self.unix_paths).iter() {
            let _ = std::fs::remove_file(path);
        }
    }

    pub fn args(&self) -> &ServerArgs {
        &self.args
    }

    /// Oversubscription's view, when on: the resident capacity and each live session's paging
    /// words (session id, view).
    pub fn paging(&self) -> Option<(u64, Vec<(u64, crate::paging::SlotView)>)> {
        self.paging.as_ref()?;
        let words = self.budget.paging_words();
        let views =
            lock(&self.sessions).iter().map(|(id, record)| (*id, crate::paging::Residency::new(words, record.slot).view())).collect();
        Some((crate::paging::Residency::new(words, 0).capacity(), views))
    }

    /// Every call, error, copy and kernel counted so far, retired workers included.
    pub fn counts(&self) -> crate::stats::Counts {
        let retired = lock(&self.retired);
        let mut sum = retired.clone();
        for slot in 0..BUDGET_SLOTS {
            sum.add(&self.stats.read(slot));
        }
        sum
    }

    /// Settings and live sessions.
    pub fn status(&self) -> RpcServerStatus {
        let (total_mem, sm_count) = *lock(&self.device_facts);
        let sessions = lock(&self.sessions)
            .iter()
            .map(|(id, record)| SessionStatus {
                session_id: *id,
                client: record.hello.client.clone(),
                worker_pid: record.worker_pid,
                memory_used: self.budget.slot_used(record.slot),
                started_at: record.started_at,
            })
            .collect();
        RpcServerStatus {
            pid: std::process::id(),
            allocation: self.args.allocation.clone(),
            backend: match *lock(&self.backend) {
                BackendKind::Emulated => "emulated".into(),
                _ => "cuda".into(),
            },
            gpu: self.args.gpu.first().copied().unwrap_or(0),
            listen: lock(&self.announced).clone(),
            memory_quota: self.budget.limit().unwrap_or(total_mem),
            sm_percentage: self.sm_percentage.load(Ordering::Acquire),
            sm_count,
            sessions,
            metrics: lock(&self.metrics_address).clone(),
        }
    }

    /// Changes the slice: memory at once for every session, SMs for sessions that start after
    /// (warm workers are replaced); running sessions are told their new limits.
    pub fn resize(self: &Arc<Self>, memory_quota: Option<u64>, sm_percentage: Option<u32>) -> Result<RpcServerStatus, String> {
        if let Some(percentage) = sm_percentage
            && !(1..=100).contains(&percentage)
        {
            return Err(format!("SM share {percentage}% is not between 1 and 100"));
        }
        if let Some(quota) = memory_quota {
            self.budget.set_limit(Some(quota));
            tracing::info!(memory_quota = quota, "memory quota changed");
        }
        if let Some(percentage) = sm_percentage
            && self.sm_percentage.swap(percentage, Ordering::AcqRel) != percentage
        {
            tracing::info!(sm_percentage = percentage, "SM share changed: replacing warm workers");
            let retired: Vec<u32> = lock(&self.warm).drain(..).map(|worker| worker.pid).collect();
            for pid in retired {
                stop_worker(pid);
            }
            self.refill();
        }
        for record in lock(&self.sessions).values() {
            let _ = send_command(&record.channel, &ToWorker::Limits);
        }
        Ok(self.status())
    }
}

/// What [`Server::secure`] made of a new connection.
enum Secured {
    /// Ready for the hello (through the TLS pump, or as it came when no TLS is needed).
    Ready(Connection),
    /// A plain TCP client where TLS is required: refused, with the reason, after its hello.
    PlainRefused(Connection),
    /// The TLS handshake failed (logged).
    Failed,
}

enum Bound {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl crate::control::Controlled for Server {
    fn status(&self) -> RpcServerStatus {
        Server::status(self)
    }

    fn resize(self: Arc<Self>, memory_quota: Option<u64>, sm_percentage: Option<u32>) -> Result<RpcServerStatus, String> {
        Server::resize(&self, memory_quota, sm_percentage)
    }

    fn checkpoint(self: Arc<Self>, session_id: u64, dir: String, timeout_ms: u64, on_device: bool) -> Result<SnapshotInfo, String> {
        Server::checkpoint(&self, session_id, &dir, timeout_ms, on_device)
    }

    fn restore(self: Arc<Self>, dir: String, name: String) -> Result<(), String> {
        Server::restore(&self, &dir, &name)
    }

    fn release(self: Arc<Self>, session_id: u64, to: Option<String>) -> Result<(), String> {
        Server::release(&self, session_id, to)
    }
}

fn bind(address: &str, server: &Server) -> anyhow::Result<(Bound, String)> {
    if let Some(path) = address.strip_prefix("unix:") {
        let path = PathBuf::from(path);
        if path.exists() {
            // A socket file left by a dead server: reuse the path only if nobody answers there.
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                bail!("{} is in use by a running server", path.display());
            }
            std::fs::remove_file(&path).with_context(|| format!("removing stale socket {}", path.display()))?;
        }
        let listener = UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
        lock(&server.unix_paths).push(path);
        Ok((Bound::Unix(listener), address.to_string()))
    } else {
        let address = address.strip_prefix("tcp:").unwrap_or(address);
        let listener = TcpListener::bind(address).with_context(|| format!("binding {address}"))?;
        let local = listener.local_addr()?.to_string();
        Ok((Bound::Tcp(listener), local))
    }
}

fn tune_tcp(stream: &std::net::TcpStream) {
    let _ = stream.set_nodelay(true);
    let socket = socket2_keepalive(stream);
    if let Err(error) = socket {
        tracing::debug!(%error, "keepalive not set");
    }
}

/// Detects dead peers within seconds: 5 s idle, then 3 probes a second apart.
fn socket2_keepalive(stream: &std::net::TcpStream) -> nix::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    setsockopt(stream, sockopt::KeepAlive, &true)?;
    setsockopt(stream, sockopt::TcpKeepIdle, &5)?;
    setsockopt(stream, sockopt::TcpKeepInterval, &1)?;
    setsockopt(stream, sockopt::TcpKeepCount, &3)
}

fn serve_listener(server: Arc<Server>, bound: Bound) {
    match bound {
        Bound::Tcp(listener) => {
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => {
                        tune_tcp(&stream);
                        let peer = stream.peer_addr().map_or_else(|_| "tcp:?".into(), |addr| addr.to_string());
                        server.accept_connection(Connection::Tcp(stream), peer);
                    }
                    Err(error) => tracing::warn!(%error, "accept failed"),
                }
            }
        }
        Bound::Unix(listener) => {
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => server.accept_connection(Connection::Unix(stream), "unix".into()),
                    Err(error) => tracing::warn!(%error, "accept failed"),
                }
            }
        }
    }
}

/// Runs the listening server until SIGTERM or SIGINT.
pub fn run(args: ServerArgs) -> anyhow::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    // Take termination signals on one thread (blocked everywhere else, inherited by threads).
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals.thread_block().context("blocking signals")?;

    if args.control.is_some() && args.cluster_key_file.is_none() {
        bail!("--control needs --cluster-key-file: control connections are authenticated with the cluster key");
    }
    let cluster_key = match &args.cluster_key_file {
        Some(path) => Some(crate::config::read_cluster_key(path)?),
        None => None,
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(flyt_ring::tls::server_config(cert, key).map_err(|error| anyhow::anyhow!("TLS: {error}"))?),
        _ => None,
    };
    if args.listen.is_empty() {
        bail!("nothing to listen on: give --listen host:port or --listen unix:/path");
    }
    if !crate::address_space::bottom_up_allowed() {
        tracing::warn!(
            "personality(ADDR_COMPAT_LAYOUT) is refused here (as by Docker's default seccomp profile): workers keep the default address-space layout, and an app whose host memory lies where the driver puts device memory has allocations fail"
        );
    }
    let image_cache = match args.image_cache_dir() {
        None => None,
        Some((dir, explicit)) => match crate::images::ImageCache::open(&dir, args.image_cache_size.0) {
            Ok(_) => Some(dir),
            Err(error) if explicit => bail!("image cache {}: {error}", dir.display()),
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "module image cache off");
                None
            }
        },
    };
    let (budget_fd, budget) = SharedBudget::create(args.memory_quota.map(|quota| quota.0)).context("budget page")?;
    let (stats_fd, stats) = crate::stats::StatsPage::create().context("metrics page")?;
    let server = Arc::new(Server {
        sm_percentage: std::sync::atomic::AtomicU32::new(args.sm_percentage),
        device_facts: Mutex::new((0, 0)),
        announced: Mutex::new(Vec::new()),
        backend: Mutex::new(if args.device == BackendKind::Emulated { BackendKind::Emulated } else { BackendKind::Cuda }),
        budget_fd,
        budget,
        stats_fd,
        stats,
        retired: Mutex::new(crate::stats::Counts::default()),
        free_slots: Mutex::new((0..BUDGET_SLOTS).rev().collect()),
        warm: Mutex::new(VecDeque::new()),
        warm_changed: Condvar::new(),
        last_worker_failure: Mutex::new(None),
        starting: AtomicUsize::new(0),
        refilling: Mutex::new(()),
        sessions: Mutex::new(HashMap::new()),
        workers: Mutex::new(HashMap::new()),
        next_session: AtomicU64::new(1),
        pending_handshakes: AtomicUsize::new(0),
        shutting_down: AtomicBool::new(false),
        cluster_key,
        tls,
        unix_paths: Mutex::new(Vec::new()),
        image_cache,
        metrics_address: Mutex::new(None),
        worker_answers: Mutex::new(HashMap::new()),
        restored: Mutex::new(HashMap::new()),
        visible: Mutex::new(None),
        paging: args
            .paging()
            .zip(args.oversubscribe)
            .map(|(settings, factor)| crate::paging::Coordinator::new(settings, factor, args.page_host_budget())),
        args,
    });

    // Open the device once before announcing readiness, so a bad GPU or a missing driver is a
    // start-up error rather than a refused first session.
    let first = server.take_warm(Duration::from_secs(120));
    let first = match first {
        Ok(worker) => worker,
        Err(reason) if server.args.device == BackendKind::Auto => {
            tracing::warn!(%reason, "no usable GPU: serving the emulated device (host memory, no kernels)");
            *lock(&server.backend) = BackendKind::Emulated;
            *lock(&server.last_worker_failure) = None;
            server.take_warm(Duration::from_secs(60)).map_err(|reason| anyhow::anyhow!(reason))?
        }
        Err(reason) => bail!("cannot open the device: {reason}"),
    };
    lock(&server.warm).push_front(first);
    server.refill();

    let mut announced = Vec::new();
    for address in &server.args.listen {
        let (bound, shown) = bind(address, &server)?;
        announced.push(shown);
        let server = server.clone();
        std::thread::Builder::new().name("flyt-accept".into()).spawn(move || serve_listener(server, bound))?;
    }
    *lock(&server.announced) = announced.clone();
    if let Some(address) = &server.args.metrics_listen {
        *lock(&server.metrics_address) = Some(crate::metrics::start(server.clone(), address)?);
    }
    if let Some(endpoint) = &server.args.control {
        crate::control::start(server.clone(), endpoint, server.args.cluster_key_file.as_deref())?;
    }
    tracing::info!(backend = ?*lock(&server.backend), gpu = %gpu_list(&server.args.gpu), "serving");
    let mut stdout = std::io::stdout();
    writeln!(stdout, "flyt-rpc-server listening on {}", announced.join(" "))?;
    stdout.flush()?;

    let signal = signals.wait().context("waiting for signals")?;
    tracing::info!(?signal, "shutting down");
    server.shutdown();
    Ok(())
}

/// GPU ordinals as `--gpu` takes them.
fn gpu_list(gpus: &[u32]) -> String {
    gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}
