//! Command-line settings; every flag can also come from the environment (`FLYT_RPC_*`).

use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{Context, bail};

use crate::backend::BackendKind;

/// A byte count: a plain number or one with a unit (`512MiB`, `16GiB`, `4M`, `1G`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let number: u64 = number.parse().map_err(|_| format!("'{text}' is not a byte count (try 4096, 512MiB or 16GiB)"))?;
        let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            "t" | "tb" | "tib" => 1 << 40,
            other => {
                return Err(format!("unknown unit '{other}' in '{text}' (use KiB, MiB, GiB or TiB)"));
            }
        };
        number.checked_mul(scale).map(ByteSize).ok_or_else(|| format!("'{text}' is too large"))
    }
}

/// `flyt-rpc-server` settings.
#[derive(Clone, Debug, clap::Args)]
pub struct ServerArgs {
    /// Where to listen: `host:port` (TCP; port 0 picks one) or `unix:/path`. Repeatable.
    #[arg(long, env = "FLYT_RPC_LISTEN", value_delimiter = ',')]
    pub listen: Vec<String>,
    /// Which device serves sessions.
    #[arg(long, env = "FLYT_RPC_DEVICE", value_enum, default_value = "auto")]
    pub device: BackendKind,
    /// CUDA ordinals of the GPUs this server serves, comma-separated, as the driver numbers them
    /// in this server's environment: each session sees them as its devices 0, 1, ... in this
    /// order, and its worker sees no other GPU (`CUDA_VISIBLE_DEVICES` set to their UUIDs). With
    /// `--device emulated`, GPUs of an emulated host of 16.
    #[arg(long, env = "FLYT_RPC_GPU", value_delimiter = ',', default_value = "0", num_args = 1..)]
    pub gpu: Vec<u32>,
    /// Device memory all sessions together may hold (default: the whole GPU).
    #[arg(long, env = "FLYT_RPC_MEMORY_QUOTA")]
    pub memory_quota: Option<ByteSize>,
    /// SM share in percent; workers run with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE set to it.
    #[arg(long, env = "FLYT_RPC_SM_PERCENTAGE", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub sm_percentage: u32,
    /// File holding the cluster key; when set, every session must present a valid token.
    #[arg(long, env = "FLYT_CLUSTER_KEY_FILE")]
    pub cluster_key_file: Option<PathBuf>,
    /// The allocation this server serves; tokens must name it.
    #[arg(long, env = "FLYT_RPC_ALLOCATION")]
    pub allocation: Option<String>,
    /// Control socket for the node manager (`unix:/path`, owner-only; needs the cluster key).
    #[arg(long, env = "FLYT_RPC_CONTROL")]
    pub control: Option<String>,
    /// The address window of this server's workers (0 to 4): window N moves the first device
    /// reservation of each worker up by N x 16 TiB in its bottom-up address space
    /// (`address_space`), so the servers of one tenant on several nodes, each given its own
    /// window, never hand out the same device address (`FLYT_SERVER` with several servers).
    #[arg(long, env = "FLYT_RPC_ADDRESS_WINDOW", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=crate::address_space::MAX_WINDOW as i64))]
    pub address_window: u32,
    /// Workers kept ready (device open) for new sessions.
    #[arg(long, env = "FLYT_RPC_WARM_WORKERS", default_value_t = 2)]
    pub warm_workers: usize,
    /// Largest copy chunk per frame.
    #[arg(long, env = "FLYT_RPC_COPY_CHUNK", default_value = "8MiB")]
    pub copy_chunk: ByteSize,
    /// Pinned staging buffers per session (each one copy chunk). Striped copies keep two chunks
    /// per data connection in flight, within three quarters of them.
    #[arg(long, env = "FLYT_RPC_STAGING_SLOTS", default_value_t = 16)]
    pub staging_slots: usize,
    /// Microseconds a session polls a short wait itself before handing it to a waiter thread.
    #[arg(long, env = "FLYT_RPC_INLINE_WAIT_US", default_value_t = 20)]
    pub inline_wait_us: u64,
    /// Certificate (PEM) this server shows TCP clients; with --tls-key, TCP sessions must use
    /// TLS (Unix sockets never do).
    #[arg(long, env = "FLYT_RPC_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "FLYT_RPC_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Seconds a new connection has to send its hello.
    #[arg(long, env = "FLYT_RPC_HANDSHAKE_TIMEOUT", default_value_t = 10)]
    pub handshake_timeout_secs: u64,
    /// Milliseconds a TCP session whose connection broke waits for its client to come back
    /// (`docs/design/reconnect.md`); 0 ends the session when its connection breaks.
    #[arg(long, env = "FLYT_RPC_RECONNECT_GRACE_MS", default_value_t = 10_000)]
    pub reconnect_grace_ms: u64,
    /// Memory of the emulated device.
    #[arg(long, env = "FLYT_RPC_EMULATED_MEMORY", default_value = "16GiB")]
    pub emulated_memory: ByteSize,
    /// SMs the emulated device reports.
    #[arg(long, env = "FLYT_RPC_EMULATED_SMS", default_value_t = 132)]
    pub emulated_sms: u32,
    /// Emulated device, for tests of address windows: every worker's first address is the same
    /// (by default each worker starts at an offset of its own), so two servers in one window
    /// hand out overlapping addresses.
    #[arg(long, hide = true)]
    pub emulated_fixed_base: bool,
    /// Folder of the module image cache, which keeps large images clients sent so that later
    /// sessions need not send them again (servers given the same folder share it), or `off`.
    /// Default: `$CACHE_DIRECTORY/images` under systemd, else `$XDG_CACHE_HOME/flyt/images` or
    /// `~/.cache/flyt/images`.
    #[arg(long, env = "FLYT_RPC_IMAGE_CACHE")]
    pub image_cache: Option<String>,
    /// Bytes the image cache may hold; the least recently used images leave first.
    #[arg(long, env = "FLYT_RPC_IMAGE_CACHE_SIZE", default_value = "4GiB")]
    pub image_cache_size: ByteSize,
    /// Serve Prometheus metrics at `http://ADDRESS/metrics` (`host:port`); off when unset.
    #[arg(long, env = "FLYT_RPC_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Folder of the ivshmem regions of this host's virtual machines (`flytctl ivshmem create`):
    /// a guest's session may use a slot of its VM's region, named and proven by the region's
    /// token, as its shared-memory segment. Unset: guests' regions are refused.
    #[arg(long, env = "FLYT_RPC_IVSHMEM_DIR")]
    pub ivshmem_dir: Option<PathBuf>,
    /// Folder of session snapshots (`flytctl ... checkpoint`): an app that reconnects with the
    /// name of a snapshot in it continues from it here (after this server restarted, say).
    #[arg(long, env = "FLYT_RPC_SNAPSHOT_DIR")]
    pub snapshot_dir: Option<PathBuf>,
    /// Oversubscription (`docs/design/paging.md`): the sessions' quota may be this many times
    /// the device memory this server keeps resident (its quota divided by it, at most the
    /// device's); idle sessions are paged out to host memory to make room. Off when unset.
    #[arg(long, env = "FLYT_RPC_OVERSUBSCRIBE", value_parser = parse_oversubscribe)]
    pub oversubscribe: Option<f64>,
    /// With --oversubscribe: milliseconds without a request (and no work queued) before a
    /// session may be paged out.
    #[arg(long, env = "FLYT_RPC_IDLE_PAGE_OUT_MS", default_value_t = 1000)]
    pub idle_page_out_ms: u64,
    /// With --oversubscribe: milliseconds a session paged in (or started) stays resident at
    /// least, so sessions taking turns do not thrash.
    #[arg(long, env = "FLYT_RPC_RESIDENT_MIN_MS", default_value_t = 2000)]
    pub resident_min_ms: u64,
    /// With --oversubscribe: milliseconds a request waits for device memory (others paged out)
    /// with no page-out progressing before it fails with CUDA_ERROR_OUT_OF_MEMORY (a slow
    /// page-out under way is waited for; at most 10 times this in all).
    #[arg(long, env = "FLYT_RPC_PAGE_WAIT_MS", default_value_t = 30_000)]
    pub page_wait_ms: u64,
    /// With --oversubscribe: host memory the workers may pin ahead for paging, all together.
    /// Each worker keeps a pool of pinned chunks as large as its session's allocations (so its
    /// page-outs and page-ins are DMA at the copy engines' speed), within this budget (a
    /// page-out short of it borrows from the pools of resident sessions); past it, paged memory
    /// goes to tmpfs pages, pinned window by window for the copy. Default: half the host's
    /// available memory; 0: nothing pinned ahead.
    #[arg(long, env = "FLYT_RPC_PAGE_HOST_BUDGET", alias = "page-pinned-max")]
    pub page_host_budget: Option<ByteSize>,
    /// With --oversubscribe: the size of the paging pools' chunks (whole 4 KiB pages).
    #[arg(long, env = "FLYT_RPC_PAGE_CHUNK", default_value = "256MiB")]
    pub page_chunk: ByteSize,
}

