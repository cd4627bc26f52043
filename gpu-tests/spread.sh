#!/usr/bin/env bash
# A session spread over two servers, as a tenant with GPUs on two nodes has it (issue 45): builds
# gpu-tests/spread_nodes.cu, runs it natively on GPUs 0 and 1 of this machine, then through Flyt
# with one flyt-rpc-server per GPU (the first serving GPU 0 in address window 0 on a Unix socket,
# the second GPU 1 in address window 1 over TCP loopback, as another node's would be), the app
# naming both (FLYT_SERVER=unix:...,127.0.0.1:PORT), with the shared-memory channel (the first
# server's) and without; stdout compared with the native run's, byte for byte. The local GPUs are
# not hidden from the app (Flyt's libraries come first on its library path).
#   gpu-tests/spread.sh --dist DIR --out DIR [--nvcc PATH] [--arch SM] [--timeout S]
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIST=dist OUT=gpu-tests/results/spread NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) ARCH=sm_90 LIMIT=300
. "$here/lib/cluster.sh"
gpu_test_start spread 2 "$@"
servers=()
trap stop_servers_and_clean EXIT

"$NVCC" -arch "$ARCH" -cudart=shared -std=c++17 -O2 -o "$TMP/spread_nodes" "$here/spread_nodes.cu" || { echo "spread: nvcc failed" >&2; exit 1; }

# start_server NAME GPU WINDOW LISTEN: one server of the tenant; its address in ADDR (not run
# in a subshell, so that the cleanup knows its pid).
start_server() {
    local name=$1 gpu=$2 window=$3 listen=$4 line=
    CUDA_VISIBLE_DEVICES=$gpu "$DIST/bin/flyt-rpc-server" --device cuda --gpu 0 --address-window "$window" --listen "$listen" \
        >"$TMP/$name.stdout" 2>"$OUT/$name.log" &
    servers+=($!)
    for _ in $(seq 600); do
        line=$(grep -m 1 '^flyt-rpc-server listening on ' "$TMP/$name.stdout" 2>/dev/null) && break
        sleep 0.1
    done
    [ -n "$line" ] || { echo "spread: server $name did not start (log: $OUT/$name.log)" >&2; exit 1; }
    ADDR=${line#flyt-rpc-server listening on }
}

CUDA_VISIBLE_DEVICES=0,1 timeout "$LIMIT" "$TMP/spread_nodes" >"$OUT/native.out" 2>"$OUT/native.err"
native_rc=$?
start_server first 0 0 "unix:$TMP/first.sock"
first=$ADDR
start_server second 1 1 127.0.0.1:0
second=$ADDR
rc=0
echo "| run | native | flyt | same output |"
echo "| --- | --- | --- | --- |"
for shm in on off; do
    env -u CUDA_VISIBLE_DEVICES LD_LIBRARY_PATH="$DIST/lib" FLYT_SERVER="$first,$second" FLYT_SHM=$shm \
        timeout "$LIMIT" "$TMP/spread_nodes" >"$OUT/flyt-shm-$shm.out" 2>"$OUT/flyt-shm-$shm.err"
    compare_row "FLYT_SHM=$shm" "flyt-shm-$shm" $?
done
# The second server's GPU alone, as the app's device 0.
env LD_LIBRARY_PATH="$DIST/lib" FLYT_SERVER="$first,$second" CUDA_VISIBLE_DEVICES=1 timeout "$LIMIT" "$TMP/spread_nodes" \
    >"$OUT/flyt-visible-1.out" 2>"$OUT/flyt-visible-1.err"
visible_rc=$?
grep -q '^devices: 1$' "$OUT/flyt-visible-1.out" || visible_rc=1
echo "| CUDA_VISIBLE_DEVICES=1 | - | $(tail -1 "$OUT/flyt-visible-1.out") (rc $visible_rc) | - |"
[ $visible_rc = 0 ] || rc=1
exit $rc
