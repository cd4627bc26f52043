#!/usr/bin/env bash
# Diagnostic on the GPU machine: torch_bench.py (quick) over a Unix socket with the shared-memory
# channel off and on, each with FLYT_STATS=1, printing the benchmark's lines and the per-call
# table (which calls block, how often, for how long) of each run.
#   benchmarks/diagnostics/torch_stats.sh DIST OUT PYTHON
set -uo pipefail
source "$(dirname "$0")/common.sh"
python=${3:?a Python with PyTorch}
start_server server --device cuda --listen "unix:$tmp/flyt.sock" || exit 1
for shm in off on; do
    echo "== FLYT_SHM=$shm"
    FLYT_SERVER=unix:$tmp/flyt.sock FLYT_SHM=$shm FLYT_STATS=1 LD_LIBRARY_PATH=$dist/lib \
        "$python" "$here/../torch_bench.py" --quick >"$out/torch-$shm.out" 2>"$out/torch-$shm.err"
    echo "exit $?"
    grep -v '"cdf' "$out/torch-$shm.out"
    grep "flyt stats" "$out/torch-$shm.err" | sort -k6 -g -r | head -25
done
