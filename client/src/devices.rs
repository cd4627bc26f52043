//! How the session's devices look to the app, whichever front asks: capabilities Flyt cannot
//! serve read 0.

use std::cell::Cell;

use flyt_protocol::device::{DeviceInfo, attr};

/// The server's index of the app's device 0, which threads that never chose a device use.
static DEFAULT_DEVICE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

thread_local! {
    /// The session device (the server's index) the calling thread's requests run on, once set.
    static THREAD_DEVICE: Cell<Option<u32>> = const { Cell::new(None) };
}

/// Sets the device of threads that never chose one (the app's device 0).
pub fn set_default_device(server_index: u32) {
    DEFAULT_DEVICE.store(server_index, std::sync::atomic::Ordering::Relaxed);
}

/// Sets the session device (the server's index) the calling thread's requests run on: the driver
/// front sets it whenever the thread's current context changes. The connection tells the server
/// before the thread's next request when it differs from the last one sent (`req::SetDevice`).
pub fn set_thread_device(server_index: u32) {
    let _ = THREAD_DEVICE.try_with(|device| device.set(Some(server_index)));
}

/// Runs `call` with the calling thread's requests made on session device `device` (the server's
/// index), then puts the thread's device back as it was.
pub fn with_thread_device<T>(device: u32, call: impl FnOnce() -> T) -> T {
    let before = THREAD_DEVICE.try_with(|current| current.replace(Some(device))).ok().flatten();
    let result = call();
    let _ = THREAD_DEVICE.try_with(|current| current.set(before));
    result
}

/// The calling thread's session device (the server's index): the app's device 0 for a thread
/// that never chose one.
pub fn thread_device() -> u32 {
    THREAD_DEVICE.try_with(Cell::get).ok().flatten().unwrap_or_else(|| DEFAULT_DEVICE.load(std::sync::atomic::Ordering::Relaxed))
}

/// A device's UUID as `nvidia-smi -L` and `CUDA_VISIBLE_DEVICES` write it.
pub fn uuid_text(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

/// `CUDA_VISIBLE_DEVICES` applied to the session's devices as the driver applies it to a
/// machine's: a comma-separated list of indices or UUIDs (`GPU-` and a prefix naming one device),
/// in the order given; the list ends at the first entry that names no device (or one already
/// named). The result: server indices, in the app's order. Unset: every device, in order.
pub fn visible_devices(spec: Option<&str>, devices: &[DeviceInfo]) -> Vec<u32> {
    let Some(spec) = spec else {
        return (0..devices.len() as u32).collect();
    };
    let is_uuid = |entry: &str| entry.len() > 4 && entry.get(..4).is_some_and(|prefix| prefix.eq_ignore_ascii_case("GPU-"));
    let names = |entry: &str, index: usize| uuid_text(&devices[index].uuid).to_ascii_lowercase().starts_with(&entry.to_ascii_lowercase());
    flyt_protocol::device::visible_list(spec, devices.len(), is_uuid, names)
        .into_iter()
        .filter_map(|index| u32::try_from(index).ok())
        .collect()
}

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
/// gives mirrored memory (`flyt_client::managed`), coherent at launches, copies and
/// synchronizations only: `CONCURRENT_MANAGED_ACCESS` reads 0 there, so programs synchronize
/// before the host touches it.
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

    fn device(uuid: [u8; 16]) -> DeviceInfo {
        DeviceInfo { name: "GPU".into(), uuid, luid: [0; 8], luid_device_node_mask: 0, total_mem: 1, attributes: Vec::new() }
    }

    #[test]
    fn cuda_visible_devices_selects_as_the_driver_does() {
        let devices = [device([0xab; 16]), device([0x12; 16]), device([0xac; 16])];
        assert_eq!(uuid_text(&[0x12; 16]), "GPU-12121212-1212-1212-1212-121212121212");
        assert_eq!(visible_devices(None, &devices), vec![0, 1, 2]);
        assert_eq!(visible_devices(Some("2,0"), &devices), vec![2, 0]);
        assert_eq!(visible_devices(Some("1,7,0"), &devices), vec![1], "the list ends at a device that does not exist");
        assert_eq!(visible_devices(Some("0,0,1"), &devices), vec![0], "or at one already named");
        assert_eq!(visible_devices(Some("GPU-1212,0"), &devices), vec![1, 0], "a UUID prefix naming one device");
        assert_eq!(visible_devices(Some("GPU-a"), &devices), Vec::<u32>::new(), "a prefix naming two names none");
        assert_eq!(visible_devices(Some("GPU-ABABABAB"), &devices), vec![0], "case does not matter");
        assert_eq!(visible_devices(Some(""), &devices), Vec::<u32>::new());
        assert_eq!(visible_devices(Some("-1"), &devices), Vec::<u32>::new());
    }

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
