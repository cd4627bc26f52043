#!/usr/bin/env bash
# Diagnostic on the GPU machine: torch_bench.py (quick) over a Unix socket with the shared-memory
# channel off and on, each with FLYT_STATS=1, printing the benchmark's lines and the per-call
# table (which calls block, how often, for how long) of each run.
#   benchmarks/diagnostics/torch_stats.sh DIST OUT PYTHON
set -uo pipefail
dist=$(cd "${1:?dist folder}" && pwd)
out=${2:?output folder}
python=${3:?a Python with PyTorch}
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
"$dist/bin/flyt-rpc-server" --device cuda --listen "unix:$tmp/flyt.sock" >"$tmp/server.out" 2>"$tmp/server.err" </dev/null &
for _ in $(seq 100); do grep -q listening "$tmp/server.out" 2>/dev/null && break; sleep 0.1; done
for shm in off on; do
    echo "== FLYT_SHM=$shm"
    FLYT_SERVER=unix:$tmp/flyt.sock FLYT_SHM=$shm FLYT_STATS=1 LD_LIBRARY_PATH=$dist/lib \
        "$python" "$here/torch_bench.py" --quick >"$out/torch-$shm.out" 2>"$out/torch-$shm.err"
    echo "exit $?"
    grep -v '"cdf' "$out/torch-$shm.out"
    grep "flyt stats" "$out/torch-$shm.err" | sort -k6 -g -r | head -25
done
