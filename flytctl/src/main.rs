//! flytctl: administers a Flyt cluster through the cluster manager's admin socket, or from
//! another host over mutual TLS (`--cluster-manager`).
//!
//! Exit codes: 0 done; 1 the cluster manager refused (the message says why and what to do);
//! 2 bad usage; 3 the cluster manager cannot be reached or did not answer in time.
#![forbid(unsafe_code)]

mod migrate;
mod sessions;
mod slurm;
mod top;

use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use clap::{Parser, Subcommand};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use flyt_daemon_kit::{
    auth::{AuthError, ClusterKey},
    rpc::{self, Endpoint, RpcError},
    tls::{Tls, TlsConfig},
};
use flyt_protocol::control::{
    auth::ServiceName,
    cluster::{
        AfterCheckpoint, AllocationRecord, ClusterAdminClient, ControlError, MovePhase, NodeHealth, NodeView, VmMode, VmRequirement, VmView,
    },
};
use serde::Serialize;

const MIB: u64 = 1 << 20;

#[derive(Parser)]
#[command(version, about = "Administer a Flyt cluster (talks to flyt-cluster-manager's admin socket, or to its TCP address over TLS)")]
struct Args {
    /// The cluster manager's admin socket.
    #[arg(long, env = "FLYTCTL_ADMIN_SOCKET", default_value = "/run/flyt/admin.sock", global = true)]
    socket: PathBuf,
    /// Administer from another host instead: the cluster manager's `listen` address (host:port),
    /// over mutual TLS (it needs `admin_over_tcp = true` and [tls]).
    #[arg(long, env = "FLYTCTL_CLUSTER_MANAGER", global = true)]
    cluster_manager: Option<String>,
    /// With --cluster-manager: the cluster's CA certificate (PEM).
    #[arg(long, env = "FLYTCTL_TLS_CA", global = true)]
    tls_ca: Option<PathBuf>,
    /// With --cluster-manager: this host's certificate, signed by the cluster's CA (PEM).
    #[arg(long, env = "FLYTCTL_TLS_CERT", global = true)]
    tls_cert: Option<PathBuf>,
    /// With --cluster-manager: that certificate's private key (PEM).
    #[arg(long, env = "FLYTCTL_TLS_KEY", global = true)]
    tls_key: Option<PathBuf>,
    /// File holding the cluster key.
    #[arg(long, env = "FLYTCTL_CLUSTER_KEY_FILE", default_value = "/etc/flyt/cluster.key", global = true)]
    cluster_key_file: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Tables as wide as their contents (by default they fit 120 columns, long cells wrapped).
    #[arg(long, global = true)]
    wide: bool,
    /// Give up on the cluster manager after this many seconds (connection, handshake and call
    /// together).
    #[arg(long, env = "FLYTCTL_TIMEOUT_SECONDS", default_value_t = 30, global = true, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_seconds: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Cluster summary: nodes, GPUs, free capacity, allocations.
    Status,
    /// VMs with their requirement, allocation and clients.
    ListVms,
    /// GPU nodes with each GPU's capacity and what is allocated on it.
    ListServernodes,
    /// Running allocations (one rpc-server each).
    #[command(alias = "list-allocations")]
    ListVirtServers,
    /// Resize a running allocation (by allocation id or VM ip); the VM keeps the new size.
    ChangeConfig {
        /// Allocation id or VM ip.
        target: String,
        /// New number of SMs.
        #[arg(long)]
        compute_units: Option<u32>,
        /// New device memory in MiB.
        #[arg(long)]
        memory_mib: Option<u64>,
    },
    /// Move a running allocation (by allocation id or VM ip) with its apps to another node or
    /// another GPU of its node: same id, size and tokens. Each app pauses at its next CUDA call, its session is
    /// checkpointed, copied and restored there, and it goes on with every pointer as it was. If
    /// anything fails, the apps go on where they were and the reason is printed.
    Migrate {
        /// Allocation id or VM ip.
        target: String,
        /// The node to move to (`flytctl list-servernodes`), or NODE/GPU for one of its GPUs
        /// (its own node: a GPU other than the one it runs on). An allocation of several GPUs
        /// moves whole to as many GPUs of another node (NODE/GPU: that GPU first), or, with
        /// --gpu, one of its GPUs to another GPU of its node.
        #[arg(long, value_parser = migrate::parse_destination)]
        to: migrate::Destination,
        /// Move only the allocation's GPU at this index (0 first, as `flytctl list-vms` lists
        /// them) to the GPU --to names (NODE/GPU, its own node; NODE alone: the fullest GPU there
        /// with room), the others staying at their indices, so its apps' device numbering holds.
        /// The apps move to a new server of the new set, which shares the GPUs that stay with
        /// the old one until the move is over: each needs room for a second slice.
        #[arg(long, value_name = "INDEX")]
        gpu: Option<u32>,
        /// Give up (the apps going on where they were) when an app makes no CUDA call within
        /// this many milliseconds.
        #[arg(long, default_value_t = 30_000)]
        timeout_ms: u64,
    },
    /// Checkpoint every session of a running allocation (by allocation id or VM ip) into a
    /// folder on its node, then let the apps go on (--resume, the default) or end their
    /// sessions (--stop).
    Checkpoint {
        /// Allocation id or VM ip.
        target: String,
        /// Folder for the snapshots: an absolute path on the allocation's node.
        #[arg(long)]
        to: String,
        /// Give up on a session (its app going on) when its app makes no CUDA call within this
        /// many milliseconds.
        #[arg(long, default_value_t = 30_000)]
        timeout_ms: u64,
        /// The apps go on where they are; the snapshots are backups (the default).
        #[arg(long, conflicts_with = "stop")]
        resume: bool,
        /// End the sessions: each app reconnects to its server's address and waits until a
        /// server there restores its snapshot (`flytctl session restore`).
        #[arg(long)]
        stop: bool,
    },
    /// Replace a running allocation's (by allocation id or VM ip) rpc-server with a fresh
    /// process of the node's rpc-server binary (an upgrade, say), on the same addresses. Each app
    /// pauses at its next CUDA call, is checkpointed, and goes on at the new server with every
    /// pointer as it was. If an app cannot be checkpointed, all go on at the old server.
    RestartServer {
        /// Allocation id or VM ip.
        target: String,
        /// Give up (the apps going on at the old server) when an app makes no CUDA call within
        /// this many milliseconds.
        #[arg(long, default_value_t = 30_000)]
        timeout_ms: u64,
    },
    /// Per-VM requirements (Flyt's vm_required_resources).
    Vm {
        #[command(subcommand)]
        command: VmCommand,
    },
    /// Stop placing new allocations on a node (running ones stay).
    Drain { node: String },
    /// Place allocations on a node again.
    Undrain { node: String },
    /// A live view of the allocations: memory, sessions, and per-second calls, copy bandwidth,
    /// kernels and errors from each rpc-server's metrics. With --json, one JSON line per refresh.
    Top {
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 2.0, value_parser = positive_seconds)]
        interval: f64,
        /// Stop after this many refreshes (default: until interrupted).
        #[arg(long)]
        iterations: Option<u64>,
    },
    /// Prometheus targets: every allocation's rpc-server metrics endpoint, as the JSON of a
    /// `file_sd_configs` file (labels: allocation, vm, node, gpu). Refresh the file from cron or a
    /// timer; Prometheus rereads it.
    PrometheusTargets,
    /// Make TLS files for a host: the cluster's CA (once per folder: kept if it is there) and a
    /// certificate signed by it for the host's names, for the daemons' [tls] settings. Needs no
    /// cluster manager.
    TlsInit {
        /// Folder for ca.pem, ca.key (keep it off the hosts), cert.pem and key.pem.
        #[arg(long)]
        dir: PathBuf,
        /// A name the host is reached by (DNS name or IP address); repeat for each.
        #[arg(long = "name", required = true)]
        names: Vec<String>,
    },
    /// A virtual machine's ivshmem region on this GPU host (the guest's shared-memory channel to
    /// the host's rpc-servers). Needs no cluster manager.
    Ivshmem {
        #[command(subcommand)]
        command: IvshmemCommand,
    },
    /// One rpc-server's sessions, through its control socket: list, checkpoint, restore,
    /// release, migrate to another server. Needs no cluster manager.
    Session {
        #[command(subcommand)]
        command: sessions::SessionCommand,
    },
    /// Slurm: its `flyt` licenses (one per GPU Slurm's jobs may have) kept in step with the
    /// cluster (docs/design/slurm.md).
    Slurm {
        #[command(subcommand)]
        command: SlurmCommand,
    },
}

