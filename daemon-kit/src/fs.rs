//! Crash-safe state files: a reader sees the old contents or the new, never a torn write.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
};

/// Writes `bytes` to `path` through a temporary file in the same folder: write, fsync, rename,
/// fsync the folder. `mode` sets the file's permissions (state may hold addresses and pids, not
/// secrets, but there is no reason for others to write it).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let folder = path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let file_name = path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "state path has no file name"))?;
    // One temporary per call: two writers of one file in one process never share one.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut temporary_name = file_name.to_os_string();
    temporary_name.push(format!(".tmp{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let temporary = folder.join(temporary_name);
    let result = (|| {
        let mut file = OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temporary, path)?;
        File::open(folder)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    result
}

/// Removes what [`write_atomic`] leaves of `path` when the process dies in the middle of a
/// write: temporary files that never replaced it. Returns how many were removed.
pub fn remove_stale_temporaries(path: &Path) -> io::Result<usize> {
    let folder = path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let Some(file_name) = path.file_name().and_then(|name| name.to_str()) else { return Ok(0) };
    let prefix = format!("{file_name}.tmp");
    let mut removed = 0;
    for entry in fs::read_dir(folder)? {
        let entry = entry?;
        if entry.file_name().to_str().is_some_and(|name| name.starts_with(&prefix)) {
            fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Creates `path` and its parents with `mode` on the last one (e.g. 0o700 for a state folder).
pub fn create_dir_with_mode(path: &Path, mode: u32) -> io::Result<()> {
    fs::create_dir_all(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_contents_and_leaves_no_temporary() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("state.json");
        write_atomic(&path, b"one", 0o600).unwrap();
        write_atomic(&path, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::read_dir(folder.path()).unwrap().count(), 1);
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn concurrent_writers_of_one_file_do_not_collide() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("state.json");
        let writers: Vec<_> = (0..8)
            .map(|index| {
                let path = path.clone();
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        write_atomic(&path, format!("writer {index}").as_bytes(), 0o600).unwrap();
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        assert!(String::from_utf8(fs::read(&path).unwrap()).unwrap().starts_with("writer "));
        assert_eq!(fs::read_dir(folder.path()).unwrap().count(), 1, "no temporary left");
    }

    #[test]
    fn a_write_cut_short_leaves_the_old_contents_and_a_removable_temporary() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("state.json");
        write_atomic(&path, b"old", 0o600).unwrap();
        // What a process killed between writing its temporary and the rename leaves behind.
        fs::write(folder.path().join("state.json.tmp4242"), b"half a ne").unwrap();
        fs::write(folder.path().join("other.json.tmp1"), b"not ours").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(remove_stale_temporaries(&path).unwrap(), 1);
        assert!(folder.path().join("other.json.tmp1").exists());
        assert_eq!(fs::read(&path).unwrap(), b"old");
    }
}
