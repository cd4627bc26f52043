//! `flyt`: starts a CUDA program through Flyt.
//!
//! `flyt run [OPTIONS] -- COMMAND [ARGS...]` puts Flyt's library folder first on the program's
//! library path, tells it where its server is, runs it as a child, passes signals on and exits
//! with its status. `flyt env` prints the same settings as shell `export` lines.
#![forbid(unsafe_code)]

mod child;
mod setup;

use std::{
    ffi::OsString,
    io::Write as _,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use clap::{Args, Parser, Subcommand};
use flyt_protocol::locate;

use crate::setup::{ServerChoice, SetupError, Shm};

const ABOUT: &str = "Start any CUDA program through Flyt: its GPU work runs on a Flyt server";

const LONG_ABOUT: &str = "\
Start any CUDA program through Flyt: its GPU work runs on a Flyt server, on this machine or another.

    flyt run -- ./my-cuda-app --its --arguments
    flyt run --server gpu-host:7000 -- python train.py
    eval \"$(flyt env)\"          # the same settings for this shell

The program needs no change: it finds Flyt's libcuda.so.1 and libcudart.so.13 where it would find
NVIDIA's. `flyt run`:
  - puts Flyt's library folder first on LD_LIBRARY_PATH (your entries follow) and sets
    TRITON_LIBCUDA_PATH to it (Triton looks for the driver there before it asks ldconfig);
    it never changes a system file;
  - finds the server: --server (or FLYT_SERVER), else the local client manager
    (FLYT_CLIENT_MANAGER_SOCKET, default /run/flyt/client-manager.sock), which must answer
    (exit code 2 with the reason when neither is there); the program's own Flyt library then
    opens the session;
  - runs the program as its child, passes SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2
    on to it, and exits with its exit status, or 128 + the signal that killed it.

Flyt's library folder is the `lib` folder beside the `bin` folder holding `flyt` (tools/dist
builds dist/bin/flyt and dist/lib), or --lib-dir / FLYT_LIB_DIR; it must hold libcudart.so.13
and libcuda.so.1 (tools/dist also puts a libcuda.so link there, which Triton links its kernel
launcher with).

Exit codes of flyt itself: 2 bad usage, no library folder, or no server; 126 the command cannot
be run; 127 the command is not found; otherwise the program's.";

#[derive(Parser)]
#[command(name = "flyt", version, about = ABOUT, long_about = LONG_ABOUT)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program through Flyt: `flyt run [OPTIONS] -- COMMAND [ARGS...]`.
    #[command(long_about = "\
Run COMMAND (looked up on PATH) through Flyt, with ARGS, and exit with its exit status (or 128 + the
signal that killed it). Signals sent to flyt (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2)
are passed on to it; Ctrl-C at a terminal reaches it once, directly.

Before it starts COMMAND, flyt checks Flyt's library folder and the server (see `flyt --help`),
and exits with code 2 and the reason when one is missing.")]
    #[command(override_usage = "flyt run [OPTIONS] [--] COMMAND [ARGS]...")]
    Run {
        #[command(flatten)]
        setup: SetupArgs,
        /// The program to run, then its arguments: everything after COMMAND is passed to it as it is.
        #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
        command: Vec<OsString>,
    },
    /// Print the environment `flyt run` would give a program, as `export` lines: `eval "$(flyt env)"`.
    #[command(long_about = "\
Print the environment `flyt run` would give a program, as shell `export` lines, after the same
checks (library folder, server). `eval \"$(flyt env)\"` makes every CUDA program started from this
shell use Flyt.")]
    Env {
        #[command(flatten)]
        setup: SetupArgs,
    },
}

#[derive(Args)]
struct SetupArgs {
    /// The Flyt server: `host:port` or `unix:/path/to/socket` (direct mode, no client manager).
    #[arg(long, env = "FLYT_SERVER", value_name = "ADDR")]
    server: Option<String>,
    /// The session token for --server (FLYT_TOKEN), when the server requires one.
    #[arg(long, value_name = "T")]
    token: Option<String>,
    /// The shared-memory channel (FLYT_SHM): auto uses it when the server is on this host, on
    /// requires it, off never uses it. Left unset, the program sees FLYT_SHM as it is.
    #[arg(long, value_enum, value_name = "MODE")]
    shm: Option<Shm>,
    /// The CA (PEM) a server's certificate must be signed by: TCP sessions use TLS (FLYT_TLS_CA).
    /// With a client manager of a TLS cluster, its CA is used without this.
    #[arg(long, env = "FLYT_TLS_CA", value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Flyt's library folder (holding libcudart.so.13 and libcuda.so.1); default: the `lib`
    /// folder beside the `bin` folder holding flyt.
    #[arg(long, env = "FLYT_LIB_DIR", value_name = "DIR")]
    lib_dir: Option<PathBuf>,
    /// The client manager's socket, asked when no server is given.
    #[arg(long, env = locate::SOCKET_ENV, default_value = locate::DEFAULT_SOCKET, value_name = "PATH")]
    client_manager_socket: PathBuf,
    /// How long the client manager may take to place this host's programs on a server.
    #[arg(long, env = "FLYT_LOCATE_TIMEOUT_SECONDS", default_value_t = 90, value_name = "SECONDS")]
    locate_timeout_seconds: u64,
}

impl SetupArgs {
    /// The library folder, the server and the variables to set, all checked.
    fn resolve(&self, program: &str) -> Result<Vec<(&'static str, OsString)>, SetupError> {
        let server = self.server.as_deref().filter(|address| !address.is_empty());
        if self.token.is_some() && server.is_none() {
            return Err(SetupError::TokenWithoutServer);
        }
        let lib_dir = setup::lib_dir(self.lib_dir.as_deref())?;
        let timeout = Duration::from_secs(self.locate_timeout_seconds.max(1));
        let server: ServerChoice = setup::server(server, &self.client_manager_socket, timeout, program)?;
        let mut vars =
            setup::environment(&lib_dir, &server, self.token.as_deref(), self.shm, std::env::var_os("LD_LIBRARY_PATH").as_deref());
        if let Some(ca) = &self.tls_ca {
            vars.push(("FLYT_TLS_CA", std::path::absolute(ca).unwrap_or_else(|_| ca.clone()).into_os_string()));
        }
        Ok(vars)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { setup, command } => {
            // clap requires COMMAND, so there is a first word.
            let Some((program, args)) = command.split_first() else {
                return ExitCode::from(2);
            };
            let name = Path::new(program).file_name().unwrap_or(program).to_string_lossy().into_owned();
            let vars = match setup.resolve(&format!("flyt run {name}")) {
                Ok(vars) => vars,
                Err(error) => return fail(&error, 2),
            };
            match child::run(program, args, &vars) {
                Ok(status) => {
                    if let Some(line) = child::death_line(program, status) {
                        eprintln!("flyt: {line}");
                    }
                    ExitCode::from(child::exit_code(status))
                }
                Err(error) => fail(&error, error.exit_code()),
            }
        }
        Command::Env { setup } => {
            let vars = match setup.resolve("flyt env") {
                Ok(vars) => vars,
                Err(error) => return fail(&error, 2),
            };
            let mut stdout = std::io::stdout().lock();
            for (name, value) in &vars {
                if writeln!(stdout, "{}", setup::export_line(name, value)).is_err() {
                    return ExitCode::from(1);
                }
            }
            ExitCode::SUCCESS
        }
    }
}

fn fail(error: &dyn std::error::Error, code: u8) -> ExitCode {
    eprintln!("flyt: {error}");
    ExitCode::from(code)
}
