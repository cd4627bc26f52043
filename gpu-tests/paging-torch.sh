#!/usr/bin/env bash
# The PyTorch test of issue 49's "Done when" (docs/design/paging.md), on a GPU machine:
#
#   gpu-tests/paging-torch.sh [--dist DIR] [--out DIR] [--python PATH] [--processes 3]
#                             [--fraction 0.6] [--turns 3] [--steps 20] [--oversubscribe 2.0]
#                             [--host-budget BYTES] [--tolerance 0] [--force]
#
# 1. Each of PROCESSES PyTorch processes (gpu-tests/frameworks/paging_torch.py --only I) runs
#    alone, natively: it holds FRACTION of the GPU's memory (nvidia-smi's total) in tensors (an
#    MLP, Adam's state, padding of known words) and trains TURNS x STEPS steps, printing every
#    loss in full precision (deterministic algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8, no TF32).
# 2. One flyt-rpc-server (DIST/bin) with --oversubscribe F and a quota of F times the GPU's memory
#    less 1 GiB per process (their CUDA contexts, outside the residency count); the PROCESSES
#    processes together through it, the local GPU hidden from them (hide_gpu: a mount namespace
#    without /dev/nvidia* and the driver's libraries), taking turns (one busy at a time): together
#    they hold more than the GPU, so each turn pages one in and another out.
# 3. Every process's losses through Flyt must equal its losses alone natively (exactly; or,
#    with --tolerance T > 0, within a relative difference T, and the report says which), its
#    padding intact each turn, at least one page-out in the server's log; then the server's
#    page-out/page-in table (benchmarks/paging.sh --report): each one's phases and the median
#    page-in scaled to 40 GiB against the target (<= 1.5 s).
# Host memory first: paged-out bytes live there. With R sessions resident at once (that GPU share
# over FRACTION), P - R + 1 are out at a turn's peak (one goes out before the next comes in): a
# host without that much available memory (plus 16 GiB for the processes) is refused with the
# largest fraction with paging it can take (--force runs anyway); 3 x 0.6 of a 141 GB H200 needs
# about 250 GiB. Unless --host-budget is given, the workers' pools may pin all P sessions' bytes
# (each pool follows its session, resident or not) where the host has room, so nothing is pinned on
# a request's clock; else the peak's bytes (the pools of resident sessions lend theirs to
# page-outs, which then pin on the spot).
# OUT gets native-I.out/.err, flyt.out/.err, server.log, losses.txt (the comparison), report.txt.
# Exit status 0 when the losses match and every run passed; 1 otherwise; 2 on a setup error.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
DIST=$root/dist OUT=/tmp/flyt-paging-torch PYTHON=/opt/torch/.venv/bin/python3 PROCESSES=3 FRACTION=0.6 TURNS=3 STEPS=20
FACTOR=2.0 BUDGET= TOLERANCE=0 FORCE=0

usage() { sed -n '2,33p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
# shellcheck source=lib/options.sh
. "$here/lib/options.sh"
parse_options "help_or_unknown paging-torch.sh" --dist=DIST --out=OUT --python=PYTHON --processes=PROCESSES \
    --fraction=FRACTION --turns=TURNS --steps=STEPS --oversubscribe=FACTOR --host-budget=BUDGET --tolerance=TOLERANCE \
    --force=FORCE=1 -- "$@"

DIST=$(cd "$DIST" 2>/dev/null && pwd) || { echo "paging-torch.sh: no --dist folder" >&2; exit 2; }
[ -x "$DIST/bin/flyt-rpc-server" ] || { echo "paging-torch.sh: $DIST/bin/flyt-rpc-server missing" >&2; exit 2; }
[ -f "$DIST/lib/libcuda.so.1" ] || { echo "paging-torch.sh: $DIST/lib/libcuda.so.1 missing" >&2; exit 2; }
[ -x "$PYTHON" ] || { echo "paging-torch.sh: no Python at $PYTHON (--python)" >&2; exit 2; }
SCRIPT=$here/frameworks/paging_torch.py
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/native-*.out "$OUT"/native-*.err "$OUT"/flyt.out "$OUT"/flyt.err "$OUT"/server.log "$OUT"/losses.txt "$OUT"/report.txt
TMP=$(mktemp -d /tmp/flyt-paging-torch.XXXXXX)
server=
stop_server() {
    [ -n "$server" ] || return 0
    kill -TERM -- "-$server" 2>/dev/null || kill -TERM "$server" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$server" 2>/dev/null
    wait "$server" 2>/dev/null
    server=
}
trap 'stop_server; rm -rf "$TMP"' EXIT

gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | head -n 1 | tr -d ' ')
[ -n "$gpu_mib" ] || { echo "paging-torch.sh: nvidia-smi gave no GPU memory" >&2; exit 2; }
# The same bytes natively and through Flyt (whatever total each reports), whole MiB.
bytes=$(awk -v m="$gpu_mib" -v f="$FRACTION" 'BEGIN { printf "%.0f", int(m * f) * 1048576 }')
# The quota leaves room for the processes' CUDA contexts, which the residency count does not hold
# (docs/design/paging.md: quota = F x (GPU - contexts)): 1 GiB each.
context_mib=1024
share_mib=$((gpu_mib - PROCESSES * context_mib))
quota_mib=$(awk -v m="$share_mib" -v f="$FACTOR" 'BEGIN { printf "%d", m * f }')
args=(--processes "$PROCESSES" --bytes "$bytes" --turns "$TURNS" --steps "$STEPS" --exact)
# Deterministic cuBLAS; the caching allocator on cudaMalloc (expandable segments would use VMM
# memory, which is not paged: docs/design/paging.md).
# (env's options first, then its settings.)
common_env=(-u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF CUBLAS_WORKSPACE_CONFIG=:4096:8)
echo "paging-torch.sh: GPU of $gpu_mib MiB; $PROCESSES processes of $FRACTION ($((bytes >> 20)) MiB), $TURNS turns of $STEPS steps" >&2

