//! The MongoDB store, through the official driver. Collections: `vm_required_resources`
//! (Flyt's: `vm_ip`, `host_ip`, `compute_units`, `memory` in MiB), `nodes`, `gpus`,
//! `allocations`; each with a unique index on its key.

use std::time::Duration;

use flyt_protocol::control::cluster::{AllocationRecord, GpuInfo, GpuRecord, NodeRecord, VmRequirement};
use futures::TryStreamExt;
use mongodb::{
    Client, Collection, IndexModel,
    bson::{Document, doc},
    options::{ClientOptions, IndexOptions},
};
use serde::{Serialize, de::DeserializeOwned};

use super::{Store, StoreError, StoredState};

/// How long the driver looks for a server before a call fails (it would wait 30 s by default).
const SERVER_SELECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// A store in a MongoDB database.
pub struct MongoStore {
    database_name: String,
    vms: Collection<VmRequirement>,
    nodes: Collection<NodeRecord>,
    gpus: Collection<GpuRecord>,
    allocations: Collection<AllocationRecord>,
}

fn mongo_error(database: &str) -> impl Fn(mongodb::error::Error) -> StoreError + '_ {
    move |error| StoreError::Mongo(database.to_string(), error.to_string())
}

impl MongoStore {
    /// Connects to `uri`, uses `database`, and makes sure the unique indexes exist.
    pub async fn connect(uri: &str, database: &str) -> Result<Self, StoreError> {
        let fail = mongo_error(database);
        let mut options = ClientOptions::parse(uri).await.map_err(&fail)?;
        options.server_selection_timeout = Some(SERVER_SELECTION_TIMEOUT);
        options.connect_timeout = Some(SERVER_SELECTION_TIMEOUT);
        options.app_name = Some("flyt-cluster-manager".to_string());
        let client = Client::with_options(options).map_err(&fail)?;
        let db = client.database(database);
        let store = Self {
            database_name: database.to_string(),
            vms: db.collection("vm_required_resources"),
            nodes: db.collection("nodes"),
            gpus: db.collection("gpus"),
            allocations: db.collection("allocations"),
        };
        let unique = |keys: Document| IndexModel::builder().keys(keys).options(IndexOptions::builder().unique(true).build()).build();
        store.vms.create_index(unique(doc! { "vm_ip": 1 })).await.map_err(&fail)?;
        store.nodes.create_index(unique(doc! { "node_id": 1 })).await.map_err(&fail)?;
        store.gpus.create_index(unique(doc! { "node_id": 1, "gpu.index": 1 })).await.map_err(&fail)?;
        store.allocations.create_index(unique(doc! { "id": 1 })).await.map_err(&fail)?;
        Ok(store)
    }

    async fn all<T: DeserializeOwned + Send + Sync>(&self, collection: &Collection<T>, sort: Document) -> Result<Vec<T>, StoreError> {
        let fail = mongo_error(&self.database_name);
        collection.find(doc! {}).sort(sort).await.map_err(&fail)?.try_collect().await.map_err(&fail)
    }

    async fn upsert<T: Serialize + Send + Sync>(&self, collection: &Collection<T>, filter: Document, record: &T) -> Result<(), StoreError> {
        collection.replace_one(filter, record).upsert(true).await.map_err(mongo_error(&self.database_name))?;
        Ok(())
    }
}

impl Store for MongoStore {
    fn describe(&self) -> String {
        format!("mongodb:{}", self.database_name)
    }

    async fn load(&self) -> Result<StoredState, StoreError> {
        Ok(StoredState {
            vm_required_resources: self.all(&self.vms, doc! { "vm_ip": 1 }).await?,
            nodes: self.all(&self.nodes, doc! { "node_id": 1 }).await?,
            gpus: self.all(&self.gpus, doc! { "node_id": 1, "gpu.index": 1 }).await?,
            allocations: self.all(&self.allocations, doc! { "id": 1 }).await?,
        })
    }

    async fn put_vm(&self, vm: &VmRequirement) -> Result<(), StoreError> {
        self.upsert(&self.vms, doc! { "vm_ip": &vm.vm_ip }, vm).await
    }

    async fn remove_vm(&self, vm_ip: &str) -> Result<bool, StoreError> {
        let result = self.vms.delete_one(doc! { "vm_ip": vm_ip }).await.map_err(mongo_error(&self.database_name))?;
        Ok(result.deleted_count > 0)
    }

    async fn put_node(&self, node: &NodeRecord) -> Result<(), StoreError> {
        self.upsert(&self.nodes, doc! { "node_id": &node.node_id }, node).await
    }

    async fn put_gpus(&self, node_id: &str, gpus: &[GpuInfo]) -> Result<(), StoreError> {
        let fail = mongo_error(&self.database_name);
        // Upsert the current GPUs, then drop the ones that disappeared: never a moment with none.
        let mut indexes = Vec::with_capacity(gpus.len());
        for gpu in gpus {
            let record = GpuRecord { node_id: node_id.to_string(), gpu: gpu.clone() };
            self.upsert(&self.gpus, doc! { "node_id": node_id, "gpu.index": i64::from(gpu.index) }, &record).await?;
            indexes.push(i64::from(gpu.index));
        }
        self.gpus.delete_many(doc! { "node_id": node_id, "gpu.index": { "$nin": indexes } }).await.map_err(&fail)?;
        Ok(())
    }

    async fn put_allocation(&self, allocation: &AllocationRecord) -> Result<(), StoreError> {
        self.upsert(&self.allocations, doc! { "id": &allocation.id }, allocation).await
    }

    async fn remove_allocation(&self, id: &str) -> Result<bool, StoreError> {
        let result = self.allocations.delete_one(doc! { "id": id }).await.map_err(mongo_error(&self.database_name))?;
        Ok(result.deleted_count > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the shared suite against `FLYT_TEST_MONGODB_URI` (`.ci/mongo-test-server` starts one),
    /// in a database of its own; skipped with a notice when the variable is unset.
    #[tokio::test]
    async fn shared_suite_passes_against_mongodb() {
        let Ok(uri) = std::env::var("FLYT_TEST_MONGODB_URI") else {
            eprintln!("SKIPPED: FLYT_TEST_MONGODB_URI is unset; run `.ci/mongo-test-server` and export the URI it prints");
            return;
        };
        let database = format!("flyt_test_{}_{}", std::process::id(), flyt_daemon_kit::host::unix_now());
        let store = MongoStore::connect(&uri, &database).await.expect("connect to the test MongoDB");
        let reopen_uri = uri.clone();
        let reopen_database = database.clone();
        crate::store::suite::run(store, move || {
            let uri = reopen_uri.clone();
            let database = reopen_database.clone();
            async move { MongoStore::connect(&uri, &database).await.expect("reconnect") }
        })
        .await;
    }
}
