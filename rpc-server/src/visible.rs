//! Which GPUs a worker's driver can name (issue 45, decision 5): the listener starts every worker
//! with `CUDA_VISIBLE_DEVICES` set to the UUIDs of the server's GPUs (`--gpu`), so a session's
//! driver cannot reach another tenant's GPU whatever the app sends; inside the worker those GPUs
//! are devices 0..n-1.
//!
//! The listener never initialises CUDA itself (it forks workers, and a process that forks after
//! `cuInit` leaves its children a driver they cannot use), so it learns the UUIDs from a short
//! probe process (`flyt-rpc-server gpu-uuids`) started with its own environment: the probe's
//! driver numbers GPUs exactly as the listener's would (its `CUDA_VISIBLE_DEVICES`,
//! `CUDA_DEVICE_ORDER` and MPS settings included), so `--gpu` means what it meant before. UUIDs
//! rather than ordinals go to the worker because an ordinal is relative to the environment it is
//! read in (the listener's own `CUDA_VISIBLE_DEVICES`, the device order); a UUID names one GPU
//! (or one MIG instance) on any host. NVML or `/proc/driver/nvidia` would give UUIDs without a
//! driver process, but in NVML's (PCI) order, which is not CUDA's default (fastest first).
//! The worker checks that its devices carry the UUIDs the listener meant (`check_uuids`).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::backend::BackendKind;

/// The variable the driver reads.
pub const VARIABLE: &str = "CUDA_VISIBLE_DEVICES";

/// How long the probe may take: `cuInit` on a host of many GPUs without persistence mode takes
/// seconds; one that hangs (a GPU fallen off the bus) must not hold the server's start for ever.
const PROBE_TIMEOUT: Duration = Duration::from_secs(90);

/// The probe's command line (`flyt-rpc-server gpu-uuids`).
#[derive(Clone, Debug, clap::Args)]
pub struct ProbeArgs {
    #[arg(long, value_enum)]
    pub backend: BackendKind,
    /// GPU ordinals as the driver in this process's environment numbers them.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub gpu: Vec<u32>,
}

