// ipc: CUDA IPC as Open MPI's smcuda and the vineyard GPU store use it. The parent exports a 1 MiB
// allocation and starts a second process of this program, which measures (and emits):
//   ipc_open   cudaIpcOpenMemHandle of a handle the process does not have open (a real mapping,
//              then closed): p50 over 50 rounds, and the very first open
//   ipc_reopen cudaIpcOpenMemHandle of a handle the process has open (a counted reference, as the
//              driver keeps them; Open MPI measured about 100 us per real open and caches): each of
//              1000 opens timed, each followed by its close (p50/p99/p99.9)
// The child reads the first value through the mapping (checked). Options: --quick (200 reopens).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

extern char **environ;

using bench::Clock;

static const float VALUE = 42.5f;

static int child(const char *hex, bool quick) {
    cudaIpcMemHandle_t handle;
    unsigned char *bytes = reinterpret_cast<unsigned char *>(&handle);
    for (size_t i = 0; i < sizeof handle; i++) sscanf(hex + 2 * i, "%2hhx", &bytes[i]);
    bool ok = true;
    bench::section("ipc_open", [&] {
        std::vector<double> us;
        double first = 0;
        for (int i = 0; i < 51; i++) {
            void *p = nullptr;
            auto a = Clock::now();
            CK(cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess));
            double t = bench::us_between(a, Clock::now());
            if (i == 0) {
                first = t;
                float got = 0;
                CK(cudaMemcpy(&got, p, sizeof got, cudaMemcpyDeviceToHost));
                ok = got == VALUE;
            } else {
                us.push_back(t);
            }
            CK(cudaIpcCloseMemHandle(p));
        }
        auto st = bench::stats(us);
        bench::Json("ipc_open").num("first_us", first).lat(st).emit();
        bench::note("ipc: first open %.1f us; open of a closed handle p50 %.1f us", first, st.p50);
    });
    bench::section("ipc_reopen", [&] {
        void *held = nullptr;
        CK(cudaIpcOpenMemHandle(&held, handle, cudaIpcMemLazyEnablePeerAccess));
        std::vector<double> us;
        int n = quick ? 200 : 1000;
        for (int i = 0; i < n; i++) {
            void *p = nullptr;
            auto a = Clock::now();
            CK(cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess));
            us.push_back(bench::us_between(a, Clock::now()));
            ok = ok && p == held;
            CK(cudaIpcCloseMemHandle(p));
        }
        CK(cudaIpcCloseMemHandle(held));
        auto st = bench::stats(us);
        bench::Json("ipc_reopen").lat(st).emit();
        bench::note("ipc: reopen of an open handle p50 %.2f us, p99 %.2f us", st.p50, st.p99);
    });
    bench::Json("ipc_check").boolean("ok", ok).emit();
    return ok ? 0 : 2;
}

static int run(const bench::Args &args) {
    CK(cudaFree(nullptr));
    bench::emit_meta("ipc");
    float *buf = nullptr;
    CK(cudaMalloc(&buf, 1 << 20));
    CK(cudaMemcpy(buf, &VALUE, sizeof VALUE, cudaMemcpyHostToDevice));
    cudaIpcMemHandle_t handle;
    CK(cudaIpcGetMemHandle(&handle, buf));
    char hex[2 * sizeof handle + 1];
    const unsigned char *bytes = reinterpret_cast<const unsigned char *>(&handle);
    for (size_t i = 0; i < sizeof handle; i++) snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return 2;
    self[len] = 0;
    char child_arg[] = "--child", quick_arg[] = "--quick";
    char *argv[] = {self, child_arg, hex, args.has("--quick") ? quick_arg : nullptr, nullptr};
    fflush(stdout);
    pid_t pid;
    if (posix_spawn(&pid, self, nullptr, nullptr, argv, environ) != 0) return 2;
    int status = 0;
    waitpid(pid, &status, 0);
    CK(cudaFree(buf));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 2;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "--child") == 0) return child(argv[2], argc >= 4 && strcmp(argv[3], "--quick") == 0);
    return bench::guarded_main(argc, argv, run);
}
