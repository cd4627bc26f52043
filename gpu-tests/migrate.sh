#!/usr/bin/env bash
# migrate.sh --dist DIR --out DIR [--moves N] [--app-mib MIB] [--big-mib LIST] [--skip LIST]
#            [--snapshots PARENT-DIR] [--gpus A,B]:
# live migration and checkpoint/restore of running apps between two rpc-servers on this machine's
# GPU (or, with --gpus A,B, server a on GPU A and server b on GPU B), the apps unable to see the GPU.
#
#   app-shm, app-socket: migration/migrate_app.cu (nvcc, static runtime; MIB of device memory in
#      many sizes, four streams, events, module globals, kernels every round) runs natively, then
#      through Flyt while `flytctl session migrate` moves it N times between the two servers,
#      alternating TCP and the Unix socket: once over the shared-memory channel (its segment, its
#      page-locked buffer and its rings follow it), once with FLYT_SHM=off. Its output must be
#      the native one and its pointers (allocations and symbols) the same at the end as at the start.
#   objects: migration/migrate_objects.cu (memory pools and stream-ordered allocations, arrays,
#      a mipmapped array, texture and surface objects read and written by kernels) moved N times
#      the same way over the shared-memory channel (every other move through the snapshot file);
#      output as native, pointers and handles kept.
#   graphs: migration/migrate_graphs.cu (a graph captured from two streams, a graph built by the
#      API whose executable graph the app changes, graph launches in flight while it moves) moved
#      N times the same way; output as native, pointers kept.
#   torch-graph (with --python): migration/migrate_torch_graph.py, a PyTorch MLP captured into a
#      CUDA graph and replayed (replays in flight while it moves), moved N times the same way.
#   two-gpus (two GPUs or more): migration/migrate_two_gpus.cu (memory, a stream, an event and a
#      module global on each of two GPUs, peer access both ways, kernels reading the other GPU's
#      memory, peer copies every round) moved N times the same way between two servers that both
#      serve the pair (--gpu A,B, from TWO_GPUS, default 0,1): the session moves whole, through
#      the snapshot file (a session of several GPUs is not handed over GPU to GPU); output as
#      native (GPU 1 still current after the move, each pointer's GPU), pointers kept.
#   restart: the same app checkpointed with --stop, its server killed, a fresh server started with
#      --snapshot-dir: the app must go on and print the native output.
#   cluster-restart: the same app through tools/local-cluster (flyt run), its allocation's server
#      replaced by `flytctl restart-server` while it runs: native output, pointers kept.
#   cluster-move (two GPUs or more): the same app through tools/local-cluster, its allocation
#      moved by `flytctl migrate` to GPU 1 of the node and back: native output, pointers kept.
#   big: for each size in --big-mib, one timed move of migrate_loop (driver API) holding that much
#      more memory (pause = drain + snapshot + restore), GPU to GPU and through the snapshot file.
# Moves go GPU to GPU where they can (flytctl session migrate --copy auto): both servers use this
# GPU, or with --gpus the source's memory is imported on the target's GPU and copied peer to peer.
# Snapshots go to /dev/shm (or --snapshots), where the GPU copies straight into the files' pinned pages.
# A short table is printed last; everything else goes to OUT.
set -u
here=$(cd "$(dirname "$0")" && pwd)
DIST= OUT= MOVES=10 APP_MIB=10240 BIG="1024 10240" SKIP= SNAP_PARENT=/dev/shm PYTHON= GPUS=0,0
usage() {
    echo "usage: $0 --dist DIR --out DIR [--moves N] [--app-mib MIB] [--big-mib 'MIB ...'] [--skip 'app-shm app-socket objects graphs torch-graph two-gpus restart cluster-restart cluster-move big'] [--snapshots PARENT-DIR] [--python PYTHON-WITH-TORCH] [--gpus A,B]" >&2
    exit 2
}
# shellcheck source=lib/options.sh
. "$here/lib/options.sh"
parse_options usage --dist=DIST --out=OUT --moves=MOVES --app-mib=APP_MIB --big-mib=BIG --skip=SKIP \
    --snapshots=SNAP_PARENT --python=PYTHON --gpus=GPUS -- "$@"
