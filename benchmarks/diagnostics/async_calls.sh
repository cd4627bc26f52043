#!/usr/bin/env bash
# Diagnostic, no GPU needed: the instructions Flyt's driver library spends in the app's process
# per call (async_calls.c: an asynchronous cuMemsetD8Async; with CALL=dtoh a synchronous 4-byte
# cuMemcpyDtoH, FLYT_SPIN_US=0 so that the wait sleeps rather than spins) on the calling thread, counted by
# callgrind (within a few instructions run after run, whatever else the machine does; the
# library's own threads are left out, as they wait or spin as the server's pace has them), for each
# DIST given, against an emulated-device
# server of that build over a Unix socket (no shared memory, no striping). For A/B of two builds.
#   [CALL=memset|dtoh] benchmarks/diagnostics/async_calls.sh OUT DIST...
set -uo pipefail
out=${1:?output folder}
shift
[ $# -gt 0 ] || { echo "async_calls: give one or more dist folders" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "async_calls: needs valgrind" >&2; exit 1; }
source "$(dirname "$0")/common.sh" "$1" "$out"
few=1000 many=11000 call=${CALL:-memset}
case $call in memset | dtoh) ;; *) echo "async_calls: CALL is memset or dtoh, not $call" >&2; exit 2 ;; esac
for build in "$@"; do
    dist=$(cd "$build" && pwd)
    cc -O2 -I"$cuda/include" "$here/async_calls.c" -o "$tmp/async_calls" -L"$dist/lib" -l:libcuda.so.1 || exit 1
    rm -f "$tmp/s.sock"
    start_server emulated --device emulated --listen "unix:$tmp/s.sock" || exit 1
    server=$!
    counts=()
    for calls in $few $many; do
        LD_LIBRARY_PATH=$dist/lib FLYT_SERVER=unix:$tmp/s.sock FLYT_SHM=off FLYT_STRIPES=0 FLYT_SPIN_US=0 timeout 600 \
            valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out/callgrind.$(basename "$dist").$call.$calls" \
            "$tmp/async_calls" "$calls" "$call" >"$tmp/run.txt" 2>&1 || { cat "$tmp/run.txt"; exit 1; }
        # Thread 1 is the app's calling thread.
        counts+=("$(awk '$1 == "totals:" || $1 == "summary:" { print $2; exit }' "$out/callgrind.$(basename "$dist").$call.$calls-01")")
    done
    kill "$server" 2>/dev/null
    wait "$server" 2>/dev/null
    echo "$dist: $(( (counts[1] - counts[0]) / (many - few) )) instructions per $call call"
done
