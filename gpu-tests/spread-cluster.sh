#!/usr/bin/env bash
# A tenant's two GPUs placed on two nodes by the control plane (issue 45, `flytctl vm add --gpus 2
# --spread`): builds gpu-tests/spread_nodes.cu and runs it natively on GPUs 0 and 1, then starts a
# cluster manager (embedded store), two node managers as two nodes of one GPU each (node-a sees
# GPU 0, node-b GPU 1, through CUDA_VISIBLE_DEVICES; each starts its own rpc-server), a client
# manager, and asks for 2 GPUs of 20 SMs, first without --spread (must be refused, saying why),
# then with it. The app runs through the client manager (no FLYT_SERVER): with the shared-memory
# channel and without; stdout compared with the native run's, byte for byte. It also checks that
# the second node's server runs with --address-window 1 and that `flytctl list-vms` lists both
# GPUs.
#   gpu-tests/spread-cluster.sh --dist DIR --out DIR [--nvcc PATH] [--arch SM] [--timeout S]
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIST=dist OUT=gpu-tests/results/spread-cluster NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) ARCH=sm_90 LIMIT=300
. "$here/lib/cluster.sh"
gpu_test_start spread-cluster 2 "$@"
cleanup() {
    stop_daemons
    wait 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "spread-cluster: $*" >&2; exit 1; }

"$NVCC" -arch "$ARCH" -cudart=shared -std=c++17 -O2 -o "$TMP/spread_nodes" "$here/spread_nodes.cu" || fail "nvcc failed"
CUDA_VISIBLE_DEVICES=0,1 timeout "$LIMIT" "$TMP/spread_nodes" >"$OUT/native.out" 2>"$OUT/native.err"
native_rc=$?

start_cluster_manager
start_node_manager node-a 0 127.0.0.1
start_node_manager node-b 1 127.0.0.2
wait_for_registered_gpus 2 || fail "the two node managers did not register a GPU each within 30 s"
start_client_manager

rc=0
echo "| run | native | flyt | same output |"
echo "| --- | --- | --- | --- |"
# Without --spread: refused, with the reason.
"$flytctl" vm add 127.0.0.1 --host-ip 127.0.0.1 --compute-units 20 --memory-mib 4096 --gpus 2 >/dev/null || fail "flytctl vm add failed"
env -u CUDA_VISIBLE_DEVICES -u FLYT_SERVER LD_LIBRARY_PATH="$DIST/lib" FLYT_CLIENT_MANAGER_SOCKET="$TMP/client-manager.sock" \
    timeout "$LIMIT" "$TMP/spread_nodes" >"$OUT/flyt-refused.out" 2>"$OUT/flyt-refused.err"
refused_rc=$?
refused=no
[ $refused_rc != 0 ] && grep -q "not allowed to spread over nodes" "$OUT/flyt-refused.err" && refused=yes
[ $refused = yes ] || rc=1
echo "| without --spread | - | refused with the reason: $refused (rc $refused_rc) | - |"
"$flytctl" vm add 127.0.0.1 --host-ip 127.0.0.1 --compute-units 20 --memory-mib 4096 --gpus 2 --spread >/dev/null || fail "flytctl vm add --spread failed"
for shm in on off; do
    env -u CUDA_VISIBLE_DEVICES -u FLYT_SERVER LD_LIBRARY_PATH="$DIST/lib" FLYT_CLIENT_MANAGER_SOCKET="$TMP/client-manager.sock" \
        FLYT_SHM=$shm timeout "$LIMIT" "$TMP/spread_nodes" >"$OUT/flyt-shm-$shm.out" 2>"$OUT/flyt-shm-$shm.err"
    compare_row "--spread, FLYT_SHM=$shm" "flyt-shm-$shm" $?
done
"$flytctl" list-vms --wide >"$OUT/list-vms.txt" 2>&1
"$flytctl" list-virt-servers --json >"$OUT/allocations.json" 2>&1
listed=no
grep -q "0: node-a/0 GPU-" "$OUT/list-vms.txt" && grep -q "1: node-b/0 GPU-" "$OUT/list-vms.txt" && listed=yes
window=$(python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))[0]; print(open("/proc/%d/cmdline" % a["further"][0]["pid"]).read().replace("\0", " "))' \
    "$OUT/allocations.json" 2>/dev/null | grep -o -- '--address-window [0-9]*')
[ "$listed" = yes ] && [ "$window" = "--address-window 1" ] || rc=1
echo "| list-vms shows both GPUs; node-b's server in window 1 | - | $listed; ${window:-no window} | - |"
exit $rc
