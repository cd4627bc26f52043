//! What a session learns about its GPU once, at the handshake: the name, identity, memory and
//! every device attribute, field by field (never an opaque `cudaDeviceProp`, whose layout changes
//! between CUDA versions). The shim answers `cudaGetDeviceProperties` and
//! `cudaDeviceGetAttribute` from this with no round trip.

use serde::{Deserialize, Serialize};

/// One device as the session sees it: its slice, not the whole card.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub uuid: [u8; 16],
    pub luid: [u8; 8],
    pub luid_device_node_mask: u32,
    /// Bytes of device memory the session may use (its quota, or the card's total).
    pub total_mem: u64,
    /// `(cudaDeviceAttr, value)` pairs; the runtime's and driver's numbering agree.
    pub attributes: Vec<(u32, i32)>,
}

impl DeviceInfo {
    /// The value of a device attribute, if the device reported it.
    pub fn attribute(&self, attribute: u32) -> Option<i32> {
        self.attributes.iter().find(|(id, _)| *id == attribute).map(|(_, value)| *value)
    }

    /// Sets (or adds) an attribute: the server uses it to show a slice's SM count.
    pub fn set_attribute(&mut self, attribute: u32, value: i32) {
        match self.attributes.iter_mut().find(|(id, _)| *id == attribute) {
            Some(entry) => entry.1 = value,
            None => self.attributes.push((attribute, value)),
        }
    }
}

/// What the driver answers for a pair of the session's devices (`cuDeviceGetP2PAttribute`,
/// `cuDeviceCanAccessPeer`), from device `from` to device `to` (indices into the session's devices).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerLink {
    pub from: u32,
    pub to: u32,
    /// `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`: `to`'s memory can be mapped for `from`.
    pub access_supported: i32,
    /// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK`.
    pub performance_rank: i32,
    /// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`.
    pub native_atomics: i32,
    /// `CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED`.
    pub array_access: i32,
}

impl PeerLink {
    /// `CUdevice_P2PAttribute`'s value for this pair, `None` for an attribute it does not know.
    pub fn attribute(&self, attribute: u32) -> Option<i32> {
        match attribute {
            1 => Some(self.performance_rank),
            2 => Some(self.access_supported),
            3 => Some(self.native_atomics),
            4 => Some(self.array_access),
            _ => None,
        }
    }
}

/// What one NVLink of a device reaches, as the session may know it (the host's NVML, read by the
/// server). A device's links are listed by their hardware index, all of them, so the index is
/// NVML's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NvLinkEnd {
    /// Not an active link that carries peer traffic, or one to a GPU outside the session (a
    /// tenant never learns other GPUs' bus ids).
    Inactive,
    /// Another device of the session (an index into its devices).
    Device(u32),
    /// An NVSwitch, or another far end that is no GPU.
    Switch,
}

/// The launch limits and shape of a Hopper (H100) GPU, which every made-up device starts from:
/// the emulated device of the server and the fake devices of the fronts' unit tests.
pub const HOPPER_LIMITS: [(u32, i32); 14] = [
    (attr::MAX_THREADS_PER_BLOCK, 1024),
    (attr::MAX_BLOCK_DIM_X, 1024),
    (attr::MAX_BLOCK_DIM_Y, 1024),
    (attr::MAX_BLOCK_DIM_Z, 64),
    (attr::MAX_GRID_DIM_X, i32::MAX),
    (attr::MAX_GRID_DIM_Y, 65535),
    (attr::MAX_GRID_DIM_Z, 65535),
    (attr::MAX_SHARED_MEMORY_PER_BLOCK, 48 << 10),
    (attr::TOTAL_CONSTANT_MEMORY, 64 << 10),
    (attr::WARP_SIZE, 32),
    (attr::MAX_PITCH, i32::MAX),
    (attr::MAX_REGISTERS_PER_BLOCK, 65536),
    (attr::CLOCK_RATE, 1_980_000),
    (attr::TEXTURE_ALIGNMENT, 512),
];

/// Highest `cudaDeviceAttr` value CUDA 13.0 defines; servers query `1..=LAST_ATTRIBUTE`.
pub const LAST_ATTRIBUTE: u32 = 147;

