#!/usr/bin/env bash
# gpu-tests/run.sh: build the gpu-tests CUDA programs, run each natively and through Flyt (one
# flyt-rpc-server on this machine, over TCP loopback, a Unix socket and the shared-memory channel),
# compare stdout (and stderr where it matters) and exit status, run the soak and fault rows, and
# print a table. Plain bash + coreutils + a C compiler; run it on the GPU machine. See README.md.
set -uo pipefail

usage() {
    cat <<'EOF'
usage: gpu-tests/run.sh [options]
  --dist DIR          Flyt binaries: DIR/lib/libcudart.so.13 and DIR/bin/flyt-rpc-server (default: dist)
  --arch SM           nvcc -arch value (default: sm_90)
  --transports LIST   comma-separated, from tcp,unix,shm,vm (default: tcp,unix,shm); vm is TCP with
                      the segment a slot of an ivshmem region (a VM guest's channel, the guest
                      played by a process on the host); shm is the Unix
                      socket with the shared-memory channel required (FLYT_SHM=on), tcp and unix
                      run with it off
  --tls               the server requires TLS on TCP (a CA and certificate made for the run with
                      flytctl tls-init); the tcp rows run over TLS (FLYT_TLS_CA) and say tcp+tls
  --out DIR           results: table.md, LATEST.md, log.txt, soak.log, server.log, build.log
                      (default: gpu-tests/results)
  --only NAME...      run only these programs (file names without .cu; fault_isolation, fault_victim or
                      fault_kernel select the fault-isolation pair); commas also separate names.
                      Soak rows still run unless --soak none is given.
  --native-only       no Flyt: run every program natively twice and compare the runs (determinism check)
  --build-only        only build the programs (exit 1 if any fails to build)
  --build-dir DIR     where the programs are built (default: gpu-tests/build, gpu-tests/build-static
                      with --runtime static)
  --runtime KIND      how the programs link CUDA's runtime: shared (nvcc -cudart=shared; Flyt apps
                      load Flyt's libcudart.so.13) or static (nvcc's default; NVIDIA's runtime inside
                      the program loads Flyt's libcuda.so.1) (default: shared). The programs in
                      libraries/ (cuBLAS, cuBLASLt, cuFFT, cuRAND, cuSPARSE, cuSOLVER) run with
                      both: each library's own runtime reaches the GPU through Flyt's libcuda.so.1,
                      as Flyt's libcudart.so.13 does (one session per process)
  --no-libraries      leave out the programs in libraries/ (CI: its toolkit has no CUDA libraries)
  --python PATH       also run the PyTorch scripts in torch/ (as torch_NAME) and the framework
                      scripts in frameworks/ (JAX, CuPy, Triton, ...; as fw_NAME) with this Python, which
                      has torch (e.g. /opt/torch/.venv/bin/python); PyTorch brings its own CUDA
                      runtime, so through Flyt they reach the GPU through Flyt's libcuda.so.1
  --device NAME       the server's --device (default: cuda; 'emulated' only checks the plumbing)
  --timeout SECONDS   limit for each program run (default: 120)
  --nvcc PATH         the compiler (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc)
  --prebuilt DIR      the programs were built elsewhere (gpu-tests/build-with-nvcc: another nvcc
                      than this machine's): run DIR's, build none (the helpers in tools/ are
                      still built, into DIR); a program missing from DIR fails its rows
  --apps DIR          also run the executables in DIR as programs of their own name, built
                      elsewhere (NVIDIA's cuda-samples: gpu-tests/nvidia-samples.sh builds them)
  --gpus LIST         the GPUs (comma-separated ordinals) every run sees: natively through
                      CUDA_VISIBLE_DEVICES, through Flyt as the one server's GPUs, in one session
                      (default: 0)
  --native-lib DIR    put DIR first on the library path of native runs (the libcudart.so.13 of
                      the toolkit that built --prebuilt programs, as an app ships its runtime)
  --no-hide           do not hide the local GPU from Flyt apps (default: every Flyt app runs in a
                      mount namespace where /dev/nvidia* and the NVIDIA driver libraries are hidden)
  --no-lib-check      do not LD_PRELOAD tools/maps_check.so into Flyt apps (default: check that no
                      NVIDIA driver library is mapped and that libcudart is DIR/lib's)
  --serial            run the Flyt transports of a program one after the other (default: together)
  --soak LIST         soak and fault rows to run: tenants,kills,worker-kill,stall, 'all' (default)
                      or 'none'
  --tenants N         apps at once per transport in the tenants row (default: 64)
  --kills N           abrupt kills in the kills row, spread over the transports (default: 1000)
  --kill-parallel N   apps running (and being killed) at once in the kills row (default: 16)
  --kill-time S       the kills row starts no new app after S seconds (default: 180)
  --warm-workers N    the server's --warm-workers (default: 16; sessions start faster in the soak)
  --budget S          no soak row starts after S seconds of run time, and the kills row starts no
                      app after it (default: 480)
Environment: NVCC_FLAGS adds flags to every nvcc command (e.g. -L.cuda/lib to link against a
fetched toolkit); CC is the C compiler for the helpers in tools/ (default: cc).
Exit status: 0 when every row passed, 1 when a row failed, 2 on a usage or setup error.
EOF
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
START_SECONDS=$SECONDS
CMDLINE="gpu-tests/run.sh $*"

die() {
    echo "run.sh: $*" >&2
    exit 2
}
abspath() {
    case $1 in
        /*) printf '%s\n' "$1" ;;
        *) printf '%s\n' "$PWD/$1" ;;
    esac
}

DIST=dist
ARCH=sm_90
TRANSPORTS=tcp,unix,shm
OUT=$here/results
BUILD=
RUNTIME=shared
LIBRARIES=1
PYTHON=
MODE=flyt
DEVICE=cuda
TIMEOUT=120
NVCC=${NVCC:-}
ONLY=()
HIDE=1
LIB_CHECK=1
SERIAL=0
SOAK=all
TENANTS=64
KILLS=1000
KILL_PAR=16
KILL_TIME=180
WARM_WORKERS=16
BUDGET=480
TLS=0
IVSHMEM_DIR= # the vm transport's region folder, in /dev/shm
PREBUILT=0
NATIVE_LIB=
APPS=
GPUS=

need_value() { if [ $# -lt 2 ] || [ -z "$2" ]; then die "$1 needs a value"; fi; }
need_number() { case $2 in '' | *[!0-9]*) die "$1 must be a whole number" ;; esac; }
while [ $# -gt 0 ]; do
    case $1 in
        --dist) need_value "$@"; DIST=$2; shift 2 ;;
        --arch) need_value "$@"; ARCH=$2; shift 2 ;;
        --transports) need_value "$@"; TRANSPORTS=$2; shift 2 ;;
        --out) need_value "$@"; OUT=$2; shift 2 ;;
        --build-dir) need_value "$@"; BUILD=$2; shift 2 ;;
        --runtime) need_value "$@"; RUNTIME=$2; shift 2 ;;
        --no-libraries) LIBRARIES=0; shift ;;
        --tls) TLS=1; shift ;;
        --python) need_value "$@"; PYTHON=$2; shift 2 ;;
        --device) need_value "$@"; DEVICE=$2; shift 2 ;;
        --timeout) need_value "$@"; need_number "$@"; TIMEOUT=$2; shift 2 ;;
        --nvcc) need_value "$@"; NVCC=$2; shift 2 ;;
        --prebuilt) need_value "$@"; PREBUILT=1; BUILD=$2; shift 2 ;;
        --native-lib) need_value "$@"; NATIVE_LIB=$2; shift 2 ;;
        --apps) need_value "$@"; APPS=$2; shift 2 ;;
        --gpus) need_value "$@"; GPUS=$2; shift 2 ;;
        --native-only) MODE=native; shift ;;
        --build-only) MODE=build; shift ;;
        --no-hide) HIDE=0; shift ;;
        --no-lib-check) LIB_CHECK=0; shift ;;
        --serial) SERIAL=1; shift ;;
        --soak) need_value "$@"; SOAK=$2; shift 2 ;;
        --tenants) need_value "$@"; need_number "$@"; TENANTS=$2; shift 2 ;;
        --kills) need_value "$@"; need_number "$@"; KILLS=$2; shift 2 ;;
        --kill-parallel) need_value "$@"; need_number "$@"; KILL_PAR=$2; shift 2 ;;
        --kill-time) need_value "$@"; need_number "$@"; KILL_TIME=$2; shift 2 ;;
        --warm-workers) need_value "$@"; need_number "$@"; WARM_WORKERS=$2; shift 2 ;;
        --budget) need_value "$@"; need_number "$@"; BUDGET=$2; shift 2 ;;
        --only)
            shift
            while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do
                IFS=, read -r -a names <<<"$1"
                ONLY+=("${names[@]}")
                shift
            done
            [ ${#ONLY[@]} -gt 0 ] || die "--only needs at least one name"
            ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[ "$KILL_PAR" -ge 1 ] || die "--kill-parallel must be at least 1"

case $RUNTIME in shared | static) ;; *) die "--runtime: shared or static, not '$RUNTIME'" ;; esac
[ -n "$BUILD" ] || BUILD=$here/build$([ "$RUNTIME" = static ] && echo -static)
DIST=$(abspath "$DIST")
OUT=$(abspath "$OUT")
BUILD=$(abspath "$BUILD")
if [ $PREBUILT = 1 ]; then
    [ -d "$BUILD" ] || die "--prebuilt: $BUILD is not a folder"
    [ "$MODE" = build ] && die "--prebuilt and --build-only exclude each other"
fi
if [ -n "$NATIVE_LIB" ]; then
    [ -f "$NATIVE_LIB/libcudart.so.13" ] || die "--native-lib: no libcudart.so.13 in $NATIVE_LIB"
    NATIVE_LIB=$(abspath "$NATIVE_LIB")
fi

IFS=, read -r -a TRANSPORT_LIST <<<"$TRANSPORTS"
for t in "${TRANSPORT_LIST[@]}"; do
    case $t in tcp | unix | shm | vm) ;; *) die "unknown transport '$t' (tcp, unix, shm, vm)" ;; esac
done
[ ${#TRANSPORT_LIST[@]} -gt 0 ] || die "no transports"

declare -A SOAK_ON=()
case $SOAK in
    all) SOAK_ON=([tenants]=1 [kills]=1 [worker-kill]=1 [stall]=1) ;;
    none) ;;
    *)
        IFS=, read -r -a soak_names <<<"$SOAK"
        for s in "${soak_names[@]}"; do
            case $s in tenants | kills | worker-kill | stall) SOAK_ON[$s]=1 ;; *) die "--soak: unknown row '$s' (tenants, kills, worker-kill, stall, all, none)" ;; esac
        done
        ;;
esac

# A Flyt session is served the server's GPUs (its first unless --gpus names several): on a host
# with more, the native reference runs see those too, or device counts and peer answers would
# differ by design. The server sees them renumbered from 0, as CUDA_VISIBLE_DEVICES makes it.
if [ -n "$GPUS" ]; then
    export CUDA_VISIBLE_DEVICES=$GPUS
else
    [ -n "${CUDA_VISIBLE_DEVICES+set}" ] || export CUDA_VISIBLE_DEVICES=0
fi
IFS=, read -r -a gpu_names <<<"$CUDA_VISIBLE_DEVICES"
SERVER_GPUS=$(seq -s, 0 $((${#gpu_names[@]} - 1)))

if [ "$MODE" = flyt ]; then
    [ -f "$DIST/lib/libcudart.so.13" ] || die "$DIST/lib/libcudart.so.13 not found (--dist)"
    [ -f "$DIST/lib/libcuda.so.1" ] || die "$DIST/lib/libcuda.so.1 not found (--dist)"
    [ -x "$DIST/bin/flyt-rpc-server" ] || die "$DIST/bin/flyt-rpc-server not found or not executable (--dist)"
fi

# ---- programs ----------------------------------------------------------------------------------
# The fault-isolation pair runs together (victim, then the faulter while the victim runs).
PAIR_VICTIM=fault_victim
PAIR_FAULTER=fault_kernel
# Programs the soak rows start themselves; never run as rows of their own.
SOAK_ONLY=(churn hold_call stall_pair)
# Programs whose stderr is compared with the native run's too (after dropping Flyt's own lines,
# `flyt: ...` and `flyt stats: ...`): the device assert message, and printf's empty stderr.
STDERR_COMPARE=(assert_fail printf)
# Programs Flyt does not support yet: natively they must PASS; through Flyt they must exit with a
# status from 1 to 123 (a checked failure, not a crash or a timeout, and never 0) and stderr must
# name an unsupported function matching the pattern, e.g.
#   [some_program]='cu(da)?(SomeCall|OtherCall)'
# None at the moment.
declare -A EXPECT_UNSUPPORTED=()
# Programs whose kernels use host memory in place (pinned memory not asked for as mapped, the
# app's own memory): through Flyt they need the shared-memory channel (transport shm); over a
# socket alone they must fail loudly like the programs above. Mapped memory (cudaHostAllocMapped,
# which cuDNN and NCCL allocate) and managed memory (cudaMallocManaged: managed_memory runs as
# natively on every transport) are mirrored device memory over a socket, exchanged at launches,
# copies and syncs.
declare -A NEEDS_SHM_CHANNEL=(
    [mapped_memory]='pinned host memory is device-accessible only over the shared-memory channel'
    [shared_file_mapped]='reaches the app.s own memory only over the shared-memory channel'
    [mapped_malloc]='reaches the app.s own memory only over the shared-memory channel'
)
# The tenants row's mix: programs (with arguments) whose output does not depend on timing under load.
TENANT_MIX=("hello_flyt" "vector_add" "kernel_args" "errors" "printf" "assert_fail" "memcpy_kinds"
    "streams_events" "per_thread_stream" "multithread" "device_info" "registered_streams 5")

# Extra nvcc flags per program; a library program names its libraries on its first line
# (`// link: -lcublas`), found at run time through an rpath to the compiler's lib64.
nvcc_flags_for() {
    case $1 in
        per_thread_stream) echo "--default-stream per-thread" ;;
        # NVML by dlopen, as NCCL loads it (dlopen is in libc from glibc 2.34; older needs -ldl).
        nvlink_topology) echo "-ldl" ;;
        # A driver API program: linked against the toolkit's libcuda stub (NVCC_FLAGS may name
        # another folder holding a libcuda.so).
        jit_link | vmm | vmm_share | no_context | graph_nodes | graph_getters | stream_memops | tensor_map | arrays_planar_sparse | green_contexts | launch_extra | cudasys) echo "-L$(dirname "$(command -v "$NVCC")")/../lib64/stubs -lcuda" ;;
        *)
            if [ -f "$here/libraries/$1.cu" ]; then
                echo "$(sed -n '1s|^// link: ||p' "$here/libraries/$1.cu") -Xlinker -rpath=$(dirname "$(command -v "$NVCC")")/../lib64"
            fi
            ;;
    esac
}
source_of() { # the source of program $1: a .cu file, torch/NAME.py for torch_NAME, frameworks/NAME.py for fw_NAME
    case $1 in
        torch_*) echo "$here/torch/${1#torch_}.py" ;;
        fw_*) echo "$here/frameworks/${1#fw_}.py" ;;
        *) if [ -f "$here/libraries/$1.cu" ]; then echo "$here/libraries/$1.cu"; else echo "$here/$1.cu"; fi ;;
    esac
}

in_list() { # NAME LIST...
    local n=$1 x
    shift
    for x in "$@"; do [ "$x" = "$n" ] && return 0; done
    return 1
}

ALL=()
for f in "$here"/*.cu; do
    [ -e "$f" ] || continue
    n=$(basename "$f" .cu)
    ALL+=("$n")
done
[ ${#ALL[@]} -gt 0 ] || die "no .cu files in $here"
# Library programs: with either runtime (with shared, the app's runtime is Flyt's libcudart.so.13
# and each library carries NVIDIA's: both run over Flyt's libcuda.so.1, in one session).
if [ $LIBRARIES = 1 ]; then
    for f in "$here"/libraries/*.cu; do
        [ -e "$f" ] && ALL+=("$(basename "$f" .cu)")
    done
fi

# Outside programs (--apps), taken as they are.
declare -A APP_PATH=()
if [ -n "${APPS:-}" ]; then
    [ -d "$APPS" ] || die "--apps: $APPS is not a folder"
    for f in "$APPS"/*; do
        [ -f "$f" ] && [ -x "$f" ] || continue
        n=$(basename "$f")
        APP_PATH[$n]=$(abspath "$f")
        ALL+=("$n")
    done
fi

# PyTorch scripts, named torch_NAME.
if [ -n "$PYTHON" ]; then
    [ -x "$PYTHON" ] || die "--python: $PYTHON is not executable"
    for f in "$here"/torch/*.py; do
        [ -e "$f" ] && ALL+=("torch_$(basename "$f" .py)")
    done
    for f in "$here"/frameworks/*.py; do
        [ -e "$f" ] && ALL+=("fw_$(basename "$f" .py)")
    done
fi

# JAX takes 75% of the GPU's memory as it starts (XLA's preallocation), paging's tenants 75% and
# paging_addresses' 60% between them: their transports run one after another, as their native
# runs run alone (three at once cannot each have that much; the ones refused fail their
# allocations, 2026-11-29 on an H200).
takes_most_of_the_gpu() { case "$1" in fw_jax_* | paging | paging_addresses) return 0 ;; esac; return 1; }

selected() { # is program $1 selected by --only?
    [ ${#ONLY[@]} -eq 0 ] && return 0
    local o
    for o in "${ONLY[@]}"; do
        [ "$o" = "$1" ] && return 0
        if [ "$1" = "$PAIR_VICTIM" ] || [ "$1" = "$PAIR_FAULTER" ]; then
            case $o in fault_isolation | "$PAIR_VICTIM" | "$PAIR_FAULTER") return 0 ;; esac
        fi
    done
    return 1
}
for o in "${ONLY[@]}"; do
    ok=0
    for n in "${ALL[@]}" fault_isolation; do [ "$o" = "$n" ] && ok=1; done
    [ $ok = 1 ] || die "--only: no program named '$o' (have: ${ALL[*]} fault_isolation)"
    in_list "$o" "${SOAK_ONLY[@]}" && die "--only: $o is run by the soak rows (--soak), not alone"
done

PROGS=() # programs run alone
RUN_PAIR=0
for n in "${ALL[@]}"; do
    in_list "$n" "${SOAK_ONLY[@]}" && continue
    selected "$n" || continue
    if [ "$n" = "$PAIR_VICTIM" ] || [ "$n" = "$PAIR_FAULTER" ]; then
        RUN_PAIR=1
    else
        PROGS+=("$n")
    fi
done
if [ $RUN_PAIR = 1 ]; then
    if [ ! -f "$here/$PAIR_VICTIM.cu" ] || [ ! -f "$here/$PAIR_FAULTER.cu" ]; then die "fault pair incomplete"; fi
fi
[ "$MODE" = flyt ] || SOAK_ON=()

if [ -z "$NVCC" ] && [ $PREBUILT = 0 ]; then
    if command -v nvcc >/dev/null 2>&1; then
        NVCC=nvcc
    elif [ -x /usr/local/cuda/bin/nvcc ]; then
        NVCC=/usr/local/cuda/bin/nvcc
    else
        die "nvcc not found (use --nvcc)"
    fi
fi
CC=${CC:-cc}

# ---- state and cleanup -------------------------------------------------------------------------
mkdir -p "$OUT" "$BUILD" || die "cannot create $OUT or $BUILD"
TABLE=$OUT/table.md
LATEST=$OUT/LATEST.md
LOG=$OUT/log.txt
SOAK_LOG=$OUT/soak.log
SERVER_LOG=$OUT/server.log
BUILD_LOG=$OUT/build.log
rm -f "$TABLE" "$LATEST" "$LOG" "$SOAK_LOG" "$SERVER_LOG" "$BUILD_LOG"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/flyt-gpu-tests.XXXXXX") || die "mktemp failed"

SERVER_PID=
BG_PIDS=()     # background subshells
BG_PIDFILES=() # pid files of the programs those run
STOPPED_PIDS=()

cleanup() {
    local p f
    for p in "${STOPPED_PIDS[@]}"; do kill -CONT "$p" 2>/dev/null; done
    for f in "${BG_PIDFILES[@]}" "$TMP"/*.pid; do
        if [ -s "$f" ]; then
            p=$(cat "$f" 2>/dev/null)
            [ -n "$p" ] && kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
        fi
    done
    for p in "${BG_PIDS[@]}"; do
        kill -0 "$p" 2>/dev/null && kill -TERM "$p" 2>/dev/null
    done
    if [ -n "$SERVER_PID" ]; then
        stop_server
    fi
    rm -rf "$TMP"
    [ -z "$IVSHMEM_DIR" ] || rm -rf "$IVSHMEM_DIR"
}
trap cleanup EXIT
trap 'echo "run.sh: interrupted" >&2; exit 130' INT TERM HUP

# The server runs in a process group of its own (setsid), so its workers can be stopped with it.
stop_server() {
    local i
    [ -n "$SERVER_PID" ] || return 0
    kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null
    for i in $(seq 1 50); do
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL -- "-$SERVER_PID" 2>/dev/null
    kill -KILL "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID" 2>/dev/null
    SERVER_PID=
}

log() { printf '%s\n' "$*" >>"$LOG"; }
slog() { printf '%s\n' "$*" >>"$SOAK_LOG"; }

# Appends a file to the log (or TARGET), at most its last 300 lines.
log_file() {
    local title=$1 file=$2 target=${3:-$LOG} lines
    lines=$(wc -l <"$file" 2>/dev/null || echo 0)
    if [ "$lines" -gt 300 ]; then
        echo "--- $title (last 300 of $lines lines) ---" >>"$target"
        tail -n 300 "$file" >>"$target"
    else
        echo "--- $title ---" >>"$target"
        cat "$file" >>"$target" 2>/dev/null
    fi
    # A file without a final newline must not glue onto the next header.
    if [ -s "$file" ] && [ "$(tail -c 1 "$file" | od -An -c | tr -d ' ')" != '\n' ]; then
        echo "" >>"$target"
    fi
}

GPU_LINE=
if command -v nvidia-smi >/dev/null 2>&1; then
    GPU_LINE=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
fi
if [ $PREBUILT = 1 ]; then
    NVCC_LINE="programs prebuilt in $BUILD by $(cat "$BUILD/nvcc.txt" 2>/dev/null || echo "an unrecorded nvcc")"
else
    NVCC_LINE="$(command -v "$NVCC") ($("$NVCC" --version 2>/dev/null | grep -i release | head -n 1))"
fi
{
    echo "gpu-tests run, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), mode $MODE, arch $ARCH, transports $TRANSPORTS"
    echo "command: $CMDLINE"
    echo "nvcc: $NVCC_LINE"
    [ -n "$GPU_LINE" ] && echo "gpu: $GPU_LINE"
    [ "$MODE" = flyt ] && echo "dist: $DIST"
} >>"$LOG"

# ---- build -------------------------------------------------------------------------------------
TO_BUILD=("${PROGS[@]}")
[ $RUN_PAIR = 1 ] && TO_BUILD+=("$PAIR_VICTIM" "$PAIR_FAULTER")
if [ "$MODE" = build ]; then
    TO_BUILD=("${ALL[@]}")
elif [ ${#SOAK_ON[@]} -gt 0 ]; then
    for n in "${SOAK_ONLY[@]}"; do [ -f "$here/$n.cu" ] && TO_BUILD+=("$n"); done
    for e in "${TENANT_MIX[@]}"; do
        n=${e%% *}
        [ -f "$here/$n.cu" ] && ! in_list "$n" "${TO_BUILD[@]}" && TO_BUILD+=("$n")
    done
fi
declare -A BUILT=()
build_pids=()
for n in "${TO_BUILD[@]}"; do
    # shellcheck disable=SC2046,SC2086  # flags are deliberately word-split
    (
        set -x
        case $n in
            # A PyTorch script "builds" into a launcher that runs it with --python's interpreter.
            torch_* | fw_*) rm -f "$BUILD/$n" && printf '#!/bin/sh\nexec %q %q "$@"\n' "$PYTHON" "$(source_of "$n")" >"$BUILD/$n" && chmod +x "$BUILD/$n" ;;
            # An outside program (--apps): taken as it is.
            *) if [ -n "${APP_PATH[$n]:-}" ]; then
                   cp "${APP_PATH[$n]}" "$BUILD/$n"
               # Built elsewhere by another nvcc (--prebuilt): taken as it is.
               elif [ $PREBUILT = 1 ]; then
                   [ -x "$BUILD/$n" ] || { echo "--prebuilt: $BUILD/$n missing" >&2; exit 1; }
               else
                   rm -f "$BUILD/$n"
                   "$NVCC" -cudart="$RUNTIME" -arch="$ARCH" $(nvcc_flags_for "$n") ${NVCC_FLAGS:-} -o "$BUILD/$n" "$(source_of "$n")"
               fi ;;
        esac
    ) >"$TMP/$n.build" 2>&1 &
    build_pids+=($!)
done
# The helpers: hide_gpu (mount namespace) and maps_check.so (LD_PRELOADed into Flyt runs).
HIDE_BIN=$BUILD/hide_gpu
MAPS_SO=$BUILD/maps_check.so
(
    set -x
    "$CC" -O2 -Wall -o "$HIDE_BIN" "$here/tools/hide_gpu.c" &&
        "$CC" -O2 -Wall -shared -fPIC -o "$MAPS_SO" "$here/tools/maps_check.c"
) >"$TMP/tools.build" 2>&1 &
tools_pid=$!
BUILD_FAILED=()
i=0
for n in "${TO_BUILD[@]}"; do
    if wait "${build_pids[$i]}" && [ -x "$BUILD/$n" ]; then
        BUILT[$n]=1
        echo "=== $n: built" >>"$BUILD_LOG"
    else
        BUILD_FAILED+=("$n")
        echo "=== $n: BUILD FAILED" >>"$BUILD_LOG"
    fi
    cat "$TMP/$n.build" >>"$BUILD_LOG"
    i=$((i + 1))
done
TOOLS_OK=0
if wait "$tools_pid" && [ -x "$HIDE_BIN" ] && [ -f "$MAPS_SO" ]; then
    TOOLS_OK=1
    echo "=== tools (hide_gpu, maps_check.so): built" >>"$BUILD_LOG"
else
    BUILD_FAILED+=(tools)
    echo "=== tools (hide_gpu, maps_check.so): BUILD FAILED" >>"$BUILD_LOG"
fi
cat "$TMP/tools.build" >>"$BUILD_LOG"
echo "built ${#BUILT[@]} of ${#TO_BUILD[@]} programs and $([ $TOOLS_OK = 1 ] && echo the || echo NOT the) tools into $BUILD${BUILD_FAILED[*]:+; failed: ${BUILD_FAILED[*]}}"
if [ "$MODE" = build ]; then
    [ ${#BUILD_FAILED[@]} -eq 0 ] && exit 0
    cat "$BUILD_LOG" >&2
    exit 1
fi

# ---- hiding the local GPU from Flyt apps ---------------------------------------------------------
# HIDE_LIST holds the lines hide_gpu acts on: device nodes and driver library files get /dev/null
# bind-mounted over them, folders of NVIDIA files only get an empty tmpfs.
HIDE_LIST=$TMP/hide.list
HIDE_NOTE="no (--no-hide)"
make_hide_list() {
    local d f real dirs=() seen_files=" " tmpfs_dirs=()
    : >"$HIDE_LIST"
    for d in /dev/nvidia*; do
        [ -e "$d" ] || continue
        if [ -c "$d" ]; then
            echo "bind $d" >>"$HIDE_LIST"
        elif [ -d "$d" ]; then
            echo "tmpfs $d" >>"$HIDE_LIST"
        fi
    done
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /proc/driver/nvidia; do
        if [ -d "$d" ]; then
            echo "tmpfs $d" >>"$HIDE_LIST"
            tmpfs_dirs+=("$(readlink -f "$d")")
        fi
    done
    # Folders that may hold driver libraries: the loader cache's, the usual system ones, CUDA's
    # forward-compatibility folder and everything on LD_LIBRARY_PATH.
    while read -r f; do dirs+=("$(dirname "$f")"); done < <(
        (ldconfig -p 2>/dev/null || true) | awk '/(libcuda\.so|libnvidia-)/ {print $NF}')
    dirs+=(/usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 /lib64 /usr/lib /lib
        /usr/local/cuda/compat /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
    IFS=: read -r -a ldp <<<"${LD_LIBRARY_PATH:-}"
    dirs+=("${ldp[@]}")
    for d in "${dirs[@]}"; do
        [ -n "$d" ] && [ -d "$d" ] || continue
        d=$(readlink -f "$d")
        local skip=0 t
        for t in "${tmpfs_dirs[@]}"; do case $d/ in "$t"/*) skip=1 ;; esac; done
        [ "$d" = "$(readlink -f "$DIST/lib")" ] && skip=1
        [ $skip = 1 ] && continue
        for f in "$d"/libcuda.so* "$d"/libcudadebugger.so* "$d"/libnvidia-*.so*; do
            [ -e "$f" ] || continue
            real=$(readlink -f "$f")
            [ -f "$real" ] || continue
            # A link into a folder the tmpfs already hides dangles in the namespace: hidden too.
            local inside=0
            for t in "${tmpfs_dirs[@]}"; do case $real in "$t"/*) inside=1 ;; esac; done
            [ $inside = 1 ] && continue
            case $seen_files in *" $real "*) continue ;; esac
            seen_files+="$real "
            echo "bind $real" >>"$HIDE_LIST"
        done
    done
}

# ---- server ------------------------------------------------------------------------------------
TCP_ADDR=
UNIX_ADDR=
start_server() {
    local args=() t line addrs a deadline unix_listen= tcp_listen=
    for t in "${TRANSPORT_LIST[@]}"; do
        case $t in
            tcp) [ -n "$tcp_listen" ] || { args+=(--listen 127.0.0.1:0); tcp_listen=1; } ;;
            unix | shm) [ -n "$unix_listen" ] || { args+=(--listen "unix:$TMP/flyt.sock"); unix_listen=1; } ;;
            vm)
                [ -n "$tcp_listen" ] || { args+=(--listen 127.0.0.1:0); tcp_listen=1; }
                # The VM's ivshmem region, as the GPU host's operator makes it.
                # In /dev/shm: the GPU driver pins only shared-memory pages.
                IVSHMEM_DIR=/dev/shm/flyt-gpu-tests-$$
                "$DIST/bin/flytctl" ivshmem create gpu-tests --dir "$IVSHMEM_DIR" --size 16GiB --sessions 8 >>"$LOG" 2>&1 ||
                    { log "flytctl ivshmem create failed"; return 1; }
                args+=(--ivshmem-dir "$IVSHMEM_DIR")
                ;;
        esac
    done
    args+=(--warm-workers "$WARM_WORKERS" --gpu "$SERVER_GPUS")
    if [ "$TLS" = 1 ]; then
        "$DIST/bin/flytctl" tls-init --dir "$TMP/tls" --name 127.0.0.1 >/dev/null || { log "flytctl tls-init failed"; return 1; }
        args+=(--tls-cert "$TMP/tls/cert.pem" --tls-key "$TMP/tls/key.pem")
    fi
    log "=== server: $DIST/bin/flyt-rpc-server --device $DEVICE ${args[*]}"
    if command -v setsid >/dev/null 2>&1; then
        setsid "$DIST/bin/flyt-rpc-server" --device "$DEVICE" "${args[@]}" >"$TMP/server.stdout" 2>"$SERVER_LOG" </dev/null &
    else
        "$DIST/bin/flyt-rpc-server" --device "$DEVICE" "${args[@]}" >"$TMP/server.stdout" 2>"$SERVER_LOG" </dev/null &
    fi
    SERVER_PID=$!
    deadline=$((SECONDS + 60))
    while :; do
        line=$(grep -m 1 '^flyt-rpc-server listening on ' "$TMP/server.stdout" 2>/dev/null) && break
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            log "server exited before it was ready; stdout:"
            log_file "server stdout" "$TMP/server.stdout"
            SERVER_PID=
            return 1
        fi
        if [ $SECONDS -ge $deadline ]; then
            log "server not ready within 60 s"
            return 1
        fi
        sleep 0.1
    done
    log "server ready (pid $SERVER_PID): $line"
    read -r -a addrs <<<"${line#flyt-rpc-server listening on }"
    for a in "${addrs[@]}"; do
        case $a in
            unix:*) UNIX_ADDR=$a ;;
            *) TCP_ADDR=$a ;;
        esac
    done
    for t in "${TRANSPORT_LIST[@]}"; do
        case $t in
            tcp | vm) [ -n "$TCP_ADDR" ] || { log "server printed no TCP address"; return 1; } ;;
            unix | shm) [ -n "$UNIX_ADDR" ] || { log "server printed no unix: address"; return 1; } ;;
        esac
    done
    return 0
}

DOWN_NOTE="server not running (it died during an earlier run)"
server_alive() { [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; }

# The server log without ANSI colours.
server_log_plain() { sed 's/\x1b\[[0-9;]*m//g' "$SERVER_LOG" 2>/dev/null; }

# The pids of run $1 that must each have opened a session: the children it reports on stderr as
# "forked pid N" where its CUDA runs in children (take_turns.h: the parent never calls CUDA), else
# the program's own.
session_pids() {
    local forked
    forked=$(sed -n 's/^forked pid \([0-9][0-9]*\)$/\1/p' "$1.err" 2>/dev/null)
    if [ -n "$forked" ]; then echo "$forked"; else cat "$1.pid"; fi
}

# Fails the caller's row (its `result` and `notes`) for each pid of run $1 (session_pids) that
# opened no session; $2 ends the note.
require_sessions() {
    local pid
    for pid in $(session_pids "$1"); do
        if ! session_opened "$pid" 10; then
            result=FAIL
            notes+=("no session in the server log for pid $pid$2")
        fi
    done
}

# Did the server log a session for this client pid? TRIES > 1 waits up to TRIES * 0.2 s.
session_opened() {
    local pid=$1 tries=${2:-1} i
    [ -n "$pid" ] || return 1
    for ((i = 1; i <= tries; i++)); do
        if server_log_plain | grep -Eq "session [^ ]+ opened: .*pid=${pid}([^0-9]|\$)"; then
            return 0
        fi
        [ "$i" -lt "$tries" ] && sleep 0.2
    done
    return 1
}

# The worker pid serving the session of client pid $1 (from the server's "opened" line), waiting up
# to $2 * 0.1 s for the line.
worker_of() {
    local pid=$1 tries=${2:-50} i w
    for ((i = 1; i <= tries; i++)); do
        w=$(server_log_plain | grep -E "session [^ ]+ opened: .*pid=${pid}([^0-9]|\$)" |
            sed -n 's/.* worker=\([0-9][0-9]*\).*/\1/p' | tail -n 1)
        [ -n "$w" ] && { echo "$w"; return 0; }
        sleep 0.1
    done
    return 1
}

server_children() { # number of live child processes of the server (its workers)
    [ -n "$SERVER_PID" ] || { echo 0; return; }
    local n
    n=$(pgrep -P "$SERVER_PID" 2>/dev/null | wc -l)
    echo "${n:-0}"
}

gpu_apps() { # the processes holding GPU 0's memory, as "PID:MiB PID:MiB ...", or nothing
    command -v nvidia-smi >/dev/null 2>&1 || return 0
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -i 0 2>/dev/null | tr -d ' ' | tr ',' ':' | sort -n | tr '\n' ' '
}

nvidia_fd_holders() { # the processes with NVIDIA device files open, as "PID(COMM):FDS ..."
    local p n out=""
    for p in /proc/[0-9]*; do
        n=$(find "$p/fd" -maxdepth 1 -lname '/dev/nvidia*' 2>/dev/null | wc -l)
        [ "$n" -gt 0 ] && out+="${p#/proc/}($(cat "$p/comm" 2>/dev/null)):$n "
    done
    printf '%s' "$out"
}

gpu_mem_used() { # MiB in use on GPU 0, or nothing without nvidia-smi
    command -v nvidia-smi >/dev/null 2>&1 || return 0
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -n 1 | tr -d ' '
}

# ---- running -----------------------------------------------------------------------------------
# run_prog BASE LIMIT HIDE [VAR=value | -u VAR]... -- EXE [ARG...]: runs EXE under `env` with those
# settings and a time limit; writes BASE.out, BASE.err, BASE.rc and BASE.pid (the program's own pid:
# the wrapper shell writes its pid, then execs hide_gpu (when HIDE is 1), which execs env, which
# execs the program). HIDE=1 also LD_PRELOADs maps_check.so, which writes BASE.maps at exit.
run_prog() {
    local base=$1 limit=$2 hide=$3 rc envs=() wrap=()
    shift 3
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        envs+=("$1")
        shift
    done
    shift
    if [ "$hide" = 1 ] || [ "$hide" = maps ]; then
        envs+=("LD_PRELOAD=$MAPS_SO" "FLYT_TEST_MAPS_OUT=$base.maps")
    fi
    [ "$hide" = 1 ] && wrap=("$HIDE_BIN" "$HIDE_LIST" --)
    : >"$base.pid"
    rm -f "$base.maps"
    # shellcheck disable=SC2016  # $$ and $@ belong to the inner shell
    timeout -k 10 "$limit" bash -c 'echo $$ >"$0"; exec "$@"' "$base.pid" "${wrap[@]}" env "${envs[@]}" "$@" \
        >"$base.out" 2>"$base.err" </dev/null
    rc=$?
    echo "$rc" >"$base.rc"
    return 0
}

NATIVE_ENV=(-u FLYT_SERVER)
[ -n "$NATIVE_LIB" ] && NATIVE_ENV+=("LD_LIBRARY_PATH=$NATIVE_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
flyt_env() { # transport -> env settings for a Flyt run
    local addr shm=off
    case $1 in
        tcp) addr=$TCP_ADDR ;;
        unix) addr=$UNIX_ADDR ;;
        shm) addr=$UNIX_ADDR shm=on ;;
        # A VM guest's channel, the guest played by a process on the host: TCP, its segment a
        # slot of the VM's ivshmem region (the file QEMU would map), wake-ups over the socket.
        vm) addr=$TCP_ADDR shm=on
            printf '%s\n' "FLYT_IVSHMEM=$IVSHMEM_DIR/gpu-tests" ;;
    esac
    # TRITON_LIBCUDA_PATH as `flyt run` sets it: Triton (torch.compile) loads the driver from there.
    printf '%s\n' "LD_LIBRARY_PATH=$DIST/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "FLYT_SERVER=$addr" "FLYT_SHM=$shm" \
        "TRITON_LIBCUDA_PATH=$DIST/lib"
    [ "$TLS" = 1 ] && [ "$1" = tcp ] && printf '%s\n' "FLYT_TLS_CA=$TMP/tls/ca.pem"
    return 0
}
FLYT_HIDE=maps # what run_prog's HIDE is for Flyt runs: 1 (hidden + maps check) or maps (check only)

ROWS=()
N_PASS=0
N_FAIL=0
add_row() { # program transport same native_rc flyt_rc result note
    local transport=$2
    [ "$TLS" = 1 ] && [ "$transport" = tcp ] && transport=tcp+tls
    ROWS+=("| $1 | $transport | $3 | $4 | $5 | $6 | $7 |")
    if [ "$6" = PASS ]; then N_PASS=$((N_PASS + 1)); else N_FAIL=$((N_FAIL + 1)); fi
    write_table
}

describe_rc() {
    case $1 in
        124 | 137) echo "$1 (timeout)" ;;
        125) echo "$1 (hide_gpu failed)" ;;
        *) echo "$1" ;;
    esac
}

