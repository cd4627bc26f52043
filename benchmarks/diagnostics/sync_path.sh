#!/usr/bin/env bash
# Diagnostic on the GPU machine: the synchronous path natively and over Flyt's shared-memory
# rings, against the real GPU and against the emulated device (which isolates Flyt's transport),
# with a CPU profile of the Flyt run when perf is there.
#   benchmarks/diagnostics/sync_path.sh DIST OUT
set -uo pipefail
dist=$(cd "${1:?dist folder}" && pwd)
out=${2:?output folder}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
cc -O2 -o "$tmp/sync_path" "$here/sync_path.c" -I"$cuda/include" -L"$cuda/lib64/stubs" -lcuda || exit 1
echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
echo "== native"
"$tmp/sync_path"
start_server() { # device socket
    FLYT_RPC_OP_TIMES=1 "$dist/bin/flyt-rpc-server" --device "$1" --listen "unix:$2" >"$tmp/$1.out" 2>"$tmp/$1.err" </dev/null &
    for _ in $(seq 100); do grep -q listening "$tmp/$1.out" "$tmp/$1.err" 2>/dev/null && return 0; sleep 0.1; done
    echo "server ($1) did not start"; cat "$tmp/$1.err"; return 1
}
flyt() { FLYT_SERVER=unix:$1 FLYT_SHM=on LD_LIBRARY_PATH=$dist/lib "${@:2}"; }
start_server emulated "$tmp/emulated.sock"
echo "== flyt shm, emulated device"
flyt "$tmp/emulated.sock" "$tmp/sync_path"
start_server cuda "$tmp/cuda.sock"
echo "== flyt shm, cuda"
flyt "$tmp/cuda.sock" "$tmp/sync_path"
echo "== flyt shm, cuda, a blocking stream"
flyt "$tmp/cuda.sock" "$tmp/sync_path" 20000 blocking
echo "== native, a blocking stream"
"$tmp/sync_path" 20000 blocking
echo "== flyt shm, cuda, FLYT_SPIN_US=0 on the client"
FLYT_SPIN_US=0 flyt "$tmp/cuda.sock" "$tmp/sync_path" 5000
sleep 0.5
echo "== server op handling times (all cuda sessions above)"
grep -h "op handling time" "$tmp/cuda.err" | sed 's/.*op handling time//' | head -40
if command -v perf >/dev/null; then
    echo "== perf profile of the flyt shm cuda run (whole machine)"
    flyt "$tmp/cuda.sock" "$tmp/sync_path" 400000 >/dev/null &
    probe=$!
    sleep 2
    perf record -a -g -o "$tmp/perf.data" -- sleep 2 >/dev/null 2>&1
    wait "$probe"
    perf report -i "$tmp/perf.data" --no-children --sort comm,dso,sym --percent-limit 0.7 --stdio 2>/dev/null |
        grep -E '^ +[0-9]' | head -60 | tee "$out/perf-top.txt"
else
    echo "(no perf)"
fi