/// Half the host's available memory (`MemAvailable` in /proc/meminfo), or 0 if it cannot be read.
fn half_available_memory() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    kib.saturating_mul(1024) / 2
}

fn parse_oversubscribe(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(factor) if (1.0..=64.0).contains(&factor) => Ok(factor),
        _ => Err(format!("'{text}' is not an oversubscription factor between 1.0 and 64")),
    }
}

impl ServerArgs {
    /// Host memory for paged-out sessions, pinned ahead (`--page-host-budget`).
    pub fn page_host_budget(&self) -> u64 {
        self.page_host_budget.map_or_else(half_available_memory, |bytes| bytes.0)
    }

    /// Paging's settings, when the server oversubscribes.
    pub fn paging(&self) -> Option<crate::paging::PagingSettings> {
        self.oversubscribe.map(|_| crate::paging::PagingSettings {
            idle: std::time::Duration::from_millis(self.idle_page_out_ms),
            resident_min: std::time::Duration::from_millis(self.resident_min_ms),
            wait: std::time::Duration::from_millis(self.page_wait_ms),
        })
    }

    /// The image cache folder, or `None` when it is off. `explicit` says the operator named it,
    /// so that a folder that cannot be used is an error rather than a warning.
    pub fn image_cache_dir(&self) -> Option<(PathBuf, bool)> {
        match self.image_cache.as_deref() {
            Some("off") => None,
            Some(dir) => Some((PathBuf::from(dir), true)),
            None => default_image_cache().map(|dir| (dir, false)),
        }
    }
}

