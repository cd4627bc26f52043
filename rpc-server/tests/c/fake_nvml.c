// A stand-in for NVIDIA's libnvidia-ml.so.1 with a fixed NVLink topology, for the server's NVML
// reading (rpc-server/src/backend/nvlinks.rs) on machines without a GPU. The host has GPUs at
// buses 0x18 (A), 0x2a (B) and 0x3a (C, another tenant's); each has 18 links by its count field.
// A's links: 0-1 to B, 2-3 to C (3 without a type: a GPU of the host all the same), 4 to a switch (bus 0x05, type SWITCH), 5 up but not for P2P,
// 6 P2P but down, 7 to a far end NVML cannot place, 8 to a switch NVML gives no type for;
// 9-17 do not exist (state NOT_SUPPORTED). B's links: 0-1 to A. C's: none up.
#include <stdio.h>
#include <string.h>

typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} PciInfo;

typedef struct {
    unsigned fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned valueType, nvmlReturn;
    unsigned long long value;
} FieldValue;

enum { SUCCESS = 0, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6 };
static const unsigned buses[3] = {0x18, 0x2a, 0x3a};
static int initialized;

// Handles are 1 + the GPU's index.
static int gpu(void *handle) {
    long index = (long)handle - 1;
    return index >= 0 && index < 3 ? (int)index : -1;
}

unsigned nvmlInit_v2(void) {
#ifdef FAIL_INIT
    return 9;  // NVML_ERROR_DRIVER_NOT_LOADED
#endif
    initialized = 1;
    return SUCCESS;
}

unsigned nvmlDeviceGetHandleByPciBusId_v2(const char *text, void **handle) {
    unsigned domain, bus, device;
    if (!initialized || sscanf(text, "%x:%x:%x", &domain, &bus, &device) != 3) return INVALID_ARGUMENT;
    for (int i = 0; i < 3; i++)
        if (domain == 0 && bus == buses[i] && device == 0) {
            *handle = (void *)(long)(i + 1);
            return SUCCESS;
        }
    return NOT_FOUND;
}

// The far end of `link` of GPU `g`: a bus, 0 for none; `type` 0 GPU, 2 switch, -1 none.
static int far_end(int g, unsigned link, unsigned *bus, int *type) {
    *type = -1;
    *bus = 0;
    if (g == 0) {
        if (link <= 1) *bus = 0x2a, *type = 0;
        else if (link == 2) *bus = 0x3a, *type = 0;
        else if (link == 3) *bus = 0x3a;
        else if (link == 4) *bus = 0x05, *type = 2;
        else if (link == 5 || link == 6) *bus = 0x2a, *type = 0;
        else if (link == 7) return NOT_SUPPORTED;
        else if (link == 8) *bus = 0x06;
        else return NOT_SUPPORTED;
        return SUCCESS;
    }
    if (g == 1 && link <= 1) {
        *bus = 0x18, *type = 0;
        return SUCCESS;
    }
    return link < 9 ? SUCCESS : NOT_SUPPORTED;
}

unsigned nvmlDeviceGetNvLinkState(void *handle, unsigned link, unsigned *active) {
    int g = gpu(handle);
    if (g < 0 || link >= 18) return INVALID_ARGUMENT;
    if (link >= 9) return NOT_SUPPORTED;
    *active = (g == 0 && link != 6) || (g == 1 && link <= 1);
    return SUCCESS;
}

unsigned nvmlDeviceGetNvLinkCapability(void *handle, unsigned link, unsigned capability, unsigned *result) {
    int g = gpu(handle);
    if (g < 0 || link >= 18 || capability > 5) return INVALID_ARGUMENT;
    if (link >= 9) return NOT_SUPPORTED;
    *result = !(g == 0 && link == 5);
    return SUCCESS;
}

// The far end of link `link` of the GPU `handle` names, as far_end; INVALID_ARGUMENT for a
// handle or link that is none.
static unsigned far_end_of(void *handle, unsigned link, unsigned *bus, int *type) {
    int g = gpu(handle);
    if (g < 0 || link >= 18) return INVALID_ARGUMENT;
    return (unsigned)far_end(g, link, bus, type);
}

unsigned nvmlDeviceGetNvLinkRemotePciInfo_v2(void *handle, unsigned link, PciInfo *pci) {
    int type;
    unsigned bus;
    unsigned status = far_end_of(handle, link, &bus, &type);
    if (status != SUCCESS) return status;
    memset(pci, 0, sizeof *pci);
    pci->bus = bus;
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", bus);
    return SUCCESS;
}

unsigned nvmlDeviceGetNvLinkRemoteDeviceType(void *handle, unsigned link, unsigned *kind) {
    int type;
    unsigned bus;
    unsigned status = far_end_of(handle, link, &bus, &type);
    if (status == INVALID_ARGUMENT) return status;
    if (status != SUCCESS || type < 0) return NOT_SUPPORTED;
    *kind = (unsigned)type;
    return SUCCESS;
}

unsigned nvmlDeviceGetFieldValues(void *handle, int count, FieldValue *values) {
    if (gpu(handle) < 0 || !values) return INVALID_ARGUMENT;
    for (int i = 0; i < count; i++) {
        values[i].nvmlReturn = values[i].fieldId == 91 ? SUCCESS : NOT_SUPPORTED;
        values[i].value = 18;
    }
    return SUCCESS;
}
