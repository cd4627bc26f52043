//! The program as a child of `flyt`: started with Flyt's environment, sent the signals `flyt`
//! receives, and waited for; `flyt` then exits as a shell would (the child's status, or
//! 128 + the signal that killed it).

use std::{
    ffi::{OsStr, OsString},
    io::ErrorKind,
    os::unix::process::ExitStatusExt,
    process::{Command, ExitStatus},
    sync::{Arc, Mutex, PoisonError},
    thread::JoinHandle,
};

use nix::{
    errno::Errno,
    sys::{
        signal::{self, Signal},
        wait::{Id, WaitPidFlag, waitid},
    },
    unistd::{Pid, getpgid, getpgrp},
};
use signal_hook::{
    consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2},
    iterator::{
        Handle, SignalsInfo,
        exfiltrator::{WithOrigin, origin::Origin},
    },
    low_level::siginfo::Cause,
};

/// The signals passed on to the program.
pub const FORWARDED: [i32; 6] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2];

/// Why the program could not be started.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum ChildError {
    /// {0}: command not found
    NotFound(String),
    /// {0}: permission denied (not an executable file?)
    NotExecutable(String),
    /// cannot start {0}: {1}
    Spawn(String, std::io::Error),
    /// cannot catch signals to pass them on: {0}
    Signals(std::io::Error),
    /// cannot wait for {0}: {1}
    Wait(String, Errno),
}

impl ChildError {
    /// A shell's codes: 127 not found, 126 found but not runnable; 1 for `flyt`'s own trouble.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NotFound(_) => 127,
            Self::NotExecutable(_) => 126,
            Self::Spawn(..) | Self::Signals(_) | Self::Wait(..) => 1,
        }
    }
}

/// Where caught signals go.
enum Target {
    /// Not started yet: signals wait here and go to the program once it runs.
    Starting(Vec<i32>),
    /// Running (or exited and not yet reaped, so its pid cannot have been reused).
    Running(Pid),
    /// Reaped: nothing is sent any more.
    Gone,
}

/// Catches [`FORWARDED`] and passes each on to the program.
struct Forwarder {
    target: Arc<Mutex<Target>>,
    handle: Handle,
    thread: JoinHandle<()>,
}

impl Forwarder {
    /// Catches the signals from now on. A signal that `flyt` was started with ignored (`nohup`
    /// ignores SIGHUP) is left ignored, and the program inherits that, as it would from a shell.
    fn start() -> Result<Self, ChildError> {
        let ignored = ignored_signals();
        let caught: Vec<i32> = FORWARDED.into_iter().filter(|signal| !ignored.contains(signal)).collect();
        let mut signals = SignalsInfo::<WithOrigin>::new(&caught).map_err(ChildError::Signals)?;
        let handle = signals.handle();
        let target = Arc::new(Mutex::new(Target::Starting(Vec::new())));
        let shared = Arc::clone(&target);
        let thread = std::thread::Builder::new()
            .name("flyt-signals".into())
            .spawn(move || {
                for origin in signals.forever() {
                    forward(&shared, &origin);
                }
            })
            .map_err(ChildError::Signals)?;
        Ok(Self { target, handle, thread })
    }

    /// The program runs as `pid`: signals caught while it started go to it now.
    fn running(&self, pid: Pid) {
        let mut target = self.target.lock().unwrap_or_else(PoisonError::into_inner);
        if let Target::Starting(pending) = &*target {
            for &number in pending {
                send(pid, number);
            }
        }
        *target = Target::Running(pid);
    }

    /// Nothing is sent from now on; call before the program is reaped.
    fn stop(self) {
        *self.target.lock().unwrap_or_else(PoisonError::into_inner) = Target::Gone;
        self.handle.close();
        let _ = self.thread.join();
    }
}

/// Passes one caught signal on. A signal the kernel raised itself (Ctrl-C, Ctrl-\ at the
/// terminal) went to the whole foreground process group, the program included when it shares
/// `flyt`'s group: sending it again would deliver it twice (a Python program would see a second
/// KeyboardInterrupt inside its handler of the first).
fn forward(target: &Mutex<Target>, origin: &Origin) {
    let mut target = target.lock().unwrap_or_else(PoisonError::into_inner);
    match &mut *target {
        Target::Starting(pending) => pending.push(origin.signal),
        Target::Running(pid) => {
            let from_terminal = origin.cause == Cause::Kernel;
            if !(from_terminal && getpgid(Some(*pid)).is_ok_and(|group| group == getpgrp())) {
                send(*pid, origin.signal);
            }
        }
        Target::Gone => {}
    }
}

