//! A worker process: opens the device before any session arrives (a warm worker), then serves
//! exactly one session and exits, so a fatal kernel fault ends only that session and process exit
//! frees everything the session held on the GPU.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use flyt_protocol::CudaError;
use flyt_protocol::device::{DeviceInfo, attr};
use flyt_protocol::frame::{encode_into, write_value};
use flyt_protocol::handshake::{ClientIdentity, HelloReply, Notice, RegionClaim, SessionInfo, ShmOffer};
use flyt_protocol::worker::{FromWorker, ToWorker};
use nix::sys::socket::{MsgFlags, send};

use crate::backend::cuda::CudaDevice;
use crate::backend::emulated::{EmulatedConfig, EmulatedDevice};
use crate::backend::{BackendKind, Device};
use crate::budget::{MemoryBudget, SharedBudget};
use crate::images::ImageCache;
use crate::session::{MoveControl, Session, SessionConfig};
use crate::shm::Segment;
use crate::transport::{Connection, Outbox};

/// Descriptor numbers a worker inherits from the listener.
pub const CHANNEL_FD: i32 = 3;
pub const BUDGET_FD: i32 = 4;
/// The metrics counters page (`stats::StatsPage`), placed by the listener like the budget page.
pub const STATS_FD: i32 = 5;

/// What a worker needs to know (passed on its command line).
#[derive(Clone, Debug, clap::Args)]
pub struct WorkerArgs {
    #[arg(long, value_enum)]
    pub backend: BackendKind,
    /// The session's GPUs: ordinals as this worker's driver numbers them (with the
    /// `CUDA_VISIBLE_DEVICES` the listener set, 0..n-1).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub gpu: Vec<u32>,
    /// The UUID names those GPUs must have (`crate::visible`); unchecked when absent.
    #[arg(long, value_delimiter = ',')]
    pub gpu_uuids: Vec<String>,
    /// Those GPUs' NVLinks as the listener's probe found them (`backend::nvlinks::encode`); when
    /// absent, the worker asks NVML itself.
    #[arg(long)]
    pub nvlinks: Option<String>,
    #[arg(long)]
    pub budget_slot: usize,
    #[arg(long)]
    pub copy_chunk: u64,
    #[arg(long)]
    pub staging_slots: usize,
    #[arg(long)]
    pub emulated_memory: u64,
    #[arg(long)]
    pub emulated_sms: u32,
    #[arg(long)]
    pub sm_percentage: u32,
    #[arg(long)]
    pub inline_wait_us: u64,
    /// Milliseconds a TCP session whose connection broke waits for its client (0: it ends).
    #[arg(long, default_value_t = 0)]
    pub reconnect_grace_ms: u64,
    #[arg(long)]
    pub image_cache: Option<std::path::PathBuf>,
    #[arg(long)]
    pub image_cache_size: u64,
    /// Time every call for the latency histogram (the listener serves metrics).
    #[arg(long)]
    pub time_calls: bool,
    /// The folder of this host's VMs' ivshmem regions (the server's `--ivshmem-dir`).
    #[arg(long)]
    pub ivshmem_dir: Option<std::path::PathBuf>,
    /// Paging (the server oversubscribes): milliseconds idle before a page-out, minimum
    /// residency, and the longest wait for device memory (`crate::paging::PagingSettings`).
    #[arg(long, num_args = 3, value_names = ["IDLE_MS", "RESIDENT_MIN_MS", "WAIT_MS"])]
    pub paging: Option<Vec<u64>>,
    /// Paging: the chunks of host memory the worker pins ahead for its session (`crate::page_pool`).
    #[arg(long, default_value_t = crate::page_pool::DEFAULT_CHUNK)]
    pub page_chunk: u64,
}