skipped() { case " $SKIP " in *" $1 "*) return 0 ;; esac; return 1; }
IFS=, read -r GPU_A GPU_B <<<"$GPUS"
[[ "$GPU_A" =~ ^[0-9]+$ && "$GPU_B" =~ ^[0-9]+$ ]] || { echo "--gpus takes two GPU indexes, A,B" >&2; exit 2; }
[ -n "$DIST" ] && [ -n "$OUT" ] || { echo "--dist and --out are needed" >&2; exit 2; }
absolute_dist_out
W=$(mktemp -d /tmp/flyt-migrate.XXXXXX)
# Snapshots go through shared memory (a folder both servers of this host read), or a folder on
# disk (--snapshots DIR: copied through staging buffers, as the GPU cannot pin a disk file).
SNAP=$SNAP_PARENT/flyt-migrate-snap-$$
trap 'pkill -f "$W/" 2>/dev/null; rm -rf "$W" "$SNAP"' EXIT
CUDA_INC=${CUDA_HOME:-/usr/local/cuda}/include
ROWS=()
row() { ROWS+=("$(printf '| %-44s | %-6s | %s |' "$1" "$2" "$3")"); printf '%s\n' "${ROWS[-1]}" >>"$OUT/rows.md"; }

# --- build -------------------------------------------------------------------------------------
cc -std=gnu11 -O2 -Wall -I"$CUDA_INC" -I"$here/../cuda-shim/cdylib/tests/c" \
    "$here/../cuda-shim/cdylib/tests/c/migrate_loop.c" -o "$W/migrate_loop" -L"$DIST/lib" -l:libcuda.so.1 || { echo "build failed"; exit 1; }
NVCC=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
"$NVCC" -O2 -arch="${ARCH:-sm_90}" -o "$W/migrate_app" "$here/migration/migrate_app.cu" || { echo "nvcc failed"; exit 1; }
"$NVCC" -O2 -arch="${ARCH:-sm_90}" -o "$W/migrate_objects" "$here/migration/migrate_objects.cu" -lcuda || { echo "nvcc failed"; exit 1; }
"$NVCC" -O2 -arch="${ARCH:-sm_90}" -o "$W/migrate_graphs" "$here/migration/migrate_graphs.cu" || { echo "nvcc failed"; exit 1; }
"$NVCC" -O2 -arch="${ARCH:-sm_90}" -o "$W/migrate_two_gpus" "$here/migration/migrate_two_gpus.cu" || { echo "nvcc failed"; exit 1; }
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
    # (server b on GPU B, the others on GPU A)
    local name=$1 gpu=$GPU_A; shift
    [ "$name" = b ] && gpu=$GPU_B
    rm -f "$W/$name.sock" "$W/$name.ctl"
    FLYT_LOG=${FLYT_SERVER_LOG:-info} "$DIST/bin/flyt-rpc-server" --device "${FLYT_MIGRATE_DEVICE:-cuda}" --gpu "$gpu" --listen "unix:$W/$name.sock" --listen 127.0.0.1:0 \
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
flyt_loop() { # SERVER-ADDRESS ARGS... (GPU hidden)
    local server=$1; shift
    "$W/hide_gpu" "$HIDE" -- env LD_LIBRARY_PATH="$W/lib" FLYT_SERVER="$server" FLYT_TOKEN="$TOKEN" FLYT_SHM=off "$W/migrate_loop" "$@"
}
flyt_app() { # SHM(on|off) SERVER-ADDRESS ARGS... (GPU hidden)
    local shm=$1 server=$2; shift 2
    "$W/hide_gpu" "$HIDE" -- env LD_LIBRARY_PATH="$W/lib" FLYT_SERVER="$server" FLYT_TOKEN="$TOKEN" FLYT_SHM="$shm" FLYT_RESUME_TIMEOUT=120 "${PROGRAM:-$W/migrate_app}" "$@"
}
move_around() { # LOG [ODD-COPY]: MOVES moves of the one session between servers a and b (it starts
    # on a), alternating TCP and the Unix socket, odd moves with --copy ODD-COPY if given (else
    # auto); sets moved, refused and pauses (ms each, f: through the file)
    local log=$1 odd_copy=${2:-auto} here_name=a to addr id i copy
    moved=0 refused=0 pauses=()
    : >"$log"
    for i in $(seq "$MOVES"); do
        sleep 0.3
        if [ $here_name = a ]; then to=b; else to=a; fi
        if [ $((i % 2)) = 1 ]; then addr=$(cat "$W/$to.tcp") copy=$odd_copy; else addr="unix:$W/$to.sock" copy=auto; fi
        id=$(session_of $here_name)
        if CTL --json session migrate --control "unix:$W/$here_name.ctl" "$id" --to-control "unix:$W/$to.ctl" --to "$addr" --dir "$SNAP" --copy $copy >"$W/move.json" 2>>"$log"; then
            moved=$((moved + 1)); here_name=$to
            cat "$W/move.json" >>"$log"
            pauses+=("$(python3 -c "import json; j=json.load(open('$W/move.json')); print('%.0f%s' % (j['total_ms'], '' if j.get('copy') == 'device' else 'f'))")")
        else
            refused=$((refused + 1))
        fi
    done
}
median_of() { printf '%s\n' "$@" | tr -d f | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }
same_output() { # NATIVE FLYT: the same lines but the pointer lines, and pointers equal start to end
    # (the "after the gate" line is the gated run's own: the native run has no gate)
    local p1 p2
    p1=$(grep '^pointers' "$2" | head -1); p2=$(grep '^pointers' "$2" | tail -1)
    [ -n "$p1" ] && [ "$p1" = "$p2" ] || return 1
    cmp -s <(grep -v '^pointers\|^after the gate' "$1") <(grep -v '^pointers\|^after the gate' "$2")
}
ROUNDS=200

