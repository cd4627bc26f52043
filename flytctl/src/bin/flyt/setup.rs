//! What `flyt run` and `flyt env` decide before a program starts: Flyt's library folder, the
//! server (given, or the local client manager, checked), and the environment the program gets.

use std::{
    ffi::{OsStr, OsString},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use flyt_daemon_kit::host;
use flyt_protocol::{
    frame::FrameError,
    handshake::ClientIdentity,
    locate::{self, LocateReply, LocateRequest},
};

/// The libraries a program loads in place of NVIDIA's: without both, a program would quietly
/// reach the local GPU (or none) through NVIDIA's own.
pub const REQUIRED_LIBRARIES: [&str; 3] = ["libcudart.so.13", "libcuda.so.1", "libnvidia-ml.so.1"];

/// Why `flyt` cannot start a program (exit code 2, like a usage error).
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum SetupError {
    /// cannot tell where flyt itself is ({0}): pass --lib-dir or set FLYT_LIB_DIR to Flyt's library folder
    OwnPath(std::io::Error),
    /// Flyt's library folder {0} does not exist: pass --lib-dir or set FLYT_LIB_DIR to the folder holding libcudart.so.13, libcuda.so.1 and libnvidia-ml.so.1 (tools/dist builds it as dist/lib)
    NoLibDir(String),
    /// Flyt's library folder {dir} lacks {missing}: pass --lib-dir or set FLYT_LIB_DIR to the folder holding libcudart.so.13, libcuda.so.1 and libnvidia-ml.so.1 (tools/dist builds it as dist/lib)
    IncompleteLibDir { dir: String, missing: String },
    /// no Flyt server: pass --server or start the client manager (nothing answers at {socket}: {reason})
    NoClientManager { socket: String, reason: String },
    /// no Flyt server: pass --server or start the client manager (the client manager at {socket} did not answer within {seconds} s; --locate-timeout-seconds)
    ClientManagerTimeout { socket: String, seconds: u64 },
    /// no Flyt server for this program: the client manager at {socket} says: {reason}
    Refused { socket: String, reason: String },
    /// no Flyt server at {address}: {reason} (pass --server with a running flyt-rpc-server's address, or start the client manager)
    NoServer { address: String, reason: String },
    /// --token needs --server (or FLYT_SERVER): the client manager hands out tokens itself
    TokenWithoutServer,
}

/// Flyt's library folder: `--lib-dir`/`FLYT_LIB_DIR`, else the `lib` folder beside the `bin`
/// folder that holds this executable (`dist/bin/flyt` -> `dist/lib`). Absolute, and checked to
/// hold [`REQUIRED_LIBRARIES`].
pub fn lib_dir(given: Option<&Path>) -> Result<PathBuf, SetupError> {
    let dir = match given {
        Some(dir) => dir.to_path_buf(),
        None => {
            let exe = std::env::current_exe().and_then(std::fs::canonicalize).map_err(SetupError::OwnPath)?;
            // <prefix>/bin/flyt -> <prefix>/lib
            exe.parent().and_then(Path::parent).unwrap_or(Path::new("/")).join("lib")
        }
    };
    // Absolute, so the program finds it whatever folder it changes to.
    let dir = std::fs::canonicalize(&dir).map_err(|_| SetupError::NoLibDir(dir.display().to_string()))?;
    if !dir.is_dir() {
        return Err(SetupError::NoLibDir(dir.display().to_string()));
    }
    let missing: Vec<&str> = REQUIRED_LIBRARIES.into_iter().filter(|name| !dir.join(name).is_file()).collect();
    if !missing.is_empty() {
        return Err(SetupError::IncompleteLibDir { dir: dir.display().to_string(), missing: missing.join(" and ") });
    }
    Ok(dir)
}

/// How the program will find its server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerChoice {
    /// `--server`/`FLYT_SERVER`: the program's shim connects there.
    Direct(String),
    /// The program's shim asks the client manager at this socket, which answered `flyt`.
    ClientManager(PathBuf),
}

