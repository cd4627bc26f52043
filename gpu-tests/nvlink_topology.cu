// nvlink_topology: the NVLinks between the GPUs this process sees, read from NVML the way NCCL
// 2.28 reads them (ncclTopoGetXmlFromGpu: NVML loaded with dlopen; per link the P2P capability,
// the state as a field value, the far end's PCI information through the unversioned call NCCL
// looks up; run with gpu-tests/run.sh --gpus 0,1 to see a pair). Printed: the device count; per
// device NVML's NVLink count field; per ordered pair of devices the links that join them and NVML's
// NVLink peer status; per device the links to a switch. Links to GPUs the process does not see are
// not printed (natively NVML shows every GPU of the host; through Flyt only the session's), so
// the output is the same natively and through Flyt whenever the session holds the GPUs the native
// run sees. On one GPU it prints that device's lines and passes.
#include <dlfcn.h>
#include <nvml.h>

#include "common.h"

// NVML's functions, looked up by the names NCCL looks up.
#define NVML_FUNCTIONS(X)                                                                          \
    X(nvmlInit_v2, nvmlReturn_t, (void))                                                           \
    X(nvmlShutdown, nvmlReturn_t, (void))                                                          \
    X(nvmlDeviceGetHandleByPciBusId_v2, nvmlReturn_t, (const char *, nvmlDevice_t *))              \
    X(nvmlDeviceGetNvLinkCapability, nvmlReturn_t, (nvmlDevice_t, unsigned, nvmlNvLinkCapability_t, unsigned *)) \
    X(nvmlDeviceGetFieldValues, nvmlReturn_t, (nvmlDevice_t, int, nvmlFieldValue_t *))             \
    X(nvmlDeviceGetNvLinkRemoteDeviceType, nvmlReturn_t, (nvmlDevice_t, unsigned, nvmlIntNvLinkDeviceType_t *)) \
    X(nvmlDeviceGetNvLinkRemotePciInfo_v2, nvmlReturn_t, (nvmlDevice_t, unsigned, nvmlPciInfo_t *)) \
    X(nvmlDeviceGetP2PStatus, nvmlReturn_t, (nvmlDevice_t, nvmlDevice_t, nvmlGpuP2PCapsIndex_t, nvmlGpuP2PStatus_t *))
#define DECLARE(name, result, args) static result(*p_##name) args;
NVML_FUNCTIONS(DECLARE)
// The unversioned remote-PCI call NCCL uses (nvml.h maps the name to _v2, so it is spelled here).
static nvmlReturn_t (*p_remote_pci_v1)(nvmlDevice_t, unsigned, void *);

struct Pci {
    unsigned domain, bus, device;
    bool operator==(const Pci &o) const { return domain == o.domain && bus == o.bus && device == o.device; }
};

// `[domain:]bus:device.function`, hexadecimal.
static Pci parse_bus_id(const char *text) {
    Pci pci = {0, 0, 0};
    unsigned a, b, c;
    if (sscanf(text, "%x:%x:%x", &a, &b, &c) == 3) pci = {a, b, c};
    else if (sscanf(text, "%x:%x", &b, &c) == 2) pci = {0, b, c};
    return pci;
}

static const int MAX_DEVICES = 16;

int main() {
    test_init("nvlink_topology");
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!EXPECT(nvml != NULL, "dlopen libnvidia-ml.so.1: %s", dlerror())) {
        printf("nvlink_topology: FAIL\n");
        return 1;
    }
    bool found = true;
