#!/usr/bin/env bash
# Diagnostic on the GPU machine: the synchronous path natively and over Flyt's shared-memory
# rings, against the real GPU and against the emulated device (which isolates Flyt's transport),
# with a CPU profile of the Flyt run when perf is there.
#   benchmarks/diagnostics/sync_path.sh DIST OUT
set -uo pipefail
source "$(dirname "$0")/common.sh"
build_probe sync_path || exit 1
echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
echo "== native"
"$tmp/sync_path"
flyt() { FLYT_SERVER=unix:$1 FLYT_SHM=on LD_LIBRARY_PATH=$dist/lib "${@:2}"; }
FLYT_RPC_OP_TIMES=1 start_server emulated --device emulated --listen "unix:$tmp/emulated.sock" || exit 1
echo "== flyt shm, emulated device"
flyt "$tmp/emulated.sock" "$tmp/sync_path"
FLYT_RPC_OP_TIMES=1 start_server cuda --device cuda --listen "unix:$tmp/cuda.sock" || exit 1
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