# Host memory for the paged-out bytes (see the top).
avail=$(($(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) * 1024))
margin=$((16 << 30))
resident=$(awk -v s="$share_mib" -v b="$((bytes >> 20))" 'BEGIN { r = int(s / b); print r < 1 ? 1 : r }')
out_at_peak=0
[ "$PROCESSES" -gt "$resident" ] && out_at_peak=$((PROCESSES - resident + 1))
need=$((out_at_peak * bytes))
echo "paging-torch.sh: $resident resident at once, $out_at_peak out at a turn's peak: $((need >> 30)) GiB of host memory; $((avail >> 30)) GiB available" >&2
if [ $((need + margin)) -gt "$avail" ]; then
    fits=$(awk -v a="$avail" -v m="$margin" -v g="$gpu_mib" -v s="$share_mib" -v p="$PROCESSES" 'BEGIN {
        best = 0
        for (f = 0.01; f < 1; f += 0.01) { r = int(s / int(g * f)); if (r < 1) r = 1; o = p > r ? p - r + 1 : 0; if (o > 0 && o * int(g * f) * 1048576 + m <= a) best = f }
        if (best > 0) printf "%.2f", best; else printf "none" }')
    echo "paging-torch.sh: this host cannot hold the paged-out bytes: $((need >> 30)) GiB + $((margin >> 30)) GiB for the processes > $((avail >> 30)) GiB available; the largest fraction with paging it can take for $PROCESSES processes: $fits (--force runs anyway)" >&2
    [ "$FORCE" = 1 ] || exit 2
fi
if [ -z "$BUDGET" ]; then
    pools=$((PROCESSES * bytes))
    if [ $((pools + margin)) -le "$avail" ]; then BUDGET=$pools; else BUDGET=$need; fi
    echo "paging-torch.sh: --page-host-budget $((BUDGET >> 20))MiB (pools for $([ "$BUDGET" = "$pools" ] && echo "all $PROCESSES sessions" || echo "the sessions out at the peak; past them, memory files"))" >&2
fi

# 1. Each alone, natively.
status=0
for i in $(seq 0 $((PROCESSES - 1))); do
    echo "paging-torch.sh: process $i alone, natively" >&2
    env -u FLYT_SERVER "${common_env[@]}" timeout 1800 "$PYTHON" "$SCRIPT" "${args[@]}" --only "$i" \
        >"$OUT/native-$i.out" 2>"$OUT/native-$i.err"
    rc=$?
    [ $rc = 0 ] || { echo "paging-torch.sh: process $i alone natively failed ($rc); see $OUT/native-$i.err" >&2; status=1; }
done