#[derive(Subcommand)]
enum SlurmCommand {
    /// Count the GPUs Slurm's jobs may have (up, undrained nodes; held by no VM) and, when the
    /// count changed, write it into slurm.conf's Licenses= line and run `scontrol reconfigure`.
    Sync {
        /// The slurm.conf of the cluster (on the slurmctld host).
        #[arg(long, env = "SLURM_CONF", default_value = "/etc/slurm/slurm.conf")]
        slurm_conf: PathBuf,
        /// The license's name (cli_filter.lua asks for `flyt`).
        #[arg(long, default_value = "flyt")]
        license: String,
        /// The scontrol to run.
        #[arg(long, default_value = "scontrol")]
        scontrol: String,
        /// Print the count only; write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Sync again every this many seconds, until stopped (a timer of its own).
        #[arg(long, value_parser = positive_seconds)]
        every: Option<f64>,
    },
}

#[derive(Subcommand)]
enum IvshmemCommand {
    /// Make (or remake, with the VM stopped) a VM's region and its token file, and print the
    /// QEMU options that give it to the VM.
    Create {
        /// The region's name (one per VM, e.g. the VM's name).
        name: String,
        /// The rpc-servers' --ivshmem-dir.
        #[arg(long, default_value = "/dev/shm/flyt-ivshmem")]
        dir: PathBuf,
        /// Bytes in the region (a power of two), e.g. 4GiB.
        #[arg(long, default_value = "4GiB", value_parser = power_of_two_bytes)]
        size: u64,
        /// Sessions of the VM at once (each takes an equal slot).
        #[arg(long, default_value_t = 8)]
        sessions: u32,
    },
}

/// Parses a byte count with an optional KiB/MiB/GiB suffix that is a power of two.
fn power_of_two_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, unit) = text.find(|c: char| !c.is_ascii_digit()).map_or((text, ""), |at| text.split_at(at));
    let shift = match unit.trim() {
        "" => 0,
        "KiB" | "K" => 10,
        "MiB" | "M" => 20,
        "GiB" | "G" => 30,
        "TiB" | "T" => 40,
        other => return Err(format!("unknown unit '{other}' (use KiB, MiB, GiB or TiB)")),
    };
    let bytes = digits.parse::<u64>().ok().and_then(|n| n.checked_mul(1 << shift)).ok_or_else(|| format!("'{text}' is not a size"))?;
    if bytes.is_power_of_two() { Ok(bytes) } else { Err(format!("{text}: an ivshmem region is a power of two in size")) }
}

