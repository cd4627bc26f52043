//! Slurm's SPANK plugin for Flyt (`docs/design/slurm.md`): `--flyt-gpus=N[,sms=S][,memory=M]`
//! on srun, sbatch and salloc.
//!
//! - In srun, sbatch and salloc (local and allocator contexts) the option's value is checked,
//!   so a bad one stops the command with the reason. (The cluster's `cli_filter.lua`, shipped
//!   beside this crate, adds the matching `--licenses=flyt:N`, so jobs queue for Flyt GPUs.)
//! - In slurmstepd (remote context, root) each step of the job asks the node's client manager,
//!   on its job socket, for the job's allocation (the one it has, or a new one), then puts Flyt's
//!   library folder, the server and the token into the step's environment (what `flyt env`
//!   sets) and the allocation into the job's AdminComment (`scontrol show job`). No GPU for the
//!   job: the step fails with the reason.
//! - In the job's epilog (slurmd, root; however the job ended: completion, scancel, time
//!   limit) the allocation is given back.
//!
//! plugstack.conf: `required /usr/lib/flyt/libflyt_spank.so lib_dir=/opt/flyt/lib
//! [socket=/run/flyt/client-manager-jobs.sock] [timeout=120] [scontrol=scontrol]
//! [slurm_conf=/etc/slurm/slurm.conf]`.
//!
//! Every entry point is `extern "C"` with a panic boundary; the plugin talks to the client
//! manager synchronously (no async runtime inside Slurm's daemons).

use std::{
    ffi::{CStr, CString, c_char, c_int, c_uint},
    io::Read,
    os::unix::net::UnixStream,
    panic::{AssertUnwindSafe, catch_unwind},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use flyt_protocol::jobs::{self, JobReply, JobRequest, JobShape};

/// The plugin's settings, from its plugstack.conf line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Flyt's library folder (libcuda.so.1, libcudart.so.13, libnvidia-ml.so.1).
    pub lib_dir: Option<PathBuf>,
    /// The client manager's job socket.
    pub socket: PathBuf,
    /// How long a job's start waits for its GPUs (placement and the server's start).
    pub timeout: Duration,
    /// The scontrol that writes the AdminComment; empty: none is written.
    pub scontrol: String,
    /// SLURM_CONF for that scontrol, when the daemons' is not the default.
    pub slurm_conf: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            lib_dir: None,
            socket: PathBuf::from(jobs::DEFAULT_JOB_SOCKET),
            timeout: Duration::from_secs(120),
            scontrol: "scontrol".into(),
            slurm_conf: None,
        }
    }
}

impl Settings {
    /// Parses plugstack.conf's `key=value` arguments.
    pub fn parse<'a>(args: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut settings = Self::default();
        for arg in args {
            match arg.split_once('=') {
                Some(("lib_dir", value)) => settings.lib_dir = Some(PathBuf::from(value)),
                Some(("socket", value)) => settings.socket = PathBuf::from(value),
                Some(("timeout", value)) => {
                    let seconds: u64 =
                        value.parse().ok().filter(|seconds| *seconds > 0).ok_or_else(|| format!("timeout={value}: seconds above 0"))?;
                    settings.timeout = Duration::from_secs(seconds);
                }
                Some(("scontrol", value)) => settings.scontrol = value.into(),
                Some(("slurm_conf", value)) => settings.slurm_conf = Some(value.into()),
                _ => return Err(format!("unknown argument {arg:?} (lib_dir=, socket=, timeout=, scontrol=, slurm_conf=)")),
            }
        }
        Ok(settings)
    }
}

/// The libraries a job's programs load in place of NVIDIA's (as `flyt run` checks).
const REQUIRED_LIBRARIES: [&str; 3] = ["libcudart.so.13", "libcuda.so.1", "libnvidia-ml.so.1"];

/// Flyt's library folder, checked: without it a job's programs would quietly reach NVIDIA's
/// driver (or none).
pub fn checked_lib_dir(settings: &Settings) -> Result<PathBuf, String> {
    let dir = settings.lib_dir.as_ref().ok_or("plugstack.conf gives the plugin no lib_dir= (Flyt's library folder)")?;
    let missing: Vec<&str> = REQUIRED_LIBRARIES.into_iter().filter(|name| !dir.join(name).is_file()).collect();
    if !missing.is_empty() {
        return Err(format!("Flyt's library folder {} lacks {} (plugstack.conf lib_dir=)", dir.display(), missing.join(" and ")));
    }
    Ok(dir.clone())
}

