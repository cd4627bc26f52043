#!/usr/bin/env bash
# One GPU-machine round for the driver library (libcuda.so.1): every gpu-tests program built with
# nvcc's default static runtime plus the library programs, through Flyt on every transport; the
# -cudart=shared programs again, library programs included (Flyt's runtime mixed with NVIDIA's libraries); then the benchmarks, quick. Results under OUT.
#   gpu-tests/driver-round.sh DIST OUT      (DIST: tools/dist output; carry it to the GPU machine)
set -uo pipefail
dist=${1:?usage: driver-round.sh DIST OUT}
out=${2:?usage: driver-round.sh DIST OUT}
cd "$(dirname "$0")/.."
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
timeout 330 gpu-tests/run.sh --dist "$dist" --out "$out/static" --runtime static --soak none --timeout 60 >"$out/static.txt" 2>&1
echo "static: exit $?"
timeout 300 gpu-tests/run.sh --dist "$dist" --out "$out/shared" --soak none --timeout 60 >"$out/shared.txt" 2>&1
echo "shared: exit $?"
timeout 300 benchmarks/run.sh --dist "$dist" --out "$out/bench" --quick >"$out/bench.txt" 2>&1
echo "benchmarks: exit $?"
for t in static shared; do
    echo "== $t: $(grep -c '| PASS |' "$out/$t/table.md" 2>/dev/null) rows pass; the others:"
    grep -E '^\| ' "$out/$t/table.md" 2>/dev/null | grep -v -e '| PASS |' -e '^| program' -e '^| ---' | head -30
done
grep -i "static runtime\|empty launch + sync p50\|null call (cudaStreamQuery) p50" "$out/bench/results.md" 2>/dev/null | head -12