#[derive(Subcommand)]
enum VmCommand {
    /// Add or replace a VM's requirement.
    Add {
        vm_ip: String,
        /// The physical host the VM runs on (placement prefers a GPU node with this host_ip).
        #[arg(long)]
        host_ip: String,
        /// SMs.
        #[arg(long)]
        compute_units: u32,
        /// Device memory in MiB.
        #[arg(long)]
        memory_mib: u64,
        /// GPUs, each a slice of these SMs and memory, on one node (unless --spread): the VM's
        /// apps see them as devices 0..N-1.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
        gpus: u32,
        /// When no one node has the --gpus, place them across nodes (the fewest; NVLink-joined
        /// GPUs within each first): one rpc-server per node, each in its own address window;
        /// the apps connect to all of them and see their GPUs as one list of devices.
        #[arg(long)]
        spread: bool,
    },
    /// List VM requirements.
    List,
    /// Remove a VM's requirement (its allocation is released).
    Remove { vm_ip: String },
}

/// Why a command failed.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
enum CtlError {
    /// cannot reach the cluster manager at {socket}: {reason}. Is flyt-cluster-manager running? (set --socket or FLYTCTL_ADMIN_SOCKET if it listens elsewhere; --cluster-manager for one on another host)
    Unreachable { socket: String, reason: String },
    /// the cluster manager at {0} refused the cluster key: use the key file of the cluster (--cluster-key-file or FLYTCTL_CLUSTER_KEY_FILE)
    WrongKey(String),
    /// the cluster manager at {0} refused the cluster key, or does not serve flytctl over TCP (set admin_over_tcp = true in its config): use the key file of the cluster (--cluster-key-file or FLYTCTL_CLUSTER_KEY_FILE)
    RemoteRefused(String),
    /// {0}
    Usage(String),
    /// cannot read the cluster key file {0}: {1} (pass --cluster-key-file or set FLYTCTL_CLUSTER_KEY_FILE)
    ReadKey(String, std::io::Error),
    /// the cluster key in {0} is shorter than 16 bytes: use the key file of the cluster (--cluster-key-file or FLYTCTL_CLUSTER_KEY_FILE)
    ShortKey(String),
    /// the cluster manager at {socket} did not answer within {seconds} s (connection, handshake and call; --timeout-seconds or FLYTCTL_TIMEOUT_SECONDS): is it stopped or overloaded?
    Timeout { socket: String, seconds: u64 },
    /// the cluster manager at {socket} dropped the call: {error}
    Call { socket: String, error: tarpc::client::RpcError },
    /// {0}
    Refused(ControlError),
    /// cannot print JSON: {0}
    Json(serde_json::Error),
    /// cannot make the TLS files: {0}
    Tls(String),
    /// cannot make the ivshmem region: {0}
    Region(String),
    /// {0}
    Session(String),
    /// slurm sync: {0}
    Slurm(String),
}

