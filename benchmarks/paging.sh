#!/usr/bin/env bash
# Paging speed on an oversubscribed GPU (issue 49, docs/design/paging.md): tenants taking turns.
#
#   benchmarks/paging.sh [--dist DIR] [--out DIR] [--processes 3] [--fraction 0.6] [--rounds 4]
#                        [--oversubscribe 2.0] [--host-budget BYTES] [--nvcc PATH] [--arch sm_90]
#                        (default host budget: pools for every session where the host has room)
#   benchmarks/paging.sh --report SERVER_LOG     (only the table, from a server log of any run)
#
# Starts one flyt-rpc-server (DIST/bin) with --oversubscribe F and a quota of F times the GPU's
# memory, then runs gpu-tests/paging.cu (built here with -cudart=shared: Flyt's
# DIST/lib/libcudart.so.13) over the Unix socket: P processes, each FRACTION of the GPU's memory,
# taking R turns each, every word checked each turn. Then it prints each page-out and page-in the
# server logged, with its phases (ms; a page-out's "pin": growing a pool that was behind its
# session), how much went through the worker's pool of host memory pinned ahead (the rest through
# a memory file: the host budget had no room), and the median page-in time scaled to 40 GiB
# against the target: <= 1.5 s.
# OUT gets server.log, paging.out, paging.err (the app's own view: each turn's first call), and
# report.txt (the table). NVCC_FLAGS adds flags to the nvcc command (e.g. -L.cuda/lib).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
DIST=$root/dist OUT=/tmp/flyt-paging PROCESSES=3 FRACTION=0.6 ROUNDS=4 FACTOR=2.0 BUDGET= NVCC=${NVCC:-} ARCH=sm_90 REPORT=

usage() { sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
# shellcheck source=../gpu-tests/lib/options.sh
. "$here/../gpu-tests/lib/options.sh"
parse_options "help_or_unknown paging.sh" --dist=DIST --out=OUT --processes=PROCESSES --fraction=FRACTION \
    --rounds=ROUNDS --oversubscribe=FACTOR --host-budget=BUDGET --nvcc=NVCC --arch=ARCH --report=REPORT -- "$@"

# The table: one row per page-out and page-in of LOG, then the 40 GiB verdict.
report() {
    awk '
        function field(name,   i, pair) {
            for (i = 1; i <= NF; i++) { split($i, pair, "="); if (pair[1] == name) return pair[2] }
            return ""
        }
        function median(values, n,   i, j, t) {
            for (i = 2; i <= n; i++) for (j = i; j > 1 && values[j - 1] > values[j]; j--) { t = values[j]; values[j] = values[j - 1]; values[j - 1] = t }
            return n % 2 ? values[(n + 1) / 2] : (values[n / 2] + values[n / 2 + 1]) / 2
        }
        / paging pool pinned ahead/ {
            pin = sprintf("%.1f GiB in %s ms", field("bytes") / 2^30, field("took_ms"))
            # Where it went (newer logs): threads, and their time populating and registering.
            if (field("threads") != "") pin = pin sprintf(" (%s GB/s, %s threads: populate %s ms, register %s ms)", field("gbps"), field("threads"), field("populate_thread_ms"), field("register_thread_ms"))
            pins = pins (pins == "" ? "" : ", ") pin
        }
        / paged out / || / paged in / {
            if (!header++) {
                if (pins != "") print "# pinned ahead by the workers before the first page-out: " pins
                printf "%-4s %7s %8s %7s %7s %7s %7s %7s %7s %7s %7s %9s %7s\n", "", "session", "GiB", "pooled", "wait", "sync", "pin", "map", "copy", "file", "release", "paging ms", "GB/s"
            }
            out = / paged out /
            bytes = field("bytes"); pooled = bytes > 0 ? 100 * field("pooled_bytes") / bytes : 0
            paging = out ? field("took_ms") : field("page_in_ms")
            pin = out ? field("pin_ms") : ""; if (pin == "") pin = "-"
            printf "%-4s %7s %8.2f %6.0f%% %7s %7s %7s %7s %7s %7s %7s %9s %7s\n", out ? "out" : "in", field("session_id"), bytes / 2^30, pooled,
                out ? "-" : field("wait_ms"), out ? field("sync_ms") : "-", pin, out ? "-" : field("map_ms"), field("copy_ms"), field("file_ms"),
                out ? field("release_ms") : "-", paging, field("gbps")
            if (!out && bytes > 0) scaled[++ins] = paging * 40 * 2^30 / bytes
        }
        END {
            if (!header) { print "no page-out or page-in in the log"; exit 1 }
            if (!ins) { print "no page-in in the log"; exit 1 }
            m = median(scaled, ins)
            printf "# page-in of 40 GiB (median of %d page-ins, scaled): %.0f ms; target <= 1500 ms: %s\n", ins, m, m <= 1500 ? "met" : "NOT met"
        }' "$1"
}

if [ -n "$REPORT" ]; then
    report "$REPORT"
    exit
fi

DIST=$(cd "$DIST" 2>/dev/null && pwd) || { echo "paging.sh: no --dist folder" >&2; exit 2; }
[ -x "$DIST/bin/flyt-rpc-server" ] || { echo "paging.sh: $DIST/bin/flyt-rpc-server missing" >&2; exit 2; }
[ -n "$NVCC" ] || NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
TMP=$(mktemp -d /tmp/flyt-paging.XXXXXX)
server=
trap '[ -z "$server" ] || kill "$server" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT

"$NVCC" -cudart=shared -arch="$ARCH" ${NVCC_FLAGS:-} -I"$root/gpu-tests" -o "$TMP/paging" "$root/gpu-tests/paging.cu" || exit 1
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | head -n 1 | tr -d ' ')
[ -n "$gpu_mib" ] || { echo "paging.sh: nvidia-smi gave no GPU memory" >&2; exit 1; }
quota_mib=$(awk -v m="$gpu_mib" -v f="$FACTOR" 'BEGIN { printf "%d", m * f }')
if [ -z "$BUDGET" ]; then
    # Pools for every session (each follows its session, resident or not) where the host has room
    # (16 GiB left for the processes): paging then never goes through memory files. Else the
    # server's default (half the available memory).
    avail=$(($(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) * 1024))
    pools=$(awk -v m="$gpu_mib" -v f="$FRACTION" -v p="$PROCESSES" 'BEGIN { printf "%.0f", p * int(m * f) * 1048576 }')
    if [ $((pools + (16 << 30))) -le "$avail" ]; then
        BUDGET=$pools
    else
        echo "paging.sh: pools for all $PROCESSES sessions ($((pools >> 30)) GiB) do not fit the host ($((avail >> 30)) GiB available): the server's default budget" >&2
    fi
