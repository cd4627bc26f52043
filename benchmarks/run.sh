#!/usr/bin/env bash
# Flyt benchmarks on the GPU machine: native CUDA vs Flyt over each transport, in one run.
#
#   benchmarks/run.sh [--dist DIR] [--out DIR] [--quick] [--transports native,unix,tcp,shm]
#                     [--programs micro,copy,...] [--budget SECONDS] [--python P] [--tls] [--build-only]
#                     [--app-env NAME=VALUE ...]
#
#   --dist DIR        prebuilt Flyt: DIR/lib/libcudart.so.13 and DIR/bin/flyt-rpc-server (default: dist,
#                     relative to the repository root)
#   --out DIR         results folder (default: benchmarks/results); gets results.md, results.json,
#                     latency.png, bandwidth.png, apps.png, flyt_stats.txt, log.txt (7 files, flat)
#   --quick           fewer iterations and smaller sweeps (about 2 minutes)
#   --transports L    which columns to run (default: all four); a Flyt transport whose first run fails is n/a
#   --programs L      only these benchmark programs (default: all: micro,copy,matmul,micro_static,
#                     copy_static,matmul_static,cublas,first_kernel,torch,launch_heavy,graph,ipc,idle_cpu,pipeline;
#                     *_static are the same programs built with nvcc's default static runtime, over Flyt's libcuda.so.1;
#                     cublas and first_kernel are built that way too)
#   --budget S        stop starting new runs S seconds after this script started (default 480, quick 150)
#   --python P        a Python with PyTorch: also run torch_bench.py (training step, batch-1 inference,
#                     start to first result, module image bytes), twice per column
#   --build-only      compile the programs into benchmarks/.build and stop (no GPU needed)
#   --app-env N=V     set N=V in the Flyt columns' apps (repeatable; every other FLYT_ variable of this
#                     shell is kept from them), for A/B runs of a client setting, e.g. FLYT_RECONNECT_MS=0
#   --no-libraries    leave out the program that needs NVIDIA's libraries (cublas; CI's CUDA has none)
#   --tls             the server requires TLS on TCP (certificate made with flytctl tls-init): the tcp
#                     column is TCP under TLS (the apps get FLYT_TLS_CA)
# Environment: NVCC (default: nvcc on PATH, /usr/local/cuda/bin/nvcc, or .cuda/bin/nvcc), CC (default gcc).
# The markdown table is printed last on stdout; progress goes to stderr.
set -euo pipefail

start=$SECONDS
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
dist=$root/dist
out=$here/results
quick=0
transports=native,unix,tcp,shm
tls=0
programs=
python=
no_libraries=0
budget=
build_only=0
app_env=()

usage() { sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
    case $1 in
        --dist) dist=${2:?--dist needs a folder}; shift 2 ;;
        --out) out=${2:?--out needs a folder}; shift 2 ;;
        --quick) quick=1; shift ;;
        --transports) transports=${2:?--transports needs a list}; shift 2 ;;
        --tls) tls=1; shift ;;
        --programs) programs=${2:?--programs needs a list}; shift 2 ;;
        --budget) budget=${2:?--budget needs seconds}; shift 2 ;;
        --python) python=${2:?--python needs a Python with PyTorch}; shift 2 ;;
        --build-only) build_only=1; shift ;;
        --no-libraries) no_libraries=1; shift ;;
        --app-env)
            [[ ${2:-} == [A-Za-z_]*=* ]] || { echo "run.sh: --app-env needs NAME=VALUE" >&2; exit 2; }
            app_env+=(--app-env "$2"); shift 2 ;;
        -h|--help) usage 0 ;;
        *) echo "run.sh: unknown argument $1" >&2; usage ;;
    esac
done
[ -n "$budget" ] || { if [ "$quick" = 1 ]; then budget=150; else budget=480; fi; }
dist=$(cd "$dist" 2>/dev/null && pwd || echo "$dist")
mkdir -p "$out"
out=$(cd "$out" && pwd)
log() { echo "run.sh: $*" >&2; }

# --- build ----------------------------------------------------------------------------------------------
nvcc=${NVCC:-}
if [ -z "$nvcc" ]; then
    for c in "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc "$root/.cuda/bin/nvcc"; do
        if [ -n "$c" ] && [ -x "$c" ]; then nvcc=$c; break; fi
    done
fi
[ -n "$nvcc" ] || { log "no nvcc found (set NVCC)"; exit 1; }
cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
ldflags=()
cuda_lib=
for d in "$cuda_home/lib64" "$cuda_home/targets/x86_64-linux/lib" "$cuda_home/lib"; do
    if [ -e "$d/libcudart.so.13" ] || [ -e "$d/libcudart.so" ]; then
        ldflags+=("-L$d")
        cuda_lib=${cuda_lib:+$cuda_lib:}$d
    fi
