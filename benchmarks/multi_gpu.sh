#!/usr/bin/env bash
# Two GPUs (or more) in one tenant, natively and through Flyt in the same run: peer copies
# (benchmarks/peer_copy.cu, without and with peer access), NCCL all-reduce with every GPU in one
# process (nccl_single_process.py) and with one process per GPU (nccl_allreduce.py through
# gpu-tests/nccl-ranks.sh), and a DDP training step as torchrun runs it (gpu-tests/torch/ddp.py,
# DDP_TIMES=1). Through Flyt: one flyt-rpc-server with every GPU (--gpu 0,..,N-1), the app over the
# shared-memory channel (shm) and, for the copies, over TCP. Each program's output goes to
# OUT/NAME.MODE.txt; the lines that carry numbers are printed last, side by side.
#   benchmarks/multi_gpu.sh --dist DIR --out DIR [--python P] [--only peer,nccl1,nccl2,ddp]
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
DIST=$root/dist OUT=/tmp/flyt-multi-gpu PY=/opt/torch/.venv/bin/python3 ONLY=peer,nccl1,nccl2,ddp
usage() {
    echo "usage: $0 --dist DIR --out DIR [--python P] [--only peer,nccl1,nccl2,ddp]" >&2
    exit 2
}
# shellcheck source=../gpu-tests/lib/options.sh
. "$here/../gpu-tests/lib/options.sh"
parse_options usage --dist=DIST --out=OUT --python=PY --only=ONLY -- "$@"
absolute_dist_out
export NCCL_NVLS_ENABLE=0
gpus=$(nvidia-smi -L | wc -l)
[ "$gpus" -ge 2 ] || { echo "multi_gpu.sh: $gpus GPU(s) here; needs 2 or more" >&2; exit 2; }
wants() { [[ ",$ONLY," == *",$1,"* ]]; }

TMP=$(mktemp -d /tmp/flyt-multi-gpu.XXXXXX)
"$DIST/bin/flyt-rpc-server" --device cuda --gpu "$(seq -s, 0 $((gpus - 1)))" --listen "unix:$TMP/s.sock" --listen 127.0.0.1:0 \
    >"$TMP/server.out" 2>"$OUT/server.log" &
server=$!
trap 'kill $server 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 100); do [ -S "$TMP/s.sock" ] && grep -q '127.0.0.1' "$TMP/server.out" && break; sleep 0.1; done
tcp=$(grep -o '127\.0\.0\.1:[0-9]*' "$TMP/server.out" | head -n 1)

# run NAME MODE COMMAND...: MODE native, shm (Unix socket + channel) or tcp.
run() {
    local name=$1 mode=$2
    shift 2
    case $mode in
        native) timeout 300 "$@" ;;
        shm) LD_LIBRARY_PATH=$DIST/lib FLYT_SERVER=unix:$TMP/s.sock FLYT_SHM=on timeout 300 "$@" ;;
        tcp) LD_LIBRARY_PATH=$DIST/lib FLYT_SERVER=$tcp FLYT_SHM=off timeout 300 "$@" ;;
    esac >"$OUT/$name.$mode.txt" 2>"$OUT/$name.$mode.err"
    echo "$name $mode: exit $?" >>"$OUT/exits.txt"
}

if wants peer; then
    /usr/local/cuda/bin/nvcc -arch=sm_90 -o "$TMP/peer_copy" "$here/peer_copy.cu"
    for mode in native shm tcp; do run peer_copy $mode "$TMP/peer_copy"; done
fi
if wants nccl1; then
    for mode in native shm; do run nccl_single_process $mode "$PY" "$here/nccl_single_process.py"; done
fi
if wants ddp; then
    for mode in native shm; do run ddp $mode env DDP_TIMES=1 "$PY" "$root/gpu-tests/torch/ddp.py"; done
fi
if wants nccl2; then
    "$root/gpu-tests/nccl-ranks.sh" --dist "$DIST" --out "$TMP/ranks" --python "$PY" --script "$here/nccl_allreduce.py" --timeout 120 \
        >"$OUT/nccl_ranks.log" 2>&1
    cp "$TMP/ranks/native.rank0.out" "$OUT/nccl_ranks.native.txt" 2>/dev/null
    cp "$TMP/ranks/flyt.rank0.out" "$OUT/nccl_ranks.shm.txt" 2>/dev/null
    grep -ho 'via [A-Za-z0-9/]*[A-Za-z0-9]' "$TMP"/ranks/native.rank*.nccl 2>/dev/null | sort | uniq -c >"$OUT/nccl_ranks.native.transports"
    grep -ho 'via [A-Za-z0-9/]*[A-Za-z0-9]' "$TMP"/ranks/flyt.rank*.nccl 2>/dev/null | sort | uniq -c >"$OUT/nccl_ranks.shm.transports"
fi

echo "# multi-GPU benchmarks, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | sed 's/^ *//')"
cat "$OUT/exits.txt" 2>/dev/null
for f in "$OUT"/*.txt "$OUT"/*.transports; do
    [ -e "$f" ] || continue
    case $f in */exits.txt) continue ;; esac
    grep -E 'GB/s|ms|via|FAIL|Error|error' "$f" | sed "s|^|$(basename "$f"): |" | head -n 12
done
