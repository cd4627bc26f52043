//! A batch scheduler's question to the client manager of a node (Slurm's SPANK plugin,
//! `slurm-spank/`): "give job X GPUs of this shape" at the job's start and "job X ended" at its
//! end. It goes over the client manager's job socket (root only: the plugin runs in slurmstepd
//! and slurmd's epilog as root), with the same framing as the shim's locate request, so the
//! plugin carries no async runtime. `docs/design/slurm.md` has the design.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::frame::{FrameError, FrameLimits};

/// The variable (and the client manager's `job_socket` setting's override) naming the job socket.
pub const JOB_SOCKET_ENV: &str = "FLYT_CLIENT_MANAGER_JOB_SOCKET";
/// Where the client manager takes job requests unless [`JOB_SOCKET_ENV`] says otherwise.
pub const DEFAULT_JOB_SOCKET: &str = "/run/flyt/client-manager-jobs.sock";
/// Requests and replies are a few hundred bytes, never bulk data.
pub const JOB_LIMITS: FrameLimits = FrameLimits { max_message: 64 << 10, max_bulk: 0 };
/// The most GPUs one job may ask for on one node.
pub const MAX_JOB_GPUS: u32 = 64;
/// Kubernetes containers' jobs (the device plugin, `docs/kubernetes.md`) are numbered from here
/// up: Slurm's job ids stay below 67,043,328 (its largest `MaxJobId`), so the two never meet.
pub const CONTAINER_JOB_BASE: u32 = 100_000_000;

/// What a job asks for on one node: `gpus` GPUs, each a slice of `compute_units` SMs and
/// `memory_mib` MiB; 0 for both means whole GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobShape {
    pub gpus: u32,
    pub compute_units: u32,
    pub memory_mib: u64,
}

impl JobShape {
    /// Parses `--flyt-gpus`'s value: `N[,sms=S][,memory=M]`, M in MiB or with a `M`, `G` or
    /// `T` suffix (`memory=16G`). A slice names both its SMs and its memory, or neither.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let usage = "expected N[,sms=S][,memory=M] (N GPUs; S SMs and M MiB of each, e.g. 1,sms=20,memory=8G; neither: whole GPUs)";
        let mut parts = spec.split(',').map(str::trim);
        let gpus: u32 = parts.next().unwrap_or("").parse().map_err(|_| format!("--flyt-gpus={spec}: {usage}"))?;
        if gpus == 0 || gpus > MAX_JOB_GPUS {
            return Err(format!("--flyt-gpus={spec}: between 1 and {MAX_JOB_GPUS} GPUs"));
        }
        let (mut compute_units, mut memory_mib) = (None, None);
        for part in parts {
            match part.split_once('=') {
                Some(("sms", value)) if compute_units.is_none() => {
                    compute_units = Some(
                        value
                            .parse::<u32>()
                            .ok()
                            .filter(|sms| *sms > 0)
                            .ok_or_else(|| format!("--flyt-gpus={spec}: sms must be a number above 0"))?,
                    );
                }
                Some(("memory", value)) if memory_mib.is_none() => {
                    memory_mib = Some(
                        parse_mib(value).ok_or_else(|| format!("--flyt-gpus={spec}: memory must be MiB above 0, or end in M, G or T"))?,
                    );
                }
                _ => return Err(format!("--flyt-gpus={spec}: unknown or repeated part {part:?}; {usage}")),
            }
        }
        match (compute_units, memory_mib) {
            (Some(compute_units), Some(memory_mib)) => Ok(Self { gpus, compute_units, memory_mib }),
            (None, None) => Ok(Self { gpus, compute_units: 0, memory_mib: 0 }),
            _ => Err(format!("--flyt-gpus={spec}: a slice names both sms= and memory= (or neither, for whole GPUs)")),
        }
    }

    /// Whole GPUs (no slice size given).
    pub fn whole(&self) -> bool {
        self.compute_units == 0 && self.memory_mib == 0
    }
}

fn parse_mib(value: &str) -> Option<u64> {
    let (number, scale) = match value.char_indices().last()? {
        (at, 'M' | 'm') => (&value[..at], 1),
        (at, 'G' | 'g') => (&value[..at], 1 << 10),
        (at, 'T' | 't') => (&value[..at], 1 << 20),
        _ => (value, 1),
    };
    number.parse::<u64>().ok().and_then(|number| number.checked_mul(scale)).filter(|mib| *mib > 0)
}