fi
budget=()
[ -z "$BUDGET" ] || budget=(--page-host-budget "$BUDGET")
# No minimum residency and a short idle time: the turns measure paging, not the waits.
FLYT_LOG=info "$DIST/bin/flyt-rpc-server" --device cuda --listen "unix:$TMP/s.sock" --oversubscribe "$FACTOR" \
    --memory-quota "${quota_mib}MiB" --idle-page-out-ms 200 --resident-min-ms 0 --page-wait-ms 120000 \
    --warm-workers "$PROCESSES" "${budget[@]}" >"$TMP/server.out" 2>"$OUT/server.log" &
server=$!
echo "paging.sh: GPU of $gpu_mib MiB, quota $quota_mib MiB" >&2
for _ in $(seq 600); do
    grep -q '^flyt-rpc-server listening on ' "$TMP/server.out" && break
    kill -0 "$server" 2>/dev/null || { echo "paging.sh: the server exited; see $OUT/server.log" >&2; exit 1; }
    sleep 0.1
done
LD_LIBRARY_PATH=$DIST/lib FLYT_SERVER=unix:$TMP/s.sock timeout 1800 "$TMP/paging" "$PROCESSES" "$FRACTION" "$ROUNDS" \
    >"$OUT/paging.out" 2>"$OUT/paging.err"
status=$?
kill "$server" 2>/dev/null
wait "$server" 2>/dev/null
server=
tail -n 1 "$OUT/paging.out"
{
    echo "# paging: $PROCESSES processes x $FRACTION of a $gpu_mib MiB GPU, $ROUNDS turns each, --oversubscribe $FACTOR, $(date -u '+%Y-%m-%d %H:%M UTC')"
    report "$OUT/server.log"
} | tee "$OUT/report.txt"
exit "$status"