/// Settles where the server is. A `unix:` address must name an existing socket; a TCP address
/// is left to the program's shim (connecting here would open a session on the server). Several
/// servers, comma-separated (a tenant's GPUs on several nodes), are each checked so. Without
/// an address, the client manager must answer a locate request within `timeout`: the same
/// request the program's shim sends, so a client manager with no GPU for this host says so now,
/// in one line, rather than inside the program.
pub fn server(address: Option<&str>, socket: &Path, timeout: Duration, program: &str) -> Result<ServerChoice, SetupError> {
    if let Some(address) = address {
        for server in address.split(',').map(str::trim).filter(|server| !server.is_empty()) {
            if let Some(path) = server.strip_prefix("unix:") {
                match std::fs::metadata(path) {
                    Ok(metadata) if std::os::unix::fs::FileTypeExt::is_socket(&metadata.file_type()) => {}
                    Ok(_) => return Err(SetupError::NoServer { address: server.into(), reason: "not a socket".into() }),
                    Err(error) => return Err(SetupError::NoServer { address: server.into(), reason: error.to_string() }),
                }
            }
        }
        return Ok(ServerChoice::Direct(address.to_string()));
    }
    let name = socket.display().to_string();
    let unreachable = |reason: String| SetupError::NoClientManager { socket: name.clone(), reason };
    let mut stream = UnixStream::connect(socket).map_err(|error| unreachable(error.to_string()))?;
    stream.set_read_timeout(Some(timeout)).map_err(|error| unreachable(error.to_string()))?;
    stream.set_write_timeout(Some(timeout)).map_err(|error| unreachable(error.to_string()))?;
    let client = ClientIdentity { hostname: host::hostname(), pid: std::process::id(), program: program.into(), boot_id: host::boot_id() };
    match locate::ask(&mut stream, &LocateRequest { client }) {
        Ok(LocateReply::Server { .. }) => Ok(ServerChoice::ClientManager(socket.to_path_buf())),
        Ok(LocateReply::Refused { reason }) => Err(SetupError::Refused { socket: name, reason }),
        Err(FrameError::Io(error)) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            Err(SetupError::ClientManagerTimeout { socket: name, seconds: timeout.as_secs() })
        }
        Err(error) => Err(unreachable(error.to_string())),
    }
}

/// `FLYT_SHM`'s values, as the shim reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shm {
    /// Use the shared-memory channel when the server shares this host.
    Auto,
    /// Require it: the program's CUDA calls fail when it cannot be set up.
    On,
    /// Never use it.
    Off,
}

impl Shm {
    fn value(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        }
    }
}

/// The variables the program gets on top of the environment `flyt` was started with, in order.
pub fn environment(
    lib_dir: &Path,
    server: &ServerChoice,
    token: Option<&str>,
    shm: Option<Shm>,
    inherited_library_path: Option<&OsStr>,
) -> Vec<(&'static str, OsString)> {
    let mut vars = vec![
        ("LD_LIBRARY_PATH", library_path(lib_dir, inherited_library_path)),
        // Triton links its launcher against, and looks for, `libcuda.so*` here before it asks
        // `ldconfig` (which knows only the system's driver).
        ("TRITON_LIBCUDA_PATH", lib_dir.as_os_str().to_owned()),
    ];
    match server {
        ServerChoice::Direct(address) => vars.push(("FLYT_SERVER", address.into())),
        ServerChoice::ClientManager(socket) => vars.push((locate::SOCKET_ENV, socket.as_os_str().to_owned())),
    }
    if let Some(token) = token {
        vars.push(("FLYT_TOKEN", token.into()));
    }
    if let Some(shm) = shm {
        vars.push(("FLYT_SHM", shm.value().into()));
    }
    vars
}

