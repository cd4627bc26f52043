#!/usr/bin/env bash
# Bulk copies over a socket (issue 46), natively and through Flyt in the same run: synchronous
# cuMemcpyHtoD/DtoH of pinned and pageable memory (benchmarks/remote_copy.c, bytes checked) through
# one flyt-rpc-server over TCP loopback and a Unix socket without the shared-memory channel, with
# striping off (FLYT_STRIPES=0: the session's one connection), one data connection and N, the
# shared-memory channel for reference; and raw_stream.c over the same kinds of socket with 1 and N
# connections, before and after those rows, the better run printed beside each Flyt row (same
# connection count): the best the machine gives.
# Compression stays off there (FLYT_STRIPE_LZ4=off). With --shape RATE (root: tc's tbf on lo, e.g.
# 8gbit for 1 GB/s), the same TCP copies run again on the shaped loopback with bf16 model weights
# and random bytes, FLYT_STRIPE_LZ4 off, auto and on (rows shaped-DATA-lz4MODE). With
# --relay-rate BYTES_PER_S (no tc needed: benchmarks/delay_relay.c as a link of that rate each
# way, shared by the session's connections) the same through the relay (rows relayed-DATA-MODE,
# MODE from --relay-modes, default "off auto on"); --only-relayed skips the unshaped rows;
# --only-striped keeps of them the N-connection rows and their raw (diagnostics/copy_sweep.sh).
# Each program's output goes to OUT/NAME.txt; a table is printed last. SERVER_ENV='NAME=VALUE ...'
# sets variables for the server only (diagnostics/copy_turns.sh's server: settings).
#   benchmarks/remote_copy.sh --dist DIR --out DIR [--cuda DIR] [--device cuda|emulated]
#                             [--sizes 64M,1G] [--reps N] [--stripes N] [--shape RATE]
#                             [--relay-rate BYTES_PER_S] [--relay-modes 'off auto on'] [--only-relayed]
#                             [--only-striped]
# DIST holds bin/flyt-rpc-server and lib/libcuda.so.1 (Flyt's); CUDA (default /usr/local/cuda) gives
# cuda.h. With --device emulated (no GPU: copies move host memory) there is no native row.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
DIST=$root/dist OUT=/tmp/flyt-remote-copy CUDA=/usr/local/cuda DEVICE=cuda SIZES=64M,1G REPS=5 STRIPES=4 SHAPE=
RELAY_RATE= RELAY_MODES="off auto on" ONLY_RELAYED= ONLY_STRIPED=
usage() {
    sed -n '17,20p' "${BASH_SOURCE[0]}" >&2
    exit 2
}
# shellcheck source=../gpu-tests/lib/options.sh
. "$here/../gpu-tests/lib/options.sh"
parse_options usage --dist=DIST --out=OUT --cuda=CUDA --device=DEVICE --sizes=SIZES --reps=REPS --stripes=STRIPES \
    --shape=SHAPE --relay-rate=RELAY_RATE --relay-modes=RELAY_MODES --only-relayed=ONLY_RELAYED=1 --only-striped=ONLY_STRIPED=1 -- "$@"
