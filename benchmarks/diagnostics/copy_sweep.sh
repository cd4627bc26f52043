#!/usr/bin/env bash
# Diagnostic on the GPU machine (issue 46): benchmarks/remote_copy.sh --only-striped once per
# setting of the server's staging and the client's stripe chunk (its striped rows over TCP and a
# Unix socket, raw with as many connections before and after), then each run's count of cells
# under 90% of raw. Each run's table and outputs stay in OUT/slotsS-chunkC/.
#   [CONNS=4] [SIZES=64M,1G] [REPS=5] [DEVICE=cuda|emulated] [SETTINGS='16:4M 8:1M 8:512K 16:256K'] \
#       benchmarks/diagnostics/copy_sweep.sh DIST OUT
# A setting is STAGING_SLOTS:STRIPE_CHUNK (FLYT_RPC_STAGING_SLOTS, FLYT_STRIPE_CHUNK; the defaults
# are 16 and 4M).
set -uo pipefail
source "$(dirname "$0")/common.sh"
for setting in ${SETTINGS:-16:4M 8:1M 8:512K 16:256K}; do
    slots=${setting%%:*} chunk=${setting#*:}
    case "$slots:$chunk" in
        [0-9]*:[0-9]*) ;;
        *) echo "copy_sweep: a setting is SLOTS:CHUNK, not $setting" >&2; exit 2 ;;
    esac
    name=slots$slots-chunk$chunk
    FLYT_RPC_STAGING_SLOTS=$slots FLYT_STRIPE_CHUNK=$chunk "$here/../remote_copy.sh" --only-striped --dist "$dist" \
        --out "$out/$name" --cuda "$cuda" --device "${DEVICE:-cuda}" --sizes "${SIZES:-64M,1G}" --reps "${REPS:-5}" \
        --stripes "${CONNS:-4}" >"$out/$name.txt" 2>&1
    echo "$name: $(grep 'cells under' "$out/$name.txt" || echo "no table (exit $?; see $out/$name.txt)")"
done