/// The variables a job's step gets, as `flyt env --server ADDRESS --token TOKEN` prints them:
/// Flyt's library folder first on the library path (the user's entries after it), Triton
/// pointed at it, the server and token, and the cluster's CA when it runs TLS.
pub fn job_environment(lib_dir: &Path, reply: &JobReply, inherited_library_path: Option<&str>) -> Vec<(&'static str, String)> {
    let JobReply::Granted { address, token, tls_ca, .. } = reply else { return Vec::new() };
    let ours = lib_dir.display().to_string();
    let mut library_path = ours.clone();
    for entry in inherited_library_path.unwrap_or("").split(':').filter(|entry| !entry.is_empty() && *entry != ours) {
        library_path.push(':');
        library_path.push_str(entry);
    }
    let mut vars = vec![
        ("LD_LIBRARY_PATH", library_path),
        ("TRITON_LIBCUDA_PATH", ours),
        ("FLYT_SERVER", address.clone()),
        ("FLYT_TOKEN", token.clone()),
    ];
    if !tls_ca.is_empty() {
        vars.push(("FLYT_TLS_CA", tls_ca.clone()));
    }
    vars
}

/// What `scontrol show job` shows of the job's allocation (its AdminComment).
pub fn admin_comment(reply: &JobReply) -> Option<String> {
    let JobReply::Granted { allocation_id, tenant, node_id, gpus, compute_units, memory_mib, .. } = reply else { return None };
    let gpus: Vec<String> = gpus.iter().map(u32::to_string).collect();
    Some(format!(
        "flyt: allocation {allocation_id} ({tenant}) on {node_id} GPU {}: {} GPU(s) of {compute_units} SMs and {memory_mib} MiB",
        gpus.join(","),
        gpus.len()
    ))
}

/// One request to the client manager's job socket, bounded by `timeout`.
pub fn ask(socket: &Path, request: &JobRequest, timeout: Duration) -> Result<JobReply, String> {
    let mut stream = UnixStream::connect(socket).map_err(|error| {
        format!(
            "the Flyt client manager's job socket {} does not answer ({error}): is flyt-client-manager running with job_socket set?",
            socket.display()
        )
    })?;
    stream.set_read_timeout(Some(timeout)).map_err(|error| error.to_string())?;
    stream.set_write_timeout(Some(timeout)).map_err(|error| error.to_string())?;
    jobs::ask(&mut stream, request).map_err(|error| match error {
        flyt_protocol::frame::FrameError::Io(io) if matches!(io.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            format!(
                "the Flyt client manager at {} gave no answer within {} s (plugstack.conf timeout=)",
                socket.display(),
                timeout.as_secs()
            )
        }
        other => format!("the Flyt client manager at {}: {other}", socket.display()),
    })
}

/// Runs `command` until it ends or `limit` passes (then it is killed): its success and output.
fn run_bounded(command: &mut Command, limit: Duration) -> Result<(), String> {
    let mut child = command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().map_err(|error| error.to_string())?;
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                let mut stderr = String::new();
                if let Some(mut pipe) = child.stderr.take() {
                    let _ = pipe.read_to_string(&mut stderr);
                }
                return Err(format!("{status}: {}", stderr.trim()));
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {} s", limit.as_secs()));
            }
            Err(error) => return Err(error.to_string()),
        }
    }
}

/// Writes the job's allocation into its AdminComment; a failure is only logged (the job runs).
fn write_admin_comment(settings: &Settings, job: u32, comment: &str) -> Result<(), String> {
    if settings.scontrol.is_empty() {
        return Ok(());
    }
    let mut command = Command::new(&settings.scontrol);
    command.args(["update", &format!("JobId={job}"), &format!("AdminComment={comment}")]);
    if let Some(conf) = &settings.slurm_conf {
        command.env("SLURM_CONF", conf);
    }
    run_bounded(&mut command, Duration::from_secs(10))
}

// ---- The C side: what Slurm loads (`slurm/spank.h`, declared by hand). ----

/// `spank_t`: Slurm's handle, opaque here.
#[repr(C)]
pub struct SpankHandle {
    _private: [u8; 0],
}
type Spank = *mut SpankHandle;