absolute_dist_out
rm -f "$OUT"/*.txt "$OUT"/*.err
TMP=$(mktemp -d /tmp/flyt-remote-copy.XXXXXX)
shaped=
trap 'kill $server 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"; [ -z "$shaped" ] || tc qdisc del dev lo root 2>/dev/null' EXIT
server=

cc -std=gnu11 -O2 -Wall -Werror -I"$CUDA/include" "$here/remote_copy.c" -o "$TMP/remote_copy" -L"$DIST/lib" -l:libcuda.so.1 || exit 1
cc -O2 -Wall -Werror -pthread "$here/raw_stream.c" -o "$TMP/raw_stream" || exit 1

memory=()
[ "$DEVICE" = emulated ] && memory=(--emulated-memory 8GiB)
read -ra server_env <<<"${SERVER_ENV:-}"
env "${server_env[@]}" "$DIST/bin/flyt-rpc-server" --device "$DEVICE" "${memory[@]}" --listen "unix:$TMP/s.sock" --listen 127.0.0.1:0 \
    >"$TMP/server.out" 2>"$OUT/server.log" &
server=$!
for _ in $(seq 100); do [ -S "$TMP/s.sock" ] && grep -q '127.0.0.1' "$TMP/server.out" && break; sleep 0.1; done
tcp=$(grep -o '127\.0\.0\.1:[0-9]*' "$TMP/server.out" | head -n 1)
[ -n "$tcp" ] || { echo "remote_copy.sh: the server did not start; see $OUT/server.log" >&2; exit 1; }

# flyt LABEL ADDRESS SHM STRIPES [LZ4 [DATA]]
flyt() {
    LD_LIBRARY_PATH=$DIST/lib FLYT_SERVER=$2 FLYT_SHM=$3 FLYT_STRIPES=$4 FLYT_STRIPE_LZ4=${5:-off} \
        timeout 900 "$TMP/remote_copy" "$1" "$REPS" "$SIZES" "${6:-pattern}" >"$OUT/$1.txt" 2>"$OUT/$1.err" || echo "$1: exit $?" >&2
}
if [ -n "$RELAY_RATE" ]; then
    cc -O2 -Wall -Werror -pthread "$here/delay_relay.c" -o "$TMP/delay_relay" || exit 1
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$TMP/delay_relay" "127.0.0.1:$port" "$tcp" 0 "$RELAY_RATE" >"$TMP/relay.out" 2>"$OUT/relay.err" &
    relay=$!
    for _ in $(seq 50); do grep -q listening "$TMP/relay.out" && break; sleep 0.1; done
    for data in weights random; do
        for mode in $RELAY_MODES; do flyt "relayed-$data-$mode" "127.0.0.1:$port" off "$STRIPES" "$mode" "$data"; done
    done
    kill $relay
    wait $relay 2>/dev/null
fi
[ -n "$ONLY_RELAYED" ] || {
conn_counts=(1 "$STRIPES") stripe_counts=(0 1 "$STRIPES")
[ -n "$ONLY_STRIPED" ] && conn_counts=("$STRIPES") stripe_counts=("$STRIPES")
[ -z "$ONLY_STRIPED" ] && [ "$DEVICE" = cuda ] && { timeout 900 "$TMP/remote_copy" native "$REPS" "$SIZES" >"$OUT/native.txt" 2>"$OUT/native.err" || echo "native: exit $?" >&2; }
[ -n "$ONLY_STRIPED" ] || flyt shm "unix:$TMP/s.sock" on 0
for transport in tcp unix; do
    address=$tcp
    [ "$transport" = unix ] && address=unix:$TMP/s.sock
    # Raw before and after Flyt's rows: the host's throughput drifts within a run, and the better
    # of the two is the figure Flyt is held to.
    for turn in a b; do
        for conns in "${conn_counts[@]}"; do
            timeout 900 "$TMP/raw_stream" pair "$transport" "$SIZES" "$REPS" "$conns" >"$OUT/raw-$transport-c$conns-$turn.txt" 2>"$OUT/raw-$transport-c$conns-$turn.err"
        done
        # The same with the server landing the bytes on the GPU (a ring of 2 or 16 MiB per connection,
        # the better printed): what a server doing a copy's whole work can reach.
        [ "$DEVICE" = cuda ] && [ "$STRIPES" -gt 1 ] && for ring in 2 16; do
            RAW_STREAM_DEVICE=1 RAW_STREAM_SERVER_BUFFER=$((ring << 20)) timeout 900 "$TMP/raw_stream" pair "$transport" "$SIZES" "$REPS" "$STRIPES" \
                >"$OUT/raw-$transport-device$ring-c$STRIPES-$turn.txt" 2>"$OUT/raw-$transport-device$ring-c$STRIPES-$turn.err"
        done
        [ "$turn" = b ] || for stripes in "${stripe_counts[@]}"; do flyt "$transport-s$stripes" "$address" off "$stripes"; done
    done
done

}

if [ -n "$SHAPE" ]; then
    if tc qdisc add dev lo root tbf rate "$SHAPE" burst 8mb latency 200ms 2>"$OUT/tc.err"; then
        shaped=1
        for data in weights random; do
            for lz4 in off auto on; do flyt "shaped-$data-lz4$lz4" "$tcp" off "$STRIPES" "$lz4" "$data"; done
        done
        timeout 900 "$TMP/raw_stream" pair tcp "$SIZES" "$REPS" "$STRIPES" >"$OUT/raw-shaped.txt" 2>"$OUT/raw-shaped.err"
        tc qdisc del dev lo root
        shaped=
    else
        echo "remote_copy.sh: --shape skipped: tc refused ($(cat "$OUT/tc.err")); it needs root and sch_tbf" >&2
    fi
fi

echo "# remote copies, $(date -u '+%Y-%m-%d %H:%M UTC'), device $DEVICE ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)), $(nproc) CPUs"
echo "# GB/s (1e9 B/s), median of $REPS synchronous copies; sN = FLYT_STRIPES=N (s0: the session's one connection);"
echo "# raw = raw_stream over the same socket with as many connections (s0, s1: one), client->server | server->client,"
echo "# the better of two runs (before and after the Flyt rows of that socket); raw landing on the GPU = the same with"
echo "# raw_stream's server copying each 1 MiB it reads to GPU 0 and each it writes from there (RAW_STREAM_DEVICE=1)"
cat "$OUT"/raw-tcp-*.txt "$OUT"/raw-unix-*.txt 2>/dev/null | grep '^{' >"$TMP/raw.jsonl"
[ -n "$RELAY_RATE" ] && echo "# relayed-DATA-MODE: TCP through delay_relay as a link of $RELAY_RATE B/s each way, $STRIPES connections, FLYT_STRIPE_LZ4=MODE"
cat "$OUT"/*.txt | grep '^bw ' | awk -v raw="$TMP/raw.jsonl" -v stripes="$STRIPES" '
    BEGIN {
        while ((getline line < raw) > 0) {
            sock = line; sub(/.*"socket":"/, "", sock); sub(/".*/, "", sock)
            dir = line; sub(/.*"dir":"/, "", dir); sub(/".*/, "", dir)
            bytes = line; sub(/.*"bytes":/, "", bytes); sub(/,.*/, "", bytes)
            conns = line; sub(/.*"conns":/, "", conns); sub(/,.*/, "", conns)
            gbps = line; sub(/.*"gbps":/, "", gbps); sub(/,.*/, "", gbps)
            if (line ~ /"device":1/) {
                if (!((sock, dir, bytes, conns) in rd) || gbps + 0 > rd[sock, dir, bytes, conns] + 0) rd[sock, dir, bytes, conns] = gbps
                continue
            }
            if (!((sock, dir, bytes, conns) in r) || gbps + 0 > r[sock, dir, bytes, conns] + 0) r[sock, dir, bytes, conns] = gbps
        }
    }
    { v[$2, $3, $4, $5] = $6; if (!($5 in seen)) { seen[$5] = 1; sizes[++ns] = $5 } if (!($2 in have)) { have[$2] = 1; labels[++nl] = $2 } }
    END {
        printf "%-10s %-10s %11s %11s %13s %13s   %s\n", "size", "case", "pinned H2D", "pinned D2H", "pageable H2D", "pageable D2H", "raw c2s | s2c   raw landing on the GPU c2s | s2c"
        for (s = 1; s <= ns; s++) for (l = 1; l <= nl; l++) {
            label = labels[l]; size = sizes[s]
            line = sprintf("%-10s %-10s %11s %11s %13s %13s", size / 1048576 "MiB", label, v[label, "pinned", "H2D", size], v[label, "pinned", "D2H", size], v[label, "pageable", "H2D", size], v[label, "pageable", "D2H", size])
            if (label ~ /^(tcp|unix)-s/) {
                sock = label; sub(/-s.*/, "", sock); n = label; sub(/.*-s/, "", n); if (n < 1) n = 1
                line = line sprintf("   %.3f | %.3f (%d conn)", r[sock, "c2s", size, n], r[sock, "s2c", size, n], n)
                if ((sock, "c2s", size, n) in rd) line = line sprintf("   %.3f | %.3f", rd[sock, "c2s", size, n], rd[sock, "s2c", size, n])
                if (n == stripes && n > 1) {
                    split("pinned H2D c2s,pinned D2H s2c,pageable H2D c2s,pageable D2H s2c", cols, ",")
                    for (c = 1; c <= 4; c++) {
                        split(cols[c], k, " ")
                        raw_gbps = r[sock, k[3], size, n]
                        if (raw_gbps > 0 && v[label, k[1], k[2], size] != "") {
                            share = v[label, k[1], k[2], size] / raw_gbps
                            cells++; if (share < 0.9) under++
                            if (worst == "" || share < worst) worst = share
                            landed = rd[sock, k[3], size, n] + 0
                            if (landed > 0) { device_cells++; if (v[label, k[1], k[2], size] + 0 >= landed) above_device++ }
                        }
                    }
                }
            }
            print line
        }
        if (cells) printf "# %d-connection cells under 90%% of raw: %d of %d (worst %.0f%%)\n", stripes, under, cells, 100 * worst
        if (device_cells) printf "# %d-connection cells at or above raw landing on the GPU: %d of %d\n", stripes, above_device, device_cells
    }'
[ -f "$OUT/raw-shaped.txt" ] && echo "# shaped loopback ($SHAPE): raw_stream over $STRIPES connections: $(grep -o '"dir":"[a-z2]*"\|"bytes":[0-9]*\|"gbps":[0-9.]*' "$OUT/raw-shaped.txt" | paste -sd' ')"
# A copy whose bytes came back wrong fails the run.
! grep -h '^FAIL' "$OUT"/*.txt
