//! The module image cache: images clients sent, kept on disk under their SHA-256 so that a later
//! session (of this server, or of another server given the same folder) loads a large image
//! without its bytes crossing the network again. Every worker process opens the same folder;
//! files are written whole under a temporary name and renamed, so a reader never sees half an
//! image, and read images are hashed again, so a damaged file is a miss rather than wrong code.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use flyt_protocol::ops::image_digest;

#[derive(Debug)]
pub struct ImageCache {
    dir: PathBuf,
    /// Bytes the folder may hold; the least recently used images go first.
    limit: u64,
    /// The thread that files images handed to [`ImageCache::put_later`], started on first use.
    writer: OnceLock<SyncSender<Arc<Vec<u8>>>>,
}

/// Images waiting to be filed; more are dropped (only a later transfer is lost).
const WRITE_QUEUE: usize = 4;

fn hex(digest: &[u8; 32]) -> String {
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl ImageCache {
    /// Opens (creating, owner-only) the cache folder.
    pub fn open(dir: &Path, limit: u64) -> std::io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        let mode = std::fs::metadata(dir)?.permissions().mode();
        if mode & 0o022 != 0 {
            return Err(std::io::Error::other(format!(
                "image cache {} is writable by others (mode {:o}): another user could plant images",
                dir.display(),
                mode & 0o777
            )));
        }
        Ok(Self { dir: dir.to_owned(), limit, writer: OnceLock::new() })
    }

    fn path(&self, digest: &[u8; 32]) -> PathBuf {
        self.dir.join(format!("{}.image", hex(digest)))
    }

    /// The image cached under `digest`, if there is one and its bytes still hash to it.
    pub fn get(&self, digest: &[u8; 32]) -> Option<Vec<u8>> {
        let path = self.path(digest);
        let bytes = std::fs::read(&path).ok()?;
        if image_digest(&bytes) != *digest {
            tracing::warn!(path = %path.display(), "cached image does not match its digest; removed");
            let _ = std::fs::remove_file(&path);
            return None;
        }
        // Touched, so eviction keeps what is in use.
        let _ = std::fs::File::options().append(true).open(&path).and_then(|file| file.set_modified(SystemTime::now()));
        Some(bytes)
    }

    /// Files `image` under its own digest (computed here, whatever the client claimed), then
    /// trims the folder to its limit. Failures only cost a later session the transfer.
    pub fn put(&self, image: &[u8]) {
        let digest = image_digest(image);
        let path = self.path(&digest);
        if path.exists() {
            return;
        }
        let temporary = self.dir.join(format!(".{}.{}.partial", hex(&digest), std::process::id()));
        let written =
            std::fs::File::create(&temporary).and_then(|mut file| file.write_all(image)).and_then(|()| std::fs::rename(&temporary, &path));
        match written {
            Ok(()) => {
                tracing::debug!(bytes = image.len(), digest = %hex(&digest), "image cached");
                self.trim();
            }
            Err(error) => {
                let _ = std::fs::remove_file(&temporary);
                tracing::warn!(%error, dir = %self.dir.display(), "could not cache a module image");
            }
        }
    }

    /// Files `image` on a background thread, so that hashing and writing a large image never
    /// delays a session; when images arrive faster than they can be written, the excess is not
    /// cached.
    pub fn put_later(self: &Arc<Self>, image: Arc<Vec<u8>>) {
        let writer = self.writer.get_or_init(|| {
            let (sender, receiver) = std::sync::mpsc::sync_channel::<Arc<Vec<u8>>>(WRITE_QUEUE);
            let cache = Arc::downgrade(self);
            let spawned = std::thread::Builder::new().name("flyt-image-cache".into()).spawn(move || {
                while let Ok(image) = receiver.recv() {
                    let Some(cache) = cache.upgrade() else { break };
                    cache.put(&image);
                }
            });
            if let Err(error) = spawned {
                tracing::warn!(%error, "no image cache writer thread");
            }
            sender
        });
        let _ = writer.try_send(image);
    }

    /// Removes the least recently used images until the folder fits its limit.
    fn trim(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        let mut images: Vec<(SystemTime, u64, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().ends_with(".image"))
            .filter_map(|entry| {
                let metadata = entry.metadata().ok()?;
                Some((metadata.modified().ok()?, metadata.len(), entry.path()))
            })
            .collect();
        let mut total: u64 = images.iter().map(|(_, len, _)| len).sum();
        images.sort();
        for (_, len, path) in images {
            if total <= self.limit {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("flyt-image-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn images_come_back_by_digest_and_damaged_ones_are_misses() {
        let dir = scratch("get");
        let cache = ImageCache::open(&dir, 1 << 20).unwrap();
        let image = vec![5u8; 1000];
        let digest = image_digest(&image);
        assert_eq!(cache.get(&digest), None);
        cache.put(&image);
        assert_eq!(cache.get(&digest).as_deref(), Some(&image[..]));
        // A flipped byte on disk: never handed out, and removed.
        let path = cache.path(&digest);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[10] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(cache.get(&digest), None);
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_least_recently_used_images_leave_first() {
        let dir = scratch("trim");
        let cache = ImageCache::open(&dir, 2500).unwrap();
        let images: Vec<Vec<u8>> = (0..3u8).map(|n| vec![n; 1000]).collect();
        cache.put(&images[0]);
        cache.put(&images[1]);
        // Used since: the first image is now the most recent.
        let past = SystemTime::now() - std::time::Duration::from_secs(60);
        std::fs::File::options().append(true).open(cache.path(&image_digest(&images[1]))).unwrap().set_modified(past).unwrap();
        cache.put(&images[2]);
        assert!(cache.get(&image_digest(&images[0])).is_some());
        assert!(cache.get(&image_digest(&images[1])).is_none(), "the least recently used image is evicted");
        assert!(cache.get(&image_digest(&images[2])).is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_folder_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("mode");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = ImageCache::open(&dir, 1 << 20).expect_err("refused");
        assert!(error.to_string().contains("writable by others"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