impl CtlError {
    fn exit_code(&self) -> u8 {
        match self {
            Self::Refused(_) | Self::Tls(_) | Self::Region(_) | Self::Session(_) | Self::Slurm(_) => 1,
            Self::ReadKey(..) | Self::ShortKey(_) | Self::WrongKey(_) | Self::RemoteRefused(_) | Self::Usage(_) | Self::Json(_) => 2,
            Self::Unreachable { .. } | Self::Timeout { .. } | Self::Call { .. } => 3,
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("flytctl: cannot start: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("flytctl: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

fn load_key(args: &Args) -> Result<ClusterKey, CtlError> {
    let path = args.cluster_key_file.display().to_string();
    ClusterKey::load(&args.cluster_key_file).map_err(|error| match error {
        AuthError::ReadKey(_, error) => CtlError::ReadKey(path, error),
        _ => CtlError::ShortKey(path),
    })
}

/// Where flytctl reaches the cluster manager, for messages: its admin socket or its address.
fn target(args: &Args) -> String {
    args.cluster_manager.clone().unwrap_or_else(|| args.socket.display().to_string())
}

/// The endpoint to dial, and the TLS to dial it with (a remote cluster manager only).
fn endpoint(args: &Args) -> Result<(Endpoint, Option<Tls>), CtlError> {
    let Some(address) = &args.cluster_manager else {
        return Ok((Endpoint::Unix(args.socket.clone()), None));
    };
    let endpoint = match Endpoint::parse(address) {
        Ok(endpoint @ Endpoint::Tcp(_)) => endpoint,
        _ => return Err(CtlError::Usage(format!("--cluster-manager `{address}`: expected host:port"))),
    };
    let (Some(ca), Some(cert), Some(key)) = (&args.tls_ca, &args.tls_cert, &args.tls_key) else {
        return Err(CtlError::Usage(
            "--cluster-manager needs --tls-ca, --tls-cert and --tls-key (or FLYTCTL_TLS_CA, FLYTCTL_TLS_CERT, FLYTCTL_TLS_KEY): the admin API never goes over plain TCP".into(),
        ));
    };
    let files = TlsConfig { ca_file: ca.display().to_string(), cert_file: cert.display().to_string(), key_file: key.display().to_string() };
    let tls = Tls::load(&files).map_err(|error| CtlError::Usage(error.to_string().replacen("[tls]", "--tls-*:", 1)))?;
    Ok((endpoint, tls))
}

/// Connects and proves the key before `deadline`.
async fn connect(args: &Args, deadline: Instant) -> Result<ClusterAdminClient, CtlError> {
    let key = load_key(args)?;
    let (endpoint, tls) = endpoint(args)?;
    let remote = tls.is_some();
    let socket = target(args);
    let left = deadline.saturating_duration_since(Instant::now());
    let stream = rpc::connect_with(&endpoint, &key, ServiceName::ClusterAdmin, left, tls.as_ref()).await.map_err(|error| match error {
        RpcError::Auth(_, AuthError::Refused | AuthError::Protocol(_)) if remote => CtlError::RemoteRefused(socket.clone()),
        RpcError::Auth(_, AuthError::Refused | AuthError::Protocol(_)) => CtlError::WrongKey(socket.clone()),
        RpcError::ConnectTimeout(..) => CtlError::Timeout { socket: socket.clone(), seconds: args.timeout_seconds },
        other => CtlError::Unreachable { socket: socket.clone(), reason: other.to_string() },
    })?;
    Ok(ClusterAdminClient::new(tarpc::client::Config::default(), rpc::transport(stream)).spawn())
}

/// Awaits a call until `deadline`, naming the socket and the limit when it runs out.
async fn call<T>(
    args: &Args,
    deadline: Instant,
    future: impl std::future::Future<Output = Result<T, tarpc::client::RpcError>>,
) -> Result<T, CtlError> {
    let socket = target(args);
    let left = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left, future).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(tarpc::client::RpcError::DeadlineExceeded)) | Err(_) => Err(CtlError::Timeout { socket, seconds: args.timeout_seconds }),
        Ok(Err(error)) => Err(CtlError::Call { socket, error }),
    }
}

/// One `file_sd_configs` group per rpc-server that serves metrics (a spread allocation has one
/// per node).
fn prometheus_targets(allocations: &[AllocationRecord]) -> Vec<serde_json::Value> {
    allocations
        .iter()
        .flat_map(|allocation| {
            let first = (allocation.metrics.as_ref(), allocation.node_id.as_str(), allocation.gpu);
            let further = allocation.further.iter().map(|share| (share.metrics.as_ref(), share.node_id.as_str(), share.gpu));
            std::iter::once(first).chain(further).filter_map(|(metrics, node, gpu)| {
                Some(serde_json::json!({
                    "targets": [metrics?],
                    "labels": {
                        "allocation": allocation.id,
                        "vm": allocation.vm_ip,
                        "node": node,
                        "gpu": gpu.to_string(),
                    },
                }))
            })
        })
        .collect()
}

/// Prints a listing as JSON, or as the table `table` makes of it and the cluster's nodes (`nodes`,
/// a call made only for the table).
async fn print_listing<T: Serialize>(
    args: &Args,
    deadline: Instant,
    rows: &[T],
    nodes: impl std::future::Future<Output = Result<Vec<NodeView>, tarpc::client::RpcError>>,
    table: fn(&[T], &[NodeView]) -> Table,
) -> Result<(), CtlError> {
    if args.json {
        return print_json(&rows);
    }
    let nodes = call(args, deadline, nodes).await?;
    println!("{}", table(rows, &nodes));
    Ok(())
}

fn print_json<T: Serialize>(value: &T) -> Result<(), CtlError> {
    println!("{}", serde_json::to_string_pretty(value).map_err(CtlError::Json)?);
    Ok(())
}

/// `--wide`: tables as wide as their contents.
static WIDE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Columns a table fits in unless `--wide`.
const TABLE_WIDTH: u16 = 120;

fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(header.to_vec());
    if !WIDE.load(std::sync::atomic::Ordering::Relaxed) {
        table.set_content_arrangement(comfy_table::ContentArrangement::Dynamic).set_width(TABLE_WIDTH);
        // Headings stay whole; long cells (notes, addresses) take the wrapping.
        for (column, heading) in table.column_iter_mut().zip(header) {
            let width = u16::try_from(heading.chars().count().min(24)).unwrap_or(24);
            column.set_constraint(comfy_table::ColumnConstraint::LowerBoundary(comfy_table::Width::Fixed(width)));
        }
    }
    table
}

