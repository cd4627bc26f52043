#!/usr/bin/env bash
# Probe: does the GPU's used memory (nvidia-smi) drift after native CUDA processes are SIGKILLed?
# The native control for the kills soak: the same churn program, natively, killed at random
# moments, PAR at a time, while HOLDERS idle processes keep a context each (as the server's warm
# workers do through the soak).
#   bash gpu-tests/probes/kill-drift.sh OUTDIR [KILLS] [PAR] [HOLDERS]
set -u
out=${1:?OUTDIR}
kills=${2:-200}
par=${3:-8}
holders=${4:-0}
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
nvcc -O2 -arch=sm_90 -I"$here" -o "$out/churn" "$here/churn.cu" || exit 1
printf '#include <cstdio>\n#include <unistd.h>\n#include <cuda_runtime.h>\nint main(){cudaFree(0);printf("up\\n");fflush(stdout);pause();}\n' >"$out/holder.cu"
nvcc -O2 -arch=sm_90 -o "$out/holder" "$out/holder.cu" || exit 1
used() { nvidia-smi --query-gpu=memory.used,memory.reserved --format=csv,noheader,nounits -i 0 | tr -d ' '; }
apps() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | tr -d ' ' | tr '\n' ' '; }
hp=()
for ((h = 0; h < holders; h++)); do
    "$out/holder" >"$out/h.$h" & hp+=($!)
done
for ((h = 0; h < holders; h++)); do
    for ((i = 0; i < 3000; i++)); do [ -s "$out/h.$h" ] && break; sleep 0.01; done
done
sleep 2
echo "before ($holders holders): used,reserved MiB $(used); apps: $(apps)"
slot() {
    local k
    for ((k = $1; k < kills; k += par)); do
        CHURN_SECONDS=60 "$out/churn" >"$out/c.$1" 2>&1 &
        local p=$! i
        for ((i = 0; i < 3000; i++)); do [ -s "$out/c.$1" ] && break; sleep 0.01; done
        sleep "0.$(printf '%03d' $((RANDOM % 300)))"
        kill -KILL $p
        wait $p 2>/dev/null
    done
}
t0=$SECONDS
sp=()
for ((s = 0; s < par; s++)); do
    slot $s &
    sp+=($!)
done
wait "${sp[@]}"
sleep 3
echo "after $kills native kills, $par at a time ($((SECONDS - t0)) s): used,reserved MiB $(used); apps: $(apps)"
kill "${hp[@]}" 2>/dev/null
wait 2>/dev/null
sleep 2
echo "holders gone: used,reserved MiB $(used)"
