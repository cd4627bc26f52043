#!/usr/bin/env bash
# Probe: NVML's per-process utilization of a busy process, without and with MPS (stopped after).
#   bash gpu-tests/probes/nvml-util.sh OUTDIR
set -u
out=${1:?OUTDIR}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
nvcc -O2 -arch=sm_90 -o "$out/probe" "$here/nvml_util_probe.cu" -lnvidia-ml || exit 1
round() {
    echo "== $1"
    "$out/probe" busy 6 & b1=$!
    "$out/probe" busy 6 & b2=$!
    sleep 3
    echo "busy pids: $b1 $b2"
    "$out/probe" ask
    wait $b1 $b2
    "$out/probe" ask | head -3
}
round "no MPS"
export CUDA_MPS_PIPE_DIRECTORY=$out/mps-pipe CUDA_MPS_LOG_DIRECTORY=$out/mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d && {
    round "MPS"
    echo quit | nvidia-cuda-mps-control
    sleep 1
}