/// The pager of a worker whose server pages (`--paging`), with a descriptor of its channel.
fn pager_for(args: &WorkerArgs, channel: &OwnedFd, budget: &Arc<SharedBudget>) -> Option<Arc<crate::paging::Pager>> {
    let &[idle, resident_min, wait] = args.paging.as_deref()? else { return None };
    let settings = crate::paging::PagingSettings {
        idle: std::time::Duration::from_millis(idle),
        resident_min: std::time::Duration::from_millis(resident_min),
        wait: std::time::Duration::from_millis(wait),
    };
    match channel.try_clone() {
        Ok(listener) => Some(Arc::new(crate::paging::Pager::new(budget.clone(), listener, settings, args.copy_chunk))),
        Err(error) => {
            tracing::warn!(%error, "paging off for this session: no descriptor of the listener's channel");
            None
        }
    }
}

fn send_to_listener(channel: &OwnedFd, message: &FromWorker) {
    let mut bytes = Vec::new();
    encode_into(message, &mut bytes);
    if let Err(error) = send(channel.as_raw_fd(), &bytes, MsgFlags::empty()) {
        tracing::error!(%error, "cannot reach the listener");
    }
}

/// Largest segment a client may offer; bigger offers are declined, not mapped.
const MAX_SEGMENT: u64 = 1 << 40;

/// Takes the client's shared-memory segment: a memfd that follows the hello over the Unix
/// socket, or a path on this host. Pins its staging area. `Err` says why not, and the session
/// goes on over the socket.
fn accept_segment<D: Device>(
    connection: &Connection,
    offer: &ShmOffer,
    client: &ClientIdentity,
    device: &D,
    ivshmem_dir: Option<&std::path::Path>,
) -> Result<Segment, String> {
    if offer.size > MAX_SEGMENT {
        return Err(format!("a segment of {} bytes is larger than this server maps", offer.size));
    }
    let segment = match &offer.region {
        Some(claim) => accept_region(claim, offer, ivshmem_dir)?,
        None => accept_file(connection, offer, client)?,
    };
    if segment.staging() > 0 {
        let staging = usize::try_from(segment.staging()).map_err(|_| "staging too large".to_string())?;
        // SAFETY: the staging area lies inside the mapping, which the session keeps.
        unsafe { device.host_register(segment.ptr(0), staging, false) }.map_err(|error| format!("pinning the staging area: {error}"))?;
    }
    Ok(segment)
}

/// A slot of a VM's ivshmem region in the server's region folder: the claim must carry the
/// region's token (the host's copy decides), and the slot must lie past the region's header.
fn accept_region(claim: &RegionClaim, offer: &ShmOffer, ivshmem_dir: Option<&std::path::Path>) -> Result<Segment, String> {
    use flyt_ring::region;
    let dir = ivshmem_dir.ok_or("this server serves no ivshmem regions (no --ivshmem-dir)")?;
    if !region::valid_name(&claim.name) {
        return Err("the region name is not valid".into());
    }
    let token = region::host_token(dir, &claim.name).map_err(|_| format!("no ivshmem region named {}", claim.name))?;
    if !region::same_token(&token, &claim.token) {
        return Err(format!("the token does not open region {}", claim.name));
    }
    if claim.offset < region::FIRST_SLOT {
        return Err("a session slot cannot overlap the region's header".into());
    }
    let path = dir.join(&claim.name);
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).map_err(|error| format!("{}: {error}", path.display()))?;
    if !region::pinnable(&file).map_err(|error| format!("{}: {error}", path.display()))? {
        return Err(format!("region {} is not in shared memory (tmpfs or hugetlbfs): the GPU cannot pin it", claim.name));
    }
    let lease = crate::shm::RegionLease::take(&file, &claim.name)?;
    Segment::map_region(file, claim.offset, offer.size, offer.staging, lease)
}

/// A memfd that follows the hello over the Unix socket, or a path on this host.
fn accept_file(connection: &Connection, offer: &ShmOffer, client: &ClientIdentity) -> Result<Segment, String> {
    let memfd = offer.path.is_empty();
    let file = if memfd {
        if connection.is_tcp() {
            return Err("a memfd segment needs a Unix socket".into());
        }
        receive_segment_fd(connection)?
    } else {
        let own_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        if client.boot_id.trim().is_empty() || client.boot_id.trim() != own_boot.trim() {
            return Err("the client runs on another host (boot ids differ)".into());
        }
        std::fs::OpenOptions::new().read(true).write(true).open(&offer.path).map_err(|error| format!("{}: {error}", offer.path))?
    };
    Segment::map(file, offer.size, offer.staging, memfd)
}

