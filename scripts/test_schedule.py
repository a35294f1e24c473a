"""How the xdist workers of one test run spent their time.

    HVD_TEST_SCHEDULE=/tmp/sched.jsonl make test      # or any pytest -n run
    python scripts/test_schedule.py /tmp/sched.jsonl

Prints, per worker, its busy time, its number of tests and when it finished
(seconds from the run's first test), how many rank pool workers were forked,
each rank pool closed after a job and why (tests/harness/rank_pool.py), then the
slowest tests with their worker.
A worker that finishes long before the other is time the schedule lost.
"""

from __future__ import annotations

import argparse
import collections
import json
import signal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="the JSON lines written under HVD_TEST_SCHEDULE")
    parser.add_argument("--top", type=int, default=40, help="slowest tests to list")
    args = parser.parse_args()
    records = [json.loads(line) for line in open(args.log) if line.strip()]
    closes = [r for r in records if "pool_closed" in r]
    starts = [r["pool_started"] for r in records if "pool_started" in r]
    records = [r for r in records if "test" in r and "start" in r]
    t0 = min(r["start"] for r in records)
    by_worker = collections.defaultdict(list)
    for r in records:
        by_worker[r["worker"]].append(r)
    print(f"{'worker':8} {'tests':>6} {'busy s':>8} {'finished at s':>14}")
    for worker, rows in sorted(by_worker.items()):
        busy = sum(r["end"] - r["start"] for r in rows)
        print(f"{worker:8} {len(rows):6d} {busy:8.1f} {max(r['end'] for r in rows) - t0:14.1f}")
    if starts:
        print(f"\n{len(starts)} rank pools started ({sum(starts)} workers forked)")
    if closes:
        fresh = sum(r["pool_closed"] for r in closes)
        print(f"\n{len(closes)} rank pools closed after a job ({fresh} workers to start again):")
        for r in closes:
            why = "; ".join(r["unfit"]) or f"exit codes {r['codes']}"
            print(f"  {r['pool_closed']} ranks  {r['test'].split(' ')[0]}: {why[:160]}")
    print(f"\n{'s':>7} {'at s':>7} worker   test")
    for r in sorted(records, key=lambda r: r["start"] - r["end"])[:args.top]:
        print(f"{r['end'] - r['start']:7.1f} {r['start'] - t0:7.1f} {r['worker']:8} {r['test']}")


if __name__ == "__main__":
    # Piped into `head`: stop quietly when the reader goes, as other tools do.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    main()