# 2. Together through one oversubscribed server, the GPU hidden from them.
HIDE=$TMP/hide.list
: >"$HIDE"
for d in /dev/nvidia*; do [ -c "$d" ] && echo "bind $d" >>"$HIDE"; done
for f in $(ldconfig -p | awk '/(libcuda\.so|libnvidia-ml\.so)/ {print $NF}'); do
    real=$(readlink -f "$f")
    case $real in "$DIST"/*) continue ;; esac
    [ -f "$real" ] && echo "bind $real" >>"$HIDE"
done
sort -u -o "$HIDE" "$HIDE"
cc -O2 -o "$TMP/hide_gpu" "$here/tools/hide_gpu.c" || { echo "paging-torch.sh: building hide_gpu failed" >&2; exit 2; }
budget=(--page-host-budget "$BUDGET")
# No minimum residency and a short idle time, as benchmarks/paging.sh: the turns measure paging.
setsid env FLYT_LOG=info "$DIST/bin/flyt-rpc-server" --device cuda --listen "unix:$TMP/s.sock" --oversubscribe "$FACTOR" \
    --memory-quota "${quota_mib}MiB" --idle-page-out-ms 200 --resident-min-ms 0 --page-wait-ms 120000 \
    --warm-workers "$PROCESSES" "${budget[@]}" >"$TMP/server.out" 2>"$OUT/server.log" </dev/null &
server=$!
for _ in $(seq 600); do
    grep -q '^flyt-rpc-server listening on ' "$TMP/server.out" && break
    kill -0 "$server" 2>/dev/null || { echo "paging-torch.sh: the server exited; see $OUT/server.log" >&2; server=; exit 2; }
    sleep 0.1
done
echo "paging-torch.sh: $PROCESSES processes taking turns through Flyt (--oversubscribe $FACTOR, quota $quota_mib MiB)" >&2
"$TMP/hide_gpu" "$HIDE" -- env "${common_env[@]}" LD_LIBRARY_PATH="$DIST/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    FLYT_SERVER="unix:$TMP/s.sock" TRITON_LIBCUDA_PATH="$DIST/lib" timeout 3600 "$PYTHON" "$SCRIPT" "${args[@]}" \
    >"$OUT/flyt.out" 2>"$OUT/flyt.err"
rc=$?
[ $rc = 0 ] || { echo "paging-torch.sh: the run through Flyt failed ($rc); see $OUT/flyt.out, flyt.err, server.log" >&2; status=1; }
stop_server

# 3. The losses, process by process: through Flyt against alone natively.
"$PYTHON" - "$OUT" "$PROCESSES" "$TURNS" "$TOLERANCE" >"$OUT/losses.txt" <<'EOF'
import re, sys
out, processes, turns, tolerance = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
line = re.compile(r"^process (\d+) (?:turn \d+ )?step (\d+): loss (\S+)$")
def losses(path, index):
    found = {}
    try:
        with open(path) as text:
            for entry in text:
                m = line.match(entry.strip())
                if m and int(m.group(1)) == index:
                    found[int(m.group(2))] = float(m.group(3))
    except OSError:
        pass
    return found
def intact(path, index):
    """Every turn of the process found its padding words as written."""
    try:
        with open(path) as text:
            lines = [entry.strip() for entry in text]
    except OSError:
        return False
    return all(f"process {index} turn {turn}: padding intact" in lines for turn in range(turns))
verdict = 0
print(f"{'process':>7} {'steps':>5} {'identical':>9} {'max rel diff':>12} {'padding':>8}  verdict")
for i in range(processes):
    native, flyt = losses(f"{out}/native-{i}.out", i), losses(f"{out}/flyt.out", i)
    same_steps = bool(native) and sorted(native) == sorted(flyt)
    diff = max((abs(flyt[s] - native[s]) / max(abs(native[s]), 1e-30) for s in native if s in flyt), default=float("inf"))
    identical = same_steps and all(flyt[s] == native[s] for s in native)
    pad = intact(f"{out}/flyt.out", i) and intact(f"{out}/native-{i}.out", i)
    ok = same_steps and pad and (identical or diff <= tolerance)
    verdict |= not ok
    print(f"{i:>7} {len(flyt):>5} {'yes' if identical else 'no':>9} {diff:>12.3g} {'intact' if pad else 'CHANGED':>8}  "
          f"{'PASS' if ok else 'FAIL'}{'' if identical or not ok else f' (within tolerance {tolerance:g})'}")
print(f"# losses through Flyt vs each process alone natively: {'PASS' if not verdict else 'FAIL'}")
sys.exit(verdict)
EOF
[ $? = 0 ] || status=1
page_outs=$(grep -c ' paged out' "$OUT/server.log")
{
    echo "# paging_torch: $PROCESSES PyTorch processes x $FRACTION of a $gpu_mib MiB GPU ($((bytes >> 20)) MiB each), $TURNS turns of $STEPS steps, --oversubscribe $FACTOR, $(date -u '+%Y-%m-%d %H:%M UTC')"
    cat "$OUT/losses.txt"
    echo "# host: $((avail >> 30)) GiB available at the start; --page-host-budget $BUDGET"
    echo "# page-outs in the server's log: $page_outs"
    "$root/benchmarks/paging.sh" --report "$OUT/server.log"
} | tee "$OUT/report.txt"
[ "$page_outs" -gt 0 ] || { echo "paging-torch.sh: no page-out: the processes did not take turns through paging" >&2; status=1; }
grep -q '^paging_torch: PASS$' "$OUT/flyt.out" || status=1
exit "$status"