/// Largest ring a client may ask for.
const MAX_RING: u64 = 16 << 20;

/// The message rings at the start of the segment, if the client asked for them and they fit.
fn ring_pair(segment: &Segment, offer: &ShmOffer, socket: &Connection) -> Option<(flyt_ring::RingReader, flyt_ring::RingWriter)> {
    let capacity = offer.rings;
    if capacity == 0 {
        return None;
    }
    let fits = capacity.is_power_of_two()
        && (4096..=MAX_RING).contains(&capacity)
        && flyt_ring::area_len(usize::try_from(capacity).ok()?) as u64 <= segment.staging();
    if !fits {
        tracing::warn!(capacity, "message rings refused: they do not fit the staging area");
        return None;
    }
    let fd = std::os::fd::AsFd::as_fd(socket).as_raw_fd();
    // A region's client runs in a VM on this host, another kernel: no shared futex.
    let wake = if offer.region.is_some() { flyt_ring::Wake::Doorbell } else { flyt_ring::Wake::Futex };
    // SAFETY: the ring area lies at the start of the staging area, inside the mapping the
    // session keeps for its whole life (the segment moves into the session, its mapping does
    // not move); the capacity was checked to be a power of two that fits; `fd` is the session's
    // socket, kept open by the connection halves that own the rings.
    let pair =
        unsafe { flyt_ring::Pair::new(segment.ptr(0), capacity as usize, flyt_ring::Side::Server, fd, flyt_ring::spin_budget(), wake) };
    Some(pair.split())
}

/// Reads the one byte that carries the segment's descriptor, right after the hello.
fn receive_segment_fd(connection: &Connection) -> Result<std::fs::File, String> {
    let _ = connection.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    let mut byte = [0u8; 1];
    let received = crate::shareable::receive_with_fd(std::os::fd::AsFd::as_fd(connection), &mut byte)
        .map_err(|error| format!("no segment descriptor: {error}"))?;
    let _ = connection.set_read_timeout(None);
    received.1.map(std::fs::File::from).ok_or_else(|| "the client offered a segment but sent no descriptor".into())
}

