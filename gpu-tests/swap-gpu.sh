#!/usr/bin/env bash
# One GPU of a tenant's two moved to a third GPU of its node while the app runs (issue 45,
# `flytctl migrate VM --gpu INDEX --to NODE/GPU`): builds gpu-tests/migration/migrate_two_gpus.cu
# and runs it natively on GPUs 0 and 1, then starts a cluster manager (embedded store), one node
# manager serving GPUs 0, 1 and 2 (its own rpc-servers), a client manager, and gives the VM two
# GPUs of 20 SMs. The app runs through the client manager with the GPU hidden from it (device
# nodes and libcuda), is held at its gate halfway, and meanwhile: index 1 moves to the third GPU,
# back to its first GPU, then index 0 moves to the third GPU. Each move must say "with 1 app",
# `flytctl list-vms` must list the new GPU at that index, the app's output must be the native
# run's and its pointers the same at the end as at the start.
#   gpu-tests/swap-gpu.sh --dist DIR --out DIR [--nvcc PATH] [--arch SM] [--timeout S]
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIST=dist OUT=gpu-tests/results/swap-gpu NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc) ARCH=sm_90 LIMIT=300
. "$here/lib/cluster.sh"
gpu_test_start swap-gpu 3 "$@"
APP=
cleanup() {
    [ -n "$APP" ] && kill -KILL "$APP" 2>/dev/null
    stop_daemons
    wait 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "swap-gpu: $*" >&2; exit 1; }

"$NVCC" -O2 -arch="$ARCH" -o "$TMP/migrate_two_gpus" "$here/migration/migrate_two_gpus.cu" || fail "nvcc failed"
cc -O2 -o "$TMP/hide_gpu" "$here/tools/hide_gpu.c" || fail "cc hide_gpu failed"
HIDE=$TMP/hide.list
: >"$HIDE"
for d in /dev/nvidia*; do [ -c "$d" ] && echo "bind $d" >>"$HIDE"; done
for f in $(ldconfig -p | awk '/libcuda\.so/ {print $NF}'); do echo "bind $(readlink -f "$f")" >>"$HIDE"; done
sort -u -o "$HIDE" "$HIDE"
mkdir -p "$TMP/lib" && cp -L "$DIST/lib/libcuda.so.1" "$TMP/lib/libcuda.so.1"
ROUNDS=200
CUDA_VISIBLE_DEVICES=0,1 timeout "$LIMIT" "$TMP/migrate_two_gpus" $ROUNDS 5 >"$OUT/native.out" 2>"$OUT/native.err"
native_rc=$?

start_cluster_manager
start_node_manager node-a 0,1,2 127.0.0.1
wait_for_registered_gpus 3 || fail "the node manager did not register 3 GPUs within 30 s (saw ${REGISTERED:-none})"
start_client_manager
VM=127.0.0.1
"$flytctl" vm add $VM --host-ip 127.0.0.1 --compute-units 20 --memory-mib 4096 --gpus 2 >/dev/null || fail "flytctl vm add failed"

gate=$TMP/gate
"$TMP/hide_gpu" "$HIDE" -- env -u CUDA_VISIBLE_DEVICES -u FLYT_SERVER LD_LIBRARY_PATH="$TMP/lib" \
    FLYT_CLIENT_MANAGER_SOCKET="$TMP/client-manager.sock" FLYT_RESUME_TIMEOUT=120 \
    timeout "$LIMIT" "$TMP/migrate_two_gpus" $ROUNDS 5 "$gate" >"$OUT/flyt.out" 2>"$OUT/flyt.err" &
APP=$!
for _ in $(seq 1200); do grep -q holding "$OUT/flyt.err" 2>/dev/null && break; kill -0 $APP 2>/dev/null || break; sleep 0.1; done
grep -q holding "$OUT/flyt.err" || fail "the app did not reach its gate: $(tail -3 "$OUT/flyt.err")"

# gpus_of: the allocation's GPUs, index 0 then 1, as "A B".
gpus_of() {
    "$flytctl" list-virt-servers --json 2>/dev/null |
        python3 -c 'import json,sys; a=json.load(sys.stdin)[0]; print(a["gpu"], *a.get("extra_gpus", []))' 2>/dev/null
}
read -r first second <<<"$(gpus_of)"
[ -n "${second:-}" ] || fail "the VM did not get two GPUs: $("$flytctl" list-virt-servers 2>&1 | head -5)"
third=$(for g in 0 1 2; do [ "$g" != "$first" ] && [ "$g" != "$second" ] && echo $g; done | head -1)

rc=0
echo "| step | result | detail |"
echo "| --- | --- | --- |"
echo "| placed | GPUs $first,$second | third GPU $third |"
# move INDEX TO EXPECT-AFTER("A B"): one move, checked.
move() {
    local index=$1 to=$2 expect=$3 before after ms started out listed=no r=FAIL
    before=$(gpus_of)
    started=$(date +%s%N)
    out=$("$flytctl" migrate $VM --gpu "$index" --to "node-a/$to" 2>&1)
    local code=$?
    ms=$((($(date +%s%N) - started) / 1000000))
    echo "$out" >>"$OUT/moves.log"
    after=$(gpus_of)
    "$flytctl" list-vms >"$OUT/list-vms-$index-$to.txt" 2>&1
    grep -q "$index: node-a/$to " "$OUT/list-vms-$index-$to.txt" && listed=yes
    if [ $code = 0 ] && [ "$after" = "$expect" ] && [ $listed = yes ] && echo "$out" | grep -q "with 1 app"; then r=PASS; else rc=1; fi
    echo "| index $index to GPU $to | $r | GPUs ${before// /,} -> ${after// /,} (expected ${expect// /,}), listed: $listed, $ms ms: $(echo "$out" | tail -1 | cut -c1-160) |"
}
move 1 "$third" "$first $third"
move 1 "$second" "$first $second"
move 0 "$third" "$third $second"

touch "$gate"
wait $APP
app_rc=$?
APP=
p1=$(grep '^pointers' "$OUT/flyt.out" | head -1)
p2=$(grep '^pointers' "$OUT/flyt.out" | tail -1)
same=no
# The gated run says where it stands after the gate (the native run has no gate): as before.
[ -n "$p1" ] && [ "$p1" = "$p2" ] && grep -qx "after the gate: current GPU 1, memory of GPU 0 and GPU 1" "$OUT/flyt.out" &&
    cmp -s <(grep -v '^pointers\|^after the gate' "$OUT/native.out") <(grep -v '^pointers\|^after the gate' "$OUT/flyt.out") && same=yes
{ [ $native_rc = 0 ] && [ $app_rc = 0 ] && [ $same = yes ]; } || rc=1
echo "| the app after the moves | $([ $rc = 0 ] && echo PASS || echo FAIL) | native rc $native_rc, flyt rc $app_rc, output and pointers as native: $same; $(tail -1 "$OUT/flyt.out" | cut -c1-120) |"
exit $rc