/// `cudaDeviceAttr` values (identical to `CUdevice_attribute`).
pub mod attr {
    macro_rules! attributes {
        ($($name:ident = $value:literal,)*) => { $(pub const $name: u32 = $value;)* };
    }
    attributes! {
        MAX_THREADS_PER_BLOCK = 1,
        MAX_BLOCK_DIM_X = 2,
        MAX_BLOCK_DIM_Y = 3,
        MAX_BLOCK_DIM_Z = 4,
        MAX_GRID_DIM_X = 5,
        MAX_GRID_DIM_Y = 6,
        MAX_GRID_DIM_Z = 7,
        MAX_SHARED_MEMORY_PER_BLOCK = 8,
        TOTAL_CONSTANT_MEMORY = 9,
        WARP_SIZE = 10,
        MAX_PITCH = 11,
        MAX_REGISTERS_PER_BLOCK = 12,
        CLOCK_RATE = 13,
        TEXTURE_ALIGNMENT = 14,
        MULTIPROCESSOR_COUNT = 16,
        INTEGRATED = 18,
        CAN_MAP_HOST_MEMORY = 19,
        COMPUTE_MODE = 20,
        MAX_TEXTURE_1D_WIDTH = 21,
        MAX_TEXTURE_2D_WIDTH = 22,
        MAX_TEXTURE_2D_HEIGHT = 23,
        MAX_TEXTURE_3D_WIDTH = 24,
        MAX_TEXTURE_3D_HEIGHT = 25,
        MAX_TEXTURE_3D_DEPTH = 26,
        MAX_TEXTURE_2D_LAYERED_WIDTH = 27,
        MAX_TEXTURE_2D_LAYERED_HEIGHT = 28,
        MAX_TEXTURE_2D_LAYERED_LAYERS = 29,
        SURFACE_ALIGNMENT = 30,
        CONCURRENT_KERNELS = 31,
        ECC_ENABLED = 32,
        PCI_BUS_ID = 33,
        PCI_DEVICE_ID = 34,
        TCC_DRIVER = 35,
        MEMORY_CLOCK_RATE = 36,
        GLOBAL_MEMORY_BUS_WIDTH = 37,
        L2_CACHE_SIZE = 38,
        MAX_THREADS_PER_MULTIPROCESSOR = 39,
        ASYNC_ENGINE_COUNT = 40,
        UNIFIED_ADDRESSING = 41,
        MAX_TEXTURE_1D_LAYERED_WIDTH = 42,
        MAX_TEXTURE_1D_LAYERED_LAYERS = 43,
        MAX_TEXTURE_2D_GATHER_WIDTH = 45,
        MAX_TEXTURE_2D_GATHER_HEIGHT = 46,
        MAX_TEXTURE_3D_WIDTH_ALT = 47,
        MAX_TEXTURE_3D_HEIGHT_ALT = 48,
        MAX_TEXTURE_3D_DEPTH_ALT = 49,
        PCI_DOMAIN_ID = 50,
        TEXTURE_PITCH_ALIGNMENT = 51,
        MAX_TEXTURE_CUBEMAP_WIDTH = 52,
        MAX_TEXTURE_CUBEMAP_LAYERED_WIDTH = 53,
        MAX_TEXTURE_CUBEMAP_LAYERED_LAYERS = 54,
        MAX_SURFACE_1D_WIDTH = 55,
        MAX_SURFACE_2D_WIDTH = 56,
        MAX_SURFACE_2D_HEIGHT = 57,
        MAX_SURFACE_3D_WIDTH = 58,
        MAX_SURFACE_3D_HEIGHT = 59,
        MAX_SURFACE_3D_DEPTH = 60,
        MAX_SURFACE_1D_LAYERED_WIDTH = 61,
        MAX_SURFACE_1D_LAYERED_LAYERS = 62,
        MAX_SURFACE_2D_LAYERED_WIDTH = 63,
        MAX_SURFACE_2D_LAYERED_HEIGHT = 64,
        MAX_SURFACE_2D_LAYERED_LAYERS = 65,
        MAX_SURFACE_CUBEMAP_WIDTH = 66,
        MAX_SURFACE_CUBEMAP_LAYERED_WIDTH = 67,
        MAX_SURFACE_CUBEMAP_LAYERED_LAYERS = 68,
        MAX_TEXTURE_1D_LINEAR_WIDTH = 69,
        MAX_TEXTURE_2D_LINEAR_WIDTH = 70,
        MAX_TEXTURE_2D_LINEAR_HEIGHT = 71,
        MAX_TEXTURE_2D_LINEAR_PITCH = 72,
        MAX_TEXTURE_2D_MIPMAPPED_WIDTH = 73,
        MAX_TEXTURE_2D_MIPMAPPED_HEIGHT = 74,
        COMPUTE_CAPABILITY_MAJOR = 75,
        COMPUTE_CAPABILITY_MINOR = 76,
        MAX_TEXTURE_1D_MIPMAPPED_WIDTH = 77,
        STREAM_PRIORITIES_SUPPORTED = 78,
        GLOBAL_L1_CACHE_SUPPORTED = 79,
        LOCAL_L1_CACHE_SUPPORTED = 80,
        MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
        MAX_REGISTERS_PER_MULTIPROCESSOR = 82,
        MANAGED_MEMORY = 83,
        IS_MULTI_GPU_BOARD = 84,
        MULTI_GPU_BOARD_GROUP_ID = 85,
        HOST_NATIVE_ATOMIC_SUPPORTED = 86,
        PAGEABLE_MEMORY_ACCESS = 88,
        CONCURRENT_MANAGED_ACCESS = 89,
        COMPUTE_PREEMPTION_SUPPORTED = 90,
        CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91,
        CAN_USE_STREAM_MEM_OPS_V1 = 92,
        CAN_USE_64_BIT_STREAM_MEM_OPS_V1 = 93,
        CAN_USE_STREAM_WAIT_VALUE_NOR_V1 = 94,
        COOPERATIVE_LAUNCH = 95,
        CAN_FLUSH_REMOTE_WRITES = 98,
        MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
        HOST_REGISTER_SUPPORTED = 99,
        PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES = 100,
        DIRECT_MANAGED_MEM_ACCESS_FROM_HOST = 101,
        MAX_BLOCKS_PER_MULTIPROCESSOR = 106,
        MAX_PERSISTING_L2_CACHE_SIZE = 108,
        MAX_ACCESS_POLICY_WINDOW_SIZE = 109,
        RESERVED_SHARED_MEMORY_PER_BLOCK = 111,
        SPARSE_CUDA_ARRAY_SUPPORTED = 112,
        HOST_REGISTER_READ_ONLY_SUPPORTED = 113,
        TIMELINE_SEMAPHORE_INTEROP_SUPPORTED = 114,
        MEMORY_POOLS_SUPPORTED = 115,
        GPU_DIRECT_RDMA_SUPPORTED = 116,
        GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS = 117,
        GPU_DIRECT_RDMA_WRITES_ORDERING = 118,
        MEMORY_POOL_SUPPORTED_HANDLE_TYPES = 119,
        CLUSTER_LAUNCH = 120,
        DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED = 121,
        CAN_USE_64_BIT_STREAM_MEM_OPS = 122,
        CAN_USE_STREAM_WAIT_VALUE_NOR = 123,
        IPC_EVENT_SUPPORT = 125,
        NUMA_CONFIG = 130,
        NUMA_ID = 131,
        MPS_ENABLED = 133,
        HOST_NUMA_ID = 134,
        MEM_DECOMPRESS_ALGORITHM_MASK = 136,
        GPU_PCI_DEVICE_ID = 139,
        GPU_PCI_SUBSYSTEM_ID = 140,
        HOST_NUMA_MEMORY_POOLS_SUPPORTED = 142,
        HOST_NUMA_MULTINODE_IPC_SUPPORTED = 143,
        HOST_MEMORY_POOLS_SUPPORTED = 144,
        ONLY_PARTIAL_HOST_NATIVE_ATOMIC_SUPPORTED = 147,
    }
}

/// A `CUDA_VISIBLE_DEVICES` list over `count` devices, read as the driver reads it: each entry an
/// ordinal or a UUID (`is_uuid`) that names exactly one device (`names(entry, index)`; a prefix
/// may do), in the order given; the list ends at the first entry that names no device, names one
/// already listed, or could name several. The client (over a session's devices) and the server
/// (over the host's GPUs) differ only in how a UUID is written and matched.
pub fn visible_list(spec: &str, count: usize, is_uuid: impl Fn(&str) -> bool, names: impl Fn(&str, usize) -> bool) -> Vec<usize> {
    let mut visible: Vec<usize> = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        let found = if let Ok(ordinal) = entry.parse::<usize>() {
            (ordinal < count).then_some(ordinal)
        } else if is_uuid(entry) {
            let mut matching = (0..count).filter(|&index| names(entry, index));
            match (matching.next(), matching.next()) {
                (Some(index), None) => Some(index),
                _ => None,
            }
        } else {
            None
        };
        match found {
            Some(index) if !visible.contains(&index) => visible.push(index),
            _ => break,
        }
    }
    visible
}