/// Follows the listener's commands during the session: tells the client its new limits whenever
/// the allocation was resized, admits data connections and returning connections, runs
/// checkpoints and their release, and page-outs (paging).
///
/// Checkpoints, releases and page-outs run in order on a thread of their own (`flyt-moves`): a
/// checkpoint waits for the app's next call, and that call may be a striped copy waiting for a
/// data connection to join, or a client that reconnects: those are answered at once, never
/// queued behind it.
#[allow(clippy::too_many_arguments, reason = "what each of the listener's commands acts on, each optional")]
fn follow_commands<D: Device>(
    channel: OwnedFd,
    session: &Session<D>,
    session_id: u64,
    device: Arc<D>,
    budget: Arc<SharedBudget>,
    stripes: Option<Arc<crate::stripes::Stripes<D>>>,
    pager: Option<Arc<crate::paging::Pager>>,
    returns: Option<(Arc<crate::reconnect::Returns>, flyt_ring::resume::Handle)>,
) {
    let (outbox, moves) = (session.outbox(), session.moves());
    let channel = Arc::new(channel);
    // What a checkpoint asks of the resumable stream: whether its client is away.
    let resumable = returns.as_ref().map(|(_, stream)| stream.clone());
    let (to_moves, moving) = std::sync::mpsc::channel::<ToWorker>();
    let moves_thread = {
        let (channel, outbox, device) = (channel.clone(), outbox.clone(), device.clone());
        std::thread::Builder::new().name("flyt-moves".into()).spawn(move || {
            while let Ok(command) = moving.recv() {
                run_move(command, &channel, &outbox, &moves, &*device, pager.as_deref(), resumable.as_ref(), session_id);
            }
        })
    };
    if moves_thread.is_err() {
        tracing::warn!("no thread for checkpoints and page-outs: this session cannot be checkpointed or paged");
    }
    let spawned = std::thread::Builder::new().name("flyt-commands".into()).spawn(move || {
        while let Some((command, fd)) = receive_command(&channel) {
            match command {
                ToWorker::Stripe { join, tcp, secured } => {
                    let Some(fd) = fd else { continue };
                    let socket = crate::stripes::connection_from_fd(fd, tcp, secured);
                    let stripes = stripes.clone();
                    // On a thread of its own: a join waits for a copy under way to end (the copy
                    // holds the links), and the commands behind it must not.
                    let admitted = std::thread::Builder::new().name("flyt-stripe-join".into()).spawn(move || {
                        let joined = match (&stripes, join.session_id == session_id) {
                            (Some(stripes), true) => stripes.join(&join, socket),
                            // Answered like a wrong secret: a claim learns nothing of other sessions.
                            _ => crate::stripes::refuse(socket, "this session takes no data connections"),
                        };
                        match joined {
                            Ok(()) => tracing::info!(session_id, index = join.index, "data connection joined"),
                            Err(reason) => tracing::warn!(session_id, index = join.index, %reason, "data connection refused"),
                        }
                    });
                    if let Err(error) = admitted {
                        // The socket closed with the closure: the client copies over its main connection.
                        tracing::warn!(session_id, %error, "a data connection could not be admitted");
                    }
                }
                ToWorker::Limits => {
                    outbox.send_notice(&Notice::Limits { devices: sliced_infos(&*device, &*budget) });
                    // A lower quota does not take memory back; the app is told how far over it is.
                    if let Some(bytes) = budget.limit().and_then(|limit| budget.used().checked_sub(limit)).filter(|bytes| *bytes > 0) {
                        outbox.send_notice(&Notice::OverBudget { bytes });
                    }
                }
                ToWorker::Reattach { reattach, tcp, secured } => {
                    let Some(fd) = fd else { continue };
                    let socket = if secured { Connection::secured_from_fd(fd) } else { Connection::from_fd(fd, tcp) };
                    let taken = match &returns {
                        Some((returns, stream)) if reattach.session_id == session_id => returns.offer(socket, &reattach, stream),
                        _ => {
                            let reason = flyt_protocol::control::rpc_server::session_ended(reattach.session_id);
                            let mut socket = socket;
                            let _ =
                                write_value(&mut socket, 0, &HelloReply::Refused { error: CudaError::DEVICES_UNAVAILABLE.code(), reason });
                            Err("a returning connection for a session that waits for none".into())
                        }
                    };
                    if let Err(reason) = taken {
                        tracing::warn!(session_id, %reason, "returning connection refused");
                    }
                }
                command @ (ToWorker::Checkpoint { .. } | ToWorker::Release { .. } | ToWorker::PageOut { .. }) => {
                    if let Err(unsent) = to_moves.send(command)
                        && matches!(unsent.0, ToWorker::Checkpoint { .. })
                    {
                        let refused = FromWorker::Checkpointed(Err("this session's worker has no thread for checkpoints".into()));
                        send_to_listener(&channel, &refused);
                    }
                }
                ToWorker::Serve { .. } | ToWorker::Restore { .. } => {
                    tracing::warn!(session_id, "a command for a worker without a session, ignored")
                }
            }
        }
    });
    if spawned.is_err() {
        tracing::warn!("no thread for the listener's commands: this session keeps its first limits and cannot be checkpointed");
    }
}

