#!/usr/bin/env bash
# Copy bandwidth of a VM guest's channel on the GPU machine: benchmarks/copy.cu natively, through
# Flyt over TCP alone (RPC-only mode: every byte on the socket), and over TCP with the segment a
# slot of an ivshmem region (shared-mem mode: pinned blocks and staging in the region, the file
# QEMU would map into the guest). No VM is booted: the guest's client runs on the host against
# the region file, so the figures are the data path's (the region file, DMA from it, the
# socket doorbells), not a guest kernel's or QEMU's.
#
#   benchmarks/ivshmem.sh [--dist DIR] [--out DIR] [--max-bytes N]
#
# Prints a table (median GB/s of the sizes copy.cu sweeps, 1 MiB and up) and writes the raw JSON
# lines to OUT.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dist=$here/../dist out=${OUT:-/tmp}/ivshmem-bench max=$((256 << 20))
while [ $# -gt 0 ]; do
    case $1 in
        --dist) dist=${2:?}; shift 2 ;;
        --out) out=${2:?}; shift 2 ;;
        --max-bytes) max=${2:?}; shift 2 ;;
        *) echo "usage: benchmarks/ivshmem.sh [--dist DIR] [--out DIR] [--max-bytes N]" >&2; exit 2 ;;
    esac
done
dist=$(cd "$dist" && pwd)
mkdir -p "$out"
tmp=$(mktemp -d)
server=
regions=/dev/shm/flyt-bench-$$ # the GPU driver pins only shared-memory pages
cleanup() { [ -z "$server" ] || kill "$server" 2>/dev/null || true; rm -rf "$tmp" "$regions"; }
trap cleanup EXIT
nvcc -O2 -arch=sm_90 -cudart=shared -o "$tmp/copy" "$here/copy.cu"
"$dist/bin/flytctl" ivshmem create bench --dir "$regions" --size 4GiB --sessions 2 >/dev/null
FLYT_LOG=info "$dist/bin/flyt-rpc-server" --device cuda --listen 127.0.0.1:0 --ivshmem-dir "$regions" >"$tmp/server.out" 2>"$tmp/server.err" &
server=$!
for _ in $(seq 300); do grep -q '^flyt-rpc-server listening on ' "$tmp/server.out" && break; sleep 0.1; done
address=$(sed -n 's/^flyt-rpc-server listening on //p' "$tmp/server.out" | awk '{print $1}')
[ -n "$address" ] || { echo "the server did not start" >&2; cat "$tmp/server.err" >&2; exit 1; }
run() { # column env...
    local column=$1
    shift
    env "$@" "$tmp/copy" --max-bytes "$max" >"$out/$column.jsonl" 2>"$out/$column.err" || echo "$column: copy failed (see $out/$column.err)" >&2
}
run native -u FLYT_SERVER
run tcp "LD_LIBRARY_PATH=$dist/lib" "FLYT_SERVER=$address" FLYT_SHM=off
run ivshmem "LD_LIBRARY_PATH=$dist/lib" "FLYT_SERVER=$address" FLYT_SHM=on "FLYT_IVSHMEM=$regions/bench"
grep -c "region wiped" "$tmp/server.err" >"$out/regions_used.txt" || true
python3 - "$out" <<'EOF'
import json, sys, os
out = sys.argv[1]
cols = ["native", "tcp", "ivshmem"]
data = {}
for c in cols:
    for line in open(os.path.join(out, c + ".jsonl")):
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if j.get("name", j.get("bench")) == "copy" or ("gbps" in j and "bytes" in j):
            if j.get("bytes", 0) >= 1 << 20 and j.get("mem") in ("pinned", "pageable") and j.get("dir") in ("H2D", "D2H", "h2d", "d2h"):
                data[(c, j["mem"], j["dir"].upper(), j["bytes"])] = j["gbps"]
keys = sorted({(m, d, b) for (_, m, d, b) in data})
print("| copy | bytes | " + " | ".join(cols) + " (GB/s, median) |")
print("| --- | ---: | " + " | ".join("---:" for _ in cols) + " |")
for m, d, b in keys:
    print(f"| {m} {d} | {b >> 20} MiB | " + " | ".join(f"{data.get((c, m, d, b), float('nan')):.2f}" for c in cols) + " |")
print(f"sessions that used the region (wiped after): {open(os.path.join(out, 'regions_used.txt')).read().strip()}")
EOF