fn send(pid: Pid, number: i32) {
    if let Ok(signal) = Signal::try_from(number) {
        // ESRCH: it has exited already; its status tells the rest.
        let _ = signal::kill(pid, signal);
    }
}

/// The signals this process was started with set to "ignore" (`SigIgn` in /proc/self/status).
fn ignored_signals() -> Vec<i32> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mask =
        status.lines().find_map(|line| line.strip_prefix("SigIgn:")).and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok()).unwrap_or(0);
    // Bit n-1 stands for signal n.
    FORWARDED.into_iter().filter(|&signal| mask & (1u64 << (signal - 1)) != 0).collect()
}

/// Runs `command` (looked up on `PATH`) with `args` and `vars` added to the environment, passes
/// signals on until it exits, and returns its status.
pub fn run(command: &OsStr, args: &[OsString], vars: &[(&str, OsString)]) -> Result<ExitStatus, ChildError> {
    let name = command.to_string_lossy().into_owned();
    // Catching starts before the program does, so a SIGTERM in between is not lost.
    let forwarder = Forwarder::start()?;
    let mut child = match Command::new(command).args(args).envs(vars.iter().map(|(name, value)| (name, value))).spawn() {
        Ok(child) => child,
        Err(error) => {
            forwarder.stop();
            return Err(match error.kind() {
                ErrorKind::NotFound => ChildError::NotFound(name),
                ErrorKind::PermissionDenied => ChildError::NotExecutable(name),
                _ => ChildError::Spawn(name, error),
            });
        }
    };
    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    forwarder.running(pid);
    // Wait for the exit without reaping, so the pid stays the program's while the forwarder may
    // still send to it; then stop forwarding, then reap.
    let waited = loop {
        match waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
            Err(Errno::EINTR) => {}
            other => break other,
        }
    };
    forwarder.stop();
    if let Err(error) = waited {
        return Err(ChildError::Wait(name, error));
    }
    child.wait().map_err(|error| ChildError::Wait(name, Errno::from_raw(error.raw_os_error().unwrap_or(0))))
}

/// `flyt`'s exit code for the program's status: its exit code, or 128 + the signal that killed
/// it, as shells report it.
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + (signal & 0x7f)).unwrap_or(255),
        (None, None) => 1,
    }
}

/// The line a shell prints when a program dies of a signal (none for SIGINT and SIGPIPE, which
/// a user or a closed pipe caused on purpose).
pub fn death_line(program: &OsStr, status: ExitStatus) -> Option<String> {
    let number = status.signal()?;
    let signal = Signal::try_from(number).ok();
    if matches!(signal, Some(Signal::SIGINT | Signal::SIGPIPE)) {
        return None;
    }
    let name = signal.map_or_else(|| format!("signal {number}"), |signal| signal.as_str().to_string());
    let core = if status.core_dumped() { " (core dumped)" } else { "" };
    Some(format!("{} was killed by {name}{core}", program.to_string_lossy()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_a_shells() {
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(255 << 8)), 255);
        // Killed by SIGTERM (15), by SIGKILL (9), by SIGSEGV with a core dump (0x80).
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(exit_code(ExitStatus::from_raw(11 | 0x80)), 139);
    }

    #[test]
    fn deaths_are_reported_like_a_shell_does() {
        let program = OsStr::new("app");
        assert_eq!(death_line(program, ExitStatus::from_raw(15)).as_deref(), Some("app was killed by SIGTERM"));
        assert_eq!(death_line(program, ExitStatus::from_raw(11 | 0x80)).as_deref(), Some("app was killed by SIGSEGV (core dumped)"));
        assert_eq!(death_line(program, ExitStatus::from_raw(2)), None);
        assert_eq!(death_line(program, ExitStatus::from_raw(3 << 8)), None);
    }
}