/// One checkpoint, release or page-out (see [`follow_commands`]).
#[allow(clippy::too_many_arguments, reason = "what each of these commands acts on")]
fn run_move<D: Device>(
    command: ToWorker,
    channel: &OwnedFd,
    outbox: &Outbox,
    moves: &MoveControl,
    device: &D,
    pager: Option<&crate::paging::Pager>,
    resumable: Option<&flyt_ring::resume::Handle>,
    session_id: u64,
) {
    match command {
        ToWorker::Checkpoint { dir, timeout_ms, on_device } => {
            // A client away (its connection broke, it may come back) cannot be asked to
            // pause: said at once rather than after the reconnect grace.
            let written = if resumable.is_some_and(flyt_ring::resume::Handle::recovering) {
                Err("its client's connection broke and the session waits for it to come back (--reconnect-grace-ms): try again later"
                    .to_string())
            } else {
                moves.checkpoint(outbox, dir.into(), std::time::Duration::from_millis(timeout_ms), on_device)
            };
            match &written {
                Ok(info) => {
                    tracing::info!(session_id, snapshot = %info.name, bytes = info.bytes, drain_us = info.drain_us, write_us = info.write_us, "checkpoint written")
                }
                Err(reason) => tracing::warn!(session_id, %reason, "checkpoint refused"),
            }
            send_to_listener(channel, &FromWorker::Checkpointed(written));
        }
        ToWorker::Release { to } => {
            if let Err(reason) = moves.release(to) {
                tracing::warn!(session_id, %reason, "release ignored");
            }
        }
        ToWorker::PageOut { reason } => match pager.map(|pager| pager.page_out(device, &reason)) {
            Some(Err(refused)) => tracing::info!(session_id, %refused, "session not paged out"),
            Some(Ok(_)) => {}
            None => tracing::warn!(session_id, "asked to page out without paging on"),
        },
        _ => {}
    }
}

/// Receives the next command and the descriptor that may come with it.
fn receive_command(channel: &OwnedFd) -> Option<(ToWorker, Option<OwnedFd>)> {
    let mut buf = vec![0u8; 1 << 20];
    let (len, fd) = crate::shareable::receive_with_fd(channel, &mut buf).ok()?;
    if len == 0 {
        return None;
    }
    let command = flyt_protocol::frame::decode_exact(&buf[..len]).ok()?;
    Some((command, fd))
}

/// The session's view of the device: its slice, not the whole card.
fn sliced_infos<D: Device>(device: &D, budget: &dyn MemoryBudget) -> Vec<DeviceInfo> {
    let mut infos = device.infos();
    if let Some(limit) = budget.limit() {
        for info in &mut infos {
            info.total_mem = info.total_mem.min(limit);
        }
    }
    // On a GPU, MPS itself reports the SM share to the context (the worker runs with
    // CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): the driver's count is the truth. The emulated device
    // has no MPS: it is made with the share's SMs (`emulated_sms`), so its attribute and its SM
    // resources (green contexts) agree.
    infos
}

/// The SMs of an emulated device of `sms` SMs that a tenant with an `sm_percentage` share sees.
fn emulated_sms(sms: u32, sm_percentage: u32) -> u32 {
    if sm_percentage >= 100 {
        return sms;
    }
    u32::try_from(u64::from(sm_percentage) * u64::from(sms) / 100).unwrap_or(sms).max(1)
}

