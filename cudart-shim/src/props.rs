//! The CUDA 13 layouts of the structs the runtime fills for the app, and how the runtime fills
//! `cudaDeviceProp` from the driver's device attributes, as NVIDIA's runtime does (Flyt's driver
//! answers them in the process). Offsets are pinned by tests against the CUDA 13.0 headers.

#![allow(non_camel_case_types, non_snake_case, reason = "C structs with the CUDA headers' field names")]

use std::ffi::{c_char, c_int, c_long, c_uint, c_void};

use flyt_protocol::device::attr;

/// `struct cudaDeviceProp` of CUDA 13.0 (1008 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct cudaDeviceProp {
    pub name: [c_char; 256],
    pub uuid: [c_char; 16],
    pub luid: [c_char; 8],
    pub luidDeviceNodeMask: c_uint,
    pub totalGlobalMem: usize,
    pub sharedMemPerBlock: usize,
    pub regsPerBlock: c_int,
    pub warpSize: c_int,
    pub memPitch: usize,
    pub maxThreadsPerBlock: c_int,
    pub maxThreadsDim: [c_int; 3],
    pub maxGridSize: [c_int; 3],
    pub totalConstMem: usize,
    pub major: c_int,
    pub minor: c_int,
    pub textureAlignment: usize,
    pub texturePitchAlignment: usize,
    pub multiProcessorCount: c_int,
    pub integrated: c_int,
    pub canMapHostMemory: c_int,
    pub maxTexture1D: c_int,
    pub maxTexture1DMipmap: c_int,
    pub maxTexture2D: [c_int; 2],
    pub maxTexture2DMipmap: [c_int; 2],
    pub maxTexture2DLinear: [c_int; 3],
    pub maxTexture2DGather: [c_int; 2],
    pub maxTexture3D: [c_int; 3],
    pub maxTexture3DAlt: [c_int; 3],
    pub maxTextureCubemap: c_int,
    pub maxTexture1DLayered: [c_int; 2],
    pub maxTexture2DLayered: [c_int; 3],
    pub maxTextureCubemapLayered: [c_int; 2],
    pub maxSurface1D: c_int,
    pub maxSurface2D: [c_int; 2],
    pub maxSurface3D: [c_int; 3],
    pub maxSurface1DLayered: [c_int; 2],
    pub maxSurface2DLayered: [c_int; 3],
    pub maxSurfaceCubemap: c_int,
    pub maxSurfaceCubemapLayered: [c_int; 2],
    pub surfaceAlignment: usize,
    pub concurrentKernels: c_int,
    pub ECCEnabled: c_int,
    pub pciBusID: c_int,
    pub pciDeviceID: c_int,
    pub pciDomainID: c_int,
    pub tccDriver: c_int,
    pub asyncEngineCount: c_int,
    pub unifiedAddressing: c_int,
    pub memoryBusWidth: c_int,
    pub l2CacheSize: c_int,
    pub persistingL2CacheMaxSize: c_int,
    pub maxThreadsPerMultiProcessor: c_int,
    pub streamPrioritiesSupported: c_int,
    pub globalL1CacheSupported: c_int,
    pub localL1CacheSupported: c_int,
    pub sharedMemPerMultiprocessor: usize,
    pub regsPerMultiprocessor: c_int,
    pub managedMemory: c_int,
    pub isMultiGpuBoard: c_int,
    pub multiGpuBoardGroupID: c_int,
    pub hostNativeAtomicSupported: c_int,
    pub pageableMemoryAccess: c_int,
    pub concurrentManagedAccess: c_int,
    pub computePreemptionSupported: c_int,
    pub canUseHostPointerForRegisteredMem: c_int,
    pub cooperativeLaunch: c_int,
    pub sharedMemPerBlockOptin: usize,
    pub pageableMemoryAccessUsesHostPageTables: c_int,
    pub directManagedMemAccessFromHost: c_int,
    pub maxBlocksPerMultiProcessor: c_int,
    pub accessPolicyMaxWindowSize: c_int,
    pub reservedSharedMemPerBlock: usize,
    pub hostRegisterSupported: c_int,
    pub sparseCudaArraySupported: c_int,
    pub hostRegisterReadOnlySupported: c_int,
    pub timelineSemaphoreInteropSupported: c_int,
    pub memoryPoolsSupported: c_int,
    pub gpuDirectRDMASupported: c_int,
    pub gpuDirectRDMAFlushWritesOptions: c_uint,
    pub gpuDirectRDMAWritesOrdering: c_int,
    pub memoryPoolSupportedHandleTypes: c_uint,
    pub deferredMappingCudaArraySupported: c_int,
    pub ipcEventSupported: c_int,
    pub clusterLaunch: c_int,
    pub unifiedFunctionPointers: c_int,
    pub deviceNumaConfig: c_int,
    pub deviceNumaId: c_int,
    pub mpsEnabled: c_int,
    pub hostNumaId: c_int,
    pub gpuPciDeviceID: c_uint,
    pub gpuPciSubsystemID: c_uint,
    pub hostNumaMultinodeIpcSupported: c_int,
    pub reserved: [c_int; 56],
}

