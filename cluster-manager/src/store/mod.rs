//! Where the cluster manager keeps what must survive a restart: VM requirements, nodes, GPUs
//! and allocations. The cluster manager holds everything in memory and writes each change
//! through; it reads the store back only at start-up.
//!
//! Two implementations: [`embedded::EmbeddedStore`] (a file under the state directory, the
//! default) and [`mongo::MongoStore`] (`[store] uri = "mongodb://..."`). One test suite
//! ([`suite`]) runs against both.

use std::future::Future;

use flyt_protocol::control::cluster::{AllocationRecord, GpuInfo, GpuRecord, NodeRecord, VmRequirement};
use serde::{Deserialize, Serialize};

pub mod embedded;
pub mod mongo;
#[cfg(test)]
pub mod suite;

/// Why the store failed.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum StoreError {
    /// cannot read the state file {0}: {1}
    Read(String, std::io::Error),
    /// the state file {0} is corrupt ({1}); move it away to start with an empty cluster
    Corrupt(String, String),
    /// cannot write the state file {0}: {1}
    Write(String, std::io::Error),
    /// MongoDB at {0}: {1}
    Mongo(String, String),
}

/// Everything the store holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredState {
    pub vm_required_resources: Vec<VmRequirement>,
    pub nodes: Vec<NodeRecord>,
    pub gpus: Vec<GpuRecord>,
    pub allocations: Vec<AllocationRecord>,
}

/// The cluster manager's persistence. Writes are upserts keyed by the record's id, so
/// repeating one is harmless.
pub trait Store: Send + Sync + 'static {
    /// For logs and `flytctl status`: `embedded:<path>` or `mongodb:<database>`.
    fn describe(&self) -> String;
    /// Everything, sorted by key.
    fn load(&self) -> impl Future<Output = Result<StoredState, StoreError>> + Send;
    /// Adds or replaces the requirement of `vm.vm_ip`.
    fn put_vm(&self, vm: &VmRequirement) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Removes a requirement; `false` when there was none.
    fn remove_vm(&self, vm_ip: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Adds or replaces the node `node.node_id`.
    fn put_node(&self, node: &NodeRecord) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Replaces every GPU of `node_id`.
    fn put_gpus(&self, node_id: &str, gpus: &[GpuInfo]) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Adds or replaces the allocation `allocation.id`.
    fn put_allocation(&self, allocation: &AllocationRecord) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Removes an allocation; `false` when there was none.
    fn remove_allocation(&self, id: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;
}