# --- the app natively ---------------------------------------------------------------------------
if ! skipped app-shm || ! skipped app-socket || ! skipped restart || ! skipped cluster-restart || ! skipped cluster-move; then
    "$W/migrate_app" "$APP_MIB" $ROUNDS 0 >"$OUT/native.out" 2>&1 || echo "native run failed: $(tail -2 "$OUT/native.out")"
fi

# --- 1. moves of a running app ------------------------------------------------------------------
for mode in shm socket; do
    skipped "app-$mode" && continue
    if [ $mode = shm ]; then shm=on; else shm=off; fi
    start_server a; A=$SRV_PID
    start_server b; B=$SRV_PID
    gate=$W/gate-$mode
    flyt_app $shm "unix:$W/a.sock" "$APP_MIB" $ROUNDS 5 "$gate" >"$OUT/$mode.out" 2>"$OUT/$mode.err" &
    APP=$!
    for _ in $(seq 1200); do grep -q holding "$OUT/$mode.err" 2>/dev/null && break; kill -0 $APP 2>/dev/null || break; sleep 0.1; done
    move_around "$OUT/moves-$mode.log"
    touch "$gate"
    wait $APP; rc=$?
    same=no; same_output "$OUT/native.out" "$OUT/$mode.out" && same=yes
    if [ $rc = 0 ] && [ $moved = "$MOVES" ] && [ $same = yes ]; then r=PASS; else r=FAIL; fi
    median=$(median_of "${pauses[@]}")
    row "migrate_app $APP_MIB MiB ($mode): $MOVES moves tcp/unix" $r "moved $moved, refused $refused, output and pointers as native: $same, exit $rc, move total median $median ms (each, f: through the file: ${pauses[*]})"
    kill $A $B 2>/dev/null; wait $A $B 2>/dev/null
done

