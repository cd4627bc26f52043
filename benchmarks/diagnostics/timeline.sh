#!/usr/bin/env bash
# Diagnostic on the GPU machine: where an empty launch + synchronize spends its time over
# Flyt's shared-memory rings, stage by stage on both sides (FLYT_TIMELINE), beside the same
# rounds natively.
#   benchmarks/diagnostics/timeline.sh DIST OUT [ROUNDS]
set -uo pipefail
source "$(dirname "$0")/common.sh"
rounds=${3:-20000}
build_probe launch_timeline || exit 1
# Marks per round: about 8 on the client, 8 on the server; both files fill at the same round.
marks=$((rounds * 8))
for mode in ctx stream; do
    echo "== native, $mode"
    "$tmp/launch_timeline" "$rounds" "$mode"
done
for mode in ctx stream; do
    rm -f "$tmp"/tl.*
    FLYT_TIMELINE="$tmp/tl" FLYT_TIMELINE_MARKS=$marks start_server cuda --device cuda --listen "unix:$tmp/cuda-$mode.sock" || exit 1
    echo "== flyt shm, $mode"
    FLYT_TIMELINE="$tmp/tl" FLYT_TIMELINE_MARKS=$marks FLYT_SERVER=unix:$tmp/cuda-$mode.sock FLYT_SHM=on \
        LD_LIBRARY_PATH=$dist/lib "$tmp/launch_timeline" "$rounds" "$mode"
    sleep 1
    files=("$tmp"/tl.*.tsv)
    if [ "${#files[@]}" -ne 2 ]; then
        echo "expected two timeline files, found: ${files[*]}"
        continue
    fi
    # The client's file is the one with launch marks.
    if grep -qP '\t1$' "${files[0]}"; then client=${files[0]} server=${files[1]}; else client=${files[1]} server=${files[0]}; fi
    cp "$client" "$out/timeline-$mode-client.tsv"
    cp "$server" "$out/timeline-$mode-server.tsv"
    python3 "$here/timeline.py" "$client" "$server" | tee "$out/timeline-$mode.txt"
    kill %% 2>/dev/null
    wait 2>/dev/null
done
