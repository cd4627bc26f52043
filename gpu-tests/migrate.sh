#!/usr/bin/env bash
# migrate.sh --dist DIR --out DIR [--moves N] [--big-mib LIST]: live migration and
# checkpoint/restore of a running app between two rpc-servers on this machine's GPU.
#
#   1. migrate_loop (driver API; device memory of several sizes, a stream, an event, each round
#      checking what the last round wrote) runs natively, then through Flyt with the GPU hidden
#      while `flytctl session migrate` moves it N times between the two servers, alternating TCP
#      and the Unix socket. Its pointers at the start and end must be equal and its output the
#      native one.
#   2. The same app is checkpointed with --stop, its server killed, a fresh server started with
#      --snapshot-dir: the app must go on and pass.
#   3. For each size in --big-mib: one move of an app holding that much more memory, timed
#      (pause = drain + snapshot + restore), beside the GPU's native copy bandwidth.
# A short table is printed last; everything else goes to OUT.
set -u
here=$(cd "$(dirname "$0")" && pwd)
DIST= OUT= MOVES=10 BIG="1024 10240"
while [ $# -gt 0 ]; do
    case $1 in
    --dist) DIST=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --moves) MOVES=$2; shift 2 ;;
    --big-mib) BIG=$2; shift 2 ;;
    *) echo "usage: $0 --dist DIR --out DIR [--moves N] [--big-mib 'MIB ...']" >&2; exit 2 ;;
    esac
done
[ -n "$DIST" ] && [ -n "$OUT" ] || { echo "--dist and --out are needed" >&2; exit 2; }
DIST=$(cd "$DIST" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d /tmp/flyt-migrate.XXXXXX)
# Snapshots go through shared memory (a folder both servers of this host read).
SNAP=/dev/shm/flyt-migrate-snap-$$
trap 'pkill -f "$W/" 2>/dev/null; rm -rf "$W" "$SNAP"' EXIT
CUDA_INC=${CUDA_HOME:-/usr/local/cuda}/include
ROWS=()
row() { ROWS+=("$(printf '| %-44s | %-6s | %s |' "$1" "$2" "$3")"); }

# --- build -------------------------------------------------------------------------------------
cc -std=gnu11 -O2 -Wall -I"$CUDA_INC" -I"$here/../cuda-shim/cdylib/tests/c" \
    "$here/../cuda-shim/cdylib/tests/c/migrate_loop.c" -o "$W/migrate_loop" -L"$DIST/lib" -l:libcuda.so.1 || { echo "build failed"; exit 1; }
# Hide the GPU from Flyt's apps: device nodes and the driver's libcuda files.
HIDE=$W/hide.list
: >"$HIDE"
for d in /dev/nvidia*; do [ -c "$d" ] && echo "bind $d" >>"$HIDE"; done
for f in $(ldconfig -p | awk '/libcuda\.so/ {print $NF}'); do echo "bind $(readlink -f "$f")" >>"$HIDE"; done
sort -u -o "$HIDE" "$HIDE"
cc -O2 -o "$W/hide_gpu" "$here/tools/hide_gpu.c" || exit 1
mkdir -p "$W/lib" && cp -L "$DIST/lib/libcuda.so.1" "$W/lib/libcuda.so.1"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/key" && chmod 600 "$W/key"
CTL() { "$DIST/bin/flytctl" --cluster-key-file "$W/key" "$@"; }
TOKEN=$(CTL session token)

start_server() { # NAME [extra args] -> sets SRV_PID; listens on unix:$W/NAME.sock and a TCP port
    local name=$1; shift
    rm -f "$W/$name.sock" "$W/$name.ctl"
    FLYT_LOG=info "$DIST/bin/flyt-rpc-server" --device "${FLYT_MIGRATE_DEVICE:-cuda}" --listen "unix:$W/$name.sock" --listen 127.0.0.1:0 \
        --cluster-key-file "$W/key" --control "unix:$W/$name.ctl" "$@" >"$W/$name.ready" 2>>"$OUT/$name.log" &
    SRV_PID=$!
    for _ in $(seq 200); do grep -q listening "$W/$name.ready" 2>/dev/null && break; sleep 0.1; done
    grep -o '127.0.0.1:[0-9]*' "$W/$name.ready" | head -1 >"$W/$name.tcp"
}
session_of() { # CONTROL-NAME -> the one session id
    for _ in $(seq 300); do
        id=$(CTL --json session list --control "unix:$W/$1.ctl" 2>/dev/null | grep -o '"session_id": [0-9]*' | head -1 | grep -o '[0-9]*$')
        [ -n "$id" ] && { echo "$id"; return; }
        sleep 0.05
    done
}
flyt_app() { # SERVER-ADDRESS ARGS... (GPU hidden)
    local server=$1; shift
    "$W/hide_gpu" "$HIDE" -- env LD_LIBRARY_PATH="$W/lib" FLYT_SERVER="$server" FLYT_TOKEN="$TOKEN" FLYT_SHM=off "$W/migrate_loop" "$@"
}