/// `enum spank_item` values used here.
const S_JOB_ID: c_int = 2;
/// `enum spank_context` values used here.
const S_CTX_REMOTE: c_int = 2;
const S_CTX_JOB_SCRIPT: c_int = 5;
/// `ESPANK_SUCCESS`.
const ESPANK_SUCCESS: c_int = 0;
/// What a SPANK function returns to stop the step (or the command).
const SPANK_FAILED: c_int = -1;

unsafe extern "C" {
    fn spank_context() -> c_int;
    fn spank_get_item(spank: Spank, item: c_int, ...) -> c_int;
    fn spank_getenv(spank: Spank, var: *const c_char, buf: *mut c_char, len: c_int) -> c_int;
    fn spank_setenv(spank: Spank, var: *const c_char, val: *const c_char, overwrite: c_int) -> c_int;
    fn spank_option_getopt(spank: Spank, opt: *const SpankOption, optarg: *mut *mut c_char) -> c_int;
    fn spank_option_register(spank: Spank, opt: *const SpankOption) -> c_int;
    fn slurm_error(format: *const c_char, ...);
    fn slurm_info(format: *const c_char, ...);
}

/// `struct spank_option`.
#[repr(C)]
pub struct SpankOption {
    name: *const c_char,
    arginfo: *const c_char,
    usage: *const c_char,
    has_arg: c_int,
    val: c_int,
    cb: Option<unsafe extern "C" fn(val: c_int, optarg: *const c_char, remote: c_int) -> c_int>,
}

/// `--flyt-gpus`, registered in `slurm_spank_init` (sbatch and salloc never read a static
/// `spank_options` table).
#[repr(transparent)]
pub struct OptionEntry(SpankOption);

// SAFETY: the entry is immutable and its pointers name static strings; Slurm only reads it.
unsafe impl Sync for OptionEntry {}

const OPTION_NAME: &CStr = c"flyt-gpus";

static FLYT_GPUS_OPTION: OptionEntry = OptionEntry(SpankOption {
    name: OPTION_NAME.as_ptr(),
    arginfo: c"N[,sms=S][,memory=M]".as_ptr(),
    usage: c"Flyt GPUs for the job on each node: N GPUs, whole or slices of S SMs and M MiB (or 16G) each.".as_ptr(),
    has_arg: 1,
    val: 0,
    cb: Some(flyt_gpus_option),
});

/// `SPANK_PLUGIN(flyt, 1)`.
#[unsafe(no_mangle)]
#[allow(non_upper_case_globals, reason = "the symbol names Slurm looks up")]
pub static plugin_name: [u8; 5] = *b"flyt\0";
#[unsafe(no_mangle)]
#[allow(non_upper_case_globals, reason = "the symbol names Slurm looks up")]
pub static plugin_type: [u8; 6] = *b"spank\0";
#[unsafe(no_mangle)]
#[allow(non_upper_case_globals, reason = "the symbol names Slurm looks up")]
pub static plugin_version: c_uint = parse_version(env!("FLYT_SLURM_VERSION_NUMBER"));
#[unsafe(no_mangle)]
#[allow(non_upper_case_globals, reason = "the symbol names Slurm looks up")]
pub static spank_plugin_version: c_uint = 1;

const fn parse_version(text: &str) -> c_uint {
    let bytes = text.as_bytes();
    let mut value: c_uint = 0;
    let mut at = 0;
    while at < bytes.len() {
        value = value * 10 + (bytes[at] - b'0') as c_uint;
        at += 1;
    }
    value
}

/// What this process of Slurm's knows: the option's value (from its callback).
struct State {
    gpus: Option<String>,
}

static STATE: Mutex<State> = Mutex::new(State { gpus: None });

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn log_error(message: &str) {
    let text = CString::new(format!("flyt: {message}").replace('\0', " ")).unwrap_or_default();
    // SAFETY: a "%s" format with one NUL-terminated string, as slurm_error expects.
    unsafe { slurm_error(c"%s".as_ptr(), text.as_ptr()) };
}

fn log_info(message: &str) {
    let text = CString::new(format!("flyt: {message}").replace('\0', " ")).unwrap_or_default();
    // SAFETY: a "%s" format with one NUL-terminated string, as slurm_info expects.
    unsafe { slurm_info(c"%s".as_ptr(), text.as_ptr()) };
}

/// Runs `body` without letting a panic reach Slurm: a panic is an error (-1).
fn boundary(what: &str, body: impl FnOnce() -> c_int) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(code) => code,
        Err(_) => {
            log_error(&format!("internal error in {what}"));
            SPANK_FAILED
        }
    }
}

