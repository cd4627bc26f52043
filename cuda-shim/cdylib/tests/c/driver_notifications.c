// Async notifications (cuDeviceRegisterAsyncNotification) against the emulated device: the
// runner lowers the slice's quota below what this program holds, and every registered callback
// hears "over budget" with the bytes by which the tenant is over, on a thread of its own; a
// callback may not register or unregister; an unregistered callback hears nothing more.
//   stdout: "allocated" once it holds HELD bytes; then it waits for a line on stdin (the runner
//   has lowered the quota) and reports.
#include "driver_expect.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const size_t HELD = 48u << 20;

static volatile int calls[2];
static volatile unsigned long long over_by[2];
static volatile CUresult register_inside = CUDA_SUCCESS;
static volatile int other_thread = 0;
static pthread_t main_thread;
static CUasyncCallbackHandle handles[2];

static void heard(CUasyncNotificationInfo *info, void *user_data, CUasyncCallbackHandle callback) {
    int which = (int)(intptr_t)user_data;
    if (info->type == CU_ASYNC_NOTIFICATION_TYPE_OVER_BUDGET) over_by[which] = info->info.overBudget.bytesOverBudget;
    other_thread = !pthread_equal(pthread_self(), main_thread);
    CUasyncCallbackHandle extra;
    register_inside = cuDeviceRegisterAsyncNotification(0, heard, NULL, &extra);
    if (callback != handles[which]) printf("FAIL: callback %d got another handle\n", which);
    calls[which]++;
}

int main(void) {
    main_thread = pthread_self();
    CUdeviceptr held;
    use_primary_context(NULL);

    EXPECT(cuDeviceRegisterAsyncNotification(0, NULL, NULL, &handles[0]), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDeviceRegisterAsyncNotification(0, heard, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDeviceRegisterAsyncNotification(7, heard, NULL, &handles[0]), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuDeviceRegisterAsyncNotification(0, heard, (void *)0, &handles[0]), CUDA_SUCCESS);
    EXPECT(cuDeviceRegisterAsyncNotification(0, heard, (void *)1, &handles[1]), CUDA_SUCCESS);
    if (handles[0] == handles[1] || !handles[0]) printf("FAIL: handles %p and %p\n", (void *)handles[0], (void *)handles[1]), failures++;
    EXPECT(cuDeviceUnregisterAsyncNotification(0, (CUasyncCallbackHandle)(uintptr_t)0x999990), CUDA_ERROR_INVALID_VALUE);

    EXPECT(cuMemAlloc(&held, HELD), CUDA_SUCCESS);
    printf("allocated\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;

    // The notice comes with a reply the program reads: the server sends it when it has applied
    // the resize, which may be just after the reply to a call made at once.
    size_t free_bytes = 0, total = 0;
    for (int i = 0; i < 500 && !(calls[0] && calls[1]); i++) {
        EXPECT(cuMemGetInfo(&free_bytes, &total), CUDA_SUCCESS);
        usleep(10000);
    }
    printf("quota now %zu MiB\n", total >> 20);
    printf("callbacks heard: %d %d\n", calls[0], calls[1]);
    printf("over budget by %llu MiB and %llu MiB\n", over_by[0] >> 20, over_by[1] >> 20);
    printf("on another thread: %s\n", other_thread ? "yes" : "no");
    printf("registering inside a callback: %s\n", name_of(register_inside));

    // Unregistered, the first callback hears nothing more; the second still may.
    EXPECT(cuDeviceUnregisterAsyncNotification(0, handles[0]), CUDA_SUCCESS);
    EXPECT(cuDeviceUnregisterAsyncNotification(0, handles[0]), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDeviceUnregisterAsyncNotification(0, handles[1]), CUDA_SUCCESS);
    EXPECT(cuMemFree(held), CUDA_SUCCESS);
    return finish();
}