# --- 1b-1d. moves of apps holding pools, arrays, textures and graphs --------------------------
moved_row() { # NAME LABEL PROGRAM [ARGS...]: PROGRAM ARGS ROUNDS 5 natively, then through Flyt,
    # held at its gate while it moves MOVES times (every other move through the snapshot file)
    local name=$1 label=$2 program=$3 gate=$W/gate-$1 rc same r
    shift 3
    "$program" "$@" $ROUNDS 5 >"$OUT/$name-native.out" 2>&1 || echo "native $name run failed: $(tail -2 "$OUT/$name-native.out")"
    start_server a; A=$SRV_PID
    start_server b; B=$SRV_PID
    PROGRAM=$program flyt_app on "unix:$W/a.sock" "$@" $ROUNDS 5 "$gate" >"$OUT/$name.out" 2>"$OUT/$name.err" &
    APP=$!
    for _ in $(seq 1200); do grep -q holding "$OUT/$name.err" 2>/dev/null && break; kill -0 $APP 2>/dev/null || break; sleep 0.1; done
    move_around "$OUT/moves-$name.log" file
    touch "$gate"
    wait $APP; rc=$?
    same=no; same_output "$OUT/$name-native.out" "$OUT/$name.out" && same=yes
    # A program that says where it stands after the gate must stand where it stood before.
    [ -n "${AFTER_GATE:-}" ] && ! grep -qx "$AFTER_GATE" "$OUT/$name.out" && same=no
    if [ $rc = 0 ] && [ $moved = "$MOVES" ] && [ $same = yes ]; then r=PASS; else r=FAIL; fi
    row "$label: $MOVES moves" $r "moved $moved, refused $refused, output, pointers and handles as native: $same, exit $rc, move total median $(median_of "${pauses[@]}") ms (${pauses[*]})"
    kill $A $B 2>/dev/null; wait $A $B 2>/dev/null
    rm -rf "$SNAP"
}
skipped objects || moved_row objects "migrate_objects (pools, arrays, textures)" "$W/migrate_objects"
skipped graphs || moved_row graphs "migrate_graphs (captured and built graphs, launches in flight)" "$W/migrate_graphs"
if [ -n "$PYTHON" ] && ! skipped torch-graph; then
    moved_row torch-graph "PyTorch CUDA graph replaying" "$PYTHON" "$here/migration/migrate_torch_graph.py"
fi
# A session of two GPUs: both servers serve the pair (start_server's GPU_A and GPU_B, for this row).
if ! skipped two-gpus && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
    TWO_GPUS=${TWO_GPUS:-0,1}
    saved_gpus="$GPU_A $GPU_B"
    GPU_A=$TWO_GPUS GPU_B=$TWO_GPUS
    AFTER_GATE="after the gate: current GPU 1, memory of GPU 0 and GPU 1" \
        moved_row two-gpus "migrate_two_gpus (session of GPUs $TWO_GPUS moved whole)" "$W/migrate_two_gpus"
    read -r GPU_A GPU_B <<<"$saved_gpus"
fi

# --- 2. checkpoint, kill the server, restore on a fresh one --------------------------------------
if ! skipped restart; then
    start_server c; C=$SRV_PID
    gate=$W/gate-restart
    flyt_app on "unix:$W/c.sock" "$APP_MIB" $ROUNDS 5 "$gate" >"$OUT/restart.out" 2>"$OUT/restart.err" &
    APP=$!
    for _ in $(seq 1200); do grep -q holding "$OUT/restart.err" 2>/dev/null && break; kill -0 $APP 2>/dev/null || break; sleep 0.1; done
    id=$(session_of c)
    CTL session checkpoint --control "unix:$W/c.ctl" "$id" --to "$SNAP" --stop >"$OUT/checkpoint.log" 2>&1
    ck=$?
    kill -9 $C; wait $C 2>/dev/null
    sleep 0.5
    started=$(date +%s%N)
    start_server c --snapshot-dir "$SNAP"; C=$SRV_PID
    touch "$gate"
    wait $APP; rc=$?
    same=no; same_output "$OUT/native.out" "$OUT/restart.out" && same=yes
    if [ $ck = 0 ] && [ $rc = 0 ] && [ $same = yes ]; then r=PASS; else r=FAIL; fi
    row "checkpoint --stop, server killed, fresh server" $r "checkpoint rc $ck, app exit $rc, output and pointers as native: $same: $(head -c 200 "$OUT/checkpoint.log" | tr '\n' ' ')"
    kill $C 2>/dev/null; wait $C 2>/dev/null
    rm -rf "$SNAP"
