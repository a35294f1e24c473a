"""`make fuzz`'s runner: each libFuzzer target (tests/fuzz) for a set time from its
seed corpus, then the store server's hypothesis fuzz (tests/unit/test_store_fuzz.py) in
its long profile; prints one table and writes the figures as JSON.

    python scripts/fuzz_run.py --seconds 60 [--targets message,byte_ring] [--json PATH]

Each target starts from a fresh copy of tests/fuzz/corpus/<target> under build/fuzz-run/
(the inputs it adds stay there, not in the repository), reads tests/fuzz/regressions/
<target> too, and writes what crashed it to build/fuzz-run/<target>/crash-* (oom-*,
timeout-*, leak-*): save such a file under tests/fuzz/regressions/<target>/ and fix the
decoder (docs/testing.md, "Fuzzing").  Coverage is libFuzzer's own: cov = edges of the
instrumented code reached, ft = features (edges with hit counts), at the end of the run.
Exits 1 when any target crashed or the hypothesis run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["message", "control_frames", "host_record", "frame_socket", "byte_ring",
           "store_client", "shm_peer", "endpoint", "agreement"]
STATUS_LINE = re.compile(r"^#(\d+)\s+\S+\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
STAT = re.compile(r"^stat::(\w+):\s+(\d+)")
ARTIFACTS = ("crash-", "oom-", "timeout-", "leak-", "slow-unit-")


def run_target(name: str, seconds: int, work: Path) -> dict:
    binary = ROOT / "build/fuzz" / f"fuzz_{name}"
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    corpus = folder / "corpus"
    shutil.copytree(ROOT / "tests/fuzz/corpus" / name, corpus)
    dirs = [str(corpus)]
    regressions = ROOT / "tests/fuzz/regressions" / name
    if regressions.is_dir():
        dirs.append(str(regressions))
    cmd = [str(binary), f"-max_total_time={seconds}", "-print_final_stats=1",
           f"-artifact_prefix={folder}/", "-timeout=10", "-rss_limit_mb=2048", *dirs]
    started = time.monotonic()
    # The limit is a safety net for a wedged target: libFuzzer stops itself at seconds.
    run = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                         timeout=seconds + 120, check=False)
    elapsed = time.monotonic() - started
    (folder / "log.txt").write_text(run.stderr)
    stats, cov, ft, corp = {}, 0, 0, 0
    for line in run.stderr.splitlines():
        m = STAT.match(line)
        if m:
            stats[m.group(1)] = int(m.group(2))
        m = STATUS_LINE.match(line)
        if m:
            cov, ft, corp = int(m.group(2)), int(m.group(3)), int(m.group(4))
    crashes = sorted(p.name for p in folder.iterdir() if p.name.startswith(ARTIFACTS))
    return {
        "target": name,
        "executions": stats.get("number_of_executed_units", 0),
        "exec_per_sec": stats.get("average_exec_per_sec", 0),
        "cov": cov,
        "ft": ft,
        "corpus": corp,
        "new_units": stats.get("new_units_added", 0),
        "peak_rss_mb": stats.get("peak_rss_mb", 0),
        "seconds": round(elapsed, 1),
        "returncode": run.returncode,
        "crashes": [str(folder / c) for c in crashes],
    }


def run_store_fuzz(seconds: int) -> dict:
    """The hypothesis fuzz of the store server, its long profile sized by `seconds`."""
    python = ROOT / ".venv/bin/python"
    env = dict(os.environ, HVD_STORE_FUZZ_PROFILE="long", HVD_STORE_FUZZ_SECONDS=str(seconds))
    cmd = [str(python if python.exists() else sys.executable), "-m", "pytest", "-q", "-p",
           "no:cacheprovider", "--hypothesis-show-statistics", "tests/unit/test_store_fuzz.py"]
    started = time.monotonic()
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env,
                         timeout=10 * seconds + 300, check=False)
    elapsed = time.monotonic() - started
    # --hypothesis-show-statistics: "- N passing, M failing, and K invalid test cases"
    # for each phase of each test.
    counts = re.findall(r"(\d+) passing, (\d+) failing", run.stdout)
    examples = sum(int(p) + int(f) for p, f in counts)
    failing = sum(int(f) for _, f in counts)
    return {
        "target": "store_server (hypothesis)",
        "executions": examples,
        "exec_per_sec": round(examples / elapsed) if elapsed > 0 else 0,
        "seconds": round(elapsed, 1),
        "returncode": run.returncode,
        "crashes": [f"{failing} failing examples"] if run.returncode != 0 else [],
        "output_tail": run.stdout[-3000:] if run.returncode != 0 else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--work", default=str(ROOT / "build/fuzz-run"))
    parser.add_argument("--json", default=None, help="default: WORK/report.json")
    parser.add_argument("--no-store", action="store_true", help="skip the hypothesis run")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.targets.split(","):
        print(f"fuzz_{name}: {args.seconds} s ...", flush=True)
        rows.append(run_target(name, args.seconds, work))
    if not args.no_store:
        print(f"store server (hypothesis, long profile, about {args.seconds} s) ...", flush=True)
        rows.append(run_store_fuzz(args.seconds))

    header = f"{'target':<28}{'executions':>12}{'exec/s':>9}{'cov':>7}{'ft':>7}{'corpus':>8}{'crashes':>9}"
    print("\n" + header + "\n" + "-" * len(header))
    for r in rows:
        print(f"{r['target']:<28}{r['executions']:>12}{r['exec_per_sec']:>9}"
              f"{r.get('cov', '-'):>7}{r.get('ft', '-'):>7}{r.get('corpus', '-'):>8}"
              f"{len(r['crashes']):>9}")
    failed = [r for r in rows if r["crashes"] or r["returncode"] not in (0,)]
    for r in failed:
        print(f"\n{r['target']}: exit {r['returncode']}; " + ", ".join(r["crashes"]))
        if r.get("output_tail"):
            print(r["output_tail"])
    report = Path(args.json) if args.json else work / "report.json"
    report.write_text(json.dumps({"seconds": args.seconds, "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                  "targets": rows}, indent=2) + "\n")
    print(f"\nreport: {report}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