log_run() { # title base
    log ""
    log "===== $1 | exit $(cat "$2.rc") ====="
    log_file "stdout" "$2.out"
    log_file "stderr" "$2.err"
    [ -f "$2.maps" ] && log "maps: $(cat "$2.maps")"
    return 0
}

# stderr without Flyt's own lines.
app_stderr() { grep -v -E '^flyt( stats)?: ' "$1" 2>/dev/null; }

# maps_problem BASE: prints why the maps check of a Flyt run failed; nothing when it passed. The
# only driver libraries the app may map are Flyt's libcuda.so.1 (and Flyt's libnvidia-ml.so.1); its runtime is Flyt's libcudart.so.13
# (shared) or none (static: NVIDIA's runtime is inside the program and must have used Flyt's driver).
maps_problem() {
    local base=$1 pid line driver cudart lib flyt_cuda l used_flyt=0
    [ "$FLYT_HIDE" = 0 ] && return 0
    pid=$(cat "$base.pid" 2>/dev/null)
    line=$(grep -E "^maps_check pid=${pid} " "$base.maps" 2>/dev/null | tail -n 1)
    if [ -z "$line" ]; then
        echo "maps check: no report (the program did not exit through exit())"
        return 0
    fi
    driver=$(sed -n 's/.* driver=\([^ ]*\).*/\1/p' <<<"$line")
    cudart=$(sed -n 's/.* cudart=\([^ ]*\).*/\1/p' <<<"$line")
    flyt_cuda=$(readlink -f "$DIST/lib/libcuda.so.1")
    flyt_nvml=$(readlink -f "$DIST/lib/libnvidia-ml.so.1" 2>/dev/null)
    IFS=, read -r -a libs <<<"$driver"
    for l in "${libs[@]}"; do
        [ "$l" = none ] && continue
        if [ "$(readlink -f "$l" 2>/dev/null)" = "$flyt_cuda" ]; then
            used_flyt=1
        elif [ -n "$flyt_nvml" ] && [ "$(readlink -f "$l" 2>/dev/null)" = "$flyt_nvml" ]; then
            : # Flyt's NVML, a front over Flyt's driver
        else
            echo "NVIDIA driver library mapped in the app: $l"
            return 0
        fi
    done
    # PyTorch maps its own CUDA runtime, whichever --runtime the .cu programs use.
    case $(basename "$base") in torch_* | fw_*)
        [ $used_flyt = 1 ] || echo "the app did not map Flyt's $flyt_cuda"
        return 0
        ;;
    esac
    if [ "$RUNTIME" = static ]; then
        [ "$cudart" = none ] || echo "a static-runtime app mapped $cudart"
        [ $used_flyt = 1 ] || echo "the app did not map Flyt's $flyt_cuda"
        return 0
    fi
    lib=$(readlink -f "$DIST/lib/libcudart.so.13")
    if [ "$(readlink -f "${cudart%%,*}" 2>/dev/null)" != "$lib" ] || [ "${cudart#*,}" != "$cudart" ]; then
        echo "the app mapped $cudart, not Flyt's $lib"
    fi
}