/// A UUID as `CUDA_VISIBLE_DEVICES` and `nvidia-smi -L` write it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-
/// xxxxxxxxxxxx`, or `MIG-...` for a MIG instance.
pub fn uuid_name(uuid: &[u8; 16], mig: bool) -> String {
    let hex: String = uuid.iter().map(|byte| format!("{byte:02x}")).collect();
    let prefix = if mig { "MIG" } else { "GPU" };
    format!("{prefix}-{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// The UUID's hex digits and dashes, without its `GPU-`/`MIG-` prefix.
fn uuid_part(name: &str) -> &str {
    name.strip_prefix("GPU-").or_else(|| name.strip_prefix("MIG-")).unwrap_or(name)
}

/// The GPUs a `CUDA_VISIBLE_DEVICES` value leaves visible, as indices into `host` (the UUID names
/// of every GPU in the order the driver numbers them), read as the driver reads it: each entry an
/// ordinal or a `GPU-`/`MIG-` UUID (a unique prefix of one is enough); the list ends at the first
/// entry that names no GPU, names one already listed, or could name several.
pub fn parse(value: &str, host: &[String]) -> Vec<usize> {
    let is_uuid = |entry: &str| entry.starts_with("GPU-") || entry.starts_with("MIG-");
    let names = |entry: &str, index: usize| {
        let name = &host[index];
        name.starts_with(&entry[..4]) && !uuid_part(entry).is_empty() && uuid_part(name).starts_with(uuid_part(entry))
    };
    flyt_protocol::device::visible_list(value, host.len(), is_uuid, names)
}

/// Checks that the worker's devices are the GPUs the listener named (`expected`, UUID names in
/// the order of its `--gpu`): a `CUDA_VISIBLE_DEVICES` the driver read otherwise (a MIG instance
/// named as a GPU, say) must be an error at start, never a session on the wrong GPU.
pub fn check_uuids(expected: &[String], found: &[[u8; 16]]) -> Result<(), String> {
    if expected.len() != found.len() {
        return Err(format!(
            "{VARIABLE}={} shows the worker {} GPU(s), not the {} it names",
            expected.join(","),
            found.len(),
            expected.len()
        ));
    }
    for (index, (name, uuid)) in expected.iter().zip(found).enumerate() {
        if uuid_part(name) != uuid_part(&uuid_name(uuid, false)) {
            return Err(format!(
                "{VARIABLE}={} shows the worker {} as device {index}, not {name}",
                expected.join(","),
                uuid_name(uuid, false)
            ));
        }
    }
    Ok(())
}

/// What the probe found: the GPUs' UUID names and, with a real driver, their NVLinks
/// (`backend::nvlinks::encode`), which the listener hands its workers.
#[derive(Debug)]
pub struct Probed {
    pub names: Vec<String>,
    pub nvlinks: Option<String>,
}

/// The line of the probe's output that carries the NVLink table.
const NVLINKS_LINE: &str = "nvlinks ";

impl Probed {
    /// The probe's output: one UUID name per line, then the NVLink table's line.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = self.names.clone();
        lines.extend(self.nvlinks.iter().map(|table| format!("{NVLINKS_LINE}{table}")));
        lines
    }
}

/// What the probe prints (`Probed::lines`): the UUID name of each of `args.gpu`, and their NVLinks.
pub fn probe(args: &ProbeArgs) -> Result<Probed, String> {
    let names = match args.backend {
        // The emulated host's GPUs are not the machine's: the listener's own CUDA_VISIBLE_DEVICES
        // (which names real GPUs, if any) does not apply to them.
        BackendKind::Emulated => {
            let host = crate::backend::emulated::host_uuid_names();
            args.gpu
                .iter()
                .map(|ordinal| {
                    host.get(*ordinal as usize)
                        .cloned()
                        .ok_or_else(|| format!("GPU {ordinal} does not exist ({} on the emulated host)", host.len()))
                })
                .collect::<Result<Vec<_>, _>>()?
        }
        BackendKind::Cuda | BackendKind::Auto => crate::backend::cuda::probe_uuid_names(&args.gpu)?,
    };
    for (index, name) in names.iter().enumerate() {
        if names[..index].contains(name) {
            return Err(format!("GPU {} named twice", args.gpu[index]));
        }
    }
    let nvlinks = match args.backend {
        // The emulated device's topology is fixed; its workers know it.
        BackendKind::Emulated => None,
        BackendKind::Cuda | BackendKind::Auto => Some(crate::backend::nvlinks::encode(&crate::backend::cuda::probe_nvlinks(&args.gpu))),
    };
    Ok(Probed { names, nvlinks })
}

/// Runs the probe as a child process of `executable` with this process's environment and
/// returns the `CUDA_VISIBLE_DEVICES` value for workers of `gpus`, and their NVLink table if
/// the probe gave one.
pub fn run_probe(executable: &std::path::Path, backend: BackendKind, gpus: &[u32]) -> Result<(String, Option<String>), String> {
    let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
    let mut child = Command::new(executable)
        .arg("gpu-uuids")
        .args(["--backend", if backend == BackendKind::Emulated { "emulated" } else { "cuda" }])
        .args(["--gpu", &list.join(",")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("starting the GPU probe: {error}"))?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("the GPU probe did not finish in {} s", PROBE_TIMEOUT.as_secs()));
            }
            Err(error) => return Err(format!("waiting for the GPU probe: {error}")),
        }
    };
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut err);
    }
    if !status.success() {
        return Err(err.trim().strip_prefix("flyt-rpc-server gpu-uuids: ").unwrap_or(err.trim()).to_string());
    }
    read_probe(&out, gpus.len()).ok_or_else(|| format!("the GPU probe answered {out:?} for GPUs {}", list.join(",")))
}

