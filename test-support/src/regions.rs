//! VM ivshmem regions for tests: a folder of them in shared memory (removed with the test),
//! made by `flytctl ivshmem create` as an operator would, and what the tests read back.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Server, artifact, series_value};

/// Where the first session slot starts in a region (after its header).
pub const FIRST_SLOT: u64 = 2 << 20;

/// A folder of regions in `/dev/shm`, where a GPU host keeps them (the driver pins only such
/// pages); removed when dropped, passed or failed. Not named `flyt-*`: other tests check that no
/// Flyt segment outlives its session there.
pub struct Regions {
    pub dir: PathBuf,
}

impl Regions {
    pub fn new(test: &str) -> Self {
        let dir = PathBuf::from(format!("/dev/shm/regions-test-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Self { dir }
    }

    /// `flytctl ivshmem create NAME --size SIZE --sessions N`: the region file, and the QEMU
    /// options the operator is told to give the VM.
    pub fn create(&self, name: &str, size: &str, sessions: u32) -> (PathBuf, Vec<String>) {
        let output = Command::new(artifact("flytctl"))
            .args(["ivshmem", "create", name, "--size", size, "--sessions", &sessions.to_string(), "--dir"])
            .arg(&self.dir)
            .output()
            .expect("run flytctl");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "flytctl ivshmem create: {stdout}{}", String::from_utf8_lossy(&output.stderr));
        let options = stdout
            .lines()
            .find(|line| line.trim_start().starts_with("-object memory-backend-file"))
            .unwrap_or_else(|| panic!("flytctl prints the QEMU options: {stdout}"));
        assert!(options.contains(&format!("-device ivshmem-plain,memdev=flyt-{name}")), "{options}");
        (self.dir.join(name), options.split_whitespace().map(str::to_string).collect())
    }
}

impl Regions {
    /// An rpc-server on the emulated device that serves these regions for allocation `vms`,
    /// listening on `listen` (and its metrics on `metrics`), with `extra` arguments.
    pub fn start_server(&self, listen: &[&str], metrics: &str, scratch: &Path, extra: &[&str]) -> Server {
        let regions = self.dir.display().to_string();
        let mut args = vec!["--device", "emulated", "--emulated-memory", "1GiB"];
        for address in listen {
            args.extend(["--listen", address]);
        }
        args.extend(["--ivshmem-dir", &regions, "--allocation", "vms", "--metrics-listen", metrics]);
        args.extend(extra);
        Server::start(&args, scratch)
    }
}

impl Drop for Regions {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Bytes a server copied for allocation `vms` in `direction` (`h2d`, `d2h`) by `path` (`shm`,
/// `socket`), from its metrics text.
pub fn copied(metrics: &str, direction: &str, path: &str) -> f64 {
    let series = format!("flyt_rpc_copied_bytes_total{{allocation=\"vms\",direction=\"{direction}\",path=\"{path}\"}}");
    series_value(metrics, &series).unwrap_or(0.0)
}

/// `len` bytes of `file` at `offset`.
pub fn read_at(file: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::open(file).expect("region"), &mut bytes, offset).expect("read");
    bytes
}

/// A loopback address with a port free now (for a server's metrics endpoint).
pub fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address").to_string()
}
