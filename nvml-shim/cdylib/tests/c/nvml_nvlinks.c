// Flyt's NVML NVLink answers against the emulated device, beside Flyt's driver, asked the way
// NCCL 2.28 asks them (ncclTopoGetXmlFromGpu): each link's P2P capability, its state as a field
// value and by call, its far end's PCI information (the unversioned call NCCL looks up, with the
// older 52-byte structure, and _v2) and type. Built against CUDA 13's nvml.h.
//
// argv[1] is the expected topology: one group per device the process sees, separated by ';', one
// character per link: a digit is the far device's index, 's' a switch, '-' an inactive link; an
// empty group is a device without NVLink.
#include <dlfcn.h>
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml_expect.h"

// nvmlPciInfo_t as NCCL declares it (src/include/nvmlwrap.h), for the unversioned call.
typedef struct {
    char busId[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    unsigned reserved[4];
} LegacyPciInfo;

#define MAX_DEVICES 8

int main(int argc, char **argv) {
    if (argc != 2) {
        printf("usage: nvml_nvlinks TOPOLOGY\n");
        return 2;
    }
    char expected[MAX_DEVICES][NVML_NVLINK_MAX_LINKS + 1] = {{0}};
    unsigned expected_devices = 0;
    for (const char *at = argv[1];; at++) {
        if (*at == ';' || *at == 0) {
            expected_devices++;
            if (*at == 0 || expected_devices == MAX_DEVICES) break;
            continue;
        }
        size_t length = strlen(expected[expected_devices]);
        if (length < NVML_NVLINK_MAX_LINKS) expected[expected_devices][length] = *at;
    }

    typedef nvmlReturn_t (*RemotePciV1)(nvmlDevice_t, unsigned, LegacyPciInfo *);
    RemotePciV1 remote_pci_v1 = (RemotePciV1)dlsym(RTLD_DEFAULT, "nvmlDeviceGetNvLinkRemotePciInfo");
    CHECK(remote_pci_v1 != NULL, "nvmlDeviceGetNvLinkRemotePciInfo is exported (NCCL looks it up by that name)");

    EXPECT(nvmlInit_v2(), NVML_SUCCESS);
    unsigned count = 0;
    EXPECT(nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
    CHECK(count == expected_devices, "NVML counts %u devices, expected %u", count, expected_devices);
    if (count > expected_devices) count = expected_devices;

    nvmlDevice_t devices[MAX_DEVICES];
    nvmlPciInfo_t pcis[MAX_DEVICES];
    for (unsigned d = 0; d < count; d++) {
        EXPECT(nvmlDeviceGetHandleByIndex_v2(d, &devices[d]), NVML_SUCCESS);
        EXPECT(nvmlDeviceGetPciInfo_v3(devices[d], &pcis[d]), NVML_SUCCESS);
        for (unsigned e = 0; e < d; e++) CHECK(strcmp(pcis[d].busId, pcis[e].busId) != 0, "devices %u and %u share a bus id", d, e);
    }

    for (unsigned d = 0; d < count; d++) {
        nvmlDevice_t device = devices[d];
        const char *ends = expected[d];
        const unsigned links = (unsigned)strlen(ends);
        const nvmlReturn_t past_last = links ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;

        // Field values: the link count, each link's state, and fields Flyt does not serve (the C2C
        // link count NCCL asks, a temperature) each with its own NOT_SUPPORTED; the call succeeds.
        nvmlFieldValue_t fields[NVML_NVLINK_MAX_LINKS + 4];
        memset(fields, 0, sizeof fields);
        fields[0].fieldId = NVML_FI_DEV_NVLINK_LINK_COUNT;
        for (unsigned l = 0; l < links; l++) {
            fields[1 + l].fieldId = NVML_FI_DEV_NVLINK_GET_STATE;
            fields[1 + l].scopeId = l;
        }
        fields[1 + links].fieldId = NVML_FI_DEV_C2C_LINK_COUNT;
        fields[2 + links].fieldId = NVML_FI_DEV_NVLINK_GET_STATE;
        fields[2 + links].scopeId = links;
        fields[3 + links].fieldId = NVML_FI_DEV_MEMORY_TEMP;
        EXPECT(nvmlDeviceGetFieldValues(device, (int)links + 4, fields), NVML_SUCCESS);
        EXPECT(fields[0].nvmlReturn, NVML_SUCCESS);
        EXPECT(fields[0].valueType, NVML_VALUE_TYPE_UNSIGNED_INT);
        EXPECT(fields[0].value.uiVal, links);
        CHECK(fields[0].timestamp > 0, "a field value carries its time");
        for (unsigned l = 0; l < links; l++) {
            EXPECT(fields[1 + l].nvmlReturn, NVML_SUCCESS);
            EXPECT(fields[1 + l].value.uiVal, ends[l] == '-' ? NVML_FEATURE_DISABLED : NVML_FEATURE_ENABLED);
        }
        EXPECT(fields[1 + links].nvmlReturn, NVML_ERROR_NOT_SUPPORTED);
        EXPECT(fields[2 + links].nvmlReturn, past_last);
        EXPECT(fields[3 + links].nvmlReturn, NVML_ERROR_NOT_SUPPORTED);
        EXPECT(nvmlDeviceGetFieldValues(device, 1, NULL), NVML_ERROR_INVALID_ARGUMENT);
        EXPECT(nvmlDeviceGetFieldValues((nvmlDevice_t)(size_t)0x1234, 1, fields), NVML_ERROR_INVALID_ARGUMENT);

        unsigned to_device[MAX_DEVICES] = {0}, to_switch = 0;
        for (unsigned l = 0; l < links; l++) {
            const int active = ends[l] != '-';
            unsigned can_p2p = 99;
            EXPECT(nvmlDeviceGetNvLinkCapability(device, l, NVML_NVLINK_CAP_P2P_SUPPORTED, &can_p2p), NVML_SUCCESS);
            EXPECT(can_p2p, active);
            EXPECT(nvmlDeviceGetNvLinkCapability(device, l, NVML_NVLINK_CAP_COUNT, &can_p2p), NVML_ERROR_INVALID_ARGUMENT);
            nvmlEnableState_t state = 99;
            EXPECT(nvmlDeviceGetNvLinkState(device, l, &state), NVML_SUCCESS);
            EXPECT(state, active ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED);
            EXPECT(nvmlDeviceGetNvLinkState(device, l, NULL), NVML_ERROR_INVALID_ARGUMENT);

            nvmlIntNvLinkDeviceType_t type = 99;
            EXPECT(nvmlDeviceGetNvLinkRemoteDeviceType(device, l, &type), NVML_SUCCESS);
            nvmlPciInfo_t remote;
            LegacyPciInfo legacy[2];
            memset(&remote, 0x7f, sizeof remote);
            memset(legacy, 0x7f, sizeof legacy);
            if (!active) {
                EXPECT(type, NVML_NVLINK_DEVICE_TYPE_UNKNOWN);
                EXPECT(nvmlDeviceGetNvLinkRemotePciInfo_v2(device, l, &remote), NVML_ERROR_NOT_SUPPORTED);
                continue;
            }
            EXPECT(nvmlDeviceGetNvLinkRemotePciInfo_v2(device, l, &remote), NVML_SUCCESS);
            if (remote_pci_v1) EXPECT(remote_pci_v1(device, l, &legacy[0]), NVML_SUCCESS);
            unsigned char canary[sizeof(LegacyPciInfo)];
            memset(canary, 0x7f, sizeof canary);
            CHECK(memcmp(&legacy[1], canary, sizeof canary) == 0, "the unversioned call writes NCCL's 52 bytes, no more");
            if (ends[l] == 's') {
                EXPECT(type, NVML_NVLINK_DEVICE_TYPE_SWITCH);
                CHECK(strcmp(remote.busId, "fffffff:ff:ff.0") == 0 && strcmp(legacy[0].busId, "fffffff:ff:ff.0") == 0,
                      "a switch's bus id is NVML's for a far end it cannot show");
                to_switch++;
                continue;
            }
            const unsigned far = (unsigned)(ends[l] - '0');
            EXPECT(type, NVML_NVLINK_DEVICE_TYPE_GPU);
            if (far >= count) continue;
            to_device[far]++;
            CHECK(memcmp(&remote, &pcis[far], sizeof remote) == 0, "device %u link %u: remote PCI %s is device %u's (%s)", d, l,
                  remote.busId, far, pcis[far].busId);
            CHECK(strcmp(legacy[0].busId, pcis[far].busIdLegacy) == 0 && legacy[0].bus == pcis[far].bus &&
                      legacy[0].domain == pcis[far].domain && legacy[0].device == pcis[far].device,
                  "device %u link %u: legacy remote PCI %s is device %u's (%s)", d, l, legacy[0].busId, far, pcis[far].busIdLegacy);
        }

        // Past the last link (and past NVML's 18), as NVML answers.
        nvmlEnableState_t state;
        unsigned can_p2p;
        nvmlPciInfo_t remote;
        nvmlIntNvLinkDeviceType_t type;
        EXPECT(nvmlDeviceGetNvLinkState(device, links, &state), past_last);
        EXPECT(nvmlDeviceGetNvLinkState(device, NVML_NVLINK_MAX_LINKS, &state), past_last);
        EXPECT(nvmlDeviceGetNvLinkCapability(device, links, NVML_NVLINK_CAP_P2P_SUPPORTED, &can_p2p), past_last);
        EXPECT(nvmlDeviceGetNvLinkRemotePciInfo_v2(device, links, &remote), past_last);
        EXPECT(nvmlDeviceGetNvLinkRemoteDeviceType(device, links, &type), past_last);

        // NVML's peer status agrees: NVLink between two devices when a link joins them.
        for (unsigned e = 0; e < count; e++) {
            if (e == d) continue;
            nvmlGpuP2PStatus_t p2p = NVML_P2P_STATUS_UNKNOWN;
            EXPECT(nvmlDeviceGetP2PStatus(device, devices[e], NVML_P2P_CAPS_INDEX_NVLINK, &p2p), NVML_SUCCESS);
            int joined = to_device[e] > 0 || (to_switch > 0 && strchr(expected[e], 's') != NULL);
            EXPECT(p2p, joined ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED);
        }

        printf("device %u: %u links;", d, links);
        for (unsigned e = 0; e < count; e++)
            if (to_device[e]) printf(" %u to device %u;", to_device[e], e);
        printf(" %u to a switch\n", to_switch);
    }
    EXPECT(nvmlShutdown(), NVML_SUCCESS);
    printf("PASSED: %d failure(s)\n", failures);
    return failures != 0;
}
