"""The timeline (docs/toolbox.md, "Timeline"): rank 0 writes a Chrome-trace JSON
array with one process row per tensor, named as Horovod names it
(`allreduce.<name>`), Horovod's phases on it, and a tick per rank as it arrives;
an event is in the file within 100 ms. Real ranks; the file is opened as JSON and
the events of a known sequence of ops are checked."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import torch

from dist_harness import run_ranks

ROOT = Path(__file__).resolve().parents[2]
BIG = 1 << 19  # float32 elements: 2 MiB, above the 1 MiB inline threshold


def _known_ops(late_delay):
    import hvd_torch as hvd

    hvd.init()
    r = hvd.rank()
    hvd.allreduce(torch.ones(4), name="small", op=hvd.Sum)  # inline: through rank 0
    handles = [hvd.allreduce_async(torch.ones(BIG), name=f"big.{i}", op=hvd.Sum) for i in range(2)]
    for h in handles:
        hvd.synchronize(h)
    hvd.allgather(torch.ones(3, 2) * r, name="gather")
    hvd.broadcast(torch.ones(5), root_rank=0, name="bcast")
    if r == 1:
        time.sleep(late_delay)  # rank 1 is late for "late": the timeline must say so
    out = hvd.allreduce(torch.ones(2), name="late", op=hvd.Sum)
    hvd.shutdown()  # stops the timeline: the file is complete
    return out.tolist()


def _rows(events):
    """Events by row name (pid -> process_name metadata)."""
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "process_name" and e["pid"] > 0}
    rows = {}
    for e in events:
        if e.get("ph") != "M" and e.get("pid", 0) in names:
            rows.setdefault(names[e["pid"]], []).append(e)
    return rows


def _phases(row):
    """The row's events as ("B", name) / ("E",) / ("X", rank) tuples, in order."""
    out = []
    for e in row:
        if e["ph"] == "B":
            out.append(("B", e["name"]))
        elif e["ph"] == "E":
            out.append(("E",))
        elif e["ph"] == "X":
            out.append(("X", e["name"]))
    return out


def _negotiation(nranks, op):
    # Ticks come in arrival order: any order of the ranks.
    return ("B", f"NEGOTIATE_{op}"), {("X", str(r)) for r in range(nranks)}, ("E",)


def _check_row(row, nranks, op, inner):
    phases = _phases(row)
    begin, ticks, end = _negotiation(nranks, op)
    assert phases[0] == begin, phases
    assert set(phases[1:1 + nranks]) == ticks, phases
    assert phases[1 + nranks] == end, phases
    assert phases[2 + nranks:] == [("B", op), ("B", "QUEUE"), ("E",), *inner, ("E",)], phases
    # Timestamps never go backwards on a row (one writer, one clock).
    ts = [e["ts"] for e in row]
    assert ts == sorted(ts), ts


def _span(name):
    return [("B", name), ("E",)]


# Shared memory (the default on one host) reads the inputs and writes the
# outputs itself: no fusion-buffer copies around its collective.
_FUSED = {"shm": ["SHM_ALLREDUCE"],
          "gloo": ["MEMCPY_IN_FUSION_BUFFER", "GLOO_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"]}