/// `struct cudaFuncAttributes` of CUDA 13.0.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct cudaFuncAttributes {
    pub sharedSizeBytes: usize,
    pub constSizeBytes: usize,
    pub localSizeBytes: usize,
    pub maxThreadsPerBlock: c_int,
    pub numRegs: c_int,
    pub ptxVersion: c_int,
    pub binaryVersion: c_int,
    pub cacheModeCA: c_int,
    pub maxDynamicSharedSizeBytes: c_int,
    pub preferredShmemCarveout: c_int,
    pub clusterDimMustBeSet: c_int,
    pub requiredClusterWidth: c_int,
    pub requiredClusterHeight: c_int,
    pub requiredClusterDepth: c_int,
    pub clusterSchedulingPolicyPreference: c_int,
    pub nonPortableClusterSizeAllowed: c_int,
    pub reserved: [c_int; 16],
}

/// `struct cudaPointerAttributes` of CUDA 13.0.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct cudaPointerAttributes {
    pub memory_type: c_int,
    pub device: c_int,
    pub devicePointer: *mut c_void,
    pub hostPointer: *mut c_void,
    pub reserved: [c_long; 8],
}

/// `cudaMemoryType` values.
pub mod memory_type {
    pub const UNREGISTERED: i32 = 0;
    pub const HOST: i32 = 1;
    pub const DEVICE: i32 = 2;
    pub const MANAGED: i32 = 3;
}

/// What `cudaDeviceProp` holds besides attributes, as the driver reports them.
pub struct Identity {
    pub name: String,
    pub uuid: [u8; 16],
    pub luid: [u8; 8],
    pub luid_device_node_mask: u32,
    pub total_mem: usize,
}

