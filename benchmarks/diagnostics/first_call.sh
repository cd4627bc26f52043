#!/usr/bin/env bash
# Diagnostic on the GPU machine: how long an app's first CUDA call takes through Flyt, apps
# started one after another (as the benchmark harness runs them) and spaced out (every worker
# warm), with the server's own account of each worker's start (`device open`) and of sessions
# that waited for one. With a second Flyt build (OTHER, e.g. an older dist/) the same rounds run
# against it and against each build's libraries with the other's server, which says whether a
# change is the app's side or the server's.
#   benchmarks/diagnostics/first_call.sh DIST OUT [OTHER_DIST] [RUNS]
set -uo pipefail
source "$(dirname "$0")/common.sh"
other=${3:-}
runs=${4:-7}
nvcc=${NVCC:-$cuda/bin/nvcc}
"$nvcc" -cudart=static -O2 -arch=sm_90 -std=c++17 -o "$tmp/first_kernel" "$here/../first_kernel.cu" || exit 1

# One round: RUNS apps over TRANSPORT, GAP seconds apart; prints their init_ms.
round() { # BUILD TRANSPORT GAP
    local build=$1 transport=$2 gap=$3 server shm=off times=()
    case $transport in
        tcp) server=127.0.0.1:47311 ;;
        unix) server=unix:$tmp/$build.sock ;;
        shm) server=unix:$tmp/$build.sock shm=on ;;
    esac
    for _ in $(seq "$runs"); do
        times+=("$(FLYT_SERVER=$server FLYT_SHM=$shm LD_LIBRARY_PATH=$libs "$tmp/first_kernel" 2>>"$out/$build-apps.err" |
            sed -n 's/.*"init_ms": *\([0-9.]*\).*/\1/p')")
        sleep "$gap"
    done
    printf '%-6s %-5s gap %-4s init_ms: %s\n' "$build" "$transport" "$gap" "${times[*]}"
}

other=${other:+$(cd "$other" && pwd)}
# name, libraries' dist, server's dist
builds=("new $dist $dist")
[ -z "$other" ] || builds+=("old $other $other" "newlibs-oldserver $dist $other" "oldlibs-newserver $other $dist")
for spec in "${builds[@]}"; do
    read -r build libs_dist server_dist <<<"$spec"
    bin=$server_dist/bin
    libs=$libs_dist/lib
    FLYT_LOG=info "$bin/flyt-rpc-server" --device cuda --listen 127.0.0.1:47311 --listen "unix:$tmp/$build.sock" \
        >"$tmp/$build.out" 2>"$out/$build-server.err" </dev/null &
    server_pid=$!
    for _ in $(seq 100); do grep -q listening "$tmp/$build.out" 2>/dev/null && break; sleep 0.1; done
    sleep 5
    for transport in unix tcp shm; do
        round "$build" "$transport" 1.5
        round "$build" "$transport" 0
    done
    kill "$server_pid"
    wait "$server_pid" 2>/dev/null
    echo "$build: workers' device open (ms): $(grep -h 'device open' "$out/$build-server.err" | sed 's/.*device open *//' | head -30 | tr '\n' ';')"
    echo "$build: sessions that waited for a worker: $(grep -c 'waited for a worker' "$out/$build-server.err"), waits (ms): $(grep -h 'waited for a worker' "$out/$build-server.err" | sed -n 's/.*waited_ms=\([0-9]*\).*/\1/p' | tr '\n' ' ')"
done