async fn run(args: Args) -> Result<(), CtlError> {
    WIDE.store(args.wide, std::sync::atomic::Ordering::Relaxed);
    if let Command::TlsInit { dir, names } = &args.command {
        let (ca, cert, key) = flyt_daemon_kit::tls::generate(dir, names).map_err(CtlError::Tls)?;
        println!("ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"", ca.display(), cert.display(), key.display());
        return Ok(());
    }
    if let Command::Session { command } = &args.command {
        let key = load_key(&args)?;
        return sessions::run(command, &key, Duration::from_secs(args.timeout_seconds), args.json).await.map_err(CtlError::Session);
    }
    if let Command::Ivshmem { command: IvshmemCommand::Create { name, dir, size, sessions } } = &args.command {
        let path = flyt_ring::region::create(dir, name, *size, *sessions).map_err(|error| CtlError::Region(error.to_string()))?;
        let mib = size >> 20;
        println!(
            "region {name}: {} ({mib} MiB, {sessions} sessions); token in {}",
            path.display(),
            flyt_ring::region::token_path(dir, name).display()
        );
        println!("QEMU options for the VM:");
        println!("  {}", flyt_ring::region::qemu_options(&path, name, *size));
        println!("rpc-servers on this host: --ivshmem-dir {}", dir.display());
        return Ok(());
    }
    if let Command::Slurm { command: SlurmCommand::Sync { slurm_conf, license, scontrol, dry_run, every } } = &args.command {
        let target =
            slurm::Target { slurm_conf: slurm_conf.clone(), license: license.clone(), scontrol: scontrol.clone(), dry_run: *dry_run };
        loop {
            let result = slurm_sync(&args, &target).await;
            let Some(every) = every else { return result };
            // A timer keeps going: the next pass may find the cluster manager or Slurm back.
            match result {
                Ok(()) => {}
                Err(error) => eprintln!("flytctl: {error}"),
            }
            tokio::time::sleep(Duration::from_secs_f64(*every)).await;
        }
    }
    // One limit for everything: connecting, the handshake and the call.
    let deadline = Instant::now() + Duration::from_secs(args.timeout_seconds);
    let client = connect(&args, deadline).await?;
    let context = || {
        let mut context = tarpc::context::current();
        context.deadline = deadline;
        context
    };
    match &args.command {
        Command::Status => {
            let status = call(&args, deadline, client.status(context())).await?;
            if args.json {
                return print_json(&status);
            }
            let mut out = Table::new();
            out.load_preset(UTF8_FULL_CONDENSED);
            out.add_row(vec!["version".to_string(), status.version]);
            out.add_row(vec!["store".to_string(), status.store]);
            out.add_row(vec!["uptime".to_string(), format!("{} s", status.uptime_seconds)]);
            out.add_row(vec![
                "nodes".to_string(),
                format!("{} up, {} down, {} drained", status.nodes_up, status.nodes_down, status.nodes_drained),
            ]);
            out.add_row(vec!["GPUs (up nodes)".to_string(), status.gpus.to_string()]);
            out.add_row(vec!["SMs free / total".to_string(), format!("{} / {}", status.free_compute_units, status.total_compute_units)]);
            out.add_row(vec!["memory free / total".to_string(), format!("{} / {} MiB", status.free_memory, status.total_memory)]);
            out.add_row(vec!["VMs".to_string(), status.vms.to_string()]);
            out.add_row(vec!["allocations".to_string(), status.allocations.to_string()]);
            out.add_row(vec!["client managers".to_string(), status.client_managers.to_string()]);
            println!("{out}");
        }
        Command::ListVms => {
            let vms = call(&args, deadline, client.list_vms(context())).await?;
            print_listing(&args, deadline, &vms, client.list_nodes(context()), vm_table).await?;
        }
        Command::ListServernodes => {
            let nodes = call(&args, deadline, client.list_nodes(context())).await?;
            if args.json {
                return print_json(&nodes);
            }
            println!("{}", node_table(&nodes));
        }
        Command::PrometheusTargets => {
            let allocations = call(&args, deadline, client.list_allocations(context())).await?;
            print_json(&prometheus_targets(&allocations))?;
        }
        Command::ListVirtServers => {
            let allocations = call(&args, deadline, client.list_allocations(context())).await?;
            print_listing(&args, deadline, &allocations, client.list_nodes(context()), allocation_table).await?;
        }
        Command::ChangeConfig { target, compute_units, memory_mib } => {
            let change = client.change_config(context(), target.clone(), *compute_units, *memory_mib);
            let allocation = call(&args, deadline, change).await?.map_err(CtlError::Refused)?;
            if args.json {
                return print_json(&allocation);
            }
            let nodes = call(&args, deadline, client.list_nodes(context())).await?;
            println!("{}", allocation_table(std::slice::from_ref(&allocation), &nodes));
        }
        Command::Migrate { target, to, gpu, timeout_ms } => {
            // A move outlives the usual limit: device memory by the tens of GiB travels.
            let deadline = Instant::now() + migrate::LONG_CALL;
            let mut long = context();
            long.deadline = deadline;
            let report = match gpu {
                Some(index) => {
                    let moving = client.migrate_one_gpu(long, target.clone(), *index, to.node.clone(), to.gpu, *timeout_ms);
                    call(&args, deadline, moving).await?
                }
                None => {
                    let moving = client.migrate(long, target.clone(), to.node.clone(), to.gpu, *timeout_ms);
                    call(&args, deadline, moving).await?
                }
            }
            .map_err(CtlError::Refused)?;
            if args.json {
                return print_json(&report);
            }
            migrate::print_move(&report);
        }
        Command::Checkpoint { target, to, timeout_ms, resume: _, stop } => {
            let after = if *stop { AfterCheckpoint::Stop } else { AfterCheckpoint::Resume };
            let deadline = Instant::now() + migrate::LONG_CALL;
            let mut long = context();
            long.deadline = deadline;
            let checkpointing = client.checkpoint(long, target.clone(), to.clone(), *timeout_ms, after);
            let report = call(&args, deadline, checkpointing).await?.map_err(CtlError::Refused)?;
            if args.json {
                print_json(&report)?;
            } else {
                migrate::print_checkpoint(&report, after);
            }
            if !report.failed.is_empty() {
                return Err(CtlError::Session(format!(
                    "{} of {} session(s) of allocation {} could not be checkpointed",
                    report.failed.len(),
                    report.failed.len() + report.snapshots.len(),
                    report.allocation_id
                )));
            }
        }
        Command::RestartServer { target, timeout_ms } => {
            // Device memory by the tens of GiB is written and read back.
            let deadline = Instant::now() + migrate::LONG_CALL;
            let mut long = context();
            long.deadline = deadline;
            let restarting = client.restart_server(long, target.clone(), *timeout_ms);
            let report = call(&args, deadline, restarting).await?.map_err(CtlError::Refused)?;
            if args.json {
                return print_json(&report);
            }
            migrate::print_restart(&report);
        }
        Command::Vm { command: VmCommand::Add { vm_ip, host_ip, compute_units, memory_mib, gpus, spread } } => {
            let requirement = VmRequirement {
                vm_ip: vm_ip.clone(),
                host_ip: host_ip.clone(),
                compute_units: *compute_units,
                memory: *memory_mib,
                gpus: *gpus,
                spread: *spread,
            };
            call(&args, deadline, client.add_vm(context(), requirement.clone())).await?.map_err(CtlError::Refused)?;
            if args.json {
                return print_json(&requirement);
            }
            let across = if *spread { ", across nodes if no one node has them" } else { "" };
            match gpus {
                1 => println!("VM {vm_ip} added: {compute_units} SMs, {memory_mib} MiB, host {host_ip}"),
                n => println!("VM {vm_ip} added: {n} GPUs of {compute_units} SMs and {memory_mib} MiB each{across}, host {host_ip}"),
            }
        }
        Command::Vm { command: VmCommand::List } => {
            let vms: Vec<VmRequirement> =
                call(&args, deadline, client.list_vms(context())).await?.into_iter().map(|vm| vm.requirement).collect();
            if args.json {
                return print_json(&vms);
            }
            let mut out = table(&["VM", "HOST", "GPUs", "SMs", "MEMORY (MiB)"]);
            for vm in &vms {
                out.add_row(vec![
                    vm.vm_ip.clone(),
                    vm.host_ip.clone(),
                    if vm.spread { format!("{} (spread)", vm.gpus) } else { vm.gpus.to_string() },
                    vm.compute_units.to_string(),
                    vm.memory.to_string(),
                ]);
            }
            println!("{out}");
        }
        Command::Vm { command: VmCommand::Remove { vm_ip } } => {
            call(&args, deadline, client.remove_vm(context(), vm_ip.clone())).await?.map_err(CtlError::Refused)?;
            if args.json {
                return print_json(&serde_json::json!({ "removed": vm_ip }));
            }
            println!("VM {vm_ip} removed");
        }
        Command::Top { interval, iterations } => {
            let mut previous = std::collections::HashMap::new();
            let mut refreshes = 0u64;
            loop {
                let refresh_deadline = Instant::now() + Duration::from_secs(args.timeout_seconds);
                let mut refresh_context = tarpc::context::current();
                refresh_context.deadline = refresh_deadline;
                let allocations = call(&args, refresh_deadline, client.list_allocations(refresh_context)).await?;
                let samples: std::collections::HashMap<_, _> = allocations
                    .iter()
                    .filter_map(|allocation| {
                        let address = allocation.metrics.as_ref()?;
                        let sample = top::scrape(address, Duration::from_secs(2)).map(|text| (top::parse(&text), Instant::now()));
                        Some((allocation.id.clone(), sample))
                    })
                    .collect();
                let rows = top::rows(&allocations, &samples, &previous);
                if args.json {
                    let unix_time = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs());
                    println!(
                        "{}",
                        serde_json::to_string(&serde_json::json!({ "unix_time": unix_time, "allocations": rows }))
                            .map_err(CtlError::Json)?
                    );
                } else {
                    if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                        print!("\x1b[2J\x1b[H");
                    }
                    println!("flytctl top: {} allocations, refreshed every {interval} s", rows.len());
                    println!("{}", top::table(&rows));
                }
                previous = samples.into_iter().filter_map(|(id, sample)| Some((id, sample.ok()?))).collect();
                refreshes += 1;
                if iterations.is_some_and(|limit| refreshes >= limit) {
                    break;
                }
                tokio::time::sleep(Duration::from_secs_f64(*interval)).await;
            }
        }
        // Made before connecting, above.
        Command::TlsInit { .. } | Command::Ivshmem { .. } | Command::Session { .. } | Command::Slurm { .. } => {}
        Command::Drain { node } | Command::Undrain { node } => {
            let drained = matches!(args.command, Command::Drain { .. });
            let record = call(&args, deadline, client.set_drained(context(), node.clone(), drained)).await?.map_err(CtlError::Refused)?;
            if args.json {
                return print_json(&record);
            }
            println!("node {} {}", record.node_id, if record.drained { "drained" } else { "undrained" });
        }
    }
    Ok(())
}