fn serve<D: Device>(
    device: D,
    args: &WorkerArgs,
    channel: OwnedFd,
    budget: Arc<SharedBudget>,
    output: Option<Arc<crate::output::Capture>>,
) -> i32 {
    if let Err(error) = device.bind_thread() {
        send_to_listener(&channel, &FromWorker::Failed { reason: error.to_string() });
        return 1;
    }
    let device = Arc::new(device);
    let infos = sliced_infos(&*device, &*budget);
    // The listener's status reports the first GPU (a server's slice of each is the same).
    let first = &infos[0];
    let sm_count = u32::try_from(first.attribute(attr::MULTIPROCESSOR_COUNT).unwrap_or(0)).unwrap_or(0);
    send_to_listener(&channel, &FromWorker::Ready { pid: std::process::id(), total_mem: first.total_mem, sm_count });
    let mut command = receive_command(&channel);
    // A moved session's snapshot first, when this worker is to continue one.
    let mut restored = None;
    if let Some((ToWorker::Restore { path }, _)) = &command {
        let started = std::time::Instant::now();
        let outcome = crate::session::restore(&*device, &*budget, std::path::Path::new(path), args.copy_chunk);
        send_to_listener(&channel, &FromWorker::Restored(outcome.as_ref().map(|_| ()).map_err(Clone::clone)));
        match outcome {
            Ok(state) => {
                tracing::info!(snapshot = %path, took_ms = started.elapsed().as_millis() as u64, "snapshot restored");
                restored = Some((state, path.clone()));
            }
            Err(reason) => {
                tracing::warn!(snapshot = %path, %reason, "snapshot not restored");
                return 1;
            }
        }
        command = receive_command(&channel);
    }
    let Some((ToWorker::Serve { session_id, hello, tcp, peer, secured }, Some(fd))) = command else {
        // The listener went away or shut the pool down: nothing to serve.
        return 0;
    };
    // NVML's process list names the app this session serves.
    budget.set_owner(hello.client.pid);
    // A TLS session reaches the worker as the local end of the listener's TLS pump.
    let connection = if secured { Connection::secured_from_fd(fd) } else { Connection::from_fd(fd, tcp) };
    let (mut shm, shm_refusal) = match &hello.shm {
        None => (None, None),
        Some(offer) => match accept_segment(&connection, offer, &hello.client, &*device, args.ivshmem_dir.as_deref()) {
            Ok(segment) => {
                tracing::info!(session_id, size = offer.size, "shared-memory channel open");
                (Some(segment), None)
            }
            Err(reason) => {
                tracing::info!(session_id, %reason, "shared-memory channel declined");
                (None, Some(reason))
            }
        },
    };
    // A moved session continues only with the segment it had, its blocks pinned again.
    if let Some((state, path)) = &restored
        && let Err(reason) = state.reattach_segment(shm.as_mut(), &*device)
    {
        let reason = match &shm_refusal {
            Some(refusal) => format!("{reason}: {refusal}"),
            None => reason,
        };
        tracing::warn!(session_id, snapshot = %path, %reason, "moved session not continued");
        if let Ok(mut writer) = connection.try_clone() {
            let _ = write_value(&mut writer, 0, &HelloReply::Refused { error: CudaError::DEVICES_UNAVAILABLE.code(), reason });
        }
        return 1;
    }
    // With rings in the segment, small messages leave the socket after the handshake; the socket
    // stays open only to tell when the client is gone.
    let rings = shm.as_ref().zip(hello.shm.as_ref()).and_then(|(segment, offer)| ring_pair(segment, offer, &connection));
    // Bulk copies over a socket may stripe over data connections; the shared-memory channel
    // carries its own (and a session without a secret stripes nothing).
    let stripe_secret = if shm.is_none() {
        crate::stripes::random_secret()
            .map_err(|error| tracing::warn!(session_id, %error, "no stripe secret: copies use the main connection"))
            .ok()
    } else {
        None
    };
    // A TCP session whose connection breaks waits for its client to come back; the
    // shared-memory channel and Unix sockets are not networks that blip (`docs/design/reconnect.md`).
    let resume_secret = if args.reconnect_grace_ms > 0 && shm.is_none() && matches!(connection, Connection::Tcp(_) | Connection::Secured(_))
    {
        crate::stripes::random_secret()
            .map_err(|error| tracing::warn!(session_id, %error, "no resume secret: the session ends if its connection breaks"))
            .ok()
    } else {
        None
    };
    let session_info = SessionInfo {
        rings: rings.is_some(),
        session_id,
        server_version: env!("CARGO_PKG_VERSION").into(),
        driver_version: device.driver_version(),
        devices: infos,
        peers: device.peer_links(),
        nvlinks: device.nvlinks(),
        copy_chunk: args.copy_chunk,
        shm_accepted: shm.is_some(),
        shm_refusal,
        emulated: device.emulated(),
        stripe_secret,
        resume_secret,
    };
    let Ok(mut writer) = connection.try_clone() else {
        return 1;
    };
    if let Err(error) = write_value(&mut writer, 0, &HelloReply::Accepted(session_info)) {
        tracing::info!(session_id, %error, "client left during the handshake");
        return 0;
    }
    let mut returns = None;
    let (reader, writer) = match (rings, resume_secret) {
        (Some((reader, writer)), _) => {
            let socket = Arc::new(connection);
            (Connection::RingIn(reader, socket.clone()), Connection::RingOut(writer, socket))
        }
        (None, Some(secret)) => {
            let waiting = crate::reconnect::Returns::new(session_id, secret, std::time::Duration::from_millis(args.reconnect_grace_ms));
            drop(writer);
            match flyt_ring::resume::resumable(connection, waiting.waiter(), flyt_ring::resume::DEFAULT_KEPT) {
                Ok((reader, writer, stream)) => {
                    returns = Some((waiting, stream));
                    (reader, writer)
                }
                Err(error) => {
                    tracing::warn!(session_id, %error, "no resumable stream: session closed");
                    return 1;
                }
            }
        }
        (None, None) => (connection, writer),
    };
    let image_cache = args.image_cache.as_deref().and_then(|dir| match ImageCache::open(dir, args.image_cache_size) {
        Ok(cache) => Some(Arc::new(cache)),
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "module image cache off for this session");
            None
        }
    });
    // SAFETY: the listener placed the stats page at STATS_FD before exec, and nothing else in
    // this process owns it.
    let stats_file = unsafe { std::fs::File::from_raw_fd(STATS_FD) };
    let stats = match crate::stats::StatsPage::map(&stats_file) {
        Ok(page) => Some(Arc::new(crate::stats::SlotStats::new(page, args.budget_slot))),
        Err(error) => {
            tracing::warn!(%error, "no metrics page: this session is not counted");
            None
        }
    };
    let config = SessionConfig {
        copy_chunk: args.copy_chunk,
        image_cache,
        stats,
        time_calls: args.time_calls,
        inline_wait: std::time::Duration::from_micros(args.inline_wait_us),
        ..SessionConfig::default()
    };
    let pager = pager_for(args, &channel, &budget);
    let session_budget: Arc<dyn MemoryBudget> = match &pager {
        Some(pager) => Arc::new(crate::paging::PagedBudget::new(budget.clone(), pager.clone())),
        None => budget.clone(),
    };
    let mut session = Session::new(device.clone(), session_budget, writer, config, shm, output);
    if let Some(pager) = &pager {
        // Host memory pinned ahead as the session allocates, ready for its page-outs.
        pager.start_pool(device.clone(), args.page_chunk);
        pager.set_session(session_id);
        session.set_pager(pager.clone());
    }
    if let Some((state, path)) = restored {
        session.adopt(state);
        // What the restore reserved is resident too.
        if let Some(pager) = &pager
            && !pager.residency().claim(budget.slot_used(args.budget_slot))
        {
            tracing::warn!(session_id, "the restored session's memory does not fit the resident share: it stays resident, uncounted");
        }
        // The app is back: its snapshot has served its purpose.
        if let Err(error) = std::fs::remove_file(&path) {
            tracing::warn!(snapshot = %path, %error, "snapshot not removed");
        }
    }
    let stripes = stripe_secret.map(|secret| session.enable_stripes(secret, args.staging_slots));
    if let (Some(stripes), Some(_)) = (&stripes, &returns) {
        stripes.resend_broken_copies();
    }
    follow_commands(channel, &session, session_id, device, budget, stripes, pager, returns);
    let outcome = session.serve(reader);
    let program = hello.client.program;
    match outcome {
        Ok(()) => tracing::info!(session_id, %program, %peer, "session ended by the client"),
        Err(error) => {
            tracing::warn!(session_id, %program, %peer, %error, "session closed: protocol error")
        }
    }
    drop(session);
    0
}