@pytest.mark.parametrize("plane,nranks", [("shm", 2), ("shm", 3), ("gloo", 2), ("gloo", 3)])
def test_timeline_of_known_ops(tmp_path, plane, nranks):
    path = tmp_path / f"timeline{nranks}.json"
    results = run_ranks(_known_ops, nranks, args=(0.4,), timeout=120,
                        env={"HOROVOD_TIMELINE": str(path),
                             "HVD_TORCH_SHM": "1" if plane == "shm" else "0"})
    assert results == [[float(nranks)] * 2] * nranks
    events = json.loads(path.read_text())  # complete JSON once stopped
    assert events[0]["ph"] == "M" and "start_time_since_epoch_in_micros" in events[0]["args"]
    rows = _rows(events)
    # Horovod's row names: the op, a dot, the user's name.
    assert set(rows) == {"allreduce.small", "allreduce.big.0", "allreduce.big.1",
                         "allgather.gather", "broadcast.bcast", "allreduce.late"}, set(rows)
    _check_row(rows["allreduce.small"], nranks, "ALLREDUCE", [])
    for name in ("allreduce.big.0", "allreduce.big.1"):
        _check_row(rows[name], nranks, "ALLREDUCE", sum((_span(p) for p in _FUSED[plane]), []))
    prefix = plane.upper()
    _check_row(rows["allgather.gather"], nranks, "ALLGATHER", _span(f"{prefix}_ALLGATHER"))
    _check_row(rows["broadcast.bcast"], nranks, "BROADCAST", _span(f"{prefix}_BROADCAST"))
    _check_row(rows["allreduce.late"], nranks, "ALLREDUCE", [])
    ends = {name: [e for e in row if e["ph"] == "E"] for name, row in rows.items()}
    assert ends["allreduce.small"][-1]["args"]["path"] == "inline"
    assert ends["allreduce.big.0"][-1]["args"]["path"] == "collective"
    # The negotiation's end names the last rank and how long the first waited.
    late = ends["allreduce.late"][0]["args"]
    assert late["last_rank"] == 1 and late["ranks"] == nranks, late
    assert late["waited_us"] >= 300_000, late
    # The late tick is rank 1's, and comes last.
    ticks = [e["name"] for e in rows["allreduce.late"] if e["ph"] == "X"]
    assert ticks[-1] == "1", ticks


def _start_stop(workdir):
    import hvd_torch as hvd

    hvd.init()
    r = hvd.rank()
    mine = os.path.join(workdir, f"t{r}.json")
    hvd.allreduce(torch.ones(2), name="before")
    hvd.start_timeline(mine, mark_cycles=True)  # every rank calls it; rank 0 writes
    hvd.allreduce(torch.ones(2), name="during")
    mid = None
    if r == 0:  # the writer flushes the event on its own, while the job runs
        deadline = time.monotonic() + 30
        while mid is None or "allreduce.during" not in mid:
            assert time.monotonic() < deadline, "the event never reached the file"
            time.sleep(0.005)
            with open(mine) as f:
                text = f.read()
            if text.rstrip().endswith("]"):
                mid = [e.get("args", {}).get("name") for e in json.loads(text)]
    hvd.allreduce(torch.ones(2), name="during.2")
    hvd.stop_timeline()
    # Rank 0's timeline also records a peer's request as it arrives, so rank 1 may
    # send "after" only once rank 0 has stopped, or the row is rightly there.
    stopped = os.path.join(workdir, "stopped")
    if r == 0:
        open(stopped, "w").close()
    deadline = time.monotonic() + 30
    while not os.path.exists(stopped):
        assert time.monotonic() < deadline, "rank 0 never stopped its timeline"
        time.sleep(0.005)
    hvd.allreduce(torch.ones(2), name="after")
    hvd.shutdown()
    return mid


def test_start_and_stop_at_run_time(tmp_path):
    results = run_ranks(_start_stop, 2, args=(str(tmp_path),), timeout=90)
    assert "allreduce.during" in results[0], results[0]  # readable JSON while still running
    assert not (tmp_path / "t1.json").exists()  # only rank 0 writes
    events = json.loads((tmp_path / "t0.json").read_text())
    rows = _rows(events)
    assert set(rows) == {"allreduce.during", "allreduce.during.2"}, set(rows)
    cycles = [e for e in events if e.get("name") == "CYCLE_START"]
    assert len(cycles) >= 2 and all(e["ph"] == "i" and e["s"] == "g" for e in cycles)


def _labelled(workdir):
    import hvd_torch as hvd
    from hvd_torch import _C

    hvd.init()
    r = hvd.rank()
    hvd.start_timeline(os.path.join(workdir, f"t{r}.json"))
    # Rank 0's timeline records a peer's request as it arrives: rank 1 sends its
    # first op only once rank 0's timeline runs, or that op's row lacks its tick.
    hvd.barrier()
    x, ops = torch.ones(2), torch.ops.hvd_torch
    # timeline_label, the allreduce schemas' last argument: each rank its own.
    ops.allreduce(x, "lab.op", 1, 1.0, 1.0, 0, f"op by {r}")
    taken = _C.eager_allreduce_(x.clone(), "lab.eager", 1, 1.0, 1.0, 0, f"eager by {r}")
    ops.synchronize(ops.allreduce_async(x, "lab.async", 1, 1.0, 1.0, 0, f"async by {r}"))
    ops.grouped_allreduce([x, x], "lab.bundle", 1, 1.0, 1.0, 0, f"bundle by {r}")
    ops.grouped_allreduce([x, x.double()], "lab.group", 1, 1.0, 1.0, 0, f"group by {r}")
    ops.allreduce(x, "lab.none", 1)
    # hvd's wrappers: the keyword after Horovod's arguments.
    hvd.allreduce(x, name="lab.hvd", op=hvd.Sum, timeline_label=f"hvd by {r}")
    hvd.synchronize(hvd.allreduce_async_(x.clone(), name="lab.hvd_async", op=hvd.Sum,
                                         timeline_label=f"hvd async by {r}"))
    hvd.stop_timeline()
    hvd.shutdown()
    return taken