/// One `flytctl slurm sync` pass: the count from the cluster manager into Slurm.
async fn slurm_sync(args: &Args, target: &slurm::Target) -> Result<(), CtlError> {
    let deadline = Instant::now() + Duration::from_secs(args.timeout_seconds);
    let client = connect(args, deadline).await?;
    let context = || {
        let mut context = tarpc::context::current();
        context.deadline = deadline;
        context
    };
    let nodes = call(args, deadline, client.list_nodes(context())).await?;
    let allocations = call(args, deadline, client.list_allocations(context())).await?;
    let count = slurm::slurm_gpus(&nodes, &allocations);
    let line = slurm::apply(target, count).map_err(CtlError::Slurm)?;
    if args.json {
        return print_json(&serde_json::json!({ "license": target.license, "count": count, "done": line }));
    }
    println!("{line}");
    Ok(())
}

/// A number of seconds above 0 (for `--interval`).
fn positive_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && seconds > 0.0 => Ok(seconds),
        _ => Err(format!("`{text}` is not a number of seconds above 0")),
    }
}

fn health(health: NodeHealth, drained: bool) -> String {
    match (health, drained) {
        (NodeHealth::Up, false) => "up".into(),
        (NodeHealth::Up, true) => "up, drained".into(),
        (NodeHealth::Down, false) => "DOWN".into(),
        (NodeHealth::Down, true) => "DOWN, drained".into(),
    }
}

