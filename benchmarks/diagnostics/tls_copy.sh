#!/usr/bin/env bash
# Diagnostic on the GPU machine: copies over plain TCP and over TCP under TLS, against one
# flyt-rpc-server each, alternating between the two several times so both see the same machine;
# prints the median GB/s per kind and direction and TLS's share of plain TCP.
#   benchmarks/diagnostics/tls_copy.sh DIST OUT [MiB...]   (default 64 256)
set -uo pipefail
source "$(dirname "$0")/common.sh"
shift 2
if [ $# -gt 0 ]; then sizes=("$@"); else sizes=(64 256); fi
build_probe tls_copy || exit 1
"$dist/bin/flytctl" tls-init --dir "$tmp/tls" --name 127.0.0.1 >/dev/null || exit 1
start_server tcp --device cuda --listen 127.0.0.1:47001 &&
    start_server tls --device cuda --listen 127.0.0.1:47002 --tls-cert "$tmp/tls/cert.pem" --tls-key "$tmp/tls/key.pem" || exit 1
flyt() { FLYT_SERVER=127.0.0.1:$1 FLYT_SHM=off LD_LIBRARY_PATH=$dist/lib "${@:2}"; }
log=$out/tls_copy.log
: >"$log"
for size in "${sizes[@]}"; do
    for pass in 1 2 3; do
        # Three rounds a run; the first round of each run (connection warm-up) is left out.
        flyt 47001 "$tmp/tls_copy" 3 "$size" | sed -n '/^round [12]/s/^/tcp '"$size"' /p' >>"$log"
        FLYT_TLS_CA=$tmp/tls/ca.pem flyt 47002 "$tmp/tls_copy" 3 "$size" | sed -n '/^round [12]/s/^/tls '"$size"' /p' >>"$log"
    done
done
grep -c . "$log" >/dev/null || { echo "no measurements"; exit 1; }
python3 - "$log" <<'PY' | tee "$out/tls_copy.md"
import statistics, sys, re
rates = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+) (\d+) round \d+ (\w+): H2D ([\d.]+) GB/s, D2H ([\d.]+) GB/s", line)
    if not m:
        continue
    transport, size, kind, h2d, d2h = m.groups()
    rates.setdefault((size, kind, "H2D", transport), []).append(float(h2d))
    rates.setdefault((size, kind, "D2H", transport), []).append(float(d2h))
print("| copy | TCP (GB/s) | TCP + TLS (GB/s) | TLS / TCP |")
print("| --- | ---: | ---: | ---: |")
for (size, kind, direction, transport) in sorted(rates):
    if transport != "tcp":
        continue
    tcp = statistics.median(rates[(size, kind, direction, "tcp")])
    tls = statistics.median(rates.get((size, kind, direction, "tls"), [0]))
    print(f"| {size} MiB {kind} {direction} (median of {len(rates[(size, kind, direction, 'tcp')])}) | {tcp:.2f} | {tls:.2f} | {100 * tls / tcp:.0f}% |")
PY
