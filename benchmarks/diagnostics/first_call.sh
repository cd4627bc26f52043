#!/usr/bin/env bash
# Diagnostic on the GPU machine: how long an app's first CUDA call takes through Flyt, apps
# started one after another (as the benchmark harness runs them) and spaced out (every worker
# warm), with the server's own account of each worker's start (`device open`) and of sessions
# that waited for one. With a second Flyt build (OTHER, e.g. an older dist/) the same rounds run
# against it, and with MIXED=1 against each build's libraries with the other's server (where
# their protocols agree), which says whether a change is the app's side or the server's.
#   [TRANSPORTS='unix tcp shm'] benchmarks/diagnostics/first_call.sh DIST OUT [OTHER_DIST] [RUNS]
set -uo pipefail
source "$(dirname "$0")/common.sh"
other=${3:-}
runs=${4:-7}
nvcc=${NVCC:-$cuda/bin/nvcc}
"$nvcc" -cudart=static -O2 -arch=sm_90 -std=c++17 -o "$tmp/first_kernel" "$here/../first_kernel.cu" || exit 1

# One round: RUNS apps over TRANSPORT, GAP seconds apart; prints their init_ms and each app's
# whole run (start to exit: how soon the next one comes when they follow each other).
round() { # BUILD TRANSPORT GAP
    local build=$1 transport=$2 gap=$3 server shm=off times=() walls=() start
    case $transport in
        tcp) server=127.0.0.1:47311 ;;
        unix) server=unix:$tmp/$build.sock ;;
        shm) server=unix:$tmp/$build.sock shm=on ;;
    esac
    for _ in $(seq "$runs"); do
        start=$(date +%s%N)
        times+=("$(FLYT_SERVER=$server FLYT_SHM=$shm LD_LIBRARY_PATH=$libs "$tmp/first_kernel" 2>>"$out/$build-apps.err" |
            sed -n 's/.*"init_ms": *\([0-9.]*\).*/\1/p' | cut -c1-6)")
        walls+=("$((($(date +%s%N) - start) / 1000000))")
        sleep "$gap"
    done
    printf '%-18s %-5s gap %-4s init_ms: %s | app ms: %s\n' "$build" "$transport" "$gap" "${times[*]}" "${walls[*]}"
}

other=${other:+$(cd "$other" && pwd)}
# name, libraries' dist, server's dist
builds=("new $dist $dist")
[ -z "$other" ] || builds+=("old $other $other")
[ -z "$other" ] || [ "${MIXED:-0}" != 1 ] || builds+=("newlibs-oldserver $dist $other" "oldlibs-newserver $other $dist")
for spec in "${builds[@]}"; do
    read -r build libs_dist server_dist <<<"$spec"
    libs=$libs_dist/lib
    dist=$server_dist FLYT_LOG=info start_server "$build" --device cuda --listen 127.0.0.1:47311 --listen "unix:$tmp/$build.sock" || exit 1
    server_pid=$!
    sleep 5
    for transport in ${TRANSPORTS:-unix tcp shm}; do
        round "$build" "$transport" 1.5
        round "$build" "$transport" 0
    done
    kill "$server_pid"
    wait "$server_pid" 2>/dev/null
    cp "$tmp/$build.err" "$out/$build-server.err"
    # Each field of the workers' `device open` lines: lowest, median, highest.
    grep -h 'device open' "$out/$build-server.err" | grep -o '[a-z_]*_ms=[0-9.]*' | tr '=' ' ' | sort -k1,1 -k2,2n |
        awk '{v[$1]=v[$1] " " $2; n[$1]++} END {for (k in v) {split(substr(v[k], 2), a, " "); printf "%s: workers opening, %s (ms) min %s median %s max %s (%d)\n", b, k, a[1], a[int((n[k]+1)/2)], a[n[k]], n[k]}}' b="$build"
    echo "$build: sessions that waited for a worker: $(grep -c 'waited for a worker' "$out/$build-server.err"), waits (ms): $(grep -h 'waited for a worker' "$out/$build-server.err" | sed -n 's/.*waited_ms=\([0-9]*\).*/\1/p' | tr '\n' ' ')"
done
