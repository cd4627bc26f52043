//! The default store: one JSON file under the state directory, rewritten whole on every change
//! through a temporary file, fsync and rename (and an fsync of the folder), so a crash leaves
//! the old state or the new, never a mix; a temporary left by a crash is removed at the next
//! open. Control-plane state is small (a few records per node and VM), so whole rewrites are
//! cheap.

use std::path::{Path, PathBuf};

use flyt_daemon_kit::fs::{remove_stale_temporaries, write_atomic};
use flyt_protocol::control::cluster::{AllocationRecord, GpuInfo, GpuRecord, NodeRecord, VmRequirement};
use tokio::sync::Mutex;

use super::{Store, StoreError, StoredState};

/// A store in one file.
pub struct EmbeddedStore {
    path: PathBuf,
    state: Mutex<StoredState>,
}

impl EmbeddedStore {
    /// Opens (or starts) the state file at `path`; its folder is created.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let name = path.display().to_string();
        if let Some(folder) = path.parent() {
            std::fs::create_dir_all(folder).map_err(|error| StoreError::Write(name.clone(), error))?;
        }
        match remove_stale_temporaries(path) {
            Ok(0) => {}
            Ok(count) => tracing::info!(path = %name, count, "removed the temporary file of a write cut short by a crash"),
            Err(error) => return Err(StoreError::Write(name, error)),
        }
        let state = match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|error| StoreError::Corrupt(name, error.to_string()))?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => StoredState::default(),
            Err(error) => return Err(StoreError::Read(name, error)),
        };
        Ok(Self { path: path.to_path_buf(), state: Mutex::new(state) })
    }

    async fn change<T>(&self, edit: impl FnOnce(&mut StoredState) -> T) -> Result<T, StoreError> {
        let mut state = self.state.lock().await;
        let mut next = state.clone();
        let result = edit(&mut next);
        sort(&mut next);
        let bytes = serde_json::to_vec_pretty(&next).map_err(|error| StoreError::Corrupt(self.describe(), error.to_string()))?;
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || write_atomic(&path, &bytes, 0o600))
            .await
            .map_err(|error| StoreError::Write(self.path.display().to_string(), std::io::Error::other(error)))?
            .map_err(|error| StoreError::Write(self.path.display().to_string(), error))?;
        // Memory follows the file only once the file holds the change.
        *state = next;
        Ok(result)
    }
}

/// Stores `record` in `records` in place of the one it replaces (`same`), if any.
fn put<T: Clone>(records: &mut Vec<T>, record: &T, same: impl Fn(&T) -> bool) {
    records.retain(|existing| !same(existing));
    records.push(record.clone());
}

/// Removes the records `matches` picks; whether there were any.
fn remove<T>(records: &mut Vec<T>, matches: impl Fn(&T) -> bool) -> bool {
    let before = records.len();
    records.retain(|existing| !matches(existing));
    before != records.len()
}

fn sort(state: &mut StoredState) {
    state.vm_required_resources.sort_by(|a, b| a.vm_ip.cmp(&b.vm_ip));
    state.nodes.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    state.gpus.sort_by(|a, b| (&a.node_id, a.gpu.index).cmp(&(&b.node_id, b.gpu.index)));
    state.allocations.sort_by(|a, b| a.id.cmp(&b.id));
}

impl Store for EmbeddedStore {
    fn describe(&self) -> String {
        format!("embedded:{}", self.path.display())
    }

    async fn load(&self) -> Result<StoredState, StoreError> {
        let mut state = self.state.lock().await.clone();
        sort(&mut state);
        Ok(state)
    }

    async fn put_vm(&self, vm: &VmRequirement) -> Result<(), StoreError> {
        self.change(|state| put(&mut state.vm_required_resources, vm, |existing| existing.vm_ip == vm.vm_ip)).await
    }

    async fn remove_vm(&self, vm_ip: &str) -> Result<bool, StoreError> {
        self.change(|state| remove(&mut state.vm_required_resources, |existing| existing.vm_ip == vm_ip)).await
    }

    async fn put_node(&self, node: &NodeRecord) -> Result<(), StoreError> {
        self.change(|state| put(&mut state.nodes, node, |existing| existing.node_id == node.node_id)).await
    }

    async fn put_gpus(&self, node_id: &str, gpus: &[GpuInfo]) -> Result<(), StoreError> {
        self.change(|state| {
            state.gpus.retain(|existing| existing.node_id != node_id);
            state.gpus.extend(gpus.iter().map(|gpu| GpuRecord { node_id: node_id.to_string(), gpu: gpu.clone() }));
        })
        .await
    }

    async fn put_allocation(&self, allocation: &AllocationRecord) -> Result<(), StoreError> {
        self.change(|state| put(&mut state.allocations, allocation, |existing| existing.id == allocation.id)).await
    }

    async fn remove_allocation(&self, id: &str) -> Result<bool, StoreError> {
        self.change(|state| remove(&mut state.allocations, |existing| existing.id == id)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn shared_suite_passes() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("state").join("cluster.json");
        let reopen_path = path.clone();
        crate::store::suite::run(EmbeddedStore::open(&path).unwrap(), move || {
            let path = reopen_path.clone();
            async move { EmbeddedStore::open(&path).unwrap() }
        })
        .await;
    }

    #[tokio::test]
    async fn a_write_cut_short_leaves_the_last_state() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("cluster.json");
        let store = EmbeddedStore::open(&path).unwrap();
        let vm =
            VmRequirement { vm_ip: "10.0.0.1".into(), host_ip: "192.0.2.1".into(), compute_units: 10, memory: 512, gpus: 1, spread: false };
        store.put_vm(&vm).await.unwrap();
        drop(store);
        // A process killed in the middle of its next write leaves a half-written temporary.
        let temporary = folder.path().join("cluster.json.tmp99999");
        std::fs::write(&temporary, b"{ \"vm_required_resour").unwrap();
        let reopened = EmbeddedStore::open(&path).unwrap();
        assert_eq!(reopened.load().await.unwrap().vm_required_resources, vec![vm]);
        assert!(!temporary.exists(), "the temporary is cleaned up");
    }

    #[tokio::test]
    async fn a_corrupt_file_is_named() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("cluster.json");
        std::fs::write(&path, "{ not json").unwrap();
        let error = EmbeddedStore::open(&path).err().unwrap().to_string();
        assert!(error.contains("cluster.json") && error.contains("corrupt"), "{error}");
    }
}