/// The emulated host's GPUs (their ordinals) that `gpus` name, read through this process's
/// `CUDA_VISIBLE_DEVICES` as the driver reads it: a worker sees only the GPUs its listener let
/// it see, numbered from 0, and any other index is refused.
fn emulated_host_gpus(gpus: &[u32], visible_devices: Option<&str>) -> Result<Vec<usize>, String> {
    use crate::backend::emulated::{HOST_GPUS, host_uuid_names};
    let visible = match visible_devices {
        Some(value) => crate::visible::parse(value, &host_uuid_names()),
        None => (0..HOST_GPUS).collect(),
    };
    let mut host_gpus = Vec::with_capacity(gpus.len());
    for gpu in gpus {
        let ordinal = visible.get(*gpu as usize).copied().ok_or_else(|| format!("GPU {gpu} does not exist ({} visible)", visible.len()))?;
        if host_gpus.contains(&ordinal) {
            return Err(format!("GPU {gpu} named twice"));
        }
        host_gpus.push(ordinal);
    }
    if host_gpus.is_empty() {
        return Err("no GPU named".into());
    }
    Ok(host_gpus)
}

/// Whether the opened devices are the GPUs the listener meant (`--gpu-uuids`).
fn check_gpus<D: Device>(args: &WorkerArgs, device: &D) -> Result<(), String> {
    if args.gpu_uuids.is_empty() {
        return Ok(());
    }
    let found: Vec<[u8; 16]> = device.infos().iter().map(|info| info.uuid).collect();
    crate::visible::check_uuids(&args.gpu_uuids, &found)
}