/// The probe's output (`Probed::lines`) for `gpus` GPUs: the `CUDA_VISIBLE_DEVICES` value and the
/// NVLink table, if any; `None` if it is not that.
fn read_probe(out: &str, gpus: usize) -> Option<(String, Option<String>)> {
    let lines = out.lines().map(str::trim).filter(|line| !line.is_empty());
    let (tables, names): (Vec<&str>, Vec<&str>) = lines.partition(|line| line.starts_with(NVLINKS_LINE));
    if names.len() != gpus || !names.iter().all(|name| name.starts_with("GPU-") || name.starts_with("MIG-")) || tables.len() > 1 {
        return None;
    }
    let nvlinks = tables.first().map(|line| line[NVLINKS_LINE.len()..].to_string());
    Some((names.join(","), nvlinks))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Vec<String> {
        (0u8..3).map(|index| uuid_name(&[index; 16], false)).collect()
    }

    #[test]
    fn uuids_are_written_as_the_driver_reads_them() {
        let uuid = *b"flyt-emulated-01";
        assert_eq!(uuid_name(&uuid, false), "GPU-666c7974-2d65-6d75-6c61-7465642d3031");
        assert_eq!(uuid_name(&uuid, true), "MIG-666c7974-2d65-6d75-6c61-7465642d3031");
    }

    #[test]
    fn a_visible_list_is_read_as_the_driver_reads_it() {
        let host = host();
        assert_eq!(parse("2,0", &host), vec![2, 0], "ordinals, in the list's order");
        assert_eq!(parse(&host[1], &host), vec![1], "a whole UUID");
        assert_eq!(parse("GPU-02020202", &host), vec![2], "a unique prefix of one");
        assert_eq!(parse("1,7,0", &host), vec![1], "the list ends at an entry naming no GPU");
        assert_eq!(parse("1,1,0", &host), vec![1], "or at one listed already");
        assert_eq!(parse("GPU-0,1", &host), Vec::<usize>::new(), "or at one naming several");
        assert_eq!(parse(&host[0].replace("GPU-", "MIG-"), &host), Vec::<usize>::new(), "a GPU is not a MIG instance");
        assert_eq!(parse("", &host), Vec::<usize>::new(), "empty: none");
        assert_eq!(parse("-1", &host), Vec::<usize>::new());
    }

    #[test]
    fn a_worker_showing_other_gpus_is_refused() {
        let host = host();
        assert!(check_uuids(&host[1..], &[[1; 16], [2; 16]]).is_ok());
        let error = check_uuids(&host[1..2], &[[2; 16]]).unwrap_err();
        assert!(error.contains("as device 0, not GPU-0101"), "{error}");
        let error = check_uuids(&host[1..], &[[1; 16]]).unwrap_err();
        assert!(error.contains("1 GPU(s), not the 2"), "{error}");
    }

    #[test]
    fn the_probes_answer_is_read_back_whole() {
        let probed = Probed { names: host()[..2].to_vec(), nvlinks: Some("d1,s;d0,s".into()) };
        let out = probed.lines().join("\n") + "\n";
        assert_eq!(read_probe(&out, 2), Some((host()[..2].join(","), Some("d1,s;d0,s".into()))));
        let without = Probed { nvlinks: None, ..probed };
        assert_eq!(read_probe(&without.lines().join("\n"), 2), Some((host()[..2].join(","), None)));
        assert_eq!(read_probe(&out, 3), None, "a GPU short");
        assert_eq!(read_probe(&format!("{out}nvlinks -;-\n"), 2), None, "two tables");
        assert_eq!(read_probe("cuInit failed\n", 1), None);
    }

    #[test]
    fn the_emulated_probe_names_the_emulated_hosts_gpus() {
        let probed = probe(&ProbeArgs { backend: BackendKind::Emulated, gpu: vec![1, 0] }).unwrap();
        assert_eq!(probed.names, vec![uuid_name(b"flyt-emulated-01", false), uuid_name(b"flyt-emulated-00", false)]);
        assert_eq!(probed.nvlinks, None, "the emulated workers know their fixed topology");
        assert_eq!(probed.lines(), probed.names);
        assert!(probe(&ProbeArgs { backend: BackendKind::Emulated, gpu: vec![0, 0] }).unwrap_err().contains("named twice"));
        assert!(probe(&ProbeArgs { backend: BackendKind::Emulated, gpu: vec![99] }).unwrap_err().contains("does not exist"));
    }
}
