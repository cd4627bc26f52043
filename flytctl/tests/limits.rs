//! flytctl against a cluster manager that hangs, and without its key: bounded, with hints that
//! name flytctl's own flags.

#[cfg(test)]
mod tests {
    use std::{
        os::unix::net::UnixListener,
        path::Path,
        process::Command,
        time::{Duration, Instant},
    };

    fn flytctl(args: &[&str], socket: &Path, key: &Path) -> (i32, String, Duration) {
        let started = Instant::now();
        let output = Command::new(env!("CARGO_BIN_EXE_flytctl"))
            .args(args)
            .arg("--socket")
            .arg(socket)
            .arg("--cluster-key-file")
            .arg(key)
            .env_remove("FLYTCTL_TIMEOUT_SECONDS")
            .output()
            .unwrap();
        (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned(), started.elapsed())
    }

    #[test]
    fn the_timeout_covers_connection_and_handshake() {
        let folder = tempfile::tempdir().unwrap();
        let key = folder.path().join("cluster.key");
        std::fs::write(&key, "test-cluster-key-0123456789abcdef").unwrap();
        // Accepts connections and never says a word, as a stopped (SIGSTOP) cluster manager's
        // socket does: the kernel completes the connection, nobody sends the challenge.
        let socket = folder.path().join("admin.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let held = std::thread::spawn(move || {
            let mut connections = Vec::new();
            if let Ok((connection, _)) = listener.accept() {
                connections.push(connection);
                std::thread::sleep(Duration::from_secs(2));
            }
        });
        let (code, stderr, took) = flytctl(&["status", "--timeout-seconds", "1"], &socket, &key);
        assert_eq!(code, 3, "{stderr}");
        assert!(stderr.contains("did not answer within 1 s") && stderr.contains("--timeout-seconds"), "{stderr}");
        assert!(took < Duration::from_millis(2500), "flytctl took {took:?} with --timeout-seconds 1");
        held.join().unwrap();
    }

    #[test]
    fn a_missing_key_names_flytctls_own_flag_and_variable() {
        let folder = tempfile::tempdir().unwrap();
        let (code, stderr, _) = flytctl(&["status"], &folder.path().join("admin.sock"), &folder.path().join("no.key"));
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("--cluster-key-file") && stderr.contains("FLYTCTL_CLUSTER_KEY_FILE"), "{stderr}");
        assert!(!stderr.contains("cluster_key_file"), "a config key flytctl does not have: {stderr}");
    }
}
