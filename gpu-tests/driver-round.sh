#!/usr/bin/env bash
# One GPU-machine round for the driver library (libcuda.so.1): every gpu-tests program built with
# nvcc's default static runtime plus the library programs and the PyTorch scripts, through Flyt on
# every transport; the -cudart=shared programs again, library programs included (Flyt's runtime
# mixed with NVIDIA's libraries); then the benchmarks, quick. Results under OUT. The device tool
# runs a command for at most 10 minutes: run the phases as separate commands (the PyTorch scripts
# are a phase of their own: with them the static phase outran its limit on 2026-11-27).
#   gpu-tests/driver-round.sh DIST OUT [tests|torch|frameworks|bench|all]   (DIST: tools/dist output, carried over)
# PYTHON (default /opt/torch/.venv/bin/python, when it exists) runs the scripts in torch/.
set -uo pipefail
dist=${1:?usage: driver-round.sh DIST OUT [tests|torch|frameworks|bench|all]}
out=${2:?usage: driver-round.sh DIST OUT [tests|torch|frameworks|bench|all]}
phase=${3:-all}
case $phase in tests | torch | frameworks | bench | all) ;; *) echo "driver-round.sh: phase is tests, torch, frameworks, bench or all, not '$phase'" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
mkdir -p "$out"
python=${PYTHON:-/opt/torch/.venv/bin/python}
torch=()
[ -x "$python" ] && torch=(--python "$python")
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
if [ "$phase" = torch ] || [ "$phase" = all ]; then
    if [ ${#torch[@]} -eq 0 ]; then
        echo "torch: no Python with PyTorch at $python (set PYTHON)"
    else
        scripts=$(cd gpu-tests/torch && ls *.py | sed 's/\.py$//; s/^/torch_/' | paste -sd, -)
        timeout 300 gpu-tests/run.sh --dist "$dist" --out "$out/torch" --soak none --timeout 120 "${torch[@]}" --only "$scripts" >"$out/torch.txt" 2>&1
        echo "torch: exit $?"
        echo "== torch: $(grep -c '| PASS |' "$out/torch/table.md" 2>/dev/null) rows pass; the others:"
        grep -E '^\| ' "$out/torch/table.md" 2>/dev/null | grep -v -e '| PASS |' -e '^| program' -e '^| ---' | head -30
    fi
fi
if [ "$phase" = frameworks ] || [ "$phase" = all ]; then
    if [ ${#torch[@]} -eq 0 ]; then
        echo "frameworks: no Python at $python (set PYTHON)"
    else
        # One transport at a time: JAX preallocates three quarters of the GPU per process.
        scripts=$(cd gpu-tests/frameworks && ls *.py | sed 's/\.py$//; s/^/fw_/' | paste -sd, -)
        timeout 540 gpu-tests/run.sh --dist "$dist" --out "$out/frameworks" --soak none --timeout 150 --serial "${torch[@]}" --only "$scripts" >"$out/frameworks.txt" 2>&1
        echo "frameworks: exit $?"
        echo "== frameworks: $(grep -c '| PASS |' "$out/frameworks/table.md" 2>/dev/null) rows pass; the others:"
        grep -E '^\| ' "$out/frameworks/table.md" 2>/dev/null | grep -v -e '| PASS |' -e '^| program' -e '^| ---' | head -30
    fi
fi
if [ "$phase" = tests ] || [ "$phase" = all ]; then
    timeout 300 gpu-tests/run.sh --dist "$dist" --out "$out/static" --runtime static --soak none --timeout 120 >"$out/static.txt" 2>&1
    echo "static: exit $?"
    timeout 240 gpu-tests/run.sh --dist "$dist" --out "$out/shared" --soak none --timeout 60 >"$out/shared.txt" 2>&1
    echo "shared: exit $?"
    for t in static shared; do
        echo "== $t: $(grep -c '| PASS |' "$out/$t/table.md" 2>/dev/null) rows pass; the others:"
        grep -E '^\| ' "$out/$t/table.md" 2>/dev/null | grep -v -e '| PASS |' -e '^| program' -e '^| ---' | head -30
    done
fi
if [ "$phase" = bench ] || [ "$phase" = all ]; then
    timeout 300 benchmarks/run.sh --dist "$dist" --out "$out/bench" --quick >"$out/bench.txt" 2>&1
    echo "benchmarks: exit $?"
    grep -i "static runtime\|empty launch + sync p50\|null call (cudaStreamQuery) p50" "$out/bench/results.md" 2>/dev/null | head -12
fi
