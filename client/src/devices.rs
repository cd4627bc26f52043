//! How the session's devices look to the app, whichever front asks: capabilities Flyt cannot
//! serve read 0.

use flyt_protocol::device::{DeviceInfo, attr};

/// Capabilities the GPU has but the app cannot use through Flyt, reported as 0 so that an app
/// that asks takes the path Flyt serves: host memory the GPU reaches directly (mapped and managed
/// memory, unless the session has the shared-memory channel: `WITH_SHARED_MEMORY`; pageable
/// memory, registered memory at its own address, host atomics: the GPU is in another process,
/// often on another machine, and a host address handed to a kernel would name the server's
/// memory), external semaphores, IPC events, host memory pools and GPUDirect RDMA, whose APIs
/// answer not-supported errors. Sparse and deferred-mapping arrays are served
/// (`cuMemMapArrayAsync`): reported as the device reports them.
pub const NOT_THROUGH_FLYT: &[u32] = &[
    attr::CAN_MAP_HOST_MEMORY,
    attr::HOST_NATIVE_ATOMIC_SUPPORTED,
    attr::PAGEABLE_MEMORY_ACCESS,
    attr::CONCURRENT_MANAGED_ACCESS,
    attr::CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
    attr::CAN_FLUSH_REMOTE_WRITES,
    attr::PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
    attr::DIRECT_MANAGED_MEM_ACCESS_FROM_HOST,
    attr::TIMELINE_SEMAPHORE_INTEROP_SUPPORTED,
    attr::GPU_DIRECT_RDMA_SUPPORTED,
    attr::GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
    attr::GPU_DIRECT_RDMA_WRITES_ORDERING,
    attr::IPC_EVENT_SUPPORT,
    attr::HOST_NUMA_MEMORY_POOLS_SUPPORTED,
    attr::HOST_NUMA_MULTINODE_IPC_SUPPORTED,
    attr::HOST_MEMORY_POOLS_SUPPORTED,
    attr::ONLY_PARTIAL_HOST_NATIVE_ATOMIC_SUPPORTED,
];

/// Capabilities among `NOT_THROUGH_FLYT` that the shared-memory channel gives: host memory kernels
/// use in place (pinned blocks the server maps at the app's addresses), and managed memory made of
/// such blocks, which the CPU and the GPU may use at the same time.
///
/// `MANAGED_MEMORY` itself is reported as the device reports it on every transport: `__managed__`
/// variables work over a socket too (through mirrors, `flyt_client::mirrors`), and NVIDIA's
/// runtime from CUDA 13.5 on leaves their host pointers NULL on a device without managed memory
/// (the program then crashes at its first use of one). `cuMemAllocManaged` over a socket alone
/// answers an error with one line.
pub const WITH_SHARED_MEMORY: &[u32] = &[attr::CAN_MAP_HOST_MEMORY, attr::CONCURRENT_MANAGED_ACCESS];

/// Capabilities that are sets of bits, of which Flyt serves some: the device's value masked.
/// Memory pools are shared between processes through a POSIX file descriptor, as physical
/// allocations are (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`), not through fabric or Windows
/// handles.
pub const SERVED_IN_PART: &[(u32, i32)] = &[(attr::MEMORY_POOL_SUPPORTED_HANDLE_TYPES, 0x1)];

/// A device attribute as the app sees it through Flyt: the device's value, or 0 for a capability
/// in `NOT_THROUGH_FLYT` (unless `shared_memory`, the session having the channel, gives it), or
/// the bits Flyt serves of one in `SERVED_IN_PART`; `None` when the device did not report the
/// attribute.
pub fn served_attribute(info: &DeviceInfo, id: u32, shared_memory: bool) -> Option<i32> {
    let value = info.attribute(id)?;
    if let Some((_, mask)) = SERVED_IN_PART.iter().find(|(part, _)| *part == id) {
        return Some(value & mask);
    }
    let served = !NOT_THROUGH_FLYT.contains(&id) || (shared_memory && WITH_SHARED_MEMORY.contains(&id));
    Some(if served { value } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_flyt_does_not_serve_read_zero() {
        let info = DeviceInfo {
            name: "Test GPU".into(),
            uuid: [0; 16],
            luid: [0; 8],
            luid_device_node_mask: 0,
            total_mem: 1 << 30,
            attributes: vec![
                (attr::CAN_MAP_HOST_MEMORY, 1),
                (attr::MEMORY_POOLS_SUPPORTED, 1),
                (attr::HOST_REGISTER_SUPPORTED, 1),
                // POSIX file descriptors and fabric handles.
                (attr::MEMORY_POOL_SUPPORTED_HANDLE_TYPES, 0x9),
            ],
        };
        assert_eq!(served_attribute(&info, attr::CAN_MAP_HOST_MEMORY, false), Some(0));
        assert_eq!(served_attribute(&info, attr::CAN_MAP_HOST_MEMORY, true), Some(1));
        // Stream-ordered allocation is served: reported as the device reports it.
        assert_eq!(served_attribute(&info, attr::MEMORY_POOLS_SUPPORTED, false), Some(1));
        // cudaHostRegister works for copies: reported as the device reports it.
        assert_eq!(served_attribute(&info, attr::HOST_REGISTER_SUPPORTED, false), Some(1));
        assert_eq!(served_attribute(&info, attr::COOPERATIVE_LAUNCH, false), None, "not reported stays unknown");
        // Pools are shared through POSIX file descriptors, not fabric handles.
        assert_eq!(served_attribute(&info, attr::MEMORY_POOL_SUPPORTED_HANDLE_TYPES, false), Some(0x1));
    }
}
