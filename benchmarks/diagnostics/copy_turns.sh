#!/usr/bin/env bash
# Diagnostic on the GPU machine (issue 46): benchmarks/remote_copy.sh --only-striped TURNS times in a
# row, then per cell (size, socket, pinned/pageable, way) the median over the turns of Flyt's GB/s,
# of raw's (each turn's better of before and after) and of Flyt's share of raw in each turn, with
# the lowest share: whether a cell under 90% in one run is under it in most, or is the host's drift.
# VARIANTS (default: one, 'default') A/B-tests settings in the same turns: each turn runs every
# variant in order, a variant being 'default' or NAME=VALUE[,NAME=VALUE...] set in the environment
# of both the server and the app (server:NAME=VALUE: the server's only; dist=DIR: another build,
# to A/B two builds in the same turns); a table per variant. Each run's table and outputs stay in
# OUT/turnN-VARIANT/.
#   [TURNS=5] [DEVICE=cuda|emulated] [VARIANTS='default FLYT_SPIN_US=0'] [CONNS=4] [SIZES=64M,1G] [REPS=5] \
#       benchmarks/diagnostics/copy_turns.sh DIST OUT
set -uo pipefail
source "$(dirname "$0")/common.sh"
variants=${VARIANTS:-default}
for turn in $(seq "${TURNS:-5}"); do
    for variant in $variants; do
        settings=() both=() server=() build=$dist
        [ "$variant" = default ] || IFS=, read -ra settings <<<"$variant"
        for setting in "${settings[@]}"; do
            case "$setting" in
                server:*) server+=("${setting#server:}") ;;
                dist=*) build=${setting#dist=} ;;
                *) both+=("$setting") ;;
            esac
        done
        name=${variant//\//_}
        env "${both[@]}" SERVER_ENV="${server[*]}" "$here/../remote_copy.sh" --only-striped --dist "$build" --out "$out/turn$turn-$name" \
            --cuda "$cuda" --device "${DEVICE:-cuda}" --sizes "${SIZES:-64M,1G}" --reps "${REPS:-5}" --stripes "${CONNS:-4}" \
            >"$out/turn$turn-$name.txt" 2>&1
        echo "turn $turn $variant: $(grep 'cells under' "$out/turn$turn-$name.txt" || echo "no table (see $out/turn$turn-$name.txt)")"
    done
done
for variant in $variants; do python3 - "$out" "${TURNS:-5}" "${variant//\//_}" <<'PY'
import re, statistics, sys
out, turns, variant = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cells = {}  # (size, socket, kind, way) -> [(flyt, raw, landing)]
columns = [("pinned", "H2D", 0), ("pinned", "D2H", 1), ("pageable", "H2D", 0), ("pageable", "D2H", 1)]
for turn in range(1, turns + 1):
    try:
        lines = open(f"{out}/turn{turn}-{variant}.txt").read().splitlines()
    except OSError:
        continue
    for line in lines:
        m = re.match(r"(\d+MiB)\s+(tcp|unix)-s(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+) \| ([\d.]+) \(\d+ conn\)(?:\s+([\d.]+) \| ([\d.]+))?", line)
        if not m or m.group(3) in ("0", "1"):
            continue
        flyt = [float(m.group(i)) for i in range(4, 8)]
        raw = [float(m.group(8)), float(m.group(9))]
        landing = [float(m.group(10)), float(m.group(11))] if m.group(10) else [0.0, 0.0]
        for (kind, way, side), value in zip(columns, flyt):
            cells.setdefault((m.group(1), m.group(2), kind, way), []).append((value, raw[side], landing[side]))
print(f"# {variant}: median over {turns} turns of remote_copy.sh --only-striped; share = Flyt / raw within a turn")
print(f"{'size':<8}{'socket':<7}{'copy':<14}{'Flyt':>7}{'raw':>7}{'landing':>9}{'share med':>11}{'share min':>11}{'turns<90%':>11}")
under = 0
for key, rows in sorted(cells.items()):
    shares = [f / r for f, r, _ in rows if r > 0]
    share = statistics.median(shares)
    under += share < 0.9
    print(f"{key[0]:<8}{key[1]:<7}{key[2] + ' ' + key[3]:<14}{statistics.median(f for f, _, _ in rows):>7.2f}"
          f"{statistics.median(r for _, r, _ in rows):>7.2f}{statistics.median(l for _, _, l in rows):>9.2f}"
          f"{100 * share:>10.0f}%{100 * min(shares):>10.0f}%{sum(s < 0.9 for s in shares):>6} of {len(shares)}")
print(f"# {variant}: cells whose median share is under 90%: {under} of {len(cells)}")
PY
done