/// `lib_dir` first, then the user's entries in their order (without `lib_dir` again, so
/// `eval "$(flyt env)"` twice does not grow the list). An unset or empty inherited value adds
/// nothing: an empty entry would mean the current folder.
pub fn library_path(lib_dir: &Path, inherited: Option<&OsStr>) -> OsString {
    use std::os::unix::ffi::OsStrExt;
    let mut path = lib_dir.as_os_str().to_owned();
    let Some(inherited) = inherited.filter(|value| !value.is_empty()) else {
        return path;
    };
    let ours = lib_dir.as_os_str().as_bytes();
    let kept: Vec<&[u8]> = inherited.as_bytes().split(|&byte| byte == b':').filter(|entry| *entry != ours).collect();
    // An inherited value that held only our folder leaves nothing to add.
    if kept.iter().all(|entry| entry.is_empty()) && kept.len() <= 1 {
        return path;
    }
    for entry in kept {
        path.push(":");
        path.push(OsStr::from_bytes(entry));
    }
    path
}

/// `NAME='value'` quoted for POSIX shells, as an `export` line.
pub fn export_line(name: &str, value: &OsStr) -> String {
    let value = value.to_string_lossy();
    format!("export {name}='{}'", value.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_folder_comes_first_and_the_users_entries_follow_in_order() {
        let dir = Path::new("/opt/flyt/lib");
        let path = |inherited: Option<&str>| library_path(dir, inherited.map(OsStr::new)).into_string().unwrap();
        assert_eq!(path(None), "/opt/flyt/lib");
        assert_eq!(path(Some("")), "/opt/flyt/lib");
        assert_eq!(path(Some("/usr/local/cuda/lib64:/x")), "/opt/flyt/lib:/usr/local/cuda/lib64:/x");
        // Run twice through `eval "$(flyt env)"`: no second copy.
        assert_eq!(path(Some("/opt/flyt/lib:/x")), "/opt/flyt/lib:/x");
        assert_eq!(path(Some("/opt/flyt/lib")), "/opt/flyt/lib");
        // The user's own empty entries (the current folder) stay theirs.
        assert_eq!(path(Some("/a::/b")), "/opt/flyt/lib:/a::/b");
    }

    /// Every `unix:` server of a list must be a socket; TCP ones are the shim's to reach.
    #[test]
    fn each_of_several_servers_is_checked() {
        let folder = tempfile::tempdir().unwrap();
        let socket = folder.path().join("a.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let (socket, missing) = (format!("unix:{}", socket.display()), format!("unix:{}", folder.path().join("b.sock").display()));
        let choose = |address: &str| server(Some(address), Path::new("/nonexistent"), Duration::from_secs(1), "test");
        assert!(matches!(choose(&format!("{socket},10.0.0.2:4000")), Ok(ServerChoice::Direct(_))));
        let error = choose(&format!("{socket},{missing}")).unwrap_err().to_string();
        assert!(error.contains("b.sock") && !error.contains("a.sock"), "the missing one is named: {error}");
    }

    #[test]
    fn export_lines_survive_quotes() {
        assert_eq!(export_line("X", OsStr::new("a'b c")), r"export X='a'\''b c'");
    }

    #[test]
    fn a_folder_without_the_driver_library_is_refused_by_name() {
        let folder = tempfile::tempdir().unwrap();
        std::fs::write(folder.path().join("libcudart.so.13"), b"").unwrap();
        let error = lib_dir(Some(folder.path())).unwrap_err().to_string();
        assert!(error.contains("lacks libcuda.so.1") && error.contains("--lib-dir"), "{error}");
        std::fs::write(folder.path().join("libcuda.so.1"), b"").unwrap();
        std::fs::write(folder.path().join("libnvidia-ml.so.1"), b"").unwrap();
        assert_eq!(lib_dir(Some(folder.path())).unwrap(), std::fs::canonicalize(folder.path()).unwrap());
    }
}