/// The plugin's request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobRequest {
    /// GPUs for `job` on this node (the one it has when it has one: every step asks).
    Allocate { job: u32, shape: JobShape },
    /// `job` ended here, however it ended: give its GPUs back.
    Release { job: u32 },
    /// How many GPUs of `shape`'s slice size (`gpus` is ignored) this node's jobs may hold now:
    /// the free ones plus those its jobs hold (Kubernetes' device plugin, `docs/kubernetes.md`).
    Capacity { shape: JobShape },
}

/// The client manager's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobReply {
    /// The job's allocation: its tasks connect to `address` with `token` (`FLYT_SERVER`,
    /// `FLYT_TOKEN`); the token lasts as long as the allocation.
    Granted {
        allocation_id: String,
        /// The tenant the cluster manager knows the job by: `job-<id>@<node>`.
        tenant: String,
        address: String,
        token: String,
        /// The cluster's CA when it runs TLS (`FLYT_TLS_CA`); empty: plain TCP.
        tls_ca: String,
        /// The node and GPUs it got, and each GPU's slice (whole GPUs resolved to sizes).
        node_id: String,
        gpus: Vec<u32>,
        compute_units: u32,
        memory_mib: u64,
    },
    /// The job's allocation was given back (`None`: it had none here).
    Released { allocation_id: Option<String> },
    /// No GPUs for the job; `reason` says why and is shown to the user.
    Refused { reason: String },
    /// The answer to [`JobRequest::Capacity`]: that many slices (or whole GPUs).
    Capacity { slices: u32 },
}

/// The whole exchange from the plugin's side, over a connected stream: sends `request`, reads
/// the one reply. Timeouts are the stream's (set them before calling).
pub fn ask(stream: &mut (impl Read + Write), request: &JobRequest) -> Result<JobReply, FrameError> {
    crate::frame::ask(stream, request, &JOB_LIMITS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{read_value, write_value};

    #[test]
    fn shapes_parse_whole_gpus_and_slices() {
        assert_eq!(JobShape::parse("1"), Ok(JobShape { gpus: 1, compute_units: 0, memory_mib: 0 }));
        assert!(JobShape::parse("2").unwrap().whole());
        assert_eq!(JobShape::parse("2,sms=20,memory=8G"), Ok(JobShape { gpus: 2, compute_units: 20, memory_mib: 8192 }));
        assert_eq!(JobShape::parse("1, memory=512 ,sms=4"), Ok(JobShape { gpus: 1, compute_units: 4, memory_mib: 512 }));
        assert_eq!(JobShape::parse("1,sms=4,memory=1T").unwrap().memory_mib, 1 << 20);
    }

    #[test]
    fn bad_shapes_are_refused_with_the_reason() {
        for (spec, reason) in [
            ("", "expected N"),
            ("0", "between 1 and"),
            ("65", "between 1 and"),
            ("x", "expected N"),
            ("1,sms=4", "both sms= and memory="),
            ("1,memory=4G", "both sms= and memory="),
            ("1,sms=0,memory=1", "sms must be"),
            ("1,sms=1,memory=0", "memory must be"),
            ("1,sms=1,memory=1Q", "memory must be"),
            ("1,sms=1,sms=2,memory=1", "repeated"),
            ("1,gpus=2", "unknown"),
            ("1,sms=1,memory=99999999999999999T", "memory must be"),
        ] {
            let error = JobShape::parse(spec).unwrap_err();
            assert!(error.contains(reason), "{spec:?}: {error}");
        }
    }

    #[test]
    fn ask_sends_the_request_and_reads_the_reply() {
        let reply = JobReply::Released { allocation_id: Some("a1".into()) };
        let mut input = Vec::new();
        write_value(&mut input, 0, &reply).unwrap();
        struct Scripted(std::io::Cursor<Vec<u8>>, Vec<u8>);
        impl Read for Scripted {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                self.0.read(buf)
            }
        }
        impl Write for Scripted {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.1.extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut stream = Scripted(std::io::Cursor::new(input), Vec::new());
        assert_eq!(ask(&mut stream, &JobRequest::Release { job: 7 }).unwrap(), reply);
        let (_, sent): (u32, JobRequest) = read_value(&mut stream.1.as_slice(), &JOB_LIMITS).unwrap();
        assert_eq!(sent, JobRequest::Release { job: 7 });
    }
}
