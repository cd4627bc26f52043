//! The rpc-servers of this node: one per allocation, bound to one GPU with its SM share and
//! memory quota.
//!
//! Each server runs in a process group of its own (a Ctrl-C or a crash of the node manager does
//! not take it down), writes its listening line to `<state>/servers/<id>.out` and its log to
//! `<id>.log`, and is recorded in `<id>.json` (pid, start time, control socket) once it listens.
//! A restarted node manager adopts what those records describe and is still running, and the
//! cluster manager says which of them to keep. A server whose node manager died before
//! recording it (mid-start) is found by its command line (its `--control` socket lies in this
//! state folder) and stopped: the cluster manager starts it again if it still wants it, so
//! nothing is orphaned.
//!
//! Every step is safe to cut short: a start killed before the record leaves a server the next
//! node manager stops; a resize killed before the record is rewritten leaves a record the next
//! status query corrects (the server's own answer wins); a stop killed half way leaves a record
//! of a server that is either gone (forgotten) or still running (adopted, then stopped on the
//! cluster manager's word).

use std::{
    collections::BTreeMap,
    fs::{self, File, OpenOptions},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use flyt_daemon_kit::{
    auth::ClusterKey,
    failpoint,
    fs::write_atomic,
    host::{process_alive, process_start_time},
    rpc::{self, Endpoint},
};
use flyt_protocol::control::{
    auth::ServiceName,
    cluster::{ControlError, GpuInfo, MAX_ADDRESS_WINDOW, RestartReport, ServerReport},
    node::{ServerRef, ServerSpec},
    rpc_server::{RpcServerControlClient, SessionStatus, SnapshotInfo},
};
use nix::{
    sys::signal::{Signal, kill, killpg},
    unistd::Pid,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::snapshots::SnapshotStore;

/// What `flyt-rpc-server` prints on stdout once it listens.
pub const READY_PREFIX: &str = "flyt-rpc-server listening on ";
const MIB: u64 = 1 << 20;
/// Deadline of status queries made for every heartbeat.
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);
/// Deadline of resize calls.
const RESIZE_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of session listings and releases.
const SESSION_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long released apps get to leave a server being restarted.
const DEPARTURE_TIMEOUT: Duration = Duration::from_secs(15);
/// What a checkpoint's writing or a restore may take beyond the app's pause: the rpc-server
/// allows 600 s for device memory by the tens of GiB.
const SNAPSHOT_CALL_TIMEOUT: Duration = Duration::from_secs(660);

/// Which backend the rpc-servers of this node use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cuda,
    Emulated,
}

impl DeviceKind {
    fn flag(self) -> &'static str {
        match self {
            Self::Cuda => "cuda",
            Self::Emulated => "emulated",
        }
    }
}

/// How servers are launched on this node.
#[derive(Clone, Debug)]
pub struct LaunchSettings {
    pub binary: String,
    pub listen_host: String,
    /// Folder of the servers' client-facing Unix sockets; `None`: TCP only.
    pub socket_dir: Option<PathBuf>,
    /// Host written into advertised addresses in place of a wildcard.
    pub advertise_host: String,
    pub key_file: PathBuf,
    pub servers_dir: PathBuf,
    /// The module image cache all servers of this node share (large images clients loaded,
    /// by content: a session on any of them need not send one again).
    pub image_cache_dir: PathBuf,
    /// Snapshots of sessions of allocations moving to or from this node, a folder each.
    pub snapshot_dir: PathBuf,
    pub device: DeviceKind,
    pub gpus: Vec<GpuInfo>,
    /// Extra environment (MPS directories).
    pub env: Vec<(String, String)>,
    pub start_timeout: Duration,
    pub stop_grace_seconds: u32,
    /// Host each server serves Prometheus metrics on (port chosen by the server); `None`: off.
    pub metrics_host: Option<String>,
    /// The VMs' ivshmem region folder every server is given; `None`: off.
    pub ivshmem_dir: Option<PathBuf>,
    /// Certificate and key the servers show TCP clients (TLS on the data plane), from `[tls]`.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// How many times its memory a GPU's slices may promise (`--oversubscribe`); `None`: 1.
    pub oversubscribe: Option<f64>,
}

impl LaunchSettings {
    /// The memory a GPU's slices may promise: its own, times the oversubscription.
    fn promisable(&self, gpu: &GpuInfo) -> u64 {
        self.oversubscribe.map_or(gpu.memory_bytes, |factor| promised(gpu.memory_bytes, factor))
    }
}

/// `memory_bytes` times an oversubscription `factor` (from 1 to 64: the product fits u64).
#[expect(clippy::cast_possible_truncation, reason = "bytes of GPU memory times a small factor, far below u64::MAX")]
pub fn promised(memory_bytes: u64, factor: f64) -> u64 {
    (memory_bytes as f64 * factor) as u64
}

/// What is recorded per server, so a restarted node manager can find it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerRecord {
    /// What it was started as (its slice as last resized): its allocation, GPUs, memory, SM
    /// share and address window, as keys of the record itself.
    #[serde(flatten)]
    pub spec: ServerSpec,
    pub pid: u32,
    /// `/proc/<pid>/stat` start time, so a reused pid is not mistaken for the server.
    pub start_time: Option<u64>,
    pub control_socket: PathBuf,
    pub addresses: Vec<String>,
}

/// A server's answer to a status query.
struct Usage {
    sessions: u32,
    /// Bytes its sessions hold.
    memory_used: u64,
    /// Its per-session quota in bytes.
    memory_quota: u64,
    sm_percentage: u32,
    /// Where it serves metrics, advertised.
    metrics: Option<String>,
}

/// Processes started with a `--control unix:<servers_dir>/<name>.control.sock` argument: the
/// rpc-servers of this state folder, by pid, with their names (see [`server_name`]). (Their
/// workers run with other arguments and are stopped with their server's process group.)
fn servers_started_in(servers_dir: &Path) -> Vec<(u32, String)> {
    let prefix = format!("unix:{}/", servers_dir.display());
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let command_line = fs::read(entry.path().join("cmdline")).ok()?;
            let arguments: Vec<&[u8]> = command_line.split(|byte| *byte == 0).collect();
            let position = arguments.iter().position(|argument| *argument == b"--control")?;
            let control = std::str::from_utf8(arguments.get(position + 1)?).ok()?;
            let id = control.strip_prefix(&prefix)?.strip_suffix(".control.sock")?;
            valid_server_name(id).then(|| (pid, id.to_string()))
        })
        .collect()
}

struct ManagedServer {
    record: ServerRecord,
    /// Our child (reaped with `try_wait`); `None` for a server adopted after a restart.
    child: Option<Child>,
    control: Option<RpcServerControlClient>,
    /// Being replaced by a fresh process (`restart`): kept and reported while none runs.
    restarting: bool,
}

/// This node's rpc-servers.
pub struct ServerManager {
    settings: LaunchSettings,
    key: ClusterKey,
    servers: Mutex<BTreeMap<String, ManagedServer>>,
    /// Starts and stops one at a time: a repeated start for one allocation finds the first.
    lifecycle: Mutex<()>,
    /// Held by resizes: a record is corrected from a server's status only when none runs.
    resizing: Mutex<()>,
    snapshots: SnapshotStore,
}

/// The name of an allocation's server on GPU `gpu`, where `taken` says which names are in use:
/// the allocation's id, or, beside a server of it on another GPU (a move between this node's
/// GPUs), the id with the GPU after a `~`. Names become file names (records, sockets).
fn server_name(allocation_id: &str, gpu: u32, taken: impl Fn(&str) -> bool) -> String {
    if taken(allocation_id) { format!("{allocation_id}~gpu{gpu}") } else { allocation_id.to_string() }
}

/// Whether `server` names the server `record` describes.
fn names(server: &ServerRef, record: &ServerRecord) -> bool {
    record.spec.allocation_id == server.allocation_id
        && server.gpu.is_none_or(|gpu| record.spec.gpu == gpu)
        && server.extra_gpus.as_ref().is_none_or(|extra| *extra == record.spec.extra_gpus)
}

/// Whether `name` is a server name [`server_name`] makes (checked where names come from files
/// and command lines).
fn valid_server_name(name: &str) -> bool {
    match name.split_once('~') {
        Some((id, gpu)) => valid_allocation_id(id) && gpu.strip_prefix("gpu").is_some_and(|digits| digits.parse::<u32>().is_ok()),
        None => valid_allocation_id(name),
    }
}

pub(crate) fn valid_allocation_id(id: &str) -> bool {
    // Ids become file names: nothing but these characters, so no path can escape the folder.
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
}

fn spawn_error(message: impl Into<String>) -> ControlError {
    ControlError::Spawn(message.into())
}

