"""Two builds of hvd-torch, interleaved: is B faster or slower than A?

    python bench/ab_builds.py --a /work/wt-base --b . --rounds 3 -- -np 2 -b 4 -e 16M -f 16

Each round runs each tree's own bench/collectives_bench.py (the arguments
after --) once on build A, then once on build B (B first in odd rounds, so a
machine that grows busier during the run favours neither); the bench puts its
own tree first on the ranks' PYTHONPATH, and this script checks in its JSON
that the ranks imported that tree's hvd_torch. Each tree needs its extension
built in place (`python setup.py build_ext --inplace`). The table gives, per op and size and per hvd-torch
column, A's time over B's (> 1: B is faster), the median over rounds and the
rounds' range, and the geometric mean over every cell. Ratios, not times: on a
shared machine only the comparison inside one run means something.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile



def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--a", required=True, help="source tree of build A (the baseline)")
    p.add_argument("--b", required=True, help="source tree of build B (the change)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None, help="where to write the table (default: none)")
    p.add_argument("bench_args", nargs=argparse.REMAINDER,
                   help="after --: arguments for collectives_bench.py")
    args = p.parse_args(argv)
    args.bench_args = [a for a in args.bench_args if a != "--"]
    return args


def bench_command(tree: str, bench_args: list[str], out: str) -> list[str]:
    """The tree's own collectives_bench.py: the bench puts its own repository first on
    the ranks' PYTHONPATH, so one tree's script would measure that tree's build for
    both A and B (as this script did until the check in run_bench)."""
    return [sys.executable, os.path.join(os.path.abspath(tree), "bench", "collectives_bench.py"),
            *bench_args, "--json", out, "--plot", out[:-len(".json")] + ".png"]


def run_bench(tree: str, bench_args: list[str], out: str) -> dict:
    """One collectives_bench.py run on the build in `tree`; its JSON.  Raises
    RuntimeError when the ranks imported hvd_torch from another tree."""
    subprocess.run(bench_command(tree, bench_args, out), check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        result = json.load(f)
    imported = result.get("hvd_torch_tree")
    if imported is not None and os.path.realpath(imported) != os.path.realpath(tree):
        raise RuntimeError(f"the ranks of the run for {tree} imported hvd_torch from {imported}")
    return result


def cells(result: dict) -> dict[tuple, float]:
    """(op, bytes, column) -> time in microseconds, for hvd-torch's columns."""
    out = {}
    for row in result["rows"]:
        for column, summary in row["results"].items():
            if column.startswith("hvd"):
                out[(row["op"], row["bytes"], column)] = summary["time_us"]
    for entry in result.get("many", []):
        for column, summary in entry["results"].items():
            if column.startswith("hvd"):
                op = f"many {entry['tensors']}x"
                out[(op, entry["bytes"], column)] = summary["time_us"]
    return out


def compare(rounds: list[tuple[dict, dict]]) -> list[dict]:
    """Per cell: A time / B time in every round, its median and range."""
    table = []
    keys = sorted(set.intersection(*(set(a) & set(b) for a, b in rounds)),
                  key=lambda k: (k[0], k[1], k[2]))
    for key in keys:
        ratios = [a[key] / b[key] for a, b in rounds]
        table.append({"op": key[0], "bytes": key[1], "column": key[2],
                      "ratio_median": statistics.median(ratios),
                      "ratio_min": min(ratios), "ratio_max": max(ratios)})
    return table


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv=None) -> int:
    args = parse_args(argv)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="ab_builds") as tmp:
        for i in range(args.rounds):
            order = ("a", "b") if i % 2 == 0 else ("b", "a")
            got = {}
            for which in order:
                tree = getattr(args, which)
                got[which] = cells(run_bench(tree, args.bench_args,
                                             os.path.join(tmp, f"{which}{i}.json")))
                print(f"# round {i + 1}/{args.rounds}: {which} done", flush=True)
            rounds.append((got["a"], got["b"]))
    table = compare(rounds)
    print(f"# A = {args.a}, B = {args.b}; A time / B time (> 1: B faster), "
          f"median of {args.rounds} rounds (range)")
    print(f"{'op':<16} {'bytes':>10} {'column':<22} {'A/B':>6}  range")
    for row in table:
        print(f"{row['op']:<16} {row['bytes']:>10} {row['column']:<22} "
              f"{row['ratio_median']:>6.3f}  {row['ratio_min']:.3f}-{row['ratio_max']:.3f}")
    overall = geomean(r["ratio_median"] for r in table)
    print(f"# geometric mean of the medians over {len(table)} cells: {overall:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"a": args.a, "b": args.b, "rounds": args.rounds,
                       "bench_args": args.bench_args, "cells": table, "geomean": overall}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
