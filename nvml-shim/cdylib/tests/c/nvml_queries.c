// Flyt's NVML against the emulated device, beside Flyt's driver: every answer must agree with the
// driver's (count, name, UUID, PCI ids, driver version, memory), NVML must make no context, the
// process list must show the tenant's processes (this one once it holds memory, and the peer
// FLYT_TEST_PEER_PID names, which holds FLYT_TEST_PEER_BYTES), utilization must count queued
// copies, and what NVML cannot answer must be an error, never made up. Built against CUDA 13's
// nvml.h and cuda.h.
//
// `nvml_queries hold BYTES` is that peer: it allocates BYTES, prints "held", and waits for its
// standard input to close.
#include <cuda.h>
#include <dlfcn.h>
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nvml_expect.h"

static int hold(size_t bytes) {
    CUcontext context;
    CUdeviceptr allocation;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&context, 0) || cuCtxSetCurrent(context) || cuMemAlloc(&allocation, bytes)) return 1;
    printf("held\n");
    fflush(stdout);
    char line[16];
    while (fgets(line, sizeof line, stdin)) {
    }
    return cuMemFree(allocation) != CUDA_SUCCESS;
}

/// Finds `pid` in a process list; its index or -1.
static int find_process(const nvmlProcessInfo_t *processes, unsigned count, unsigned pid) {
    for (unsigned i = 0; i < count; i++)
        if (processes[i].pid == pid) return (int)i;
    return -1;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "hold") == 0) return hold((size_t)strtoull(argv[2], NULL, 0));
    const char *peer_text = getenv("FLYT_TEST_PEER_PID"), *peer_bytes_text = getenv("FLYT_TEST_PEER_BYTES");
    const unsigned peer = peer_text ? (unsigned)strtoul(peer_text, NULL, 0) : 0;
    const unsigned long long peer_bytes = peer_bytes_text ? strtoull(peer_bytes_text, NULL, 0) : 0;
    const unsigned others = peer ? 1 : 0;
    unsigned count = 99;
    EXPECT(nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED);
    EXPECT(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    EXPECT(nvmlInit_v2(), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetCount_v2(NULL), NVML_ERROR_INVALID_ARGUMENT);

    EXPECT(cuInit(0), CUDA_SUCCESS);
    int driver_count = 0;
    EXPECT(cuDeviceGetCount(&driver_count), CUDA_SUCCESS);
    CHECK((int)count == driver_count && count > 0, "NVML counts %u devices, the driver %d", count, driver_count);

    nvmlDevice_t device;
    EXPECT(nvmlDeviceGetHandleByIndex_v2(0, &device), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetHandleByIndex_v2(count, &device), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT(nvmlDeviceGetHandleByIndex_v2(0, &device), NVML_SUCCESS);
    unsigned index = 99;
    EXPECT(nvmlDeviceGetIndex(device, &index), NVML_SUCCESS);
    EXPECT(index, 0);
    EXPECT(nvmlDeviceGetIndex((nvmlDevice_t)(size_t)0x1234, &index), NVML_ERROR_INVALID_ARGUMENT);

    // Peer-to-peer with itself, as NCCL asks: what NVIDIA's NVML answers on an H100.
    nvmlGpuP2PStatus_t p2p = NVML_P2P_STATUS_UNKNOWN;
    EXPECT(nvmlDeviceGetP2PStatus(device, device, NVML_P2P_CAPS_INDEX_READ, &p2p), NVML_SUCCESS);
    EXPECT(p2p, NVML_P2P_STATUS_NOT_SUPPORTED);
    EXPECT(nvmlDeviceGetP2PStatus(device, device, NVML_P2P_CAPS_INDEX_NVLINK, &p2p), NVML_SUCCESS);
    EXPECT(p2p, NVML_P2P_STATUS_NOT_SUPPORTED);
    EXPECT(nvmlDeviceGetP2PStatus(device, (nvmlDevice_t)(size_t)0x1234, NVML_P2P_CAPS_INDEX_READ, &p2p), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT(nvmlDeviceGetP2PStatus(device, device, NVML_P2P_CAPS_INDEX_READ, NULL), NVML_ERROR_INVALID_ARGUMENT);

    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], driver_name[256];
    EXPECT(nvmlDeviceGetName(device, name, sizeof name), NVML_SUCCESS);
    EXPECT(cuDeviceGetName(driver_name, sizeof driver_name, 0), CUDA_SUCCESS);
    CHECK(strcmp(name, driver_name) == 0, "name '%s' vs the driver's '%s'", name, driver_name);
    EXPECT(nvmlDeviceGetName(device, name, 3), NVML_ERROR_INSUFFICIENT_SIZE);

    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE], driver_uuid[64];
    EXPECT(nvmlDeviceGetUUID(device, uuid, sizeof uuid), NVML_SUCCESS);
    CUuuid bytes;
    EXPECT(cuDeviceGetUuid_v2(&bytes, 0), CUDA_SUCCESS);
    const unsigned char *b = (const unsigned char *)bytes.bytes;
    snprintf(driver_uuid, sizeof driver_uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    CHECK(strcmp(uuid, driver_uuid) == 0, "UUID '%s' vs the driver's '%s'", uuid, driver_uuid);
    nvmlDevice_t by_uuid = NULL;
    EXPECT(nvmlDeviceGetHandleByUUID(uuid, &by_uuid), NVML_SUCCESS);
    CHECK(by_uuid == device, "the UUID finds the same device");
    EXPECT(nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000", &by_uuid), NVML_ERROR_NOT_FOUND);

    // The PCI string PyTorch builds from the driver's attributes finds the device.
    int domain = -1, bus = -1, slot = -1;
    EXPECT(cuDeviceGetAttribute(&domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetAttribute(&slot, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0), CUDA_SUCCESS);
    char pci_string[32];
    snprintf(pci_string, sizeof pci_string, NVML_DEVICE_PCI_BUS_ID_FMT, domain, bus, slot);
    nvmlDevice_t by_pci = NULL;
    EXPECT(nvmlDeviceGetHandleByPciBusId_v2(pci_string, &by_pci), NVML_SUCCESS);
    CHECK(by_pci == device, "the PCI bus id %s finds the same device", pci_string);
    nvmlPciInfo_t pci;
    EXPECT(nvmlDeviceGetPciInfo_v3(device, &pci), NVML_SUCCESS);
    CHECK(strcmp(pci.busId, pci_string) == 0, "busId '%s' vs '%s'", pci.busId, pci_string);
    CHECK((int)pci.domain == domain && (int)pci.bus == bus && (int)pci.device == slot, "PCI fields");

    int cuda_version = 0, nvml_cuda_version = 0;
    EXPECT(cuDriverGetVersion(&cuda_version), CUDA_SUCCESS);
    EXPECT(nvmlSystemGetCudaDriverVersion_v2(&nvml_cuda_version), NVML_SUCCESS);
    EXPECT(nvml_cuda_version, cuda_version);
    int major = 0, minor = 0, driver_major = -1;
    EXPECT(nvmlDeviceGetCudaComputeCapability(device, &major, &minor), NVML_SUCCESS);
    EXPECT(cuDeviceGetAttribute(&driver_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0), CUDA_SUCCESS);
    EXPECT(major, driver_major);

    // NVML made no context: the primary context is still inactive.
    unsigned flags = 0;
    int active = 1;
    EXPECT(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
    EXPECT(active, 0);

    // Before this process holds memory, only the peer (when there is one) is listed.
    nvmlProcessInfo_t processes[4];
    unsigned process_count = 4;
    EXPECT(nvmlDeviceGetComputeRunningProcesses_v3(device, &process_count, processes), NVML_SUCCESS);
    EXPECT(process_count, others);
    if (peer) {
        int at = find_process(processes, process_count, peer);
        CHECK(at >= 0 && processes[at].usedGpuMemory == peer_bytes, "the peer %u holding %llu is listed", peer, peer_bytes);
    }

    // Memory: the slice as the driver's session sees it.
    CUcontext context;
    EXPECT(cuDevicePrimaryCtxRetain(&context, 0), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(context), CUDA_SUCCESS);
    CUdeviceptr allocation;
    const size_t held = 64 << 20;
    EXPECT(cuMemAlloc(&allocation, held), CUDA_SUCCESS);
    size_t free_bytes = 0, total_bytes = 0;
    EXPECT(cuMemGetInfo(&free_bytes, &total_bytes), CUDA_SUCCESS);
    nvmlMemory_t memory;
    EXPECT(nvmlDeviceGetMemoryInfo(device, &memory), NVML_SUCCESS);
    CHECK(memory.total == total_bytes, "total %llu vs the driver's %zu", memory.total, total_bytes);
    CHECK(memory.used == memory.total - memory.free && memory.used >= held, "used %llu of %llu, free %llu", memory.used, memory.total,
          memory.free);
    nvmlMemory_v2_t memory2;
    memory2.version = 1;
    EXPECT(nvmlDeviceGetMemoryInfo_v2(device, &memory2), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    memory2.version = nvmlMemory_v2;
    EXPECT(nvmlDeviceGetMemoryInfo_v2(device, &memory2), NVML_SUCCESS);
    CHECK(memory2.total == total_bytes && memory2.used + memory2.free == memory2.total, "v2 memory");

    // This process now holds memory on the device, and is listed with it.
    process_count = 0;
    EXPECT(nvmlDeviceGetComputeRunningProcesses_v3(device, &process_count, NULL), NVML_ERROR_INSUFFICIENT_SIZE);
    EXPECT(process_count, 1 + others);
    process_count = 4;
    EXPECT(nvmlDeviceGetComputeRunningProcesses_v3(device, &process_count, processes), NVML_SUCCESS);
    EXPECT(process_count, 1 + others);
    int self = find_process(processes, process_count, (unsigned)getpid());
    CHECK(self >= 0 && processes[self].usedGpuMemory == held, "this process holding %llu is listed", (unsigned long long)held);
    CHECK(!peer || find_process(processes, process_count, peer) >= 0, "the peer is still listed");
    // The unversioned symbol takes the v1 struct (PyTorch's out-of-memory report looks it up so);
    // nvml.h maps the name to _v3, so it is found the way PyTorch finds it.
    typedef nvmlReturn_t (*processes_v1)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *);
    processes_v1 get_processes_v1 = (processes_v1)dlsym(RTLD_DEFAULT, "nvmlDeviceGetComputeRunningProcesses");
    CHECK(get_processes_v1 != NULL, "nvmlDeviceGetComputeRunningProcesses is exported");
    nvmlProcessInfo_v1_t old_processes[2];
    process_count = 2;
    if (get_processes_v1) EXPECT(get_processes_v1(device, &process_count, old_processes), NVML_SUCCESS);
    CHECK(process_count == 1 + others && (old_processes[0].usedGpuMemory == held || old_processes[others].usedGpuMemory == held),
          "v1 process list");
    process_count = 4;
    EXPECT(nvmlDeviceGetGraphicsRunningProcesses_v3(device, &process_count, processes), NVML_SUCCESS);
    EXPECT(process_count, 0);

    // Utilization: a copy queued and waited for counts as memory time within the last second.
    // (The emulated device runs no kernels, so none of their time can be counted.)
    nvmlUtilization_t utilization = {101, 101};
    EXPECT(nvmlDeviceGetUtilizationRates(device, &utilization), NVML_SUCCESS);
    CHECK(utilization.gpu <= 100 && utilization.memory <= 100, "utilization %u%% %u%%", utilization.gpu, utilization.memory);
    EXPECT(cuMemsetD8(allocation, 7, held), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT(nvmlDeviceGetUtilizationRates(device, &utilization), NVML_SUCCESS);
    CHECK(utilization.memory >= 1 && utilization.memory <= 100 && utilization.gpu == 0, "after a memset: gpu %u%%, memory %u%%",
          utilization.gpu, utilization.memory);
    EXPECT(nvmlDeviceGetUtilizationRates(device, NULL), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT(cuMemFree(allocation), CUDA_SUCCESS);

    // What Flyt cannot tell is an error at the call, never a made-up value.
    unsigned temperature;
    EXPECT(nvmlDeviceGetTemperature(device, NVML_TEMPERATURE_GPU, &temperature), NVML_ERROR_NOT_SUPPORTED);
    CHECK(strcmp(nvmlErrorString(NVML_ERROR_NOT_SUPPORTED), "Not Supported") == 0, "error string");

    EXPECT(nvmlShutdown(), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED);
    printf("PASSED: %d failure(s)\n", failures);
    return failures != 0;
}