/// Puts the advertised host in place of a wildcard listen address (`0.0.0.0:4000`).
fn advertise(address: &str, host: &str) -> String {
    for wildcard in ["0.0.0.0:", "[::]:"] {
        if let Some(port) = address.strip_prefix(wildcard) {
            let host = if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() };
            return format!("{host}:{port}");
        }
    }
    address.to_string()
}

/// The port of the TCP address among a server's `addresses` (`host:port`; the others are
/// `unix:` paths).
fn tcp_port(addresses: &[String]) -> Option<u16> {
    let address = addresses.iter().find(|address| !address.starts_with("unix:"))?;
    address.rsplit_once(':')?.1.parse().ok().filter(|port| *port != 0)
}

/// What a failed step says, without repeating "the rpc-server refused".
fn reason(error: ControlError) -> String {
    match error {
        ControlError::Server(reason) => reason,
        other => other.to_string(),
    }
}

/// Moves every file of folder `from` into folder `to` (one file system).
fn move_files(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        fs::rename(entry.path(), to.join(entry.file_name()))?;
    }
    Ok(())
}

fn micros_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX)
}

fn last_lines(path: &Path, count: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join(" | ")
}

fn signal(pid: u32, signal: Signal, group: bool) {
    let Ok(raw) = i32::try_from(pid) else { return };
    if raw <= 1 {
        return;
    }
    let _ = if group { killpg(Pid::from_raw(raw), signal) } else { kill(Pid::from_raw(raw), signal) };
}

impl ManagedServer {
    fn alive(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => process_alive(self.record.pid, self.record.start_time),
        }
    }
}