# compare PROGRAM TRANSPORT NATIVE_BASE OTHER_BASE FLYT_RUN(1|0) [EXTRA_NOTE]
compare() {
    local prog=$1 tr=$2 nb=$3 fb=$4 is_flyt=$5 extra=${6:-} same nrc frc result=PASS notes=() m
    nrc=$(cat "$nb.rc")
    frc=$(cat "$fb.rc")
    if cmp -s "$nb.out" "$fb.out"; then same=yes; else same=no; fi
    if [ "$same" = no ]; then
        result=FAIL
        notes+=("stdout differs")
        log "--- stdout diff native vs $tr ($prog) ---"
        diff -u --label native "$nb.out" --label "$tr" "$fb.out" >>"$LOG" 2>&1
    fi
    if in_list "$prog" "${STDERR_COMPARE[@]}"; then
        if ! cmp -s <(app_stderr "$nb.err") <(app_stderr "$fb.err"); then
            result=FAIL
            same=no
            notes+=("stderr differs")
            log "--- stderr diff native vs $tr ($prog), flyt: lines dropped ---"
            diff -u --label native <(app_stderr "$nb.err") --label "$tr" <(app_stderr "$fb.err") >>"$LOG" 2>&1
        else
            same="$same (+stderr)"
        fi
    fi
    if [ "$nrc" != "$frc" ]; then result=FAIL; notes+=("exit status differs"); fi
    if [ "$nrc" != 0 ]; then result=FAIL; notes+=("native run failed"); fi
    case $frc in 124 | 137) notes+=("$tr run timed out") ;; 125) notes+=("hide_gpu: $(grep -m 1 '^hide_gpu:' "$fb.err")") ;; esac
    if [ "$is_flyt" = 1 ]; then
        require_sessions "$fb" ": did it use the system libcudart?"
        m=$(maps_problem "$fb")
        [ -n "$m" ] && { result=FAIL; notes+=("$m"); }
        if ! server_alive; then
            result=FAIL
            notes+=("server not running after this run")
        fi
    fi
    [ -n "$extra" ] && { result=FAIL; notes+=("$extra"); }
    local note="" x
    for x in "${notes[@]}"; do note+="${note:+; }$x"; done
    add_row "$prog" "$tr" "$same" "$(describe_rc "$nrc")" "$(describe_rc "$frc")" "$result" "$note"
}