def test_rank_0s_timeline_label_marks_its_ops_row(tmp_path):
    """A label is rank 0's own: a zero-length event on the op's row, on every path
    (the dispatcher, the eager entry, async, a bundle, a group's members)."""
    assert run_ranks(_labelled, 2, args=(str(tmp_path),), timeout=90) == [None, None]
    rows = _rows(json.loads((tmp_path / "t0.json").read_text()))
    expected = {"allreduce.lab.op": "op by 0", "allreduce.lab.eager": "eager by 0",
                "allreduce.lab.async": "async by 0", "allreduce.lab.bundle": "bundle by 0",
                "allreduce.lab.group.0": "group by 0", "allreduce.lab.group.1": "group by 0",
                "allreduce.lab.none": None, "allreduce.lab.hvd": "hvd by 0",
                "allreduce.lab.hvd_async": "hvd async by 0"}
    for row, label in expected.items():
        ticks = [e["name"] for e in rows[row] if e["ph"] == "X"]
        assert ticks.count(label) == (label is not None), (row, ticks)
        assert sorted(t for t in ticks if t != label) == ["0", "1"], (row, ticks)


def test_hvdrun_timeline_flags(tmp_path):
    """hvdrun --timeline-filename/--timeline-mark-cycles reach the ranks (relative path
    resolved against hvdrun's directory)."""
    script = ("import torch, hvd_torch as hvd\n"
              "hvd.init()\n"
              "for i in range(3): hvd.allreduce(torch.ones(8), name='grad')\n"
              "hvd.shutdown()\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "hvdrun", "-np", "2", "--timeline-filename", "tl.json",
         "--timeline-mark-cycles", sys.executable, "-c", script],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = json.loads((tmp_path / "tl.json").read_text())
    phases = [p for p in _phases(_rows(events)["allreduce.grad"]) if p[0] == "B"]
    assert phases.count(("B", "NEGOTIATE_ALLREDUCE")) == 3, phases
    assert any(e.get("name") == "CYCLE_START" for e in events)


