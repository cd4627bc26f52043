#!/usr/bin/env python3
"""Compares benchmark reports (`results.md` of `benchmarks/run.sh`) of two builds run in turns.

    compare.py --before A.md C.md ... --now B.md D.md ...

Each cell (a metric's row, one transport's column) is SLOWER when every run now is worse than
every run before and the medians differ by more than the larger of the two groups' spreads
(max - min), FASTER the other way round. The native column and the raw socket/ring rows do not
depend on Flyt's build: the verdicts they get are the machine's drift, the rule's false alarms,
and are counted apart as the noise floor.
"""
import argparse
import re
import statistics
import sys

COLUMNS = ("native", "unix", "tcp", "shm")
# Units where more is better; everything else (us, ms, s, %) is a time or a cost.
HIGHER_BETTER = ("GB/s", "/s)", "GFLOP/s", "TFLOP/s", "(x faster")


def number(text):
    """The first number in a cell ("4.761 (94% of raw)", "243,622"), or None."""
    match = re.match(r"\s*([0-9][0-9,]*\.?[0-9]*)", text)
    return float(match.group(1).replace(",", "")) if match else None


def parse(path):
    cells = {}
    with open(path) as report:
        for line in report:
            parts = [part.strip() for part in line.strip().strip("|").split("|")]
            if len(parts) < 5 or parts[0] in ("metric", "---") or parts[0].startswith("**"):
                continue
            metric = parts[0]
            if metric.endswith("(x)") or "minus native" in metric:
                continue  # derived from other rows
            for column, text in zip(COLUMNS, parts[1:5]):
                value = number(text)
                if value is not None:
                    cells[(metric, column)] = value
    return cells


def control(metric, column):
    return column == "native" or metric.startswith("raw ")


def verdict(before, now, higher_better):
    """SLOWER, FASTER or "" for one cell's runs before and now."""
    if higher_better:  # compare as costs
        before, now = [-value for value in before], [-value for value in now]
    spread = max(max(before) - min(before), max(now) - min(now))
    shift = statistics.median(now) - statistics.median(before)
    if min(now) > max(before) and shift > spread:
        return "SLOWER"
    if max(now) < min(before) and -shift > spread:
        return "FASTER"
    return ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", nargs="+", required=True)
    parser.add_argument("--now", nargs="+", required=True)
    parser.add_argument("--all", action="store_true", help="list every cell, not only those with a verdict")
    args = parser.parse_args()
    before = [parse(path) for path in args.before]
    now = [parse(path) for path in args.now]
    keys = [key for key in before[0] if all(key in run for run in before + now)]
    counts = {(kind, flagged): 0 for kind in ("flyt", "control") for flagged in ("", "SLOWER", "FASTER")}
    print("| metric | column | before | now | verdict |")
    print("| --- | --- | --- | --- | --- |")
    for metric, column in keys:
        higher_better = any(unit in metric for unit in HIGHER_BETTER)
        b = [run[(metric, column)] for run in before]
        n = [run[(metric, column)] for run in now]
        said = verdict(b, n, higher_better)
        kind = "control" if control(metric, column) else "flyt"
        counts[(kind, said)] += 1
        if said or args.all:
            fmt = lambda values: ", ".join(f"{value:g}" for value in values)
            print(f"| {metric[:70]} | {column}{' (control)' if kind == 'control' else ''} | {fmt(b)} | {fmt(n)} | {said} |")
    for kind in ("flyt", "control"):
        total = sum(counts[(kind, flagged)] for flagged in ("", "SLOWER", "FASTER"))
        print(f"{kind} cells: {total}, slower {counts[(kind, 'SLOWER')]}, faster {counts[(kind, 'FASTER')]}", file=sys.stderr)


if __name__ == "__main__":
    main()