impl ServerManager {
    /// A manager over `settings.servers_dir`, adopting the recorded servers that still run.
    pub fn new(settings: LaunchSettings, key: ClusterKey) -> std::io::Result<Self> {
        flyt_daemon_kit::fs::create_dir_with_mode(&settings.servers_dir, 0o700)?;
        let mut servers = BTreeMap::new();
        for entry in fs::read_dir(&settings.servers_dir)? {
            let path = entry?.path();
            if path.extension().and_then(|extension| extension.to_str()) != Some("json") {
                continue;
            }
            let record: Option<ServerRecord> = fs::read(&path).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok());
            // The record's file is named after its server.
            let name = path.file_stem().and_then(|stem| stem.to_str()).unwrap_or_default().to_string();
            let named = |record: &ServerRecord| {
                valid_server_name(&name)
                    && valid_allocation_id(&record.spec.allocation_id)
                    && name.split('~').next() == Some(record.spec.allocation_id.as_str())
            };
            match record {
                Some(record) if named(&record) && process_alive(record.pid, record.start_time) => {
                    tracing::info!(allocation = %record.spec.allocation_id, server = %name, pid = record.pid, "adopting a running rpc-server");
                    servers.insert(name, ManagedServer { record, child: None, control: None, restarting: false });
                }
                Some(record) if named(&record) => {
                    tracing::info!(allocation = %record.spec.allocation_id, pid = record.pid, "a recorded rpc-server is gone; forgetting it");
                    Self::remove_files(&settings, &name);
                }
                _ => {
                    tracing::warn!(path = %path.display(), "unreadable server record, or one not named after its allocation; removing it");
                    let _ = fs::remove_file(&path);
                }
            }
        }
        Self::stop_unrecorded(&settings, &servers);
        for id in servers.keys() {
            let _ = flyt_daemon_kit::fs::remove_stale_temporaries(&Self::record_path(&settings, id));
        }
        let snapshots = SnapshotStore::new(settings.snapshot_dir.clone());
        Ok(Self { settings, key, servers: Mutex::new(servers), lifecycle: Mutex::new(()), resizing: Mutex::new(()), snapshots })
    }

    /// Stops rpc-servers started from this state folder that no record describes: their node
    /// manager died after starting them and before recording them.
    fn stop_unrecorded(settings: &LaunchSettings, adopted: &BTreeMap<String, ManagedServer>) {
        for (pid, id) in servers_started_in(&settings.servers_dir) {
            if adopted.get(&id).is_some_and(|server| server.record.pid == pid) {
                continue;
            }
            tracing::warn!(allocation = %id, pid, "an rpc-server was left mid-start by a node manager that died before recording it: stopping it");
            signal(pid, Signal::SIGKILL, true);
            signal(pid, Signal::SIGKILL, false);
            let deadline = Instant::now() + Duration::from_secs(5);
            while process_alive(pid, None) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if !adopted.contains_key(&id) {
                Self::remove_files(settings, &id);
            }
        }
    }

    fn record_path(settings: &LaunchSettings, id: &str) -> PathBuf {
        settings.servers_dir.join(format!("{id}.json"))
    }

    fn remove_files(settings: &LaunchSettings, id: &str) {
        for name in [format!("{id}.json"), format!("{id}.out"), format!("{id}.control.sock")] {
            let _ = fs::remove_file(settings.servers_dir.join(name));
        }
        if let Some(folder) = &settings.socket_dir {
            let _ = fs::remove_file(folder.join(format!("{id}.sock")));
        }
    }

    fn report(record: &ServerRecord, usage: Option<&Usage>) -> ServerReport {
        let (sessions, memory_used_bytes, metrics) =
            usage.map_or((0, 0, None), |usage| (usage.sessions, usage.memory_used, usage.metrics.clone()));
        ServerReport {
            metrics,
            allocation_id: record.spec.allocation_id.clone(),
            gpu: record.spec.gpu,
            extra_gpus: record.spec.extra_gpus.clone(),
            pid: record.pid,
            addresses: record.addresses.clone(),
            memory_quota_bytes: record.spec.memory.saturating_mul(MIB),
            sm_percentage: record.spec.sm_percentage,
            sessions,
            memory_used_bytes,
        }
    }

    /// The command line of server `name` for `spec` on `gpu`, listening on TCP port `tcp_port`
    /// (0: one the system picks) and restoring the snapshots of `snapshot_dir` for apps that
    /// come back with their names.
    fn command(
        &self,
        name: &str,
        spec: &ServerSpec,
        gpu: &GpuInfo,
        control_socket: &Path,
        tcp_port: u16,
        snapshot_dir: Option<&Path>,
    ) -> Command {
        let settings = &self.settings;
        let mut command = Command::new(&settings.binary);
        command.arg("--listen").arg(format!("{}:{tcp_port}", settings.listen_host));
        if let Some(folder) = &settings.socket_dir {
            command.arg("--listen").arg(format!("unix:{}", folder.join(format!("{name}.sock")).display()));
        }
        command
            .args(["--device", settings.device.flag()])
            .args([
                "--gpu",
                &std::iter::once(gpu.index)
                    .chain(spec.extra_gpus.iter().copied())
                    .map(|index| index.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            ])
            .args(["--memory-quota", &spec.memory.saturating_mul(MIB).to_string()])
            .args(["--sm-percentage", &spec.sm_percentage.to_string()])
            .arg("--cluster-key-file")
            .arg(&settings.key_file)
            .args(["--allocation", &spec.allocation_id])
            .arg("--control")
            .arg(format!("unix:{}", control_socket.display()))
            .arg("--image-cache")
            .arg(&settings.image_cache_dir);
        if let Some((cert, key)) = &settings.tls {
            command.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
        }
        if let Some(host) = &settings.metrics_host {
            command.arg("--metrics-listen").arg(format!("{host}:0"));
        }
        if let Some(dir) = &settings.ivshmem_dir {
            command.arg("--ivshmem-dir").arg(dir);
        }
        if let Some(dir) = snapshot_dir {
            command.arg("--snapshot-dir").arg(dir);
        }
        if let Some(factor) = settings.oversubscribe {
            command.args(["--oversubscribe", &factor.to_string()]);
        }
        if spec.address_window > 0 {
            command.args(["--address-window", &spec.address_window.to_string()]);
        }
        if settings.device == DeviceKind::Emulated {
            command.args(["--emulated-memory", &gpu.memory_bytes.to_string()]).args(["--emulated-sms", &gpu.sm_count.to_string()]);
        }
        command.envs(settings.env.iter().map(|(name, value)| (name, value)));
        command
    }

    /// GPU `index` of this node.
    fn gpu(&self, index: u32) -> Result<GpuInfo, ControlError> {
        self.settings
            .gpus
            .iter()
            .find(|gpu| gpu.index == index)
            .cloned()
            .ok_or_else(|| ControlError::Invalid(format!("this node has no GPU {index}")))
    }

    /// Starts the server for `spec` and waits until it listens; an already running server for
    /// the allocation on that GPU is reported as it is. One on another GPU runs on beside it (a
    /// move between this node's GPUs), under a name of its own.
    pub async fn start(&self, spec: ServerSpec) -> Result<ServerReport, ControlError> {
        if !valid_allocation_id(&spec.allocation_id) {
            return Err(ControlError::Invalid(format!("bad allocation id {:?}", spec.allocation_id)));
        }
        let _one_at_a_time = self.lifecycle.lock().await;
        let name = {
            let servers = self.servers.lock().await;
            let mut mine = servers.values().filter(|server| server.record.spec.allocation_id == spec.allocation_id);
            // The same GPUs: started already. Another set with the same first GPU (one GPU of the
            // allocation moving) runs beside it, as one on another first GPU does.
            if let Some(server) =
                mine.clone().find(|server| server.record.spec.gpu == spec.gpu && server.record.spec.extra_gpus == spec.extra_gpus)
            {
                return Ok(Self::report(&server.record, None));
            }
            if mine.nth(1).is_some() {
                return Err(ControlError::Invalid(format!("allocation {} already runs two servers on this node", spec.allocation_id)));
            }
            server_name(&spec.allocation_id, spec.gpu, |name| servers.contains_key(name))
        };
        let gpu = self.gpu(spec.gpu)?;
        if spec.sm_percentage == 0
            || spec.sm_percentage > 100
            || spec.memory == 0
            || spec.memory.saturating_mul(MIB) > self.settings.promisable(&gpu)
        {
            return Err(ControlError::Invalid(format!("GPU {} cannot give {} MiB at {}% SMs", gpu.index, spec.memory, spec.sm_percentage)));
        }
        if spec.address_window > MAX_ADDRESS_WINDOW {
            return Err(ControlError::Invalid(format!("address window {} is above {MAX_ADDRESS_WINDOW}", spec.address_window)));
        }
        for (at, extra) in spec.extra_gpus.iter().enumerate() {
            let other = self.gpu(*extra)?;
            if *extra == spec.gpu || spec.extra_gpus[..at].contains(extra) {
                return Err(ControlError::Invalid(format!("GPU {extra} named twice for allocation {}", spec.allocation_id)));
            }
            if spec.memory.saturating_mul(MIB) > self.settings.promisable(&other) {
                return Err(ControlError::Invalid(format!("GPU {extra} cannot give {} MiB", spec.memory)));
            }
        }
        let (child, addresses) = self.spawn(&name, &spec, &gpu, 0, None).await?;
        let id = &spec.allocation_id;
        let pid = child.id();
        failpoint::hit("node.listening");
        let record = ServerRecord {
            spec: ServerSpec { allocation_id: id.clone(), gpu: gpu.index, ..spec.clone() },
            pid,
            start_time: process_start_time(pid),
            control_socket: self.settings.servers_dir.join(format!("{name}.control.sock")),
            addresses,
        };
        self.write_record(&name, &record)?;
        let report = Self::report(&record, None);
        self.servers.lock().await.insert(name, ManagedServer { record, child: Some(child), control: None, restarting: false });
        Ok(report)
    }

    /// The name of the allocation's server `server` names: the one on its GPU, or its only one.
    pub async fn name_of(&self, server: &ServerRef) -> Result<String, ControlError> {
        let servers = self.servers.lock().await;
        let matching: Vec<(&String, u32)> = servers
            .iter()
            .filter(|(_, managed)| names(server, &managed.record))
            .map(|(name, managed)| (name, managed.record.spec.gpu))
            .collect();
        match matching.as_slice() {
            [(name, _)] => Ok((*name).clone()),
            [] => Err(ControlError::UnknownAllocation(server.to_string())),
            several => {
                let gpus: Vec<String> = several.iter().map(|(_, gpu)| gpu.to_string()).collect();
                Err(ControlError::Invalid(format!(
                    "allocation {} runs servers on GPUs {} of this node: name one",
                    server.allocation_id,
                    gpus.join(" and ")
                )))
            }
        }
    }

    /// Stops the allocation's server `server` names, or all of its servers here.
    pub async fn stop_server(&self, server: &ServerRef) -> Result<(), ControlError> {
        let names: Vec<String> =
            self.servers.lock().await.iter().filter(|(_, managed)| names(server, &managed.record)).map(|(name, _)| name.clone()).collect();
        for name in names {
            self.stop(&name).await?;
        }
        Ok(())
    }

    /// Runs server `name` for `spec` on `gpu` (see [`Self::command`]) and waits until it
    /// listens; returns it with its advertised addresses. A server that does not come up is
    /// killed and its files removed.
    async fn spawn(
        &self,
        name: &str,
        spec: &ServerSpec,
        gpu: &GpuInfo,
        tcp_port: u16,
        snapshot_dir: Option<&Path>,
    ) -> Result<(Child, Vec<String>), ControlError> {
        let id = name;
        let dir = &self.settings.servers_dir;
        let out_path = dir.join(format!("{id}.out"));
        let log_path = dir.join(format!("{id}.log"));
        let control_socket = dir.join(format!("{id}.control.sock"));
        if let Some(folder) = &self.settings.socket_dir {
            fs::create_dir_all(folder).map_err(|error| spawn_error(format!("cannot create {}: {error}", folder.display())))?;
        }
        let stdout = File::create(&out_path).map_err(|error| spawn_error(format!("cannot create {}: {error}", out_path.display())))?;
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|error| spawn_error(format!("cannot open {}: {error}", log_path.display())))?;
        let mut command = self.command(name, spec, gpu, &control_socket, tcp_port, snapshot_dir);
        // A group of its own: signals meant for the node manager's group do not reach it.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        command.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
        let mut child = command
            .spawn()
            .map_err(|error| spawn_error(format!("cannot run {}: {error} (set [rpc_server] binary)", self.settings.binary)))?;
        let pid = child.id();
        tracing::info!(allocation = %spec.allocation_id, server = %id, pid, gpu = gpu.index, memory_mib = spec.memory, sm_percentage = spec.sm_percentage, "rpc-server started");
        failpoint::hit("node.spawned");

        match self.wait_until_listening(&mut child, &out_path, &log_path).await {
            Ok(addresses) => Ok((child, addresses)),
            Err(error) => {
                signal(pid, Signal::SIGKILL, true);
                let _ = child.wait();
                Self::remove_files(&self.settings, id);
                Err(error)
            }
        }
    }

    fn write_record(&self, name: &str, record: &ServerRecord) -> Result<(), ControlError> {
        let bytes = serde_json::to_vec_pretty(record).map_err(|error| spawn_error(error.to_string()))?;
        write_atomic(&Self::record_path(&self.settings, name), &bytes, 0o600)
            .map_err(|error| spawn_error(format!("cannot record the server in {}: {error}", self.settings.servers_dir.display())))
    }

    async fn wait_until_listening(&self, child: &mut Child, out_path: &Path, log_path: &Path) -> Result<Vec<String>, ControlError> {
        let started = Instant::now();
        loop {
            let output = fs::read_to_string(out_path).unwrap_or_default();
            if let Some(line) = output.lines().find(|line| line.starts_with(READY_PREFIX))
                && output.contains('\n')
            {
                let addresses: Vec<String> = line[READY_PREFIX.len()..]
                    .split_whitespace()
                    .map(|address| advertise(address, &self.settings.advertise_host))
                    .collect();
                if addresses.is_empty() {
                    return Err(spawn_error("the server printed no address"));
                }
                return Ok(addresses);
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(spawn_error(format!(
                    "{} exited ({status}) before listening; its log {}: {}",
                    self.settings.binary,
                    log_path.display(),
                    last_lines(log_path, 5)
                )));
            }
            if started.elapsed() > self.settings.start_timeout {
                return Err(spawn_error(format!(
                    "{} did not print its listening line within {:?}; its log {}: {}",
                    self.settings.binary,
                    self.settings.start_timeout,
                    log_path.display(),
                    last_lines(log_path, 5)
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A control client for the server (connected on first use, dropped on failure).
    async fn control(&self, id: &str) -> Option<RpcServerControlClient> {
        let socket = {
            let servers = self.servers.lock().await;
            let server = servers.get(id)?;
            if let Some(control) = &server.control {
                return Some(control.clone());
            }
            server.record.control_socket.clone()
        };
        let stream = rpc::connect(&Endpoint::Unix(socket.clone()), &self.key, ServiceName::RpcServerControl).await;
        let stream = match stream {
            Ok(stream) => stream,
            Err(error) => {
                tracing::debug!(allocation = id, %error, "rpc-server control socket unavailable");
                return None;
            }
        };
        let client = RpcServerControlClient::new(tarpc::client::Config::default(), rpc::transport(stream)).spawn();
        if let Some(server) = self.servers.lock().await.get_mut(id) {
            server.control = Some(client.clone());
        }
        Some(client)
    }

    async fn forget_control(&self, id: &str) {
        if let Some(server) = self.servers.lock().await.get_mut(id) {
            server.control = None;
        }
    }

    /// Changes a server's memory quota and/or SM share through its control socket.
    pub async fn resize(&self, id: &str, memory: Option<u64>, sm_percentage: Option<u32>) -> Result<ServerReport, ControlError> {
        let _resizing = self.resizing.lock().await;
        if !self.servers.lock().await.contains_key(id) {
            return Err(ControlError::UnknownAllocation(id.to_string()));
        }
        let control = self
            .control(id)
            .await
            .ok_or_else(|| ControlError::Server(format!("the rpc-server of {id} does not answer on its control socket")))?;
        let result = control.resize(rpc::deadline(RESIZE_TIMEOUT), memory.map(|mib| mib.saturating_mul(MIB)), sm_percentage).await;
        let status = match result {
            Ok(Ok(status)) => status,
            Ok(Err(reason)) => return Err(ControlError::Server(reason)),
            Err(error) => {
                self.forget_control(id).await;
                return Err(ControlError::Server(format!("resize of {id} failed: {error}")));
            }
        };
        let mut servers = self.servers.lock().await;
        let server = servers.get_mut(id).ok_or_else(|| ControlError::UnknownAllocation(id.to_string()))?;
        if let Some(memory) = memory {
            server.record.spec.memory = memory;
        }
        if let Some(percentage) = sm_percentage {
            server.record.spec.sm_percentage = percentage;
        }
        let record = server.record.clone();
        drop(servers);
        self.write_record(id, &record)?;
        tracing::info!(allocation = id, memory_mib = record.spec.memory, sm_percentage = record.spec.sm_percentage, "rpc-server resized");
        let usage = Usage {
            sessions: u32::try_from(status.sessions.len()).unwrap_or(u32::MAX),
            memory_used: status.sessions.iter().map(|session| session.memory_used).sum(),
            memory_quota: status.memory_quota,
            sm_percentage: status.sm_percentage,
            metrics: status.metrics.map(|address| advertise(&address, &self.settings.advertise_host)),
        };
        Ok(Self::report(&record, Some(&usage)))
    }

    /// This node's snapshot folders.
    pub fn snapshots(&self) -> &SnapshotStore {
        &self.snapshots
    }

    /// The cluster key this node proves itself with (to other node managers too).
    pub fn key(&self) -> &ClusterKey {
        &self.key
    }

    /// The control client of allocation `id`'s server, or why there is none.
    async fn control_of(&self, id: &str) -> Result<RpcServerControlClient, ControlError> {
        if !self.servers.lock().await.contains_key(id) {
            return Err(ControlError::UnknownAllocation(id.to_string()));
        }
        self.control(id).await.ok_or_else(|| ControlError::Server(format!("the rpc-server of {id} does not answer on its control socket")))
    }

    /// A failed control call: the connection is dropped (the next call reconnects).
    async fn control_call_failed(&self, id: &str, what: &str, error: &tarpc::client::RpcError) -> ControlError {
        self.forget_control(id).await;
        ControlError::Server(format!("{what} on the rpc-server of {id} failed: {error}"))
    }

    /// The live sessions of allocation `id`'s server.
    pub async fn sessions(&self, id: &str) -> Result<Vec<SessionStatus>, ControlError> {
        let control = self.control_of(id).await?;
        match control.status(rpc::deadline(SESSION_CALL_TIMEOUT)).await {
            Ok(status) => Ok(status.sessions),
            Err(error) => Err(self.control_call_failed(id, "the status query", &error).await),
        }
    }

    /// Pauses a session of server `id` and writes its snapshot into `dir` (`on_device`: without
    /// its device memory, which a server of this host copies GPU to GPU).
    pub async fn checkpoint(
        &self,
        id: &str,
        session_id: u64,
        dir: &Path,
        timeout_ms: u64,
        on_device: bool,
    ) -> Result<SnapshotInfo, ControlError> {
        let control = self.control_of(id).await?;
        let deadline = rpc::deadline(Duration::from_millis(timeout_ms) + SNAPSHOT_CALL_TIMEOUT);
        let (dir_text, context) = (dir.display().to_string(), deadline);
        let checkpoint = if on_device {
            control.checkpoint_on_device(context, session_id, dir_text, timeout_ms).await
        } else {
            control.checkpoint(context, session_id, dir_text, timeout_ms).await
        };
        match checkpoint {
            Ok(Ok(info)) => {
                tracing::info!(allocation = id, session_id, snapshot = %info.name, bytes = info.bytes, dir = %dir.display(), "session checkpointed");
                Ok(info)
            }
            Ok(Err(reason)) => Err(ControlError::Server(format!("session {session_id}: {reason}"))),
            Err(error) => Err(self.control_call_failed(id, &format!("the checkpoint of session {session_id}"), &error).await),
        }
    }

    /// Restores snapshot `name` from `dir` into allocation `id`'s server, where it waits for
    /// its app.
    pub async fn restore(&self, id: &str, dir: &str, name: &str) -> Result<(), ControlError> {
        let control = self.control_of(id).await?;
        match control.restore(rpc::deadline(SNAPSHOT_CALL_TIMEOUT), dir.to_string(), name.to_string()).await {
            Ok(Ok(())) => {
                tracing::info!(allocation = id, snapshot = name, "snapshot restored; it waits for its app");
                Ok(())
            }
            Ok(Err(reason)) => Err(ControlError::Server(reason)),
            Err(error) => Err(self.control_call_failed(id, &format!("the restore of snapshot {name}"), &error).await),
        }
    }

    /// Ends a checkpoint's pause: the app moves to `to` or goes on here.
    pub async fn release(&self, id: &str, session_id: u64, to: Option<String>) -> Result<(), ControlError> {
        let control = self.control_of(id).await?;
        match control.release(rpc::deadline(SESSION_CALL_TIMEOUT), session_id, to.clone()).await {
            Ok(Ok(())) => {
                tracing::info!(allocation = id, session_id, to = to.as_deref().unwrap_or("(stays here)"), "session released");
                Ok(())
            }
            Ok(Err(reason)) => Err(ControlError::Server(reason)),
            Err(error) => Err(self.control_call_failed(id, &format!("the release of session {session_id}"), &error).await),
        }
    }

    /// Stops a server: asks it to shut down (sessions get the grace period), then SIGTERM,
    /// then SIGKILL to its process group. An unknown allocation is already stopped.
    pub async fn stop(&self, id: &str) -> Result<(), ControlError> {
        let control = self.control(id).await;
        let mut server = {
            // Only the hand-over is serialised with starts; the waiting below is not, so several
            // servers stop at once.
            let _one_at_a_time = self.lifecycle.lock().await;
            let Some(server) = self.servers.lock().await.remove(id) else { return Ok(()) };
            server
        };
        Self::end_process(id, &mut server, control, self.settings.stop_grace_seconds).await;
        Self::remove_files(&self.settings, id);
        // Snapshots of a move from or to this server have served their purpose.
        if let Err(error) = self.snapshots.discard(&server.record.spec.allocation_id) {
            tracing::warn!(allocation = id, %error, "snapshots not removed");
        }
        tracing::info!(allocation = id, pid = server.record.pid, "rpc-server stopped");
        Ok(())
    }

    /// Ends a server's process: asks it to shut down (sessions get `grace` seconds), then
    /// SIGTERM, then SIGKILL to its process group; returns once it is gone.
    async fn end_process(id: &str, server: &mut ManagedServer, control: Option<RpcServerControlClient>, grace: u32) {
        if let Some(control) = control {
            let _ = control.shutdown(rpc::deadline(Duration::from_secs(1)), grace).await;
        } else {
            signal(server.record.pid, Signal::SIGTERM, false);
        }
        let mut deadline = Instant::now() + Duration::from_secs(u64::from(grace) + 2);
        let mut escalation = [Signal::SIGTERM, Signal::SIGKILL].into_iter();
        while server.alive() {
            if Instant::now() >= deadline {
                let Some(next) = escalation.next() else { break };
                tracing::warn!(allocation = id, pid = server.record.pid, ?next, "rpc-server still running; signalling it");
                signal(server.record.pid, next, next == Signal::SIGKILL);
                deadline = Instant::now() + Duration::from_secs(3);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Some(child) = &mut server.child {
            let _ = child.try_wait();
        }
    }

    /// Replaces allocation `id`'s server with a fresh process of the configured binary on the
    /// same addresses (same TCP port, same Unix socket), its sessions carried over. Every
    /// session is checkpointed at once into a folder of this restart's own; when one cannot be,
    /// the others go on where they are and the server keeps running untouched. Then each app is
    /// released to reconnect to the address it used (it retries until a server there has its
    /// snapshot), the old server is stopped, and the new one, given that folder, restores each
    /// snapshot when its app comes back.
    pub async fn restart(&self, id: &str, timeout_ms: u64) -> Result<RestartReport, ControlError> {
        let started = Instant::now();
        let old = self.servers.lock().await.get(id).map(|server| server.record.clone());
        let old = old.ok_or_else(|| ControlError::UnknownAllocation(id.to_string()))?;
        let port = tcp_port(&old.addresses).ok_or_else(|| {
            ControlError::Server(format!("the rpc-server of {id} has no TCP port to keep (addresses {:?})", old.addresses))
        })?;
        let gpu = self.gpu(old.spec.gpu)?;
        let sessions = self.sessions(id).await?;
        // Snapshots are written into a folder of this restart's own, and moved to the folder
        // restarted servers restore from only once the old server is gone: the old one, itself
        // maybe a restarted server, must not restore the apps it releases.
        let folder = self.snapshots.prepare(&old.spec.allocation_id)?;
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let dir = folder.join(format!("restart-{stamp}"));
        let restored = folder.join("restarted");
        for path in [&dir, &restored] {
            flyt_daemon_kit::fs::create_dir_with_mode(path, 0o700)
                .map_err(|error| ControlError::Server(format!("cannot create {}: {error}", path.display())))?;
        }

        let outcomes =
            futures::future::join_all(sessions.iter().map(|session| self.checkpoint(id, session.session_id, &dir, timeout_ms, false)))
                .await;
        let mut paused = Vec::new();
        let mut failures = Vec::new();
        for (session, outcome) in sessions.iter().zip(outcomes) {
            match outcome {
                Ok(info) => paused.push(info),
                Err(error) => failures.push(format!("session {}: {}", session.session_id, reason(error))),
            }
        }
        if !failures.is_empty() {
            for info in &paused {
                if let Err(error) = self.release(id, info.session_id, None).await {
                    tracing::warn!(allocation = id, session_id = info.session_id, %error, "a paused app could not be told to go on");
                }
            }
            let _ = fs::remove_dir_all(&dir);
            return Err(ControlError::Server(format!("not restarted (its apps go on there): {}", failures.join("; "))));
        }
        for info in &paused {
            // Empty: the app reconnects to the address it used, where the new server will be.
            if let Err(error) = self.release(id, info.session_id, Some(String::new())).await {
                tracing::warn!(allocation = id, session_id = info.session_id, %error, "a checkpointed app could not be released; it ends with the old server");
            }
        }
        // A release is answered before the app hears of it: the old server stays until the apps
        // have left it (bounded), or they would lose their connection mid-way.
        let leaving: Vec<u64> = paused.iter().map(|info| info.session_id).collect();
        let deadline = Instant::now() + DEPARTURE_TIMEOUT;
        while !leaving.is_empty() && Instant::now() < deadline {
            match self.sessions(id).await {
                Ok(sessions) if sessions.iter().any(|session| leaving.contains(&session.session_id)) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                _ => break,
            }
        }

        let _one_at_a_time = self.lifecycle.lock().await;
        let control = self.control(id).await;
        let mut old_server = {
            let mut servers = self.servers.lock().await;
            let server = servers.get_mut(id).ok_or_else(|| ControlError::UnknownAllocation(id.to_string()))?;
            // Reported as it was while no process serves it: the cluster manager must not take
            // the allocation for gone.
            server.restarting = true;
            server.control = None;
            ManagedServer { record: server.record.clone(), child: server.child.take(), control: None, restarting: false }
        };
        // Its sessions were all released: nothing is left to give a grace period to.
        Self::end_process(id, &mut old_server, control, 0).await;
        tracing::info!(allocation = id, pid = old.pid, "rpc-server stopped for its restart");
        // Beside the snapshots of an earlier restart whose apps have not come back yet.
        if let Err(error) = move_files(&dir, &restored) {
            tracing::warn!(allocation = id, %error, "snapshots not handed to the new server; their apps will fail");
        }
        let _ = fs::remove_dir(&dir);
        let spec = old.spec.clone();
        let (child, addresses) = match self.spawn(id, &spec, &gpu, port, Some(&restored)).await {
            Ok(started) => started,
            Err(error) => {
                // Gone: reported missing, the cluster manager releases the allocation.
                self.servers.lock().await.remove(id);
                Self::remove_files(&self.settings, id);
                return Err(ControlError::Spawn(format!(
                    "the old rpc-server of {id} is stopped and its new one did not start (its apps fail): {}",
                    reason(error)
                )));
            }
        };
        if addresses != old.addresses {
            tracing::warn!(allocation = id, before = ?old.addresses, after = ?addresses, "the restarted rpc-server listens elsewhere");
        }
        let pid = child.id();
        let record = ServerRecord { pid, start_time: process_start_time(pid), addresses: addresses.clone(), ..old.clone() };
        if let Err(error) = self.write_record(id, &record) {
            tracing::warn!(allocation = id, %error, "the restarted rpc-server runs unrecorded");
        }
        if let Some(server) = self.servers.lock().await.get_mut(id) {
            *server = ManagedServer { record, child: Some(child), control: None, restarting: false };
        }
        tracing::info!(allocation = id, old_pid = old.pid, pid, sessions = paused.len(), "rpc-server restarted; its apps come back to it");
        Ok(RestartReport {
            allocation_id: old.spec.allocation_id.clone(),
            node_id: String::new(),
            old_pid: old.pid,
            new_pid: pid,
            addresses,
            sessions: paused,
            total_us: micros_since(started),
        })
    }

    /// Every running server with its sessions; servers that exited are forgotten (and so
    /// reported missing to the cluster manager, which releases their allocations).
    pub async fn reports(&self) -> Vec<ServerReport> {
        let mut exited = Vec::new();
        let records: Vec<(String, ServerRecord)> = {
            let mut servers = self.servers.lock().await;
            for (id, server) in servers.iter_mut() {
                if !server.restarting && !server.alive() {
                    exited.push(id.clone());
                }
            }
            for id in &exited {
                if let Some(mut server) = servers.remove(id) {
                    let status = server.child.as_mut().and_then(|child| child.try_wait().ok().flatten());
                    tracing::warn!(allocation = %id, pid = server.record.pid, ?status, "rpc-server exited");
                }
            }
            servers.iter().map(|(name, server)| (name.clone(), server.record.clone())).collect()
        };
        for id in &exited {
            Self::remove_files(&self.settings, id);
        }
        // In parallel and bounded: a hung server must not delay the heartbeat past the lease.
        futures::future::join_all(records.iter().map(|(name, record)| async move {
            let usage = tokio::time::timeout(STATUS_TIMEOUT, self.usage(name)).await.ok().flatten();
            let Some(usage) = usage else { return Self::report(record, None) };
            // The server's own slice wins over the record (a resize cut short by a crash of
            // this node manager left the record behind).
            let record = self.correct_record(name, record, usage.memory_quota / MIB, usage.sm_percentage).await;
            Self::report(&record, Some(&usage))
        }))
        .await
    }

    /// Rewrites a server's record when the server reports another slice; returns the record.
    async fn correct_record(&self, name: &str, record: &ServerRecord, memory: u64, sm_percentage: u32) -> ServerRecord {
        if (record.spec.memory, record.spec.sm_percentage) == (memory, sm_percentage) || memory == 0 {
            return record.clone();
        }
        // A resize under way writes the record itself.
        let Ok(_resizing) = self.resizing.try_lock() else { return record.clone() };
        let mut servers = self.servers.lock().await;
        let Some(server) = servers.get_mut(name) else { return record.clone() };
        tracing::info!(allocation = %record.spec.allocation_id, memory_mib = memory, sm_percentage, "the record of this rpc-server was behind its slice; corrected");
        server.record.spec.memory = memory;
        server.record.spec.sm_percentage = sm_percentage;
        let corrected = server.record.clone();
        drop(servers);
        if let Err(error) = self.write_record(name, &corrected) {
            tracing::warn!(allocation = %corrected.spec.allocation_id, %error, "cannot rewrite the server's record");
        }
        corrected
    }

    /// What the server says of itself on its control socket (`None` when it does not answer).
    async fn usage(&self, id: &str) -> Option<Usage> {
        let control = self.control(id).await?;
        match control.status(rpc::deadline(STATUS_TIMEOUT)).await {
            Ok(status) => Some(Usage {
                sessions: u32::try_from(status.sessions.len()).unwrap_or(u32::MAX),
                memory_used: status.sessions.iter().map(|session| session.memory_used).sum(),
                memory_quota: status.memory_quota,
                sm_percentage: status.sm_percentage,
                metrics: status.metrics.map(|address| advertise(&address, &self.settings.advertise_host)),
            }),
            Err(_) => {
                self.forget_control(id).await;
                None
            }
        }
    }

    /// Names of the servers this manager runs (their allocations' ids, but beside a server on
    /// another GPU).
    pub async fn server_names(&self) -> Vec<String> {
        self.servers.lock().await.keys().cloned().collect()
    }

    /// Stops every server (node manager shutdown).
    pub async fn stop_all(&self) {
        let ids = self.server_names().await;
        futures::future::join_all(ids.iter().map(|id| self.stop(id))).await;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::os::unix::{fs::PermissionsExt, process::CommandExt};

    use super::*;

    /// A stand-in for flyt-rpc-server: records its arguments, prints the listening line and
    /// waits to be killed.
    const STAND_IN: &str =
        "#!/bin/sh\necho \"$@\" > \"$0.args\"\necho \"flyt-rpc-server listening on 0.0.0.0:45678 unix:/tmp/x.sock\"\nexec sleep 600\n";
    const FAILING: &str = "#!/bin/sh\necho 'error: no such device' >&2\nexit 3\n";

    #[test]
    fn a_restart_keeps_the_port_of_the_tcp_address() {
        assert_eq!(tcp_port(&["unix:/run/flyt/a.sock".into(), "192.0.2.7:4000".into()]), Some(4000));
        assert_eq!(tcp_port(&["[2001:db8::7]:4001".into()]), Some(4001));
        assert_eq!(tcp_port(&["unix:/run/flyt/a.sock".into()]), None);
        assert_eq!(tcp_port(&["192.0.2.7:0".into()]), None);
    }

    fn settings(folder: &Path, script: &str) -> LaunchSettings {
        // Written by `cp`, not by this process: a test thread forking meanwhile would inherit a
        // descriptor open for writing, and running the script then fails with "text file busy".
        let (source, binary) = (folder.join("rpc-server.source"), folder.join("rpc-server"));
        fs::write(&source, script).unwrap();
        assert!(Command::new("cp").arg(&source).arg(&binary).status().unwrap().success());
        fs::set_permissions(&binary, fs::Permissions::from_mode(0o755)).unwrap();
        LaunchSettings {
            binary: binary.display().to_string(),
            listen_host: "127.0.0.1".into(),
            socket_dir: None,
            advertise_host: "192.0.2.7".into(),
            key_file: folder.join("key"),
            servers_dir: folder.join("servers"),
            image_cache_dir: folder.join("images"),
            snapshot_dir: folder.join("snapshots"),
            device: DeviceKind::Emulated,
            gpus: vec![GpuInfo {
                index: 0,
                uuid: "GPU-e".into(),
                name: "Emulated".into(),
                memory_bytes: 8 << 30,
                sm_count: 40,
                emulated: true,
                links: Vec::new(),
            }],
            env: vec![],
            start_timeout: Duration::from_secs(5),
            stop_grace_seconds: 0,
            metrics_host: Some("0.0.0.0".into()),
            ivshmem_dir: Some("/dev/shm/flyt-ivshmem".into()),
            tls: None,
            oversubscribe: None,
        }
    }

    fn key() -> ClusterKey {
        ClusterKey::from_bytes(b"0123456789abcdef0123").unwrap()
    }

    /// A manager of stand-in servers in `folder` (for other modules' tests).
    pub(crate) fn test_manager(folder: &Path) -> ServerManager {
        ServerManager::new(settings(folder, STAND_IN), key()).unwrap()
    }

    fn spec(id: &str) -> ServerSpec {
        ServerSpec { allocation_id: id.into(), gpu: 0, extra_gpus: Vec::new(), memory: 1024, sm_percentage: 25, address_window: 0 }
    }

    /// An oversubscribed GPU (8 GiB, x2) takes a 12 GiB slice and its server pages; without it,
    /// the same slice is refused.
    #[tokio::test]
    async fn an_oversubscribed_gpu_promises_more_than_its_memory() {
        let folder = tempfile::tempdir().unwrap();
        let big = ServerSpec { memory: 12 * 1024, ..spec("alloc-big") };
        let plain = ServerManager::new(settings(folder.path(), STAND_IN), key()).unwrap();
        assert!(matches!(plain.start(big.clone()).await, Err(ControlError::Invalid(_))));
        drop(plain);
        let settings = LaunchSettings { oversubscribe: Some(2.0), ..settings(folder.path(), STAND_IN) };
        let manager = ServerManager::new(settings.clone(), key()).unwrap();
        let report = manager.start(big).await.unwrap();
        assert_eq!(report.memory_quota_bytes, 12 << 30);
        let args = fs::read_to_string(format!("{}.args", settings.binary)).unwrap();
        assert!(args.contains("--oversubscribe 2"), "{args}");
        assert!(matches!(manager.start(ServerSpec { memory: 17 * 1024, ..spec("alloc-huge") }).await, Err(ControlError::Invalid(_))));
        manager.stop("alloc-big").await.unwrap();
    }

    /// A record keeps its flat keys (the spec's beside the process's), so a node manager
    /// upgraded under running servers reads their records, older ones without the later keys too.
    #[test]
    fn a_record_reads_and_writes_flat_keys() {
        let json = r#"{"allocation_id":"alloc-1","gpu":1,"extra_gpus":[2],"memory":1024,"sm_percentage":25,"address_window":3,
            "pid":7,"start_time":null,"control_socket":"/run/x.sock","addresses":["192.0.2.7:1"]}"#;
        let record: ServerRecord = serde_json::from_str(json).unwrap();
        let spec =
            ServerSpec { allocation_id: "alloc-1".into(), gpu: 1, extra_gpus: vec![2], memory: 1024, sm_percentage: 25, address_window: 3 };
        assert_eq!((&record.spec, record.pid), (&spec, 7));
        assert_eq!(serde_json::to_value(&record).unwrap(), serde_json::from_str::<serde_json::Value>(json).unwrap());
        let older = r#"{"allocation_id":"alloc-1","pid":7,"start_time":5,"control_socket":"/run/x.sock","addresses":[],"gpu":0,"memory":64,"sm_percentage":10}"#;
        let record: ServerRecord = serde_json::from_str(older).unwrap();
        assert_eq!((record.spec.extra_gpus.len(), record.spec.address_window, record.start_time), (0, 0, Some(5)));
    }

    #[tokio::test]
    async fn starts_records_adopts_and_stops_servers() {
        let folder = tempfile::tempdir().unwrap();
        let settings = settings(folder.path(), STAND_IN);
        let manager = ServerManager::new(settings.clone(), key()).unwrap();
        let report = manager.start(spec("alloc-1")).await.unwrap();
        assert_eq!(report.addresses, vec!["192.0.2.7:45678".to_string(), "unix:/tmp/x.sock".to_string()]);
        assert_eq!(report.memory_quota_bytes, 1 << 30);
        let args = fs::read_to_string(format!("{}.args", settings.binary)).unwrap();
        for expected in [
            "--listen 127.0.0.1:0",
            "--device emulated",
            "--gpu 0",
            "--memory-quota 1073741824",
            "--sm-percentage 25",
            "--allocation alloc-1",
            "--emulated-memory 8589934592",
            "--emulated-sms 40",
            "--metrics-listen 0.0.0.0:0",
            "--ivshmem-dir /dev/shm/flyt-ivshmem",
        ] {
            assert!(args.contains(expected), "{expected} missing from {args}");
        }
        assert_eq!(manager.start(spec("alloc-1")).await.unwrap().pid, report.pid, "a repeated start is idempotent");
        assert!(settings.servers_dir.join("alloc-1.json").exists());

        // A new manager (a restarted node manager) adopts the running server.
        drop(manager);
        let adopted = ServerManager::new(settings.clone(), key()).unwrap();
        let reports = adopted.reports().await;
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].pid, report.pid);
        adopted.stop("alloc-1").await.unwrap();
        assert!(!process_alive(report.pid, None));
        assert!(!settings.servers_dir.join("alloc-1.json").exists());
        assert!(adopted.reports().await.is_empty());
        adopted.stop("alloc-1").await.unwrap();
    }

    /// A spread allocation's further node: its server gets the allocation's address window,
    /// recorded so a restart keeps it; a window past the server's range is refused.
    #[tokio::test]
    async fn a_server_of_a_further_node_gets_its_address_window() {
        let folder = tempfile::tempdir().unwrap();
        let settings = settings(folder.path(), STAND_IN);
        let manager = ServerManager::new(settings.clone(), key()).unwrap();
        manager.start(ServerSpec { address_window: 2, ..spec("alloc-w") }).await.unwrap();
        let args = fs::read_to_string(format!("{}.args", settings.binary)).unwrap();
        assert!(args.contains("--address-window 2"), "{args}");
        let record: ServerRecord = serde_json::from_str(&fs::read_to_string(settings.servers_dir.join("alloc-w.json")).unwrap()).unwrap();
        assert_eq!(record.spec.address_window, 2);
        let error = manager.start(ServerSpec { address_window: MAX_ADDRESS_WINDOW + 1, ..spec("alloc-x") }).await.unwrap_err().to_string();
        assert!(error.contains("address window 5 is above 4"), "{error}");
        manager.start(spec("alloc-y")).await.unwrap();
        let args = fs::read_to_string(format!("{}.args", settings.binary)).unwrap();
        assert!(!args.contains("--address-window"), "window 0 is the server's default: {args}");
        manager.stop("alloc-w").await.unwrap();
        manager.stop("alloc-y").await.unwrap();
    }

    #[test]
    fn a_second_server_of_an_allocation_is_named_after_its_gpu() {
        assert_eq!(server_name("alloc-1", 1, |_| false), "alloc-1");
        assert_eq!(server_name("alloc-1", 1, |name| name == "alloc-1"), "alloc-1~gpu1");
        for good in ["alloc-1", "alloc-1~gpu0", "a_b~gpu12"] {
            assert!(valid_server_name(good), "{good}");
        }
        for bad in ["", "alloc-1~", "alloc-1~gpu", "alloc-1~gpux", "~gpu1", "a/b~gpu1", "alloc-1~cpu1", "a~gpu1~gpu2"] {
            assert!(!valid_server_name(bad), "{bad}");
        }
    }

    /// A move between two GPUs of the node: the allocation's second server runs beside the
    /// first under its own name, each is named by its GPU (unnamed, the call is ambiguous), and
    /// a restarted manager adopts both.
    #[tokio::test]
    async fn an_allocation_runs_a_server_on_each_of_two_gpus_during_a_move() {
        let folder = tempfile::tempdir().unwrap();
        let mut settings = settings(folder.path(), STAND_IN);
        let second = GpuInfo { index: 1, uuid: "GPU-f".into(), ..settings.gpus[0].clone() };
        settings.gpus.push(second);
        let manager = ServerManager::new(settings.clone(), key()).unwrap();
        let first = manager.start(spec("alloc-3")).await.unwrap();
        let other = manager.start(ServerSpec { gpu: 1, ..spec("alloc-3") }).await.unwrap();
        assert_ne!(first.pid, other.pid);
        assert_eq!(manager.start(ServerSpec { gpu: 1, ..spec("alloc-3") }).await.unwrap().pid, other.pid, "idempotent per GPU");
        let error = manager.start(ServerSpec { gpu: 0, ..spec("alloc-4") }).await;
        assert!(error.is_ok(), "another allocation is unaffected: {error:?}");
        assert!(settings.servers_dir.join("alloc-3~gpu1.json").exists());
        assert_eq!(manager.name_of(&ServerRef::new("alloc-3", Some(1))).await.unwrap(), "alloc-3~gpu1");
        assert_eq!(manager.name_of(&ServerRef::new("alloc-3", Some(0))).await.unwrap(), "alloc-3");
        let ambiguous = manager.name_of(&ServerRef::new("alloc-3", None)).await.unwrap_err().to_string();
        assert!(ambiguous.contains("runs servers on GPUs 0 and 1"), "{ambiguous}");
        assert!(manager.name_of(&ServerRef::new("alloc-3", Some(2))).await.is_err());

        drop(manager);
        let adopted = ServerManager::new(settings.clone(), key()).unwrap();
        let mut reports: Vec<(String, u32, u32)> =
            adopted.reports().await.into_iter().map(|report| (report.allocation_id, report.gpu, report.pid)).collect();
        reports.sort();
        assert_eq!(reports[..2], [("alloc-3".to_string(), 0, first.pid), ("alloc-3".to_string(), 1, other.pid)]);
        // The source's server stops; the target's is then the allocation's only one.
        adopted.stop_server(&ServerRef::new("alloc-3", Some(0))).await.unwrap();
        assert!(!process_alive(first.pid, None) && process_alive(other.pid, None));
        assert_eq!(adopted.name_of(&ServerRef::new("alloc-3", None)).await.unwrap(), "alloc-3~gpu1");
        adopted.stop_server(&ServerRef::new("alloc-3", None)).await.unwrap();
        adopted.stop_server(&ServerRef::new("alloc-4", None)).await.unwrap();
        assert!(!process_alive(other.pid, None));
        assert!(adopted.reports().await.is_empty());
    }

    /// A move of one GPU of an allocation (index 1: GPUs 0,1 become 0,2): the new server has
    /// the same first GPU, runs beside the old one, and each is named by its whole set.
    #[tokio::test]
    async fn a_move_of_one_gpu_runs_a_second_server_with_the_same_first_gpu() {
        let folder = tempfile::tempdir().unwrap();
        let mut settings = settings(folder.path(), STAND_IN);
        for index in [1, 2] {
            let gpu = GpuInfo { index, uuid: format!("GPU-{index}"), ..settings.gpus[0].clone() };
            settings.gpus.push(gpu);
        }
        let manager = ServerManager::new(settings.clone(), key()).unwrap();
        let old = manager.start(ServerSpec { extra_gpus: vec![1], ..spec("alloc-5") }).await.unwrap();
        let new = manager.start(ServerSpec { extra_gpus: vec![2], ..spec("alloc-5") }).await.unwrap();
        assert_ne!(old.pid, new.pid, "another set runs beside");
        let again = manager.start(ServerSpec { extra_gpus: vec![2], ..spec("alloc-5") }).await.unwrap();
        assert_eq!(again.pid, new.pid, "idempotent per set");
        assert_eq!(manager.name_of(&ServerRef::of_set("alloc-5", 0, &[1])).await.unwrap(), "alloc-5");
        assert_eq!(manager.name_of(&ServerRef::of_set("alloc-5", 0, &[2])).await.unwrap(), "alloc-5~gpu0");
        let ambiguous = manager.name_of(&ServerRef::new("alloc-5", Some(0))).await.unwrap_err().to_string();
        assert!(ambiguous.contains("runs servers on GPUs 0 and 0"), "{ambiguous}");
        assert!(manager.name_of(&ServerRef::of_set("alloc-5", 0, &[])).await.is_err());
        // The old set's server stops alone.
        manager.stop_server(&ServerRef::of_set("alloc-5", 0, &[1])).await.unwrap();
        assert!(!process_alive(old.pid, None) && process_alive(new.pid, None));
        assert_eq!(manager.name_of(&ServerRef::new("alloc-5", Some(0))).await.unwrap(), "alloc-5~gpu0");
        manager.stop_server(&ServerRef::new("alloc-5", None)).await.unwrap();
        assert!(!process_alive(new.pid, None));
    }

    #[tokio::test]
    async fn a_server_started_but_not_recorded_is_stopped_by_the_next_manager() {
        let folder = tempfile::tempdir().unwrap();
        // A shell that keeps its command line (no exec), as a server waiting to listen would.
        let settings = settings(folder.path(), "#!/bin/sh\nwhile true; do sleep 1; done\n");
        flyt_daemon_kit::fs::create_dir_with_mode(&settings.servers_dir, 0o700).unwrap();
        // What a node manager killed between spawning a server and recording it leaves behind.
        let control = settings.servers_dir.join("alloc-7.control.sock");
        let mut orphan = Command::new(&settings.binary)
            .args(["--control", &format!("unix:{}", control.display())])
            .process_group(0)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let pid = orphan.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while servers_started_in(&settings.servers_dir).is_empty() {
            assert!(Instant::now() < deadline, "the stand-in never showed up in /proc");
            std::thread::sleep(Duration::from_millis(20));
        }
        // The shell's `sleep` children carry its command line for a moment between fork and exec,
        // so the scan may see them too: the stand-in itself must be among what it finds.
        assert!(servers_started_in(&settings.servers_dir).contains(&(pid, "alloc-7".to_string())));
        let manager = ServerManager::new(settings.clone(), key()).unwrap();
        let _ = orphan.wait();
        assert!(!process_alive(pid, None), "the unrecorded server still runs");
        assert!(manager.reports().await.is_empty());
        assert!(servers_started_in(&settings.servers_dir).is_empty());
    }

    #[tokio::test]
    async fn a_server_that_dies_is_dropped_from_reports() {
        let folder = tempfile::tempdir().unwrap();
        let manager = ServerManager::new(settings(folder.path(), STAND_IN), key()).unwrap();
        let report = manager.start(spec("alloc-2")).await.unwrap();
        signal(report.pid, Signal::SIGKILL, false);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !manager.reports().await.is_empty() {
            assert!(Instant::now() < deadline, "the dead server is still reported");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn failures_say_why() {
        let folder = tempfile::tempdir().unwrap();
        let manager = ServerManager::new(settings(folder.path(), FAILING), key()).unwrap();
        let error = manager.start(spec("alloc-3")).await.unwrap_err().to_string();
        assert!(error.contains("exited") && error.contains("no such device"), "{error}");
        let error = manager.start(ServerSpec { gpu: 5, ..spec("alloc-4") }).await.unwrap_err().to_string();
        assert!(error.contains("no GPU 5"), "{error}");
        let error = manager.start(spec("../escape")).await.unwrap_err().to_string();
        assert!(error.contains("bad allocation id"), "{error}");
        let error = manager.start(ServerSpec { memory: 9000, ..spec("alloc-5") }).await.unwrap_err().to_string();
        assert!(error.contains("cannot give"), "{error}");
    }

    /// A stand-in for the rpc-server's control service, served the way the rpc-server serves
    /// it (cluster-key handshake, then tarpc over daemon-kit's transport).
    /// Each resize call: (memory quota in bytes, SM percentage).
    type ResizeCalls = std::sync::Arc<std::sync::Mutex<Vec<(Option<u64>, Option<u32>)>>>;

    /// The snapshot calls the fake received, in order (`checkpoint 1 /dir`, `restore /dir NAME`,
    /// `release 1 Some("addr")`).
    type MoveCalls = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

    #[derive(Clone)]
    struct FakeControl(ResizeCalls, MoveCalls);

    impl flyt_protocol::control::rpc_server::RpcServerControl for FakeControl {
        async fn status(self, _: tarpc::context::Context) -> flyt_protocol::control::rpc_server::RpcServerStatus {
            // The slice the last resize set (each value kept until changed), as a server keeps it.
            let calls = self.0.lock().unwrap().clone();
            let memory_quota = calls.iter().rev().find_map(|(memory, _)| *memory).unwrap_or(1 << 30);
            let sm_percentage = calls.iter().rev().find_map(|(_, percentage)| *percentage).unwrap_or(25);
            flyt_protocol::control::rpc_server::RpcServerStatus {
                pid: 1,
                allocation: Some("alloc-6".into()),
                backend: "emulated".into(),
                gpu: 0,
                listen: vec![],
                memory_quota,
                sm_percentage,
                sm_count: 10,
                sessions: vec![flyt_protocol::control::rpc_server::SessionStatus {
                    session_id: 1,
                    client: Default::default(),
                    worker_pid: 2,
                    memory_used: 4096,
                    started_at: 0,
                }],
                metrics: Some("0.0.0.0:9464".into()),
            }
        }

        async fn resize(
            self,
            context: tarpc::context::Context,
            memory_quota: Option<u64>,
            sm_percentage: Option<u32>,
        ) -> Result<flyt_protocol::control::rpc_server::RpcServerStatus, String> {
            self.0.lock().unwrap().push((memory_quota, sm_percentage));
            Ok(self.status(context).await)
        }

        async fn checkpoint(
            self,
            _: tarpc::context::Context,
            session_id: u64,
            dir: String,
            _: u64,
        ) -> Result<flyt_protocol::control::rpc_server::SnapshotInfo, String> {
            self.1.lock().unwrap().push(format!("checkpoint {session_id} {dir}"));
            if session_id != 1 {
                return Err(format!("no session {session_id} on this server"));
            }
            Ok(SnapshotInfo { session_id, name: "ab".repeat(16), bytes: 100, device_bytes: 64, drain_us: 1, write_us: 2 })
        }

        async fn checkpoint_on_device(
            self,
            _: tarpc::context::Context,
            _: u64,
            _: String,
            _: u64,
        ) -> Result<flyt_protocol::control::rpc_server::SnapshotInfo, String> {
            Err("the node manager does not move sessions on one GPU".into())
        }

        async fn restore(self, _: tarpc::context::Context, dir: String, name: String) -> Result<(), String> {
            self.1.lock().unwrap().push(format!("restore {dir} {name}"));
            Ok(())
        }

        async fn release(self, _: tarpc::context::Context, session_id: u64, to: Option<String>) -> Result<(), String> {
            self.1.lock().unwrap().push(format!("release {session_id} {to:?}"));
            Ok(())
        }

        async fn shutdown(self, _: tarpc::context::Context, _grace_seconds: u32) {}
    }

    #[tokio::test]
    async fn resizes_and_usage_go_through_the_control_socket() {
        use flyt_protocol::control::rpc_server::RpcServerControl;

        let folder = tempfile::tempdir().unwrap();
        let manager = ServerManager::new(settings(folder.path(), STAND_IN), key()).unwrap();
        let report = manager.start(spec("alloc-6")).await.unwrap();
        assert!(matches!(manager.resize("alloc-6", Some(2048), None).await, Err(ControlError::Server(_))), "no control socket yet");

        let socket = folder.path().join("servers").join("alloc-6.control.sock");
        let listener = rpc::ControlListener::bind(&Endpoint::Unix(socket), 0o600).await.unwrap();
        let calls = FakeControl(Default::default(), Default::default());
        let served = calls.clone();
        let server = tokio::spawn(rpc::accept_loop(listener, key(), vec![ServiceName::RpcServerControl], move |_, stream| {
            let service = served.clone();
            async move { rpc::serve_connection(stream, service.serve()).await }
        }));

        let resized = manager.resize("alloc-6", Some(2048), Some(50)).await.unwrap();
        assert_eq!(calls.0.lock().unwrap().clone(), vec![(Some(2048 * MIB), Some(50))]);
        assert_eq!((resized.memory_quota_bytes, resized.sm_percentage, resized.sessions), (2048 * MIB, 50, 1));
        let reports = manager.reports().await;
        assert_eq!((reports[0].sessions, reports[0].memory_used_bytes), (1, 4096));
        assert_eq!(reports[0].metrics.as_deref(), Some("192.0.2.7:9464"), "the wildcard host is advertised as this node");
        let record: ServerRecord = serde_json::from_slice(&fs::read(folder.path().join("servers/alloc-6.json")).unwrap()).unwrap();
        assert_eq!((record.spec.memory, record.spec.sm_percentage), (2048, 50));
        assert!(matches!(manager.resize("alloc-x", Some(1), None).await, Err(ControlError::UnknownAllocation(_))));

        // A resize the server applied but the record missed (a node manager killed in between):
        // the server's own answer wins and the record is rewritten.
        calls.0.lock().unwrap().push((Some(3072 * MIB), Some(75)));
        let reports = manager.reports().await;
        assert_eq!((reports[0].memory_quota_bytes, reports[0].sm_percentage), (3072 * MIB, 75));
        let record: ServerRecord = serde_json::from_slice(&fs::read(folder.path().join("servers/alloc-6.json")).unwrap()).unwrap();
        assert_eq!((record.spec.memory, record.spec.sm_percentage), (3072, 75));

        // The steps of a move reach the server as asked, and its refusals come back with the reason.
        assert_eq!(manager.sessions("alloc-6").await.unwrap()[0].session_id, 1);
        let folder_of_moves = manager.snapshots().prepare("alloc-6").unwrap();
        let info = manager.checkpoint("alloc-6", 1, &folder_of_moves, 500, false).await.unwrap();
        manager.restore("alloc-6", "/snapshots", &info.name).await.unwrap();
        manager.release("alloc-6", 1, Some("192.0.2.8:4000".into())).await.unwrap();
        let refused = manager.checkpoint("alloc-6", 2, &folder_of_moves, 500, false).await.unwrap_err().to_string();
        assert!(refused.contains("session 2: no session 2"), "{refused}");
        assert!(matches!(manager.sessions("alloc-x").await, Err(ControlError::UnknownAllocation(_))));
        assert_eq!(
            calls.1.lock().unwrap().clone(),
            vec![
                format!("checkpoint 1 {}", folder_of_moves.display()),
                format!("restore /snapshots {}", info.name),
                "release 1 Some(\"192.0.2.8:4000\")".to_string(),
                format!("checkpoint 2 {}", folder_of_moves.display()),
            ]
        );
        // Stopping the server takes its snapshot folder with it.
        server.abort();
        manager.stop("alloc-6").await.unwrap();
        assert!(!folder_of_moves.exists());
        signal(report.pid, Signal::SIGKILL, false);
    }

    #[test]
    fn wildcards_are_replaced_by_the_advertised_host() {
        assert_eq!(advertise("0.0.0.0:80", "10.1.2.3"), "10.1.2.3:80");
        assert_eq!(advertise("[::]:80", "fe80::1"), "[fe80::1]:80");
        assert_eq!(advertise("127.0.0.1:80", "10.1.2.3"), "127.0.0.1:80");
        assert_eq!(advertise("unix:/a", "10.1.2.3"), "unix:/a");
    }
}