/// The arguments of a SPANK call as strings.
///
/// # Safety
/// `argv` holds `argc` NUL-terminated strings (or is null), as Slurm passes them.
unsafe fn arguments(argc: c_int, argv: *const *const c_char) -> Vec<String> {
    let count = usize::try_from(argc).unwrap_or(0);
    if argv.is_null() {
        return Vec::new();
    }
    (0..count)
        .filter_map(|index| {
            // SAFETY: index < argc, per the caller's contract.
            let arg = unsafe { *argv.add(index) };
            // SAFETY: each non-null entry is a NUL-terminated string.
            (!arg.is_null()).then(|| unsafe { CStr::from_ptr(arg) }.to_string_lossy().into_owned())
        })
        .collect()
}

/// The settings from plugstack.conf's arguments, which Slurm passes to every call.
///
/// # Safety
/// As [`arguments`].
unsafe fn settings_from(argc: c_int, argv: *const *const c_char) -> Result<Settings, String> {
    // SAFETY: the caller's contract.
    let args = unsafe { arguments(argc, argv) };
    Settings::parse(args.iter().map(String::as_str))
}

fn job_id(spank: Spank) -> Option<u32> {
    let mut job: u32 = 0;
    // SAFETY: S_JOB_ID's out-parameter is a `uint32_t *`, valid for the call.
    let code = unsafe { spank_get_item(spank, S_JOB_ID, &mut job as *mut u32) };
    (code == ESPANK_SUCCESS && job != 0).then_some(job)
}

fn job_getenv(spank: Spank, name: &CStr) -> Option<String> {
    let mut buffer = vec![0 as c_char; 64 << 10];
    let len = c_int::try_from(buffer.len()).unwrap_or(c_int::MAX);
    // SAFETY: the buffer is `len` bytes long and outlives the call; `name` is NUL-terminated.
    let code = unsafe { spank_getenv(spank, name.as_ptr(), buffer.as_mut_ptr(), len) };
    if code != ESPANK_SUCCESS {
        return None;
    }
    // SAFETY: on success Slurm wrote a NUL-terminated string into the buffer.
    Some(unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().into_owned())
}

fn job_setenv(spank: Spank, name: &str, value: &str) -> Result<(), String> {
    let (Ok(name_c), Ok(value_c)) = (CString::new(name), CString::new(value)) else {
        return Err(format!("{name} holds a NUL byte"));
    };
    // SAFETY: both are NUL-terminated strings that outlive the call.
    let code = unsafe { spank_setenv(spank, name_c.as_ptr(), value_c.as_ptr(), 1) };
    if code == ESPANK_SUCCESS { Ok(()) } else { Err(format!("cannot set {name} in the job's environment (spank error {code})")) }
}

/// `--flyt-gpus`'s callback: in srun, sbatch and salloc (remote 0) a bad value stops the
/// command; in slurmstepd (remote 1) the value is kept for `slurm_spank_init_post_opt`.
unsafe extern "C" fn flyt_gpus_option(_val: c_int, optarg: *const c_char, _remote: c_int) -> c_int {
    boundary("--flyt-gpus", || {
        if optarg.is_null() {
            log_error("--flyt-gpus needs a value: N[,sms=S][,memory=M]");
            return SPANK_FAILED;
        }
        // SAFETY: Slurm passes the option's argument as a NUL-terminated string.
        let value = unsafe { CStr::from_ptr(optarg) }.to_string_lossy().into_owned();
        if let Err(reason) = JobShape::parse(&value) {
            log_error(&reason);
            return SPANK_FAILED;
        }
        state().gpus = Some(value);
        0
    })
}

/// # Safety
/// Called by Slurm with its handle and plugstack.conf's arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn slurm_spank_init(spank: Spank, argc: c_int, argv: *const *const c_char) -> c_int {
    boundary("slurm_spank_init", || {
        // SAFETY: the option is static, so it outlives Slurm's use of it; Slurm copies what it keeps.
        let code = unsafe { spank_option_register(spank, &FLYT_GPUS_OPTION.0) };
        if code != ESPANK_SUCCESS {
            log_error(&format!("cannot register --flyt-gpus (spank error {code})"));
            return SPANK_FAILED;
        }
        // SAFETY: Slurm passes plugstack.conf's argc strings in argv.
        if let Err(reason) = unsafe { settings_from(argc, argv) } {
            log_error(&format!("plugstack.conf: {reason}"));
        }
        0
    })
}