/// Builds `cudaDeviceProp` from a device's identity and attributes (`attribute`: the driver's
/// value, 0 for one it does not report), field by field.
pub fn device_prop(identity: &Identity, attribute: impl Fn(u32) -> i32) -> cudaDeviceProp {
    let a = |id: u32| attribute(id);
    let size = |id: u32| usize::try_from(a(id)).unwrap_or(0);
    // SAFETY: `cudaDeviceProp` is plain old data (integers and arrays of them), for which the
    // all-zero bit pattern is a valid value; reserved and unknown fields stay zero.
    let mut prop: cudaDeviceProp = unsafe { std::mem::zeroed() };
    for (slot, byte) in prop.name.iter_mut().zip(identity.name.bytes().take(255)) {
        *slot = byte as c_char;
    }
    prop.uuid = identity.uuid.map(|byte| byte as c_char);
    prop.luid = identity.luid.map(|byte| byte as c_char);
    prop.luidDeviceNodeMask = identity.luid_device_node_mask;
    prop.totalGlobalMem = identity.total_mem;
    prop.sharedMemPerBlock = size(attr::MAX_SHARED_MEMORY_PER_BLOCK);
    prop.regsPerBlock = a(attr::MAX_REGISTERS_PER_BLOCK);
    prop.warpSize = a(attr::WARP_SIZE);
    prop.memPitch = size(attr::MAX_PITCH);
    prop.maxThreadsPerBlock = a(attr::MAX_THREADS_PER_BLOCK);
    prop.maxThreadsDim = [a(attr::MAX_BLOCK_DIM_X), a(attr::MAX_BLOCK_DIM_Y), a(attr::MAX_BLOCK_DIM_Z)];
    prop.maxGridSize = [a(attr::MAX_GRID_DIM_X), a(attr::MAX_GRID_DIM_Y), a(attr::MAX_GRID_DIM_Z)];
    prop.totalConstMem = size(attr::TOTAL_CONSTANT_MEMORY);
    prop.major = a(attr::COMPUTE_CAPABILITY_MAJOR);
    prop.minor = a(attr::COMPUTE_CAPABILITY_MINOR);
    prop.textureAlignment = size(attr::TEXTURE_ALIGNMENT);
    prop.texturePitchAlignment = size(attr::TEXTURE_PITCH_ALIGNMENT);
    prop.multiProcessorCount = a(attr::MULTIPROCESSOR_COUNT);
    prop.integrated = a(attr::INTEGRATED);
    prop.canMapHostMemory = a(attr::CAN_MAP_HOST_MEMORY);
    prop.maxTexture1D = a(attr::MAX_TEXTURE_1D_WIDTH);
    prop.maxTexture1DMipmap = a(attr::MAX_TEXTURE_1D_MIPMAPPED_WIDTH);
    prop.maxTexture2D = [a(attr::MAX_TEXTURE_2D_WIDTH), a(attr::MAX_TEXTURE_2D_HEIGHT)];
    prop.maxTexture2DMipmap = [a(attr::MAX_TEXTURE_2D_MIPMAPPED_WIDTH), a(attr::MAX_TEXTURE_2D_MIPMAPPED_HEIGHT)];
    prop.maxTexture2DLinear =
        [a(attr::MAX_TEXTURE_2D_LINEAR_WIDTH), a(attr::MAX_TEXTURE_2D_LINEAR_HEIGHT), a(attr::MAX_TEXTURE_2D_LINEAR_PITCH)];
    prop.maxTexture2DGather = [a(attr::MAX_TEXTURE_2D_GATHER_WIDTH), a(attr::MAX_TEXTURE_2D_GATHER_HEIGHT)];
    prop.maxTexture3D = [a(attr::MAX_TEXTURE_3D_WIDTH), a(attr::MAX_TEXTURE_3D_HEIGHT), a(attr::MAX_TEXTURE_3D_DEPTH)];
    prop.maxTexture3DAlt = [a(attr::MAX_TEXTURE_3D_WIDTH_ALT), a(attr::MAX_TEXTURE_3D_HEIGHT_ALT), a(attr::MAX_TEXTURE_3D_DEPTH_ALT)];
    prop.maxTextureCubemap = a(attr::MAX_TEXTURE_CUBEMAP_WIDTH);
    prop.maxTexture1DLayered = [a(attr::MAX_TEXTURE_1D_LAYERED_WIDTH), a(attr::MAX_TEXTURE_1D_LAYERED_LAYERS)];
    prop.maxTexture2DLayered =
        [a(attr::MAX_TEXTURE_2D_LAYERED_WIDTH), a(attr::MAX_TEXTURE_2D_LAYERED_HEIGHT), a(attr::MAX_TEXTURE_2D_LAYERED_LAYERS)];
    prop.maxTextureCubemapLayered = [a(attr::MAX_TEXTURE_CUBEMAP_LAYERED_WIDTH), a(attr::MAX_TEXTURE_CUBEMAP_LAYERED_LAYERS)];
    prop.maxSurface1D = a(attr::MAX_SURFACE_1D_WIDTH);
    prop.maxSurface2D = [a(attr::MAX_SURFACE_2D_WIDTH), a(attr::MAX_SURFACE_2D_HEIGHT)];
    prop.maxSurface3D = [a(attr::MAX_SURFACE_3D_WIDTH), a(attr::MAX_SURFACE_3D_HEIGHT), a(attr::MAX_SURFACE_3D_DEPTH)];
    prop.maxSurface1DLayered = [a(attr::MAX_SURFACE_1D_LAYERED_WIDTH), a(attr::MAX_SURFACE_1D_LAYERED_LAYERS)];
    prop.maxSurface2DLayered =
        [a(attr::MAX_SURFACE_2D_LAYERED_WIDTH), a(attr::MAX_SURFACE_2D_LAYERED_HEIGHT), a(attr::MAX_SURFACE_2D_LAYERED_LAYERS)];
    prop.maxSurfaceCubemap = a(attr::MAX_SURFACE_CUBEMAP_WIDTH);
    prop.maxSurfaceCubemapLayered = [a(attr::MAX_SURFACE_CUBEMAP_LAYERED_WIDTH), a(attr::MAX_SURFACE_CUBEMAP_LAYERED_LAYERS)];
    prop.surfaceAlignment = size(attr::SURFACE_ALIGNMENT);
    prop.concurrentKernels = a(attr::CONCURRENT_KERNELS);
    prop.ECCEnabled = a(attr::ECC_ENABLED);
    prop.pciBusID = a(attr::PCI_BUS_ID);
    prop.pciDeviceID = a(attr::PCI_DEVICE_ID);
    prop.pciDomainID = a(attr::PCI_DOMAIN_ID);
    prop.tccDriver = a(attr::TCC_DRIVER);
    prop.asyncEngineCount = a(attr::ASYNC_ENGINE_COUNT);
    prop.unifiedAddressing = a(attr::UNIFIED_ADDRESSING);
    prop.memoryBusWidth = a(attr::GLOBAL_MEMORY_BUS_WIDTH);
    prop.l2CacheSize = a(attr::L2_CACHE_SIZE);
    prop.persistingL2CacheMaxSize = a(attr::MAX_PERSISTING_L2_CACHE_SIZE);
    prop.maxThreadsPerMultiProcessor = a(attr::MAX_THREADS_PER_MULTIPROCESSOR);
    prop.streamPrioritiesSupported = a(attr::STREAM_PRIORITIES_SUPPORTED);
    prop.globalL1CacheSupported = a(attr::GLOBAL_L1_CACHE_SUPPORTED);
    prop.localL1CacheSupported = a(attr::LOCAL_L1_CACHE_SUPPORTED);
    prop.sharedMemPerMultiprocessor = size(attr::MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
    prop.regsPerMultiprocessor = a(attr::MAX_REGISTERS_PER_MULTIPROCESSOR);
    prop.managedMemory = a(attr::MANAGED_MEMORY);
    prop.isMultiGpuBoard = a(attr::IS_MULTI_GPU_BOARD);
    prop.multiGpuBoardGroupID = a(attr::MULTI_GPU_BOARD_GROUP_ID);
    prop.hostNativeAtomicSupported = a(attr::HOST_NATIVE_ATOMIC_SUPPORTED);
    prop.pageableMemoryAccess = a(attr::PAGEABLE_MEMORY_ACCESS);
    prop.concurrentManagedAccess = a(attr::CONCURRENT_MANAGED_ACCESS);
    prop.computePreemptionSupported = a(attr::COMPUTE_PREEMPTION_SUPPORTED);
    prop.canUseHostPointerForRegisteredMem = a(attr::CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM);
    prop.cooperativeLaunch = a(attr::COOPERATIVE_LAUNCH);
    prop.sharedMemPerBlockOptin = size(attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    prop.pageableMemoryAccessUsesHostPageTables = a(attr::PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES);
    prop.directManagedMemAccessFromHost = a(attr::DIRECT_MANAGED_MEM_ACCESS_FROM_HOST);
    prop.maxBlocksPerMultiProcessor = a(attr::MAX_BLOCKS_PER_MULTIPROCESSOR);
    prop.accessPolicyMaxWindowSize = a(attr::MAX_ACCESS_POLICY_WINDOW_SIZE);
    prop.reservedSharedMemPerBlock = size(attr::RESERVED_SHARED_MEMORY_PER_BLOCK);
    prop.hostRegisterSupported = a(attr::HOST_REGISTER_SUPPORTED);
    prop.sparseCudaArraySupported = a(attr::SPARSE_CUDA_ARRAY_SUPPORTED);
    prop.hostRegisterReadOnlySupported = a(attr::HOST_REGISTER_READ_ONLY_SUPPORTED);
    prop.timelineSemaphoreInteropSupported = a(attr::TIMELINE_SEMAPHORE_INTEROP_SUPPORTED);
    prop.memoryPoolsSupported = a(attr::MEMORY_POOLS_SUPPORTED);
    prop.gpuDirectRDMASupported = a(attr::GPU_DIRECT_RDMA_SUPPORTED);
    prop.gpuDirectRDMAFlushWritesOptions = a(attr::GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS) as c_uint;
    prop.gpuDirectRDMAWritesOrdering = a(attr::GPU_DIRECT_RDMA_WRITES_ORDERING);
    prop.memoryPoolSupportedHandleTypes = a(attr::MEMORY_POOL_SUPPORTED_HANDLE_TYPES) as c_uint;
    prop.deferredMappingCudaArraySupported = a(attr::DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED);
    prop.ipcEventSupported = a(attr::IPC_EVENT_SUPPORT);
    prop.clusterLaunch = a(attr::CLUSTER_LAUNCH);
    // No attribute reports unified function pointers; the runtime derives it from the
    // architecture (sm_90 and newer have them).
    prop.unifiedFunctionPointers = i32::from(prop.major >= 9);
    prop.deviceNumaConfig = a(attr::NUMA_CONFIG);
    prop.deviceNumaId = a(attr::NUMA_ID);
    prop.mpsEnabled = a(attr::MPS_ENABLED);
    prop.hostNumaId = a(attr::HOST_NUMA_ID);
    prop.gpuPciDeviceID = a(attr::GPU_PCI_DEVICE_ID) as c_uint;
    prop.gpuPciSubsystemID = a(attr::GPU_PCI_SUBSYSTEM_ID) as c_uint;
    prop.hostNumaMultinodeIpcSupported = a(attr::HOST_NUMA_MULTINODE_IPC_SUPPORTED);
    prop
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    #[test]
    fn layouts_match_the_cuda_13_headers() {
        // Offsets measured from CUDA 13.0's driver_types.h (offsetof).
        assert_eq!(size_of::<cudaDeviceProp>(), 1008);
        assert_eq!(offset_of!(cudaDeviceProp, uuid), 256);
        assert_eq!(offset_of!(cudaDeviceProp, totalGlobalMem), 288);
        assert_eq!(offset_of!(cudaDeviceProp, major), 360);
        assert_eq!(offset_of!(cudaDeviceProp, multiProcessorCount), 384);
        assert_eq!(offset_of!(cudaDeviceProp, hostNumaMultinodeIpcSupported), 780);
        assert_eq!(size_of::<cudaFuncAttributes>(), 144);
        assert_eq!(size_of::<cudaPointerAttributes>(), 88);
    }

    #[test]
    fn properties_come_from_attributes() {
        let identity = Identity { name: "Test GPU".into(), uuid: [7; 16], luid: [0; 8], luid_device_node_mask: 0, total_mem: 80 << 30 };
        let attributes = [(attr::MULTIPROCESSOR_COUNT, 32), (attr::COMPUTE_CAPABILITY_MAJOR, 9), (attr::WARP_SIZE, 32)];
        let prop = device_prop(&identity, |id| attributes.iter().find(|(a, _)| *a == id).map_or(0, |(_, v)| *v));
        assert_eq!(prop.multiProcessorCount, 32);
        assert_eq!(prop.warpSize, 32);
        assert_eq!(prop.totalGlobalMem, 80 << 30);
        assert_eq!(prop.name[..8].iter().map(|c| *c as u8).collect::<Vec<_>>(), b"Test GPU");
        assert_eq!(prop.name[8], 0);
        assert_eq!(prop.uuid[0], 7);
        assert_eq!(prop.unifiedFunctionPointers, 1);
    }
}
