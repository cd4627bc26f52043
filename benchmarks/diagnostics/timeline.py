#!/usr/bin/env python3
"""Lines up FLYT_TIMELINE files of a client and its server (same host, one time-stamp counter)
and prints, for launch + synchronize rounds, the median time of each stage after the app's
launch call began, and the median gap between consecutive stages.

    timeline.py CLIENT.tsv SERVER.tsv [FIRST,SECOND]

A round starts where the client marks FIRST then SECOND (default 7,1: the app enters the
export whose body is a launch).
"""
import statistics
import sys

NAMES = {
    1: "client: launch body", 2: "client: launch written", 3: "client: call begins",
    4: "client: request written", 5: "client: reply read", 6: "client: call returns",
    7: "app enters export", 8: "export returns to app",
    10: "server: frame read", 11: "server: request handled", 12: "server: driver launch begins",
    13: "server: driver launch returned", 14: "server: wait saw work done", 15: "server: reply written",
}


def load(path):
    per_us = None
    marks = []
    for line in open(path):
        if line.startswith("#"):
            per_us = float(line.split()[-1])
            continue
        tick, stage = line.split()
        if int(stage):
            marks.append((int(tick), int(stage)))
    return per_us, marks


def main():
    per_us, client = load(sys.argv[1])
    _, server = load(sys.argv[2])
    merged = sorted(client + server)
    end = min(client[-1][0], server[-1][0])
    first, second = (int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "7,1").split(","))
    only_client = sorted(client)
    starts = [only_client[i][0] for i in range(len(only_client) - 1)
              if only_client[i][1] == first and only_client[i + 1][1] == second]
    offsets = {}
    sequences = {}
    for begin, next_begin in zip(starts, starts[1:]):
        if next_begin > end:
            break
        seen = []
        for tick, stage in merged:
            if tick < begin:
                continue
            if tick >= next_begin:
                break
            seen.append((tick, stage))
        order = tuple(stage for _, stage in seen)
        sequences[order] = sequences.get(order, 0) + 1
        counts = {}
        for tick, stage in seen:
            counts[stage] = counts.get(stage, 0) + 1
            offsets.setdefault((stage, counts[stage]), []).append((tick - begin) / per_us)
    rounds = sum(sequences.values())
    common = max(sequences, key=sequences.get)
    print(f"{rounds} rounds; ticks per us {per_us:.1f}; most common order ({sequences[common]} rounds):")
    print("   " + " ".join(str(s) for s in common))
    print(f"{'stage':44} {'p50 us':>8} {'p90 us':>8}  {'gap p50':>8}")
    previous = 0.0
    counts = {}
    for stage in common:
        counts[stage] = counts.get(stage, 0) + 1
        values = sorted(offsets[(stage, counts[stage])])
        p50 = values[len(values) // 2]
        p90 = values[len(values) * 9 // 10]
        label = NAMES.get(stage, str(stage)) + (f" #{counts[stage]}" if counts[stage] > 1 else "")
        print(f"{label:44} {p50:8.3f} {p90:8.3f}  {p50 - previous:8.3f}")
        previous = p50
    round_times = [(b - a) / per_us for a, b in zip(starts, starts[1:]) if b <= end]
    print(f"round (enter to next enter) p50 {statistics.median(round_times):.3f} us")


if __name__ == "__main__":
    main()