/// In slurmstepd (root, before the tasks start): the job's GPUs and their environment.
///
/// # Safety
/// Called by Slurm with its handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn slurm_spank_init_post_opt(spank: Spank, argc: c_int, argv: *const *const c_char) -> c_int {
    boundary("slurm_spank_init_post_opt", || {
        // SAFETY: a plain query of Slurm's context.
        if unsafe { spank_context() } != S_CTX_REMOTE {
            return 0;
        }
        let Some(gpus) = state().gpus.clone() else { return 0 };
        // SAFETY: Slurm passes plugstack.conf's argc strings in argv to every call.
        let settings = unsafe { settings_from(argc, argv) };
        match start_step(spank, settings, &gpus) {
            Ok(()) => 0,
            Err(reason) => {
                log_error(&reason);
                SPANK_FAILED
            }
        }
    })
}

fn start_step(spank: Spank, settings: Result<Settings, String>, gpus: &str) -> Result<(), String> {
    let settings = settings.map_err(|reason| format!("plugstack.conf: {reason}"))?;
    let shape = JobShape::parse(gpus)?;
    let lib_dir = checked_lib_dir(&settings)?;
    let job = job_id(spank).ok_or("Slurm gave no job id")?;
    let reply = ask(&settings.socket, &JobRequest::Allocate { job, shape }, settings.timeout).and_then(|reply| match reply {
        JobReply::Refused { reason } => Err(reason),
        granted => Ok(granted),
    });
    let reply = match reply {
        Ok(reply) => reply,
        Err(reason) => {
            // The step fails before any task can print: the job's AdminComment says why.
            let _ = write_admin_comment(&settings, job, &format!("flyt: no GPUs: {reason}"));
            return Err(format!("no Flyt GPUs for job {job}: {reason}"));
        }
    };
    let inherited = job_getenv(spank, c"LD_LIBRARY_PATH");
    for (name, value) in job_environment(&lib_dir, &reply, inherited.as_deref()) {
        job_setenv(spank, name, &value)?;
    }
    if let Some(comment) = admin_comment(&reply) {
        log_info(&format!("job {job}: {comment}"));
        if let Err(reason) = write_admin_comment(&settings, job, &comment) {
            log_error(&format!("job {job}: cannot write the AdminComment with {}: {reason}", settings.scontrol));
        }
    }
    Ok(())
}

/// The variable Slurm hands `--flyt-gpus` to the epilog in (`SPANK_` + its option variable).
const EPILOG_OPTION_VARIABLES: [&str; 2] = ["SPANK__SLURM_SPANK_OPTION_flyt_flyt_gpus", "_SLURM_SPANK_OPTION_flyt_flyt_gpus"];

/// Whether the job asked for Flyt GPUs, in its epilog. Slurm 22.05's `spank_option_getopt`
/// answers "not given" there for a table option (its cache holds it unset), so the variable
/// it would read is read first.
fn asked_in_epilog(spank: Spank) -> bool {
    if EPILOG_OPTION_VARIABLES.iter().any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty())) {
        return true;
    }
    let mut value: *mut c_char = std::ptr::null_mut();
    // SAFETY: the option is `--flyt-gpus` as registered; `value` receives a pointer Slurm owns.
    unsafe { spank_option_getopt(spank, &FLYT_GPUS_OPTION.0, &mut value) == ESPANK_SUCCESS }
}