def test_timeline_of_the_digits_example(tmp_path):
    """examples/digits_train.py under hvdrun --timeline-filename: every parameter's
    gradient allreduce has its row, negotiated once per step on both ranks."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "hvdrun", "-np", "2", "--timeline-filename", "digits.json",
         sys.executable, str(ROOT / "examples" / "digits_train.py"), "--epochs", "1",
         "--checkpoint", str(tmp_path / "ckpt.pt")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(json.loads((tmp_path / "digits.json").read_text()))
    params = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
              "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    for p in params:
        assert f"broadcast.{p}" in rows, sorted(rows)
        phases = _phases(rows[f"allreduce.{p}"])
        steps = phases.count(("B", "NEGOTIATE_ALLREDUCE"))
        assert steps == 24, (p, steps)  # 1498 images / (2 ranks x 32) = 24 steps
        assert phases.count(("X", "0")) == phases.count(("X", "1")) == steps


def _horovods_timeline_check(path, delay):
    """Horovod's own timeline test, as a Horovod user writes it: an op, a tenth of a
    second, then the file (on rank 0) parsed while the job still runs."""
    import hvd_torch as hvd

    hvd.init()
    out = hvd.allreduce(torch.tensor([1.0, 2.0, 3.0]), name="test_allreduce", op=hvd.Sum)
    after = time.monotonic()
    time.sleep(delay)
    seen = None
    if hvd.rank() == 0:
        # The writer flushes on its own within about 20 ms of an event; a loaded
        # machine may run it later, so wait for the event the test is about (the
        # op's row, the array closed) rather than for a time. No op follows until
        # then: only the writer's own flush can put it there.
        deadline = after + 30
        while True:
            with open(path) as f:
                text = f.read()
            if "allreduce.test_allreduce" in text and text.rstrip().endswith("]"):
                break
            assert time.monotonic() < deadline, f"the op never reached the file: {text!r}"
            time.sleep(0.005)
        seen = dict(text=text, waited=time.monotonic() - after)
    hvd.grouped_allreduce([torch.ones(2), torch.ones(3)])  # one op: a CPU group of one dtype
    hvd.grouped_allgather([torch.ones(2), torch.ones(3)], name="ga")  # one row per member
    hvd.allreduce(torch.ones(1), name="last")  # recorded, then written by shutdown()
    hvd.shutdown()
    return out.tolist(), seen


@pytest.mark.parametrize("nranks", [2, 3])
def test_an_op_reaches_the_file_while_the_job_runs(tmp_path, nranks):
    path = tmp_path / "timeline.json"
    results = run_ranks(_horovods_timeline_check, nranks, args=(str(path), 0.1), timeout=90,
                        env={"HOROVOD_TIMELINE": str(path), "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    assert [out for out, _ in results] == [[float(nranks), 2.0 * nranks, 3.0 * nranks]] * nranks
    seen = results[0][1]
    print(f"\nthe op was in the file {seen['waited'] * 1e3:.0f} ms after it ended")
    text = seen["text"]
    for word in ("allreduce.test_allreduce", "NEGOTIATE_ALLREDUCE", "ALLREDUCE", "CYCLE_START"):
        assert word in text, (word, text)
    events = json.loads(text)  # complete JSON while the job runs
    phases = _phases(_rows(events)["allreduce.test_allreduce"])
    # The whole op: negotiation with a tick per rank, then the op, both ended.
    assert phases[0] == ("B", "NEGOTIATE_ALLREDUCE") and ("B", "ALLREDUCE") in phases, phases
    assert {p for p in phases if p[0] == "X"} == {("X", str(r)) for r in range(nranks)}, phases
    assert phases.count(("E",)) == sum(1 for p in phases if p[0] == "B"), phases
    assert any(e.get("name") == "CYCLE_START" and e["ph"] == "i" for e in events)
    # shutdown() wrote the rest and closed the array.
    final = _rows(json.loads(path.read_text()))
    assert ("B", "ALLREDUCE") in _phases(final["allreduce.last"])
    assert {"allgather.ga.0", "allgather.ga.1"} <= set(final), sorted(final)
    assert [r for r in final if r.startswith("grouped_allreduce.noname.")], sorted(final)


def test_a_script_that_never_calls_shutdown_still_leaves_a_complete_file(tmp_path):
    """hvd_torch's atexit shutdown stops the timeline: the last op is in the file."""
    script = ("import torch, hvd_torch as hvd\n"
              "hvd.init()\n"
              "hvd.allreduce(torch.ones(8), name='exit.last')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "hvdrun", "-np", "2", "--timeline-filename", "tl.json",
         sys.executable, "-c", script],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (tmp_path / "tl.json").read_text()
    assert text.endswith("]\n"), text[-200:]
    phases = _phases(_rows(json.loads(text))["allreduce.exit.last"])
    assert phases[-1] == ("E",) and ("B", "ALLREDUCE") in phases, phases


def _timeline_into_a_link(path):
    import hvd_torch as hvd

    hvd.init()
    try:
        hvd.start_timeline(path)
    except Exception as e:  # noqa: BLE001  (the message is what the test checks)
        return f"{type(e).__name__}: {e}"
    finally:
        hvd.shutdown()
    return "started"


def test_a_timeline_never_writes_through_a_planted_link(tmp_path):
    """A link planted at the timeline's path (a shared folder) must not make rank 0
    overwrite what it points to (issue #44)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "timeline.json"
    link.symlink_to(victim)
    results = run_ranks(_timeline_into_a_link, 2, args=(str(link),), timeout=90)
    assert "is a symbolic link" in results[0] and str(link) in results[0], results
    assert victim.read_text() == "precious\n"