fi

# in_local_cluster INNER LOG NAME: runs the script INNER under `flyt run` of tools/local-cluster
# (DIST's binaries, under the names it looks for, in $W/cluster-bin), its output in LOG; rc its
# exit status, same whether $OUT/NAME.out is the native output.
in_local_cluster() {
    local bin=$W/cluster-bin b
    mkdir -p "$bin"
    for b in flyt flyt-rpc-server flytctl flyt-cluster-manager flyt-node-manager flyt-client-manager; do ln -sf "$DIST/bin/$b" "$bin/$b"; done
    ln -sf "$DIST/lib/libcudart.so.13" "$bin/libcudart.so"
    ln -sf "$DIST/lib/libcuda.so.1" "$bin/libflyt_libcuda.so"
    ln -sf "$DIST/lib/libnvidia-ml.so.1" "$bin/libflyt_nvml_lib.so"
    chmod +x "$1"
    "$here/../tools/local-cluster" --bin-dir "$bin" -- "$1" >"$2" 2>&1
    rc=$?
    same=no; same_output "$OUT/native.out" "$OUT/$3.out" && same=yes
}

# --- 2b. flytctl restart-server under a local cluster ---------------------------------------------
# The app runs through `flyt run` of tools/local-cluster (cluster manager on its embedded store,
# node manager serving this GPU, client manager), held at its gate while `flytctl restart-server`
# replaces its allocation's rpc-server (the node manager checkpoints, stops, restarts, restores).
if ! skipped cluster-restart; then
    gate=$W/gate-cluster
    cat >"$W/cluster_inner.sh" <<INNER
#!/usr/bin/env bash
# Under flyt run: the app (GPU hidden) held at its gate while its server is replaced.
"$W/hide_gpu" "$HIDE" -- env FLYT_RESUME_TIMEOUT=120 "$W/migrate_app" $APP_MIB $ROUNDS 5 "$gate" >"$OUT/cluster-restart.out" 2>"$OUT/cluster-restart.err" &
app=\$!
for _ in \$(seq 1200); do grep -q holding "$OUT/cluster-restart.err" 2>/dev/null && break; kill -0 \$app 2>/dev/null || break; sleep 0.1; done
started=\$(date +%s%N)
"$DIST/bin/flytctl" restart-server 127.0.0.1 >"$OUT/restart-server.log" 2>&1
echo "restart-server rc=\$? in \$(( (\$(date +%s%N) - started) / 1000000 )) ms" >>"$OUT/restart-server.log"
touch "$gate"
wait \$app
INNER
    in_local_cluster "$W/cluster_inner.sh" "$OUT/cluster.log" cluster-restart
    restarted=no; grep -q "rpc-server restarted" "$OUT/restart-server.log" && restarted=yes
    if [ $rc = 0 ] && [ $same = yes ] && [ $restarted = yes ]; then r=PASS; else r=FAIL; fi
    row "restart-server under a local cluster" $r "server replaced: $restarted, app exit $rc, output and pointers as native: $same: $(grep -m1 'rpc-server restarted\|rc=' "$OUT/restart-server.log" | head -c 220)"
fi

# --- 2c. flytctl migrate between this host's GPUs under a local cluster -----------------------------
# With two GPUs or more: the app runs through `flyt run` of tools/local-cluster while
# `flytctl migrate` moves its allocation to GPU 1 of the node and back (placement picks GPU 0).
if ! skipped cluster-move && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
    gate=$W/gate-cluster-move
    cat >"$W/cluster_move.sh" <<INNER
