#!/usr/bin/env bash
# Probe: does the GPU's used memory (nvidia-smi) drift after native CUDA processes are SIGKILLed?
# The control for the kills soak: the same churn program, natively, killed at random moments.
#   bash gpu-tests/probes/kill-drift.sh OUTDIR [KILLS]
set -u
out=${1:?OUTDIR}
kills=${2:-200}
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
nvcc -O2 -arch=sm_90 -I"$here" -o "$out/churn" "$here/churn.cu" || exit 1
used() { nvidia-smi --query-gpu=memory.used,memory.reserved --format=csv,noheader,nounits -i 0 | tr -d ' '; }
apps() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | tr -d ' ' | tr '\n' ' '; }
echo "before: used,reserved MiB $(used); apps: $(apps)"
slot() {
    local k
    for ((k = $1; k < kills; k += 8)); do
        CHURN_SECONDS=60 "$out/churn" >"$out/c.$1" 2>&1 &
        local p=$! i
        for ((i = 0; i < 3000; i++)); do [ -s "$out/c.$1" ] && break; sleep 0.01; done
        sleep "0.$(printf '%03d' $((RANDOM % 300)))"
        kill -KILL $p
        wait $p 2>/dev/null
    done
}
t0=$SECONDS
for s in 0 1 2 3 4 5 6 7; do slot $s & done
wait
sleep 2
echo "after $kills native kills ($((SECONDS - t0)) s): used,reserved MiB $(used); apps: $(apps)"
