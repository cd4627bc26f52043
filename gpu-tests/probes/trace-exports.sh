#!/usr/bin/env bash
# Runs library programs natively with export_trace.so preloaded and writes what the driver's private
# table entries were called with and answered, per program, under OUT. GPU machine only.
#   gpu-tests/probes/trace-exports.sh OUT [ENTRIES]
set -uo pipefail
out=${1:?usage: trace-exports.sh OUT [ENTRIES]}
entries=${2:-21318c60:4,21318c60:39,21318c60:51,6e163fbe:7,f8cff951:1,f8cff951:2,69a28e9f:19,69a28e9f:21,69a28e9f:24,69a28e9f:25}
here=$(cd "$(dirname "$0")/.." && pwd)
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
lib64=$(dirname "$NVCC")/../lib64
bin=$(mktemp -d)
mkdir -p "$out"
gcc -O1 -shared -fPIC -o "$bin/export_trace.so" "$here/probes/export_trace.c" -ldl -lpthread || exit 1
for p in libraries/cublas_gemm libraries/cublaslt_matmul libraries/cufft_transforms libraries/cusolver_getrf device_info; do
    n=$(basename $p)
    link=$(sed -n '1s|^// link: ||p' "$here/$p.cu")
    "$NVCC" -O2 -arch=sm_90 -I"$here" -I"$here/libraries" -o "$bin/$n" "$here/$p.cu" $link -Xlinker -rpath="$lib64" >"$bin/$n.build.txt" 2>&1 || { echo "$n: build failed"; continue; }
    EXPORT_TRACE=$entries EXPORT_TRACE_OUT="$out/$n.trace.txt" LD_PRELOAD="$bin/export_trace.so" timeout 120 "$bin/$n" >"$bin/$n.stdout.txt" 2>&1
    echo "$n: exit $?, $(grep -c ' call .* returned' "$out/$n.trace.txt" 2>/dev/null) traced calls logged"
done
# The private-entry probe: meanings read off against public facts.
gcc -O1 -o "$bin/tools_probe" "$here/probes/tools_probe.c" -I"$lib64/../include" -L"$lib64/stubs" -lcuda && "$bin/tools_probe" >"$out/tools_probe.txt" 2>&1
echo "tools_probe: exit $?"
if command -v python3 >/dev/null && python3 -c 'import torch' 2>/dev/null; then
    EXPORT_TRACE=$entries EXPORT_TRACE_OUT="$out/torch.trace.txt" LD_PRELOAD="$bin/export_trace.so" timeout 300 python3 -c '
import torch
a = torch.randn(256, 256, device="cuda"); b = a @ a; torch.cuda.synchronize()
m = torch.nn.Linear(64, 64).cuda(); l = m(torch.randn(8, 64, device="cuda")).sum(); l.backward(); torch.cuda.synchronize()
print("torch ok", float(b.sum()) == float(b.sum()))' >"$bin/torch.stdout.txt" 2>&1
    echo "torch: exit $?, $(grep -c ' call .* returned' "$out/torch.trace.txt" 2>/dev/null) traced calls logged"
fi
for f in "$out"/*.trace.txt; do echo "== $(basename "$f"): calls per entry"; grep -o '^[0-9a-f]*\[[0-9]*\] call [0-9]* returned' "$f" | awk '{print $1}' | sort | uniq -c; done