#define LOOK_UP(name, result, args) found &= EXPECT((p_##name = (result(*) args)dlsym(nvml, #name)) != NULL, "NVML exports " #name);
    NVML_FUNCTIONS(LOOK_UP)
    found &= EXPECT((p_remote_pci_v1 = (nvmlReturn_t(*)(nvmlDevice_t, unsigned, void *))dlsym(nvml, "nvmlDeviceGetNvLinkRemotePciInfo")) != NULL,
                    "NVML exports nvmlDeviceGetNvLinkRemotePciInfo");
    if (!found) {
        printf("nvlink_topology: FAIL\n");
        return 1;
    }
    nvmlReturn_t r = p_nvmlInit_v2();
    if (!EXPECT(r == NVML_SUCCESS, "nvmlInit_v2: %d", (int)r)) {
        printf("nvlink_topology: FAIL\n");
        return 1;
    }

    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    if (count > MAX_DEVICES) count = MAX_DEVICES;
    printf("devices: %d\n", count);
    Pci pcis[MAX_DEVICES];
    nvmlDevice_t handles[MAX_DEVICES];
    for (int d = 0; d < count; d++) {
        char bus_id[32];
        CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, d));
        pcis[d] = parse_bus_id(bus_id);
        r = p_nvmlDeviceGetHandleByPciBusId_v2(bus_id, &handles[d]);
        EXPECT(r == NVML_SUCCESS, "device %d: nvmlDeviceGetHandleByPciBusId_v2: %d", d, (int)r);
    }

    for (int d = 0; d < count; d++) {
        nvmlDevice_t device = handles[d];
        nvmlFieldValue_t field;
        memset(&field, 0, sizeof field);
        field.fieldId = NVML_FI_DEV_NVLINK_LINK_COUNT;
        r = p_nvmlDeviceGetFieldValues(device, 1, &field);
        unsigned link_count = (r == NVML_SUCCESS && field.nvmlReturn == NVML_SUCCESS) ? field.value.uiVal : 0;
        if (link_count) printf("device %d: NVLink count %u\n", d, link_count);
        else printf("device %d: no NVLink\n", d);

        int to_device[MAX_DEVICES] = {0}, to_switch = 0, pci_calls_agree = 1;
        for (unsigned l = 0; l < NVML_NVLINK_MAX_LINKS; l++) {
            unsigned can_p2p = 0;
            if (p_nvmlDeviceGetNvLinkCapability(device, l, NVML_NVLINK_CAP_P2P_SUPPORTED, &can_p2p) != NVML_SUCCESS || !can_p2p) continue;
            memset(&field, 0, sizeof field);
            field.fieldId = NVML_FI_DEV_NVLINK_GET_STATE;
            field.scopeId = l;
            if (p_nvmlDeviceGetFieldValues(device, 1, &field) != NVML_SUCCESS || field.nvmlReturn != NVML_SUCCESS ||
                field.value.uiVal != NVML_FEATURE_ENABLED)
                continue;
            // NCCL's structure is 52 bytes; room for the current 68 too. Both start with a 16-byte
            // bus id followed by domain, bus and device.
            unsigned char v1[128];
            memset(v1, 0, sizeof v1);
            if (p_remote_pci_v1(device, l, v1) != NVML_SUCCESS) continue;
            unsigned fields[3];
            memcpy(fields, v1 + 16, sizeof fields);
            const Pci remote = {fields[0], fields[1], fields[2]};
            nvmlPciInfo_t v2;
            memset(&v2, 0, sizeof v2);
            if (p_nvmlDeviceGetNvLinkRemotePciInfo_v2(device, l, &v2) != NVML_SUCCESS || !(Pci{v2.domain, v2.bus, v2.device} == remote))
                pci_calls_agree = 0;
            int far = -1;
            for (int e = 0; e < count; e++)
                if (e != d && pcis[e] == remote) far = e;
            if (far >= 0) {
                to_device[far]++;
                continue;
            }
            // A GPU this process does not see is not printed; any other far end is a switch.
            nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
            bool gpu = p_nvmlDeviceGetNvLinkRemoteDeviceType(device, l, &type) == NVML_SUCCESS && type == NVML_NVLINK_DEVICE_TYPE_GPU;
            nvmlDevice_t other;
            char remote_id[32];
            snprintf(remote_id, sizeof remote_id, "%08x:%02x:%02x.0", remote.domain, remote.bus, remote.device);
            gpu = gpu || p_nvmlDeviceGetHandleByPciBusId_v2(remote_id, &other) == NVML_SUCCESS;
            if (!gpu) to_switch++;
        }
        EXPECT(pci_calls_agree, "device %d: nvmlDeviceGetNvLinkRemotePciInfo and _v2 agree", d);
        for (int e = 0; e < count; e++) {
            if (e == d) continue;
            nvmlGpuP2PStatus_t status = NVML_P2P_STATUS_UNKNOWN;
            r = p_nvmlDeviceGetP2PStatus(device, handles[e], NVML_P2P_CAPS_INDEX_NVLINK, &status);
            printf("device %d -> device %d: %d NVLinks, NVML NVLink P2P status %s\n", d, e, to_device[e],
                   r != NVML_SUCCESS ? "error" : status == NVML_P2P_STATUS_OK ? "OK" : "not OK");
        }
        printf("device %d -> a switch: %d NVLinks\n", d, to_switch);
    }
    EXPECT(p_nvmlShutdown() == NVML_SUCCESS, "nvmlShutdown");
    return test_finish();
}
