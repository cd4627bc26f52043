//! One behaviour, two stores: every [`Store`] must pass [`run`].

use std::future::Future;

use flyt_protocol::{
    control::cluster::{
        AllocationRecord, AllocationState, GpuInfo, GpuRecord, MovePhase, NodeHealth, NodeRecord, PendingMove, SliceSize, VmRequirement,
    },
    handshake::ClientIdentity,
};

use super::Store;

fn vm(ip: &str, units: u32) -> VmRequirement {
    VmRequirement { vm_ip: ip.into(), host_ip: "192.0.2.1".into(), compute_units: units, memory: 2048, gpus: 1, spread: false }
}

fn gpu(index: u32) -> GpuInfo {
    GpuInfo {
        index,
        uuid: format!("GPU-{index}"),
        name: "Emulated".into(),
        memory_bytes: 16 << 30,
        sm_count: 80,
        emulated: true,
        links: Vec::new(),
    }
}

fn node(id: &str) -> NodeRecord {
    NodeRecord {
        node_id: id.into(),
        host_ip: "192.0.2.1".into(),
        boot_id: "boot".into(),
        control_address: "127.0.0.1:7071".into(),
        health: NodeHealth::Up,
        drained: false,
        registered_at: 1,
    }
}

fn allocation(id: &str) -> AllocationRecord {
    AllocationRecord {
        id: id.into(),
        vm_ip: "10.0.0.1".into(),
        node_id: "node-a".into(),
        gpu: 0,
        extra_gpus: vec![1],
        compute_units: 20,
        memory: 1024,
        sm_percentage: 25,
        state: AllocationState::Running,
        addresses: vec!["127.0.0.1:4000".into()],
        pid: 4242,
        clients: vec![ClientIdentity { hostname: "vm".into(), pid: 7, program: "app".into(), boot_id: "b".into() }],
        sessions: 1,
        created_at: 100,
        idle_since: None,
        pending_resize: None,
        metrics: Some("127.0.0.1:9464".into()),
        pending_move: None,
        further: Vec::new(),
    }
}

/// Exercises every operation on `store` (which must start empty), then checks that `reopen`
/// (a new handle on the same data) sees the final state.
pub async fn run<S: Store, F, Fut>(store: S, reopen: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    assert_eq!(store.load().await.unwrap(), Default::default(), "a new store starts empty");

    store.put_vm(&vm("10.0.0.2", 10)).await.unwrap();
    store.put_vm(&vm("10.0.0.1", 20)).await.unwrap();
    store.put_vm(&vm("10.0.0.2", 30)).await.unwrap();
    let vms = store.load().await.unwrap().vm_required_resources;
    assert_eq!(vms, vec![vm("10.0.0.1", 20), vm("10.0.0.2", 30)], "upsert replaces, load sorts");
    assert!(store.remove_vm("10.0.0.1").await.unwrap());
    assert!(!store.remove_vm("10.0.0.1").await.unwrap(), "removing twice reports absence");

    store.put_node(&node("node-b")).await.unwrap();
    store.put_node(&node("node-a")).await.unwrap();
    let mut drained = node("node-a");
    drained.drained = true;
    drained.health = NodeHealth::Down;
    store.put_node(&drained).await.unwrap();
    assert_eq!(store.load().await.unwrap().nodes, vec![drained.clone(), node("node-b")]);

    store.put_gpus("node-a", &[gpu(0), gpu(1), gpu(2)]).await.unwrap();
    store.put_gpus("node-b", &[gpu(0)]).await.unwrap();
    store.put_gpus("node-a", &[gpu(1), gpu(0)]).await.unwrap();
    let gpus = store.load().await.unwrap().gpus;
    let expected = vec![
        GpuRecord { node_id: "node-a".into(), gpu: gpu(0) },
        GpuRecord { node_id: "node-a".into(), gpu: gpu(1) },
        GpuRecord { node_id: "node-b".into(), gpu: gpu(0) },
    ];
    assert_eq!(gpus, expected, "put_gpus replaces a node's GPUs and leaves other nodes' alone");

    store.put_allocation(&allocation("alloc-2")).await.unwrap();
    store.put_allocation(&allocation("alloc-1")).await.unwrap();
    let mut starting = allocation("alloc-2");
    starting.state = AllocationState::Starting;
    starting.pid = 0;
    starting.addresses.clear();
    store.put_allocation(&starting).await.unwrap();
    assert_eq!(store.load().await.unwrap().allocations[1], starting, "a placement under way is stored as such");
    let mut resized = allocation("alloc-2");
    resized.compute_units = 40;
    resized.idle_since = Some(500);
    resized.clients.clear();
    resized.pending_resize = Some(SliceSize { compute_units: 60, memory: 4096, sm_percentage: 75 });
    // A move under way is stored as such too (a restart rolls it back or finishes it).
    resized.pending_move = Some(PendingMove {
        from_node: "node-a".into(),
        from_gpu: 0,
        to_node: "node-b".into(),
        to_gpu: 1,
        to_sm_percentage: 50,
        phase: MovePhase::Switching,
        from_extra_gpus: Vec::new(),
        to_extra_gpus: vec![2],
    });
    store.put_allocation(&resized).await.unwrap();
    assert_eq!(store.load().await.unwrap().allocations, vec![allocation("alloc-1"), resized.clone()]);
    assert!(store.remove_allocation("alloc-1").await.unwrap());
    assert!(!store.remove_allocation("alloc-1").await.unwrap());

    let final_state = store.load().await.unwrap();
    drop(store);
    let reopened = reopen().await;
    assert_eq!(reopened.load().await.unwrap(), final_state, "a new handle sees everything written");
    assert_eq!(final_state.allocations, vec![resized]);
    assert_eq!(final_state.vm_required_resources, vec![vm("10.0.0.2", 30)]);
}