done
build=$here/.build
mkdir -p "$build"
progs=(probe micro copy matmul launch_heavy graph ipc pipeline idle_cpu)
log "building with $nvcc into $build"
pids=()
names=()
# build_cu NAME SOURCE RUNTIME [LIBS...]: $build/NAME from SOURCE.cu with nvcc -cudart=RUNTIME, in the
# background (its pid in pids, its log $build/NAME.build.log), unless it is newer than the source
# and common.h.
build_cu() {
    local name=$1 source=$here/$2.cu runtime=$3
    shift 3
    if [ "$build/$name" -nt "$source" ] && [ "$build/$name" -nt "$here/common.h" ]; then return; fi
    "$nvcc" -cudart="$runtime" -O3 -arch=sm_90 -std=c++17 "${ldflags[@]}" -o "$build/$name" "$source" "$@" \
        >"$build/$name.build.log" 2>&1 &
    pids+=($!)
    names+=("$name")
}
for p in "${progs[@]}"; do build_cu "$p" "$p" shared; done
# The same programs with nvcc's default static runtime: NVIDIA's runtime inside, over Flyt's libcuda.so.1.
for p in micro copy matmul; do build_cu "${p}_static" "$p" static; done
# cuBLAS and start-up, static runtime only (cuBLAS brings its own runtime either way).
[ "$no_libraries" = 1 ] || build_cu cublas cublas static -lcublas
build_cu first_kernel first_kernel static
for c in raw_stream raw_rtt; do
    "${CC:-gcc}" -O2 -Wall -o "$build/$c" "$here/$c.c" >"$build/$c.build.log" 2>&1 &
    pids+=($!)
    names+=("$c")
done
failed=0
for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
        log "building ${names[$i]} failed:"
        cat "$build/${names[$i]}.build.log" >&2
        failed=1
    fi
done
[ "$failed" = 0 ] || exit 1
log "built in $((SECONDS - start)) s"
[ "$build_only" = 0 ] || exit 0

# --- the Flyt server ------------------------------------------------------------------------------------
tmp=$(mktemp -d /tmp/flyt-bench.XXXXXX)
server_pid=
harness_pid=
unix_addr=
tcp_addr=
cleanup() {
    local rc=$?
    if [ -n "$harness_pid" ] && kill -0 "$harness_pid" 2>/dev/null; then
        kill -TERM "$harness_pid" 2>/dev/null || true
        wait "$harness_pid" 2>/dev/null || true
    fi
    if [ -n "$server_pid" ]; then
        kill -TERM "$server_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$server_pid" 2>/dev/null; then
            # It did not stop within 5 s: end it and the worker processes it started, by their ids.
            local kids
            kids=$(pgrep -P "$server_pid" 2>/dev/null || true)
            log "flyt-rpc-server did not stop on SIGTERM; killing it${kids:+ and its workers $kids}"
            # shellcheck disable=SC2086 # kids is a list of pids
            kill -KILL "$server_pid" $kids 2>/dev/null || true
        fi
        wait "$server_pid" 2>/dev/null || true
        if [ -d "$out" ]; then
            {
                echo "=== flyt-rpc-server stdout (last 200 lines)"
                tail -n 200 "$tmp/server.out" 2>/dev/null || true
                echo "=== flyt-rpc-server stderr (last 400 lines)"
                tail -n 400 "$tmp/server.err" 2>/dev/null || true
            } >>"$out/log.txt"
        fi
    fi
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$transports" != native ]; then
    if [ -x "$dist/bin/flyt-rpc-server" ]; then
        tls_args=()
        if [ "$tls" = 1 ]; then
            "$dist/bin/flytctl" tls-init --dir "$tmp/tls" --name 127.0.0.1 >/dev/null
            tls_args=(--tls-cert "$tmp/tls/cert.pem" --tls-key "$tmp/tls/key.pem")
            export FLYT_TLS_CA=$tmp/tls/ca.pem
            log "TLS on TCP: the tcp column is TCP under TLS"
        fi
        log "starting $dist/bin/flyt-rpc-server"
        "$dist/bin/flyt-rpc-server" --device cuda --listen 127.0.0.1:0 --listen "unix:$tmp/flyt.sock" "${tls_args[@]}" \
            >"$tmp/server.out" 2>"$tmp/server.err" </dev/null &
        server_pid=$!
        ready=
        for _ in $(seq 600); do
            ready=$(grep -h -m1 '^flyt-rpc-server listening on ' "$tmp/server.out" "$tmp/server.err" 2>/dev/null |
                head -n1 || true)
            [ -z "$ready" ] || break
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 0.1
        done
        if [ -n "$ready" ]; then
            for tok in ${ready#flyt-rpc-server listening on }; do
                case $tok in
                    unix:*) unix_addr=$tok ;;
                    *:*) tcp_addr=$tok ;;
                esac
            done
            log "server ready: tcp $tcp_addr, $unix_addr"
        else
            log "flyt-rpc-server gave no ready line within 60 s (or exited); Flyt transports will be n/a"
            tail -n 20 "$tmp/server.err" >&2 || true
        fi
    else
        log "no $dist/bin/flyt-rpc-server; Flyt transports will be n/a"
    fi
fi

# --- run ------------------------------------------------------------------------------------------------
left=$((budget - (SECONDS - start) - 5))
[ "$left" -gt 10 ] || left=10
args=(run --build "$build" --out "$out" --dist "$dist" --transports "$transports" --cuda-lib "$cuda_lib"
      --raw-stream "$build/raw_stream" --raw-rtt "$build/raw_rtt" --server-log "$tmp/server.err" --budget-s "$left" --unix-addr "$unix_addr" --tcp-addr "$tcp_addr"
      --server-pid "${server_pid:-0}")
[ "$quick" = 0 ] || args+=(--quick)
[ -z "$programs" ] || args+=(--programs "$programs")
[ -z "$python" ] || args+=(--python "$python")
args+=("${app_env[@]}")
# In the background with `wait`, so that a signal to this script runs the cleanup at once.
python3 "$here/harness.py" "${args[@]}" &
harness_pid=$!
wait "$harness_pid"
harness_pid=
log "done in $((SECONDS - start)) s; results in $out"
