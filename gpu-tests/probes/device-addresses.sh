#!/usr/bin/env bash
# Probe: where a Flyt worker's device addresses lie, next to where the driver puts them natively.
# Runs va_layout_probe --list natively and through a local flyt-rpc-server over shared memory,
# and shows where a warm worker's mappings start (the bottom-up layout: see
# rpc-server/src/address_space.rs).
#   bash gpu-tests/probes/device-addresses.sh DIST OUTDIR
set -u
dist=$(cd "${1:?DIST}" && pwd)
out=${2:?OUTDIR}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
nvcc -o "$out/va" "$here/va_layout_probe.c" -lcuda || exit 1
echo "== native"
"$out/va" --list
sock="$out/flyt.sock"
"$dist/bin/flyt-rpc-server" --listen "unix:$sock" --device cuda >"$out/server.log" 2>&1 &
server=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
echo "== through Flyt (shared memory)"
FLYT_SERVER="unix:$sock" FLYT_SHM=on LD_LIBRARY_PATH="$dist/lib" "$out/va" --list
status=$?
worker=$(pgrep -P "$server" | head -1)
if [ -n "$worker" ]; then
    echo "== a warm worker's first 6 mappings and its libcuda"
    head -6 "/proc/$worker/maps"
    grep -m1 libcuda "/proc/$worker/maps"
fi
kill "$server"
wait "$server" 2>/dev/null
exit $status