fn clients(allocation: &AllocationRecord) -> String {
    if allocation.clients.is_empty() {
        return match allocation.idle_since {
            Some(since) => format!("none (idle since {since})"),
            None => "none".into(),
        };
    }
    allocation.clients.iter().map(|client| format!("{}[{}]", client.program, client.pid)).collect::<Vec<_>>().join(", ")
}

/// Where an allocation's servers run, node by node in the order its apps number the devices:
/// `node-a/0,1 + node-b/0`.
fn placement(allocation: &AllocationRecord) -> String {
    let node = |node_id: &str, gpu: u32, extra: &[u32]| {
        let gpus: Vec<String> = std::iter::once(gpu).chain(extra.iter().copied()).map(|gpu| gpu.to_string()).collect();
        format!("{node_id}/{}", gpus.join(","))
    };
    std::iter::once(node(&allocation.node_id, allocation.gpu, &allocation.extra_gpus))
        .chain(allocation.further.iter().map(|share| node(&share.node_id, share.gpu, &share.extra_gpus)))
        .collect::<Vec<_>>()
        .join(" + ")
}

/// An allocation's GPUs, one line each in the order its apps number them: the device, its
/// node and GPU, the GPU's UUID (from `nodes`), and the slice's SMs and memory on it.
fn allocated_gpus(allocation: &AllocationRecord, nodes: &[NodeView]) -> String {
    allocation
        .all_gpus()
        .iter()
        .enumerate()
        .map(|(device, placed)| {
            let uuid = nodes
                .iter()
                .find(|view| view.node.node_id == placed.node_id)
                .and_then(|view| view.gpus.iter().find(|usage| usage.gpu.index == placed.index))
                .map_or("?", |usage| usage.gpu.uuid.as_str());
            format!("{device}: {}/{} {uuid} {} SMs {} MiB", placed.node_id, placed.index, allocation.compute_units, allocation.memory)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn vm_table(vms: &[VmView], nodes: &[NodeView]) -> Table {
    let mut out = table(&[
        "VM",
        "HOST",
        "SMs",
        "MEMORY (MiB)",
        "ALLOCATION",
        "GPUs (DEVICE: NODE/GPU UUID SLICE)",
        "MODE",
        "CLIENTS",
        "CLIENT MANAGER",
    ]);
    for vm in vms {
        let (allocation, place, users) = match &vm.allocation {
            Some(allocation) => (allocation.id.clone(), allocated_gpus(allocation, nodes), clients(allocation)),
            None => ("-".into(), "-".into(), "-".into()),
        };
        out.add_row(vec![
            vm.requirement.vm_ip.clone(),
            vm.requirement.host_ip.clone(),
            vm.requirement.compute_units.to_string(),
            vm.requirement.memory.to_string(),
            allocation,
            place,
            vm.mode.map_or("-", VmMode::name).to_string(),
            users,
            if vm.client_manager_connected { "connected" } else { "-" }.to_string(),
        ]);
    }
    out
}

fn node_table(nodes: &[NodeView]) -> Table {
    let mut out = table(&["NODE", "STATE", "HOST", "GPU", "NAME", "SMs used/total", "MEMORY used/total (MiB)", "ALLOCATIONS"]);
    for view in nodes {
        let state = health(view.node.health, view.node.drained);
        if view.gpus.is_empty() {
            out.add_row(vec![view.node.node_id.clone(), state.clone(), view.node.host_ip.clone(), "-".into()]);
        }
        for usage in &view.gpus {
            let name = if usage.gpu.emulated { format!("{} (emulated)", usage.gpu.name) } else { usage.gpu.name.clone() };
            out.add_row(vec![
                view.node.node_id.clone(),
                state.clone(),
                view.node.host_ip.clone(),
                usage.gpu.index.to_string(),
                name,
                format!("{}/{}", usage.allocated_compute_units, usage.gpu.sm_count),
                format!("{}/{}", usage.allocated_memory, usage.gpu.memory_bytes / MIB),
                usage.allocations.to_string(),
            ]);
        }
    }
    out
}

fn allocation_table(allocations: &[AllocationRecord], nodes: &[NodeView]) -> Table {
    // Addresses, metrics and the clients' names make rows hundreds of columns wide: they show
    // with --wide; the default keeps to what fits 120 columns.
    let wide = WIDE.load(std::sync::atomic::Ordering::Relaxed);
    let mut header = vec!["ALLOCATION", "VM", "NODE/GPU", "SMs", "SM %", "MEMORY (MiB)", "STATE"];
    if wide {
        header.extend(["GPUs (DEVICE: NODE/GPU UUID SLICE)", "ADDRESS", "METRICS"]);
    }
    header.extend(["PID", "SESSIONS", "CLIENTS"]);
    let mut out = table(&header);
    for allocation in allocations {
        let mut row = vec![
            allocation.id.clone(),
            allocation.vm_ip.clone(),
            placement(allocation),
            allocation.compute_units.to_string(),
            allocation.sm_percentage.to_string(),
            allocation.memory.to_string(),
            match (allocation.state, &allocation.pending_resize, &allocation.pending_move) {
                (_, _, Some(pending)) if pending.phase == MovePhase::Copying => format!("moving to {}/{}", pending.to_node, pending.to_gpu),
                (_, _, Some(pending)) => format!("moving from {}/{}", pending.from_node, pending.from_gpu),
                (_, Some(size), None) => format!("resizing to {} SMs, {} MiB", size.compute_units, size.memory),
                (state, None, None) => format!("{state:?}").to_lowercase(),
            },
        ];
        if wide {
            row.push(allocated_gpus(allocation, nodes));
            row.push(
                std::iter::once(allocation.addresses.join(" "))
                    .chain(allocation.further.iter().map(|share| share.addresses.join(" ")))
                    .collect::<Vec<_>>()
                    .join(" + "),
            );
            row.push(allocation.metrics.as_ref().map_or_else(|| "-".to_string(), |address| format!("http://{address}/metrics")));
        }
        row.push(
            std::iter::once(allocation.pid)
                .chain(allocation.further.iter().map(|share| share.pid))
                .map(|pid| pid.to_string())
                .collect::<Vec<_>>()
                .join(" + "),
        );
        row.push(allocation.sessions.to_string());
        row.push(if wide { clients(allocation) } else { allocation.clients.len().to_string() });
        out.add_row(row);
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::Args;

    #[test]
    fn a_zero_timeout_is_refused_by_the_parser() {
        let refused = Args::try_parse_from(["flytctl", "--timeout-seconds", "0", "status"]).err().expect("--timeout-seconds 0 accepted");
        assert!(refused.to_string().contains("--timeout-seconds"), "{refused}");
        assert!(Args::try_parse_from(["flytctl", "--timeout-seconds", "1", "status"]).is_ok());
    }

    /// A spread allocation: its nodes in order on one line, its GPUs one line each with the
    /// device number, node, GPU, UUID (from the node list; `?` when the node is not listed) and slice.
    #[test]
    fn a_spread_allocation_lists_every_gpu_in_order() {
        use flyt_protocol::control::cluster::{GpuInfo, GpuUsage, NodeHealth, NodeRecord, NodeShare, NodeView};
        let mut allocation: flyt_protocol::control::cluster::AllocationRecord = serde_json::from_value(serde_json::json!({
            "id": "alloc-1", "vm_ip": "10.0.0.1", "node_id": "a", "gpu": 0, "extra_gpus": [1], "compute_units": 20,
            "memory": 1024, "sm_percentage": 25, "state": "Running", "addresses": [], "pid": 7, "clients": [],
            "sessions": 0, "created_at": 0, "idle_since": null,
        }))
        .unwrap();
        allocation.further.push(NodeShare {
            node_id: "b".into(),
            gpu: 2,
            extra_gpus: Vec::new(),
            sm_percentage: 50,
            address_window: 1,
            addresses: Vec::new(),
            pid: 8,
            sessions: 0,
            metrics: None,
        });
        assert_eq!(super::placement(&allocation), "a/0,1 + b/2");
        let gpu = |index: u32, uuid: &str| GpuUsage {
            gpu: GpuInfo {
                index,
                uuid: uuid.into(),
                name: "g".into(),
                memory_bytes: 1 << 30,
                sm_count: 80,
                emulated: false,
                links: Vec::new(),
            },
            allocated_compute_units: 0,
            allocated_memory: 0,
            allocations: 0,
        };
        let node = NodeView {
            node: NodeRecord {
                node_id: "a".into(),
                host_ip: String::new(),
                boot_id: String::new(),
                control_address: String::new(),
                health: NodeHealth::Up,
                drained: false,
                registered_at: 0,
            },
            gpus: vec![gpu(0, "GPU-a0"), gpu(1, "GPU-a1")],
            last_heartbeat_ms: 0,
        };
        assert_eq!(
            super::allocated_gpus(&allocation, &[node]),
            "0: a/0 GPU-a0 20 SMs 1024 MiB\n1: a/1 GPU-a1 20 SMs 1024 MiB\n2: b/2 ? 20 SMs 1024 MiB"
        );
    }

    #[test]
    fn tables_fit_120_columns_unless_wide() {
        let long = "127.0.0.1:39891 unix:/tmp/flyt-local-cluster.yUxRod/sockets/alloc-343f047567.sock".to_string();
        let row = || vec![long.clone(), long.clone(), "flyt run hello_flyt[8358], hello_flyt[8382]".to_string()];
        let mut narrow = super::table(&["ADDRESS", "AGAIN", "CLIENTS"]);
        narrow.add_row(row());
        let widest = narrow.to_string().lines().map(|line| line.chars().count()).max().unwrap_or(0);
        assert!(widest <= 120, "{widest} columns:\n{narrow}");
        super::WIDE.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut wide = super::table(&["ADDRESS", "AGAIN", "CLIENTS"]);
        super::WIDE.store(false, std::sync::atomic::Ordering::Relaxed);
        wide.add_row(row());
        assert!(wide.to_string().lines().any(|line| line.chars().count() > 120), "{wide}");
    }
}