# --- 1. ten moves of a running app ----------------------------------------------------------------
"$W/migrate_loop" 600 10 >"$OUT/native.out" 2>&1
start_server a; A=$SRV_PID
start_server b; B=$SRV_PID
flyt_app "unix:$W/a.sock" 600 10 >"$OUT/moved.out" 2>"$OUT/moved.err" &
APP=$!
here_name=a moved=0 refused=0
: >"$OUT/moves.log"
for i in $(seq "$MOVES"); do
    sleep 0.3
    if [ $here_name = a ]; then to=b; else to=a; fi
    if [ $((i % 2)) = 1 ]; then addr=$(cat "$W/$to.tcp"); else addr="unix:$W/$to.sock"; fi
    id=$(session_of $here_name)
    if CTL session migrate --control "unix:$W/$here_name.ctl" "$id" --to-control "unix:$W/$to.ctl" --to "$addr" --dir "$SNAP" >>"$OUT/moves.log" 2>&1; then
        moved=$((moved + 1)); here_name=$to
    else
        refused=$((refused + 1))
    fi
done
wait $APP; rc=$?
p1=$(grep '^pointers' "$OUT/moved.out" | head -1); p2=$(grep '^pointers' "$OUT/moved.out" | tail -1)
same_ptr=no; [ -n "$p1" ] && [ "$p1" = "$p2" ] && same_ptr=yes
grep -v '^pointers' "$OUT/native.out" >"$W/n" ; grep -v '^pointers' "$OUT/moved.out" >"$W/m"
if [ $rc = 0 ] && [ $moved = "$MOVES" ] && [ $same_ptr = yes ] && cmp -s "$W/n" "$W/m"; then r=PASS; else r=FAIL; fi
row "migrate_loop: $MOVES moves (tcp/unix) mid-run" $r "moved $moved, refused $refused, pointers equal: $same_ptr, exit $rc"
kill $A $B 2>/dev/null; wait $A $B 2>/dev/null

# --- 2. checkpoint, kill the server, restore on a fresh one --------------------------------------
start_server c; C=$SRV_PID
flyt_app "unix:$W/c.sock" 300 10 >"$OUT/restart.out" 2>"$OUT/restart.err" &
APP=$!
sleep 0.5
id=$(session_of c)
CTL session checkpoint --control "unix:$W/c.ctl" "$id" --to "$SNAP" --stop >"$OUT/checkpoint.log" 2>&1
ck=$?
kill -9 $C; wait $C 2>/dev/null
sleep 0.5
start_server c --snapshot-dir "$SNAP"; C=$SRV_PID
wait $APP; rc=$?
p1=$(grep '^pointers' "$OUT/restart.out" | head -1); p2=$(grep '^pointers' "$OUT/restart.out" | tail -1)
if [ $ck = 0 ] && [ $rc = 0 ] && [ -n "$p1" ] && [ "$p1" = "$p2" ]; then r=PASS; else r=FAIL; fi
row "checkpoint --stop, server killed, fresh server" $r "checkpoint rc $ck, app exit $rc: $(head -c 150 "$OUT/checkpoint.log" | tr '\n' ' ')"
kill $C 2>/dev/null; wait $C 2>/dev/null

# --- 3. timed moves of much memory -----------------------------------------------------------------
for mib in $BIG; do
    start_server a; A=$SRV_PID
    start_server b; B=$SRV_PID
    flyt_app "unix:$W/a.sock" 150 20 "$mib" >"$OUT/big$mib.out" 2>"$OUT/big$mib.err" &
    APP=$!
    id=
    for _ in $(seq 600); do grep -q '^pointers' "$OUT/big$mib.out" 2>/dev/null && break; sleep 0.1; done
    id=$(session_of a)
    started=$(date +%s.%N)
    CTL --json session migrate --control "unix:$W/a.ctl" "$id" --to-control "unix:$W/b.ctl" --to "unix:$W/b.sock" --dir "$SNAP" >"$OUT/big$mib.json" 2>&1
    mrc=$?
    ended=$(date +%s.%N)
    wait $APP; arc=$?
    if [ $mrc = 0 ] && [ $arc = 0 ]; then
        r=PASS
        detail=$(python3 -c "import json,sys; j=json.load(open('$OUT/big$mib.json')); s=j['snapshot']; print('drain %.1f ms, snapshot %.0f ms, restore %.0f ms, total %.0f ms (%.2f GB/s through the snapshot file)' % (s['drain_us']/1e3, s['write_us']/1e3, j['restore_ms'], j['total_ms'], s['device_bytes']/1e9/((s['write_us']/1e6)+j['restore_ms']/1e3)))" 2>&1)
    else
        r=FAIL; detail="app exit $arc: $(head -c 200 "$OUT/big$mib.json" | tr '\n' ' ')"
    fi
    row "move of an app holding $mib MiB more" $r "$detail"
    kill $A $B 2>/dev/null; wait $A $B 2>/dev/null
    rm -rf "$SNAP"
done

{
    echo "| row | result | detail |"
    echo "| --- | --- | --- |"
    printf '%s\n' "${ROWS[@]}"
} | tee "$OUT/table.md"
