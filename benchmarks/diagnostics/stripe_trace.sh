#!/usr/bin/env bash
# Diagnostic on the GPU machine: where a striped copy's time goes. One flyt-rpc-server with
# FLYT_RPC_STRIPE_TRACE=1; benchmarks/remote_copy.c over TCP with CONNS data connections (pinned and
# pageable, both ways, 64 MiB and 1 GiB) and raw_stream with as many connections before and after;
# then the medians of the server's traces per way, size and connection count: the copy's time, its
# dealing thread waiting for the links (network-bound), queueing the landed chunks' device copies
# and making jobs (taking staging, which waits for the slot's last device copy), and the busiest
# and idlest link; and the app's side (FLYT_STRIPE_TRACE=1): when the connections' first chunks
# began moving and their last were done, and the calling thread's steps. The server's log and the
# programs' outputs stay in OUT.
# SOCKET=unix: over a Unix socket instead of TCP loopback.
#   [CONNS='4 8'] [REPS=3] [SIZES=64M,1G] [SOCKET=tcp|unix] benchmarks/diagnostics/stripe_trace.sh DIST OUT
set -uo pipefail
source "$(dirname "$0")/common.sh"
cc -std=gnu11 -O2 -I"$cuda/include" "$here/../remote_copy.c" -o "$tmp/remote_copy" -L"$dist/lib" -l:libcuda.so.1 || exit 1
cc -O2 -pthread "$here/../raw_stream.c" -o "$tmp/raw_stream" || exit 1
socket=${SOCKET:-tcp}
FLYT_RPC_STRIPE_TRACE=1 start_server traced --device cuda --listen 127.0.0.1:0 --listen "unix:$tmp/s.sock" || exit 1
address=$(grep -o '127\.0\.0\.1:[0-9]*' "$tmp/traced.out" | head -n 1)
[ "$socket" = unix ] && address=unix:$tmp/s.sock
for conns in ${CONNS:-4 8}; do
    for turn in before flyt after; do
        if [ "$turn" = flyt ]; then
            LD_LIBRARY_PATH=$dist/lib FLYT_SERVER=$address FLYT_SHM=off FLYT_STRIPES=$conns FLYT_STRIPE_LZ4=off FLYT_STRIPE_TRACE=1 \
                timeout 300 "$tmp/remote_copy" "$socket-s$conns" "${REPS:-3}" "${SIZES:-64M,1G}" >"$out/flyt-s$conns.txt" 2>&1
        else
            "$tmp/raw_stream" pair "$socket" "${SIZES:-64M,1G}" "${REPS:-3}" "$conns" 2>/dev/null | grep '^{' >>"$out/raw.jsonl"
        fi
    done
done
kill "$(jobs -p)" 2>/dev/null
wait 2>/dev/null
cp "$tmp/traced.err" "$out/server.log"
grep -h '^bw' "$out"/flyt-s*.txt
python3 - "$out/raw.jsonl" "$out/server.log" "$out"/flyt-s*.txt <<'PY'
import collections, json, re, statistics, sys
raw = collections.defaultdict(list)
for line in open(sys.argv[1]):
    j = json.loads(line)
    raw[(j["dir"], j["bytes"] >> 20, j["conns"])].append(j["gbps"])
for key, values in sorted(raw.items()):
    print("raw", *key, "GB/s:", " ".join(f"{v:.1f}" for v in values))
rows = collections.defaultdict(list)
for line in open(sys.argv[2]):
    if "striped copy traced" not in line:
        continue
    field = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line))
    links = lambda name: [int(x) for x in field[name].strip('"').split(",")]
    key = (field["way"].strip('"'), int(field["len"]) >> 20, int(field["connections"]))
    rows[key].append([int(field["total_us"]), int(field["waiting_for_links_us"]), int(field["queueing_landed_us"]),
                      int(field["making_jobs_us"]), max(links("links_working_us")), min(links("links_working_us")),
                      max(links("links_idle_us")), max(links("links_finishing_us"))])
print("way, MiB, connections | medians, us: copy, waiting for links, queueing landed, making jobs,"
      " link working max/min, link idle max, link finishing max")
for key, values in sorted(rows.items()):
    print(*key, "|", *[int(statistics.median(v[i] for v in values)) for i in range(8)], f"(n={len(values)})")
app = collections.defaultdict(list)
for name in sys.argv[3:]:
    for line in open(name, errors="replace"):
        if "striped copy traced" not in line:
            continue
        field = dict(re.findall(r'(\w+)=(\S+)', line))
        links = lambda name: [int(x) for x in field[name].split(",")]
        first = [x for x in links("first_chunk_us") if x > 0] or [0]
        marks = ("handed_us", "written_us", "reply_us") if field["way"] == "htod" else ("sent_us", "reply_us", "landed_us")
        steps = [int(field[k]) for k in marks]
        app[(field["way"], int(field["len"]) >> 20, int(field["connections"]))].append(
            [min(first), max(first), max(links("last_chunk_done_us")), max(links("busy_us")), min(links("busy_us"))] + steps)
print("the app's side: way, MiB, connections | medians, us: first chunk begun min/max, last chunk done max, busy max/min,"
      " then htod: handed, written, reply; dtoh: sent, reply, landed")
for key, values in sorted(app.items()):
    print(*key, "|", *[int(statistics.median(v[i] for v in values)) for i in range(8)], f"(n={len(values)})")
PY