# compare_unsupported PROGRAM TRANSPORT NATIVE_BASE FLYT_BASE EXTRA_NOTE PATTERN: a program Flyt
# does not support (on this transport): native must pass, Flyt must fail loudly (exit 1-123, stderr
# matching PATTERN, which names the unsupported call).
compare_unsupported() {
    local prog=$1 tr=$2 nb=$3 fb=$4 extra=${5:-} pattern=$6 nrc frc result=PASS notes=() named m
    nrc=$(cat "$nb.rc")
    frc=$(cat "$fb.rc")
    # A Python script torch_NAME or fw_NAME says "NAME: PASS".
    local short=${prog#torch_}
    short=${short#fw_}
    if [ "$nrc" != 0 ] || ! tail -n 1 "$nb.out" | grep -q "^${short}: PASS\$"; then
        result=FAIL
        notes+=("native run failed")
    fi
    named=$(grep -oE "$pattern" "$fb.err" 2>/dev/null | head -n 1)
    if [ "$frc" = 0 ]; then
        result=FAIL
        notes+=("exited 0 through Flyt: an unsupported program must fail loudly")
    elif [ "$frc" -ge 124 ]; then
        result=FAIL
        notes+=("through Flyt it ended with status $frc (timeout, crash or signal), not a checked failure")
    fi
    if [ -z "$named" ]; then
        result=FAIL
        notes+=("stderr names no unsupported function matching $pattern")
    else
        notes+=("fails as expected; stderr names $named")
    fi
    require_sessions "$fb" ""
    m=$(maps_problem "$fb")
    [ -n "$m" ] && { result=FAIL; notes+=("$m"); }
    server_alive || { result=FAIL; notes+=("server not running after this run"); }
    [ -n "$extra" ] && { result=FAIL; notes+=("$extra"); }
    local note="" x
    for x in "${notes[@]}"; do note+="${note:+; }$x"; done
    add_row "$prog (expected unsupported through Flyt)" "$tr" "n/a" "$(describe_rc "$nrc")" "$(describe_rc "$frc")" "$result" "$note"
}

# A native run must not have gone through Flyt (e.g. LD_LIBRARY_PATH already pointing at dist/lib).
native_used_flyt() { [ -n "$SERVER_PID" ] && session_opened "$(cat "$1.pid")"; }

# wait_ready FILE PID: waits up to 60 s for FILE (a program's "ready" mark) while PID runs; true
# when FILE is there.
wait_ready() {
    local i
    for ((i = 0; i < 600; i++)); do
        [ -e "$1" ] && return 0
        kill -0 "$2" 2>/dev/null || break
        sleep 0.1
    done
    [ -e "$1" ]
}

# run_pair LABEL BASE_PREFIX HIDE [env settings]...: the fault-isolation pair, concurrently.
# Writes BASE_PREFIX.victim.* and BASE_PREFIX.faulter.*; sets PAIR_NOTE when the choreography failed.
PAIR_NOTE=
run_pair() {
    local label=$1 base=$2 hide=$3 sync vsub
    shift 3
    PAIR_NOTE=""
    sync=$TMP/sync.$label
    rm -rf "$sync"
    mkdir -p "$sync"
    run_prog "$base.victim" $((TIMEOUT + 60)) "$hide" "$@" "FLYT_TEST_SYNC_DIR=$sync" -- "$BUILD/$PAIR_VICTIM" &
    vsub=$!
    BG_PIDS+=("$vsub")
    BG_PIDFILES+=("$base.victim.pid")
    wait_ready "$sync/victim.ready" "$vsub" || PAIR_NOTE="victim never became ready"
    run_prog "$base.faulter" "$TIMEOUT" "$hide" "$@" -- "$BUILD/$PAIR_FAULTER"
    : >"$sync/faulter.done"
    wait "$vsub"
    [ -s "$base.victim.rc" ] || echo 125 >"$base.victim.rc"
}

# ---- table -------------------------------------------------------------------------------------
HEADER=()
write_table() {
    {
        if [ "$MODE" = native ]; then
            echo "| program | run | same output | first exit | second exit | result | note |"
        else
            echo "| program | transport | same output | native exit | flyt exit | result | note |"
        fi
        echo "| --- | --- | --- | --- | --- | --- | --- |"
        [ ${#ROWS[@]} -gt 0 ] && printf '%s\n' "${ROWS[@]}"
        echo ""
        echo "total: $((N_PASS + N_FAIL)) rows, $N_PASS passed, $N_FAIL failed"
    } >"$TABLE.body"
    {
        printf '%s\n' "${HEADER[@]}"
        echo ""
        cat "$TABLE.body"
    } >"$TABLE"
    rm -f "$TABLE.body"
}

budget_left() { [ $((SECONDS - START_SECONDS)) -lt "$BUDGET" ]; }

# ---- main --------------------------------------------------------------------------------------
if [ "$MODE" = flyt ]; then
    if [ "$HIDE" = 1 ]; then
        [ $TOOLS_OK = 1 ] || die "the helpers in tools/ did not build (see $BUILD_LOG); --no-hide runs without them"
        make_hide_list
        log "hide list:"
        log_file "hide list" "$HIDE_LIST"
        if ! out=$("$HIDE_BIN" "$HIDE_LIST" -- true 2>&1); then
            die "cannot hide the GPU ($out); run as root, or pass --no-hide"
        fi
        FLYT_HIDE=1
        [ "$LIB_CHECK" = 1 ] || die "--no-lib-check needs --no-hide (hidden runs always check the libraries)"
        folders=$(grep '^tmpfs ' "$HIDE_LIST" | cut -d' ' -f2 | paste -sd, -)
        HIDE_NOTE="yes: a mount namespace per app with /dev/null over $(grep -c '^bind /dev/' "$HIDE_LIST") device nodes and $(grep '^bind ' "$HIDE_LIST" | grep -vc '^bind /dev/') driver library files, an empty tmpfs over $(grep -c '^tmpfs ' "$HIDE_LIST") folders${folders:+ ($folders)}"
    elif [ $TOOLS_OK = 1 ] && [ "$LIB_CHECK" = 1 ]; then
        FLYT_HIDE=maps
    else
        FLYT_HIDE=0
    fi
fi
HEADER=("<!-- $CMDLINE -->"
    "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    "- GPU: ${GPU_LINE:-unknown (no nvidia-smi)} (name, driver, memory)"
    "- nvcc: $NVCC_LINE; arch $ARCH; runtime: $RUNTIME (nvcc -cudart=$RUNTIME); server device: $DEVICE; transports: $TRANSPORTS")
if [ "$MODE" = flyt ]; then
    HEADER+=("- dist: $DIST (libcudart.so.13 of $(date -u -r "$DIST/lib/libcudart.so.13" '+%Y-%m-%d %H:%M UTC'))"
        "- GPU hidden from Flyt apps: $HIDE_NOTE"
        "- library check in every Flyt app (maps_check.so at exit): $([ "$FLYT_HIDE" = 0 ] && echo "off" || echo "on: no libcuda.so*/libnvidia-* mapped but Flyt's libcuda.so.1, libcudart $([ "$RUNTIME" = static ] && echo "none (static)" || echo "from dist")")")
fi
write_table

if [ "$MODE" = flyt ]; then
    if ! start_server; then
        echo "run.sh: flyt-rpc-server did not start; see $LOG and $SERVER_LOG" >&2
        DOWN_NOTE="server did not start (see log.txt, server.log)"
    fi
    # Record which libcudart each mode resolves to, once.
    first=${PROGS[0]:-$PAIR_VICTIM}
    if [ -n "${BUILT[$first]:-}" ]; then
        log "native libcudart: $(ldd "$BUILD/$first" 2>&1 | grep libcudart)"
        log "flyt libcudart:   $(env LD_LIBRARY_PATH="$DIST/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$BUILD/$first" 2>&1 | grep libcudart)"
    fi
    # Hiding self-check: inside the namespace the driver is gone for everyone, not just for Flyt.
    if [ "$FLYT_HIDE" = 1 ] && [ -n "${BUILT[hello_flyt]:-}" ]; then
        notes=()
        result=PASS
        grep -Eq '^bind .*/libcuda\.so' "$HIDE_LIST" || grep -Eq '^tmpfs ' "$HIDE_LIST" ||
            { result=FAIL; notes+=("found no libcuda.so to hide"); }
        grep -Eq '^bind /dev/nvidia' "$HIDE_LIST" || { result=FAIL; notes+=("found no /dev/nvidia* node to hide"); }
        hb=$TMP/hidecheck
        run_prog "$hb" 60 1 "${NATIVE_ENV[@]}" -- "$BUILD/hello_flyt"
        log_run "hello_flyt | native, inside the hiding namespace (must fail)" "$hb"
        hrc=$(cat "$hb.rc")
        if [ "$hrc" = 0 ] || [ "$hrc" = 125 ]; then
            result=FAIL
            notes+=("a native CUDA program inside the namespace exited $hrc (must fail: no GPU)")
        else
            notes+=("native hello_flyt inside: exit $hrc, $(grep -m 1 -o 'cudaError[A-Za-z]*' "$hb.out" || echo 'no error name')")
        fi
        if grep -q ' driver=none ' "$hb.maps" 2>/dev/null; then
            notes+=("libcuda not loadable inside")
        else
            result=FAIL
            notes+=("inside the namespace the program mapped: $(sed -n 's/.* driver=\([^ ]*\).*/\1/p' "$hb.maps" 2>/dev/null)")
        fi
        if command -v nvidia-smi >/dev/null 2>&1; then
            if "$HIDE_BIN" "$HIDE_LIST" -- nvidia-smi -L >"$TMP/hidesmi" 2>&1; then
                result=FAIL
                notes+=("nvidia-smi -L works inside the namespace")
            else
                notes+=("nvidia-smi -L fails inside")
            fi
        fi
        note=""
        for x in "${notes[@]}"; do note+="${note:+; }$x"; done
        add_row "GPU hidden (self-check)" - - - "$(describe_rc "$hrc")" "$result" "$note"
    fi
fi

for n in "${BUILD_FAILED[@]}"; do add_row "$n" build - - - FAIL "build failed (see build.log)"; done

for n in "${PROGS[@]}"; do
    [ -n "${BUILT[$n]:-}" ] || continue
    echo "running $n"
    nb=$TMP/$n.native
    run_prog "$nb" "$TIMEOUT" 0 "${NATIVE_ENV[@]}" -- "$BUILD/$n"
    log_run "$n | native" "$nb"
    if [ "$MODE" = native ]; then
        rb=$TMP/$n.rerun
        run_prog "$rb" "$TIMEOUT" 0 "${NATIVE_ENV[@]}" -- "$BUILD/$n"
        log_run "$n | native rerun" "$rb"
        compare "$n" native-rerun "$nb" "$rb" 0
        continue
    fi
    extra=""
    native_used_flyt "$nb" && extra="the native run opened a Flyt session"
    live=()
    run_pids=()
    for t in "${TRANSPORT_LIST[@]}"; do
        if ! server_alive; then
            add_row "$n" "$t" - "$(cat "$nb.rc")" - FAIL "$DOWN_NOTE"
            continue
        fi
        fb=$TMP/$n.$t
        mapfile -t fenv < <(flyt_env "$t")
        live+=("$t")
        if [ "$SERIAL" = 1 ] || takes_most_of_the_gpu "$n"; then
            run_prog "$fb" "$TIMEOUT" "$FLYT_HIDE" "${fenv[@]}" -- "$BUILD/$n"
        else
            run_prog "$fb" "$TIMEOUT" "$FLYT_HIDE" "${fenv[@]}" -- "$BUILD/$n" &
            run_pids+=($!)
        fi
    done
    for p in "${run_pids[@]}"; do wait "$p"; done
    for t in "${live[@]}"; do
        fb=$TMP/$n.$t
        log_run "$n | $t" "$fb"
        unsupported=${EXPECT_UNSUPPORTED[$n]:-}
        [ -z "$unsupported" ] && [ "$t" != shm ] && [ "$t" != vm ] && unsupported=${NEEDS_SHM_CHANNEL[$n]:-}
        if [ -n "$unsupported" ]; then
            compare_unsupported "$n" "$t" "$nb" "$fb" "$extra" "$unsupported"
        else
            compare "$n" "$t" "$nb" "$fb" 1 "$extra"
        fi
    done
done

if [ $RUN_PAIR = 1 ] && [ -n "${BUILT[$PAIR_VICTIM]:-}" ] && [ -n "${BUILT[$PAIR_FAULTER]:-}" ]; then
    echo "running the fault-isolation pair ($PAIR_VICTIM + $PAIR_FAULTER)"
    nb=$TMP/pair.native
    run_pair native "$nb" 0 "${NATIVE_ENV[@]}"
    nnote=$PAIR_NOTE
    log_run "$PAIR_VICTIM | native (with $PAIR_FAULTER faulting meanwhile)" "$nb.victim"
    log_run "$PAIR_FAULTER | native (while $PAIR_VICTIM ran)" "$nb.faulter"
    [ -n "$nnote" ] && log "native pair: $nnote"
    if [ "$MODE" = flyt ] && { native_used_flyt "$nb.victim" || native_used_flyt "$nb.faulter"; }; then
        nnote="${nnote:+$nnote; }the native run opened a Flyt session"
    fi
    if [ "$MODE" = native ]; then
        rb=$TMP/pair.rerun
        run_pair rerun "$rb" 0 "${NATIVE_ENV[@]}"
        rnote=$PAIR_NOTE
        log_run "$PAIR_VICTIM | native rerun" "$rb.victim"
        log_run "$PAIR_FAULTER | native rerun" "$rb.faulter"
        compare "$PAIR_VICTIM" native-rerun "$nb.victim" "$rb.victim" 0 "${nnote:-$rnote}"
        compare "$PAIR_FAULTER" native-rerun "$nb.faulter" "$rb.faulter" 0 "${nnote:-$rnote}"
    else
        for t in "${TRANSPORT_LIST[@]}"; do
            if ! server_alive; then
                add_row "$PAIR_VICTIM" "$t" - "$(cat "$nb.victim.rc")" - FAIL "$DOWN_NOTE"
                add_row "$PAIR_FAULTER" "$t" - "$(cat "$nb.faulter.rc")" - FAIL "$DOWN_NOTE"
                continue
            fi
            fb=$TMP/pair.$t
            mapfile -t fenv < <(flyt_env "$t")
            run_pair "$t" "$fb" "$FLYT_HIDE" "${fenv[@]}"
            fnote=$PAIR_NOTE
            log_run "$PAIR_VICTIM | $t (with $PAIR_FAULTER faulting meanwhile, same server)" "$fb.victim"
            log_run "$PAIR_FAULTER | $t (while $PAIR_VICTIM ran)" "$fb.faulter"
            compare "$PAIR_VICTIM" "$t" "$nb.victim" "$fb.victim" 1 "${nnote:-$fnote}"
            compare "$PAIR_FAULTER" "$t" "$nb.faulter" "$fb.faulter" 1 "${nnote:-$fnote}"
        done
    fi
fi

# ---- soak and fault rows ------------------------------------------------------------------------
# shellcheck source-path=SCRIPTDIR source=soak.sh
[ ${#SOAK_ON[@]} -gt 0 ] && . "$here/soak.sh"

if [ "$MODE" = flyt ]; then
    if [ -n "$SERVER_PID" ] && ! server_alive; then
        log "the server was not running at the end of the run"
    fi
    stop_server
fi

# ---- table and LATEST.md -----------------------------------------------------------------------
write_table
{
    echo "# gpu-tests: latest run"
    echo ""
    cat "$TABLE"
    echo ""
    echo "Run time: $((SECONDS - START_SECONDS)) s."
} >"$LATEST"
cat "$TABLE"
kept=""
for f in table.md LATEST.md log.txt soak.log server.log build.log; do [ -e "$OUT/$f" ] && kept+="${kept:+, }$f"; done
echo "results: $OUT ($kept)"
[ $N_FAIL -eq 0 ] && [ $((N_PASS + N_FAIL)) -gt 0 ]
