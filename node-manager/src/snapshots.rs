//! Snapshot folders of moving allocations: `<snapshot_dir>/<allocation>/`. The allocation's
//! rpc-server writes a session's snapshot there at a checkpoint; the target's rpc-server reads
//! it from there on this host, or, on another node, from the target node manager's own folder,
//! which it fills by pulling the file from this one in chunks over the control plane
//! ([`SnapshotStore::fetch`] there, [`SnapshotStore::chunk`] here).
//!
//! Only files of valid snapshot names in a valid allocation's folder are ever served or
//! written: a peer names a snapshot, never a path.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use flyt_daemon_kit::{
    auth::ClusterKey,
    rpc::{self, Endpoint},
};
use flyt_protocol::control::{
    auth::ServiceName,
    cluster::ControlError,
    node::{FetchedSnapshot, NodeManagerControlClient, SNAPSHOT_CHUNK_BYTES, SnapshotChunk},
    rpc_server::SNAPSHOT_SUFFIX,
};
use futures::{StreamExt as _, TryStreamExt as _};
use tokio::io::AsyncWriteExt as _;

use crate::servers::valid_allocation_id;

/// Chunk requests in flight at once while fetching: the next chunks travel while one is
/// written (the control plane allows 16 per connection).
const CHUNKS_IN_FLIGHT: usize = 4;
/// Deadline of one chunk request.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether `name` can be a snapshot's name (the rpc-server's: 32 hex digits).
fn valid_snapshot_name(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|byte| byte.is_ascii_hexdigit())
}

fn invalid(message: String) -> ControlError {
    ControlError::Invalid(message)
}

fn io_error(path: &Path, error: &std::io::Error) -> ControlError {
    ControlError::Server(format!("{}: {error}", path.display()))
}

/// This node's snapshot folders.
#[derive(Clone, Debug)]
pub struct SnapshotStore {
    root: PathBuf,
}

impl SnapshotStore {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// The folder of `allocation_id`'s snapshots (not created).
    pub fn folder(&self, allocation_id: &str) -> Result<PathBuf, ControlError> {
        if !valid_allocation_id(allocation_id) {
            return Err(invalid(format!("bad allocation id {allocation_id:?}")));
        }
        Ok(self.root.join(allocation_id))
    }

    /// The folder of `allocation_id`'s snapshots, created (owner-only) when missing.
    pub fn prepare(&self, allocation_id: &str) -> Result<PathBuf, ControlError> {
        let folder = self.folder(allocation_id)?;
        flyt_daemon_kit::fs::create_dir_with_mode(&folder, 0o700).map_err(|error| io_error(&folder, &error))?;
        Ok(folder)
    }

    /// The file of snapshot `name` of `allocation_id`.
    fn file(&self, allocation_id: &str, name: &str) -> Result<PathBuf, ControlError> {
        if !valid_snapshot_name(name) {
            return Err(invalid(format!("{name:?} is not a snapshot name")));
        }
        Ok(self.folder(allocation_id)?.join(format!("{name}{SNAPSHOT_SUFFIX}")))
    }

    /// Bytes `offset..offset + len` of a snapshot (fewer at its end), with its whole length.
    pub async fn chunk(&self, allocation_id: &str, name: &str, offset: u64, len: u64) -> Result<SnapshotChunk, ControlError> {
        let path = self.file(allocation_id, name)?;
        if len > SNAPSHOT_CHUNK_BYTES {
            return Err(invalid(format!("a snapshot chunk is at most {SNAPSHOT_CHUNK_BYTES} bytes")));
        }
        tokio::task::spawn_blocking(move || {
            use std::io::{Read as _, Seek as _};
            let mut file = std::fs::File::open(&path).map_err(|error| io_error(&path, &error))?;
            let total = file.metadata().map_err(|error| io_error(&path, &error))?.len();
            let want = len.min(total.saturating_sub(offset));
            let mut bytes = vec![0u8; usize::try_from(want).unwrap_or(0)];
            file.seek(std::io::SeekFrom::Start(offset)).map_err(|error| io_error(&path, &error))?;
            file.read_exact(&mut bytes).map_err(|error| io_error(&path, &error))?;
            Ok(SnapshotChunk { total, bytes })
        })
        .await
        .unwrap_or_else(|error| Err(ControlError::Server(format!("reading a snapshot chunk failed: {error}"))))
    }