/// In the job's epilog (slurmd, root), however the job ended: its GPUs go back. Never fails
/// (a failing epilog drains the node); a release the cluster manager misses is retried by the
/// client manager.
///
/// # Safety
/// Called by Slurm with its handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn slurm_spank_job_epilog(spank: Spank, argc: c_int, argv: *const *const c_char) -> c_int {
    boundary("slurm_spank_job_epilog", || {
        // SAFETY: a plain query of Slurm's context.
        if unsafe { spank_context() } != S_CTX_JOB_SCRIPT {
            return 0;
        }
        if !asked_in_epilog(spank) {
            return 0;
        }
        // SAFETY: Slurm passes plugstack.conf's argc strings in argv to every call.
        let Ok(settings) = (unsafe { settings_from(argc, argv) }) else { return 0 };
        let Some(job) = job_id(spank) else { return 0 };
        match ask(&settings.socket, &JobRequest::Release { job }, settings.timeout) {
            Ok(JobReply::Released { allocation_id: Some(id) }) => log_info(&format!("job {job} ended: allocation {id} released")),
            Ok(_) => {}
            Err(reason) => log_error(&format!("job {job} ended, but its GPUs could not be given back now: {reason}")),
        }
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(tls_ca: &str) -> JobReply {
        JobReply::Granted {
            allocation_id: "a1b2".into(),
            tenant: "job-7@10.0.0.5".into(),
            address: "unix:/run/flyt/s.sock".into(),
            token: "tok".into(),
            tls_ca: tls_ca.into(),
            node_id: "node-a".into(),
            gpus: vec![0, 1],
            compute_units: 40,
            memory_mib: 4096,
        }
    }

    #[test]
    fn settings_come_from_plugstack_arguments() {
        let settings = Settings::parse(["lib_dir=/opt/flyt/lib", "socket=/tmp/j.sock", "timeout=30", "slurm_conf=/etc/s.conf"]).unwrap();
        assert_eq!(settings.lib_dir.as_deref(), Some(Path::new("/opt/flyt/lib")));
        assert_eq!(settings.socket, Path::new("/tmp/j.sock"));
        assert_eq!(settings.timeout, Duration::from_secs(30));
        assert_eq!(settings.slurm_conf.as_deref(), Some("/etc/s.conf"));
        assert_eq!(Settings::parse([]).unwrap().socket, Path::new(jobs::DEFAULT_JOB_SOCKET));
        assert!(Settings::parse(["libdir=/x"]).unwrap_err().contains("unknown argument"));
        assert!(Settings::parse(["timeout=0"]).unwrap_err().contains("above 0"));
    }

    #[test]
    fn the_job_gets_what_flyt_env_sets() {
        let vars = job_environment(Path::new("/opt/flyt/lib"), &granted(""), Some("/opt/flyt/lib:/usr/local/lib::"));
        assert_eq!(
            vars,
            vec![
                ("LD_LIBRARY_PATH", "/opt/flyt/lib:/usr/local/lib".to_string()),
                ("TRITON_LIBCUDA_PATH", "/opt/flyt/lib".to_string()),
                ("FLYT_SERVER", "unix:/run/flyt/s.sock".to_string()),
                ("FLYT_TOKEN", "tok".to_string()),
            ]
        );
        let vars = job_environment(Path::new("/l"), &granted("/etc/flyt/ca.pem"), None);
        assert_eq!(vars[0], ("LD_LIBRARY_PATH", "/l".to_string()));
        assert_eq!(vars.last().unwrap(), &("FLYT_TLS_CA", "/etc/flyt/ca.pem".to_string()));
        assert!(job_environment(Path::new("/l"), &JobReply::Refused { reason: "x".into() }, None).is_empty());
    }

    #[test]
    fn the_comment_names_the_allocation_and_what_it_holds() {
        assert_eq!(
            admin_comment(&granted("")).unwrap(),
            "flyt: allocation a1b2 (job-7@10.0.0.5) on node-a GPU 0,1: 2 GPU(s) of 40 SMs and 4096 MiB"
        );
    }

    #[test]
    fn a_lib_dir_without_flyts_libraries_is_refused_by_name() {
        let folder = tempfile::tempdir().unwrap();
        let settings = Settings { lib_dir: Some(folder.path().to_path_buf()), ..Settings::default() };
        let error = checked_lib_dir(&settings).unwrap_err();
        assert!(error.contains("lacks libcudart.so.13 and libcuda.so.1 and libnvidia-ml.so.1"), "{error}");
        for name in REQUIRED_LIBRARIES {
            std::fs::write(folder.path().join(name), b"").unwrap();
        }
        assert_eq!(checked_lib_dir(&settings).unwrap(), folder.path());
        assert!(checked_lib_dir(&Settings::default()).unwrap_err().contains("no lib_dir="));
    }

    #[test]
    fn a_silent_client_manager_is_an_error_within_the_timeout() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("jobs.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let started = Instant::now();
        let error = ask(&path, &JobRequest::Release { job: 1 }, Duration::from_millis(300)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(error.contains("no answer within"), "{error}");
        let error = ask(&folder.path().join("none.sock"), &JobRequest::Release { job: 1 }, Duration::from_secs(1)).unwrap_err();
        assert!(error.contains("job_socket"), "{error}");
    }

    #[test]
    fn the_plugin_version_is_a_slurm_release() {
        assert!(plugin_version >> 16 >= 20, "{plugin_version:#x}");
    }
}
