#!/usr/bin/env bash
# PyTorch's nccl backend with one rank per GPU of this machine, natively and through Flyt, as
# torchrun --nproc-per-node N runs it: one flyt-rpc-server serving all N GPUs (--gpu 0,..,N-1),
# every rank a tenant of it over the shared-memory channel (FLYT_SHM=on) seeing all N GPUs and
# using GPU RANK (DEVICE), as natively; the ranks' outputs compared with the native run's. NCCL's
# transport choice is logged (NCCL_DEBUG=INFO) to OUT. The local GPUs are not hidden from the
# Flyt ranks (Flyt's libraries come first on their library path).
#   gpu-tests/nccl-ranks.sh --dist DIR --out DIR [--python P] [--ranks N] [--script PY] [--timeout S]
# --script runs another script the same way (benchmarks/nccl_allreduce.py: timings, printed for
# both runs rather than compared). A rank still running after --timeout seconds (default 300) has
# its threads' stacks (and the server's) written to OUT/LABEL.rankN.stacks before it is stopped.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIST=dist OUT=gpu-tests/results/nccl-ranks PY=/opt/torch/.venv/bin/python RANKS= SCRIPT=$here/torch/nccl.py LIMIT=300
usage() {
    echo "usage: $0 --dist DIR --out DIR [--python P] [--ranks N] [--script PY] [--timeout S]" >&2
    exit 2
}
# shellcheck source=lib/cluster.sh
. "$here/lib/cluster.sh"
parse_options usage --dist=DIST --out=OUT --python=PY --ranks=RANKS --script=SCRIPT --timeout=LIMIT -- "$@"
SCRIPT=$(cd "$(dirname "$SCRIPT")" && pwd)/$(basename "$SCRIPT")
absolute_dist_out
[ -n "$RANKS" ] || RANKS=$(nvidia-smi -L | wc -l)
if [ "$RANKS" -lt 2 ]; then
    echo "nccl-ranks: $RANKS GPU(s) here; needs 2 or more" >&2
    exit 2
fi
TMP=$(mktemp -d /tmp/flyt-nccl-ranks.XXXXXX)
servers=()
trap stop_servers_and_clean EXIT
port=$((29600 + RANDOM % 300))

# run_ranks LABEL ENV_FOR_RANK: starts every rank, waits, keeps each one's output.
run_ranks() {
    local label=$1 pids=() r
    for ((r = 0; r < RANKS; r++)); do
        # NCCL writes its log to stdout unless told otherwise: the ranks' stdout stays comparable.
        env RANK=$r WORLD_SIZE=$RANKS MASTER_ADDR=127.0.0.1 MASTER_PORT=$port NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$OUT/$label.rank$r.nccl" \
            $(rank_env "$label" $r) \
            "$PY" "$SCRIPT" >"$OUT/$label.rank$r.out" 2>"$OUT/$label.rank$r.err" &
        pids+=($!)
    done
    local waited=0
    while [ $waited -lt "$LIMIT" ] && any_alive "${pids[@]}"; do sleep 1; waited=$((waited + 1)); done
    if any_alive "${pids[@]}"; then
        for r in "${!pids[@]}"; do
            kill -0 "${pids[$r]}" 2>/dev/null && dump_stacks "${pids[$r]}" >"$OUT/$label.rank$r.stacks" 2>&1
        done
        [ "$label" = native ] || dump_stacks $(pgrep -f flyt-rpc-server) >"$OUT/$label.server.stacks" 2>&1
        kill -9 "${pids[@]}" 2>/dev/null
        echo "nccl-ranks: $label ranks still running after $LIMIT s: stacks in $OUT/$label.rank*.stacks" >&2
    fi
    local rc=0
    for r in "${!pids[@]}"; do wait "${pids[$r]}" || rc=1; done
    port=$((port + 1))
    return $rc
}
any_alive() {
    local pid
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 0; done
    return 1
}
dump_stacks() {
    local debugger pid
    debugger=$(command -v gdb || command -v cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)
    for pid in "$@"; do
        echo "===== pid $pid: $(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | cut -c1-200)"
        timeout 60 "$debugger" -p "$pid" -batch -ex "set pagination off" -ex "thread apply all bt 25" 2>&1 |
            grep -E '^(Thread|#[0-9]+ )' | cut -c1-300
    done
}
rank_env() {
    if [ "$1" = native ]; then
        echo "DEVICE=$2"
    else
        echo "DEVICE=$2 LD_LIBRARY_PATH=$DIST/lib FLYT_SERVER=unix:$TMP/gpus.sock FLYT_SHM=on"
    fi
}

run_ranks native; native_rc=$?
gpus=$(seq -s, 0 $((RANKS - 1)))
"$DIST/bin/flyt-rpc-server" --device cuda --gpu "$gpus" --listen "unix:$TMP/gpus.sock" >"$OUT/server.log" 2>&1 &
servers+=($!)
for _ in $(seq 100); do [ -S "$TMP/gpus.sock" ] && break; sleep 0.1; done
run_ranks flyt; flyt_rc=$?

echo "| rank | native | flyt | same output |"
echo "| --- | --- | --- | --- |"
all=0
for ((r = 0; r < RANKS; r++)); do
    same=no
    cmp -s "$OUT/native.rank$r.out" "$OUT/flyt.rank$r.out" && same=yes
    [ $same = yes ] || all=1
    echo "| $r | $(tail -1 "$OUT/native.rank$r.out") | $(tail -1 "$OUT/flyt.rank$r.out") | $same |"
done
echo "NCCL transports through Flyt: $(grep -ho 'via [A-Za-z0-9/]*[A-Za-z0-9]' "$OUT"/flyt.rank*.nccl | sort | uniq -c | tr '\n' ' ')"
[ $native_rc = 0 ] && [ $flyt_rc = 0 ] && [ $all = 0 ]
