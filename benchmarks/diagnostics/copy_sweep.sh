#!/usr/bin/env bash
# Diagnostic on the GPU machine (issue 46): striped copies under several server staging sizes and
# stripe chunks, each setting beside raw_stream with as many connections run just before and just
# after it (the better raw run is the reference, as in remote_copy.sh). One flyt-rpc-server per
# staging-slot count, listening on TCP loopback and a Unix socket; no shared memory, no LZ4.
# Prints one line per setting and socket: each cell's GB/s and its share of raw, and how many
# cells are under 90%. Outputs stay in OUT.
#   [CONNS=4] [SIZES=64M,1G] [REPS=5] [DEVICE=cuda|emulated] [SETTINGS='16:4M 8:1M 8:512K 16:256K'] \
#       benchmarks/diagnostics/copy_sweep.sh DIST OUT
# A setting is STAGING_SLOTS:STRIPE_CHUNK (FLYT_RPC_STAGING_SLOTS, FLYT_STRIPE_CHUNK; the defaults
# are 16 and 4M).
set -uo pipefail
source "$(dirname "$0")/common.sh"
conns=${CONNS:-4} sizes=${SIZES:-64M,1G} reps=${REPS:-5}
cc -std=gnu11 -O2 -I"$cuda/include" "$here/../remote_copy.c" -o "$tmp/remote_copy" -L"$dist/lib" -l:libcuda.so.1 || exit 1
cc -O2 -pthread "$here/../raw_stream.c" -o "$tmp/raw_stream" || exit 1
for setting in ${SETTINGS:-16:4M 8:1M 8:512K 16:256K}; do
    slots=${setting%%:*} chunk=${setting#*:}
    case "$slots:$chunk" in
        [0-9]*:[0-9]*) ;;
        *) echo "copy_sweep: a setting is SLOTS:CHUNK, not $setting" >&2; exit 2 ;;
    esac
    rm -f "$tmp/s.sock"
    start_server "slots$slots" --device "${DEVICE:-cuda}" --staging-slots "$slots" --listen "unix:$tmp/s.sock" --listen 127.0.0.1:0 || exit 1
    server=$!
    tcp=$(grep -o '127\.0\.0\.1:[0-9]*' "$tmp/slots$slots.out" | head -n 1)
    for socket in tcp unix; do
        address=$tcp
        [ "$socket" = unix ] && address=unix:$tmp/s.sock
        name=$socket-slots$slots-chunk$chunk
        "$tmp/raw_stream" pair "$socket" "$sizes" "$reps" "$conns" 2>/dev/null | grep '^{' >"$out/raw-$name.jsonl"
        LD_LIBRARY_PATH=$dist/lib FLYT_SERVER=$address FLYT_SHM=off FLYT_STRIPES=$conns FLYT_STRIPE_LZ4=off \
            FLYT_STRIPE_CHUNK=$chunk timeout 300 "$tmp/remote_copy" "$name" "$reps" "$sizes" >"$out/flyt-$name.txt" 2>&1 ||
            echo "$name: remote_copy exit $?"
        "$tmp/raw_stream" pair "$socket" "$sizes" "$reps" "$conns" 2>/dev/null | grep '^{' >>"$out/raw-$name.jsonl"
    done
    kill "$server" 2>/dev/null
    wait "$server" 2>/dev/null
done
python3 - "$out" "$conns" <<'PY'
import glob, json, os, sys

out, conns = sys.argv[1], sys.argv[2]
for flyt in sorted(glob.glob(os.path.join(out, "flyt-*.txt"))):
    name = os.path.basename(flyt)[len("flyt-"):-len(".txt")]
    raw = {}
    for line in open(os.path.join(out, f"raw-{name}.jsonl")):
        row = json.loads(line)
        key = (row["dir"], row["bytes"])
        raw[key] = max(raw.get(key, 0.0), row["gbps"])
    cells, under = [], 0
    for line in open(flyt):
        words = line.split()
        if words[:1] != ["bw"]:
            continue
        memory, way, size, gbps = words[2], words[3], int(words[4]), float(words[5])
        reference = raw.get(("c2s" if way == "H2D" else "s2c", size))
        if not reference:
            cells.append(f"{size >> 20}M {memory[:3]} {way} {gbps:.1f} (no raw)")
            continue
        share = gbps / reference
        under += share < 0.9
        cells.append(f"{size >> 20}M {memory[:3]} {way} {gbps:.1f} ({100 * share:.0f}%)")
    print(f"{name} ({conns} conns): {under} of {len(cells)} cells under 90% of raw")
    print("    " + "; ".join(cells))
PY