fn default_image_cache() -> Option<PathBuf> {
    let env_dir = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty()).map(PathBuf::from);
    // systemd's `CacheDirectory=` may list several folders, separated by colons.
    let systemd =
        std::env::var("CACHE_DIRECTORY").ok().and_then(|dirs| dirs.split(':').next().filter(|dir| !dir.is_empty()).map(PathBuf::from));
    systemd
        .map(|dir| dir.join("images"))
        .or_else(|| env_dir("XDG_CACHE_HOME").map(|dir| dir.join("flyt/images")))
        .or_else(|| env_dir("HOME").map(|dir| dir.join(".cache/flyt/images")))
}

/// Reads the cluster key: the file's bytes without surrounding whitespace; refuses a key that
/// others can read or one too short to be a secret.
pub fn read_cluster_key(path: &Path) -> anyhow::Result<Vec<u8>> {
    use std::os::unix::fs::PermissionsExt;
    let metadata = std::fs::metadata(path).with_context(|| format!("cluster key {}", path.display()))?;
    if metadata.permissions().mode() & 0o077 != 0 {
        bail!("cluster key {} is readable by others: chmod 600 it", path.display());
    }
    let key = std::fs::read(path).with_context(|| format!("reading cluster key {}", path.display()))?;
    let key = key.trim_ascii().to_vec();
    if key.len() < 16 {
        bail!("cluster key {} is shorter than 16 bytes", path.display());
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_units_and_refuse_junk() {
        assert_eq!("4096".parse(), Ok(ByteSize(4096)));
        assert_eq!("512MiB".parse(), Ok(ByteSize(512 << 20)));
        assert_eq!("16 GiB".parse(), Ok(ByteSize(16 << 30)));
        assert_eq!("4m".parse(), Ok(ByteSize(4 << 20)));
        assert!("12 parsecs".parse::<ByteSize>().is_err());
        assert!("GiB".parse::<ByteSize>().is_err());
        assert!("99999999999TiB".parse::<ByteSize>().is_err());
    }
}