/// Runs a worker process to its end; returns the exit code.
pub fn run(args: &WorkerArgs, output: Option<Arc<crate::output::Capture>>) -> i32 {
    // SAFETY: the listener placed the channel and the budget page at these descriptors before
    // exec (`listener::spawn_worker`), and nothing else in this process owns them.
    let (channel, budget_file) = unsafe { (OwnedFd::from_raw_fd(CHANNEL_FD), std::fs::File::from_raw_fd(BUDGET_FD)) };
    let budget = match SharedBudget::map(&budget_file, args.budget_slot) {
        Ok(budget) => Arc::new(budget),
        Err(error) => {
            send_to_listener(&channel, &FromWorker::Failed { reason: format!("budget page: {error}") });
            return 1;
        }
    };
    match args.backend {
        BackendKind::Emulated => {
            let visible_devices = std::env::var(crate::visible::VARIABLE).ok();
            let opened = emulated_host_gpus(&args.gpu, visible_devices.as_deref()).and_then(|host_gpus| {
                let config =
                    EmulatedConfig { memory: args.emulated_memory, sms: emulated_sms(args.emulated_sms, args.sm_percentage), host_gpus };
                let device = EmulatedDevice::new(config).keep_allocation_addresses(args.paging.is_some());
                check_gpus(args, &device).map(|()| device)
            });
            match opened {
                Ok(device) => serve(device, args, channel, budget, output),
                Err(reason) => {
                    send_to_listener(&channel, &FromWorker::Failed { reason });
                    1
                }
            }
        }
        BackendKind::Cuda | BackendKind::Auto => {
            let chunk = usize::try_from(args.copy_chunk).unwrap_or(4 << 20);
            let nvlinks = args.nvlinks.as_deref().and_then(|word| {
                crate::backend::nvlinks::decode(word, args.gpu.len())
                    .inspect_err(|reason| tracing::warn!(%reason, "asking NVML instead"))
                    .ok()
            });
            let opened = CudaDevice::open(&args.gpu, args.staging_slots, chunk, nvlinks)
                .map(|device| device.keep_allocation_addresses(args.paging.is_some()))
                .and_then(|device| check_gpus(args, &device).map(|()| device));
            match opened {
                Ok(device) => serve(device, args, channel, budget, output),
                Err(reason) => {
                    send_to_listener(&channel, &FromWorker::Failed { reason });
                    1
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::visible::uuid_name;

    #[test]
    fn an_emulated_worker_sees_only_its_visible_gpus_numbered_from_zero() {
        let gpu = |ordinal| uuid_name(&crate::backend::emulated::host_uuid(ordinal), false);
        let visible = format!("{},{}", gpu(5), gpu(2));
        assert_eq!(emulated_host_gpus(&[0, 1], Some(&visible)), Ok(vec![5, 2]));
        assert_eq!(emulated_host_gpus(&[1], Some(&visible)), Ok(vec![2]));
        assert_eq!(emulated_host_gpus(&[2], Some(&visible)), Err("GPU 2 does not exist (2 visible)".into()), "past the list");
        assert_eq!(emulated_host_gpus(&[0], Some(&gpu(99))), Err("GPU 0 does not exist (0 visible)".into()), "a GPU the host lacks");
        assert_eq!(emulated_host_gpus(&[3], None), Ok(vec![3]), "unset: the whole host");
        assert_eq!(emulated_host_gpus(&[1, 1], None), Err("GPU 1 named twice".into()));
    }
}