#!/usr/bin/env bash
# Under flyt run: the app (GPU hidden) held at its gate while its allocation moves GPU 0 -> 1 -> 0.
"$W/hide_gpu" "$HIDE" -- env FLYT_RESUME_TIMEOUT=120 "$W/migrate_app" $APP_MIB $ROUNDS 5 "$gate" >"$OUT/cluster-move.out" 2>"$OUT/cluster-move.err" &
app=\$!
for _ in \$(seq 1200); do grep -q holding "$OUT/cluster-move.err" 2>/dev/null && break; kill -0 \$app 2>/dev/null || break; sleep 0.1; done
for to in local/1 local; do
    "$DIST/bin/flytctl" migrate 127.0.0.1 --to \$to >>"$OUT/cluster-move.log" 2>&1
    echo "migrate --to \$to rc=\$?" >>"$OUT/cluster-move.log"
    sleep 0.5
done
# Why a move did not go GPU to GPU, if one did not (the cluster manager's log).
grep -h "not GPU to GPU" "\$(dirname "\$FLYTCTL_ADMIN_SOCKET")"/*.log >>"$OUT/cluster-move.log" 2>/dev/null
touch "$gate"
wait \$app
INNER
    in_local_cluster "$W/cluster_move.sh" "$OUT/cluster-move-cluster.log" cluster-move
    moves=$(grep -c 'rc=0$' "$OUT/cluster-move.log" 2>/dev/null)
    if [ $rc = 0 ] && [ $same = yes ] && [ "$moves" = 2 ]; then r=PASS; else r=FAIL; fi
    row "flytctl migrate GPU 0 -> 1 -> 0 of one node" $r "moves ok: $moves of 2, app exit $rc, output and pointers as native: $same: $(grep -o 'moved from [^ ]* to [^ ]* with [0-9]* app in [0-9.]* ms' "$OUT/cluster-move.log" | tr '\n' ';')"
fi

# --- 3. timed moves of much memory, GPU to GPU and through the snapshot file ---------------------
for mib in $BIG; do
    skipped big && break
    for copy in device file; do
        start_server a; A=$SRV_PID
        start_server b; B=$SRV_PID
        flyt_loop "unix:$W/a.sock" 150 20 "$mib" >"$OUT/big$mib-$copy.out" 2>"$OUT/big$mib-$copy.err" &
        APP=$!
        for _ in $(seq 600); do grep -q '^pointers' "$OUT/big$mib-$copy.out" 2>/dev/null && break; sleep 0.1; done
        id=$(session_of a)
        CTL --json session migrate --control "unix:$W/a.ctl" "$id" --to-control "unix:$W/b.ctl" --to "unix:$W/b.sock" --dir "$SNAP" --copy $copy >"$OUT/big$mib-$copy.json" 2>&1
        mrc=$?
        wait $APP; arc=$?
        if [ $mrc = 0 ] && [ $arc = 0 ]; then
            r=PASS
            detail=$(python3 -c "import json,sys; j=json.load(open('$OUT/big$mib-$copy.json')); s=j['snapshot']; print('drain %.1f ms, snapshot %.0f ms, restore %.0f ms, total %.0f ms (%.2f GB/s)' % (s['drain_us']/1e3, s['write_us']/1e3, j['restore_ms'], j['total_ms'], s['device_bytes']/1e9/((s['write_us']/1e6)+j['restore_ms']/1e3)))" 2>&1)
        else
            r=FAIL; detail="app exit $arc: $(head -c 200 "$OUT/big$mib-$copy.json" | tr '\n' ' ')"
        fi
        row "move of an app holding $mib MiB more ($copy)" $r "$detail"
        kill $A $B 2>/dev/null; wait $A $B 2>/dev/null
        rm -rf "$SNAP"
    done
done

{
    echo "| row | result | detail |"
    echo "| --- | --- | --- |"
    printf '%s\n' "${ROWS[@]}"
} | tee "$OUT/table.md"