    /// Copies snapshot `name` of `allocation_id` from the node manager at `from` into this
    /// node's folder for the allocation. The file appears under its name only when complete
    /// and of the length the source reported.
    pub async fn fetch(&self, key: &ClusterKey, allocation_id: &str, from: &str, name: &str) -> Result<FetchedSnapshot, ControlError> {
        let started = Instant::now();
        let path = self.file(allocation_id, name)?;
        let unreachable = |reason: String| ControlError::NodeUnreachable { node: from.to_string(), reason };
        let endpoint = Endpoint::parse(from).map_err(|error| unreachable(error.to_string()))?;
        let stream = rpc::connect(&endpoint, key, ServiceName::NodeManager).await.map_err(|error| unreachable(error.to_string()))?;
        let source = NodeManagerControlClient::new(tarpc::client::Config::default(), rpc::transport(stream)).spawn();
        let folder = self.prepare(allocation_id)?;
        let partial = folder.join(format!("{name}.partial"));
        let copied = async {
            let read = |offset: u64| {
                let (source, allocation_id, name) = (source.clone(), allocation_id.to_string(), name.to_string());
                async move {
                    match source.snapshot_chunk(rpc::deadline(CHUNK_TIMEOUT), allocation_id, name, offset, SNAPSHOT_CHUNK_BYTES).await {
                        Ok(chunk) => chunk,
                        Err(error) => Err(unreachable(format!("reading the snapshot at byte {offset}: {error}"))),
                    }
                }
            };
            let first = read(0).await?;
            let total = first.total;
            let mut file = tokio::fs::File::create(&partial).await.map_err(|error| io_error(&partial, &error))?;
            let mut written = 0u64;
            let mut write = async |chunk: SnapshotChunk, offset: u64| {
                let expected = SNAPSHOT_CHUNK_BYTES.min(total - offset);
                if chunk.total != total || chunk.bytes.len() as u64 != expected {
                    return Err(ControlError::Server(format!(
                        "snapshot {name} changed on {from} while it was copied (at byte {offset}: {} of {expected} bytes, length {} then {total})",
                        chunk.bytes.len(),
                        chunk.total
                    )));
                }
                file.write_all(&chunk.bytes).await.map_err(|error| io_error(&partial, &error))?;
                written += expected;
                Ok(())
            };
            write(first, 0).await?;
            let offsets = std::iter::successors(Some(SNAPSHOT_CHUNK_BYTES), |offset| Some(offset + SNAPSHOT_CHUNK_BYTES));
            let mut rest = futures::stream::iter(offsets.take_while(|offset| *offset < total))
                .map(|offset| {
                    let chunk = read(offset);
                    async move { chunk.await.map(|chunk| (chunk, offset)) }
                })
                .buffered(CHUNKS_IN_FLIGHT);
            while let Some((chunk, offset)) = rest.try_next().await? {
                write(chunk, offset).await?;
            }
            drop(rest);
            if written != total {
                return Err(ControlError::Server(format!("snapshot {name}: {written} of {total} bytes arrived")));
            }
            file.sync_all().await.map_err(|error| io_error(&partial, &error))?;
            tokio::fs::rename(&partial, &path).await.map_err(|error| io_error(&path, &error))?;
            Ok(total)
        }
        .await;
        match copied {
            Ok(bytes) => {
                let took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                tracing::info!(
                    allocation = allocation_id,
                    snapshot = name,
                    from,
                    bytes,
                    took_ms = took_us / 1000,
                    "snapshot copied from another node"
                );
                Ok(FetchedSnapshot { dir: folder.display().to_string(), bytes, took_us })
            }
            Err(error) => {
                let _ = tokio::fs::remove_file(&partial).await;
                Err(error)
            }
        }
    }

    /// Removes `allocation_id`'s snapshot folder and what it holds (nothing there is fine).
    pub fn discard(&self, allocation_id: &str) -> Result<(), ControlError> {
        let folder = self.folder(allocation_id)?;
        match std::fs::remove_dir_all(&folder) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(io_error(&folder, &error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use flyt_protocol::control::node::NodeManagerControl as _;

    use super::*;
    use crate::{servers::tests::test_manager, service::NodeService};

    const NAME: &str = "0123456789abcdef0123456789abcdef";

    fn key() -> ClusterKey {
        ClusterKey::from_bytes(b"0123456789abcdef0123").unwrap()
    }

    /// A node manager's control service on loopback, serving `manager`'s snapshots.
    async fn serve(manager: Arc<crate::servers::ServerManager>) -> String {
        let listener = rpc::ControlListener::bind(&Endpoint::Tcp("127.0.0.1:0".into()), 0o600).await.unwrap();
        let address = listener.local_endpoint().to_string();
        let service = NodeService(manager);
        tokio::spawn(rpc::accept_loop(listener, key(), vec![ServiceName::NodeManager], move |_, stream| {
            let service = service.clone();
            async move { rpc::serve_connection(stream, service.serve()).await }
        }));
        address
    }

    /// A file of several chunks and a ragged end crosses from one node manager's folder to
    /// another's intact; what is not a snapshot name or not there is refused.
    #[tokio::test]
    async fn a_snapshot_crosses_between_node_managers_in_chunks() {
        let (source_folder, target_folder) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let source = Arc::new(test_manager(source_folder.path()));
        let target = SnapshotStore::new(target_folder.path().join("snapshots"));
        let contents: Vec<u8> = (0..(2 * SNAPSHOT_CHUNK_BYTES + 12_345)).map(|at| (at * 7 % 251) as u8).collect();
        let folder = source.snapshots().prepare("alloc-9").unwrap();
        std::fs::write(folder.join(format!("{NAME}{SNAPSHOT_SUFFIX}")), &contents).unwrap();
        let address = serve(source.clone()).await;

        let fetched = target.fetch(&key(), "alloc-9", &address, NAME).await.unwrap();
        assert_eq!(fetched.bytes, contents.len() as u64);
        let copy = std::fs::read(Path::new(&fetched.dir).join(format!("{NAME}{SNAPSHOT_SUFFIX}"))).unwrap();
        assert!(copy == contents, "the copy differs from the source");
        assert_eq!(std::fs::read_dir(&fetched.dir).unwrap().count(), 1, "no partial file is left");

        let missing = target.fetch(&key(), "alloc-9", &address, &NAME.replace('0', "f")).await.unwrap_err().to_string();
        assert!(missing.contains("No such file"), "{missing}");
        let escape = target.fetch(&key(), "alloc-9", &address, "../../etc/passwd").await.unwrap_err().to_string();
        assert!(escape.contains("not a snapshot name"), "{escape}");
        let escape = source.snapshots().chunk("../x", NAME, 0, 1).await.unwrap_err().to_string();
        assert!(escape.contains("bad allocation id"), "{escape}");
        let nobody = target.fetch(&key(), "alloc-9", "127.0.0.1:1", NAME).await.unwrap_err().to_string();
        assert!(nobody.contains("127.0.0.1:1 did not answer"), "{nobody}");

        source.snapshots().discard("alloc-9").unwrap();
        assert!(!folder.exists());
        source.snapshots().discard("alloc-9").unwrap();
    }
}
