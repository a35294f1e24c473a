"""The suite's tiers, and what every test shares: the harness on sys.path, the
warm rank pools, one Ray per cluster shape.

Every test belongs to exactly one tier.  Its folder gives it (tests/unit,
tests/ranks, tests/launcher, tests/multihost, tests/ray, tests/gpu,
tests/slow, tests/wheel); a test may name another tier with a marker of its own (a unit
check inside a feature's rank file carries @pytest.mark.unit).  Run one tier
with `pytest -m TIER tests`; `make test-fast` is the unit tier plus the C++
units.  `serial` is not a tier: it marks tests that measure the machine
(bytes on loopback, CPU time, a whole-machine job) and must not share it,
so `make test` runs them after the parallel part, alone.

A unit test starts no process: the suite fails a unit-tier test that does.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# The harness modules (dist_harness, rank_pool, ...) import by plain name, and
# so do the test modules that share helpers across tiers (test_adasum's
# reference for the GPU tests): every folder is on sys.path, the harness first.
for _folder in ["harness", "unit", "ranks", "launcher", "multihost", "ray", "gpu", "slow",
                "wheel"][::-1]:
    if str(TESTS / _folder) not in sys.path:
        sys.path.insert(0, str(TESTS / _folder))

# One intra-op thread per test process, as torchrun gives each rank: the suite
# runs two xdist workers, each starting ranks, on two cores, and a second
# OpenMP thread per process only adds spinning and switches (about 8 % less CPU
# over the example tests). Tests that need more threads set them themselves.
os.environ.setdefault("OMP_NUM_THREADS", "1")

TIERS = {
    "unit": "starts no process; seconds in all",
    "ranks": "multi-rank jobs through the harness (warm rank pools)",
    "launcher": "hvdrun, the doctor, examples and other subprocesses",
    "multihost": "hosts in network namespaces with an sshd each",
    "ray": "a real local Ray (one per cluster shape) or Ray clusters",
    "gpu": "GPU test files (on the CPU path without a GPU) and the CUDA sources' build",
    "slow": "soaks, installs and benchmark CLIs: minutes each",
    "integrations": "Lightning, Accelerate, Transformers and Ray Train v2 (scripts/setup.sh pins them) on hvd",
    "wheel": "the binary wheel built, installed and run with no compiler and no system Gloo "
             "(make test-wheel, its own CI step; not in make test)",
}
OTHER_MARKERS = {
    "serial": "measures the machine (loopback bytes, CPU time): runs alone, after the rest",
    "cpp": "builds and runs the C++ unit tests (a make subprocess, still in the unit tier)",
}


def pytest_configure(config):
    for name, what in {**TIERS, **OTHER_MARKERS}.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    if config.getoption("dist", "no") == "loadgroup":
        _check_loadgroup_holds()


def _check_loadgroup_holds():
    """pytest-xdist's --dist loadgroup tags a grouped test by rewriting the
    node's `_nodeid`; pytest 9.2 reads a node's id from elsewhere, so the
    groups (one make, one Ray per shape, one set of namespace hosts) would
    silently not hold and two workers would share what one must own.
    scripts/setup.sh pins a pair that agree."""
    from _pytest.nodes import Node

    if "_nodeid" not in inspect.getsource(Node.nodeid.fget):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} ignores pytest-xdist's --dist loadgroup groups: "
            "run scripts/setup.sh (it installs the pinned pytest and pytest-xdist)")


def tier_of(item) -> str:
    """The tier a test belongs to: its own tier marker, else its folder's."""
    own = [m.name for m in item.iter_markers() if m.name in TIERS]
    if own:
        return own[0]
    folder = Path(str(item.fspath)).resolve().parent.name
    if folder not in TIERS:
        raise pytest.UsageError(f"{item.nodeid}: a test file outside the tier folders "
                                f"({', '.join(TIERS)}) and with no tier marker")
    return folder


# tryfirst: pytest-xdist reads the xdist_group markers in its own hook of this name.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = tier_of(item)
        if not item.get_closest_marker(tier):
            item.add_marker(getattr(pytest.mark, tier))
        group = _xdist_group(item, tier)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    # Ray modules that share a cluster shape run one after another, so one Ray
    # serves them all (harness/ray_harness.py starts a new one only when the
    # shape changes).  Within a shape, the tests on warm workers come first,
    # by their number of workers, so that one warm executor serves each run of
    # them (ray_harness.warm_executor).
    #
    # The xdist groups come first, the largest kinds first (Ray, then the
    # namespace hosts, then the C++ units): --dist loadgroup hands out work in
    # collection order, and a group of minutes handed out last ran on one
    # worker while the other had nothing left. Ungrouped tests fill in around
    # them.  sorted() is stable: otherwise file order stays.
    def order_key(item):
        shape = getattr(item.module, "RAY_SHAPE", None) if item.get_closest_marker("ray") else None
        if shape is not None:
            callspec = getattr(item, "callspec", None)
            warm = callspec.params.get("warm_executor") if callspec else None
            return (0, repr(sorted(shape.items())), float("inf") if warm is None else warm)
        group = item.get_closest_marker("xdist_group")
        name = group.args[0] if group and group.args else group.kwargs.get("name") if group else None
        if name is None:
            return (4, "", 0)
        kind = 1 if name.startswith("ray-") else 2 if name == "multihost" else 3
        return (kind, name, 0)

    items[:] = sorted(items, key=order_key)
    _write_serial_files(items)


def _write_serial_files(items) -> None:
    """With HVD_SERIAL_FILES=FILE (the Makefile's parallel part), the files that
    hold serial tests, one per line, for the serial part to collect alone."""
    path = os.environ.get("HVD_SERIAL_FILES")
    if not path:
        return
    files = sorted({item.nodeid.split("::")[0] for item in items
                    if item.get_closest_marker("serial")})
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}"  # each xdist worker writes the same list
    with open(tmp, "w") as f:
        f.write("".join(f"{name}\n" for name in files))
    os.replace(tmp, path)


def _xdist_group(item, tier):
    """Tests that must share one pytest-xdist worker (--dist loadgroup): the Ray
    modules of one cluster shape share their local Ray, the namespace hosts are
    one set of addresses that one job at a time can use, and the C++ units are
    one `make` in one build folder."""
    shape = getattr(item.module, "RAY_SHAPE", None)
    if tier == "ray" or shape:  # an integrations module on Ray shares its shape's Ray
        if shape:
            return "ray-" + "-".join(f"{k}{v}" for k, v in sorted(shape.items()))
        return f"ray-{item.module.__name__}"
    if tier == "multihost":
        return "multihost"
    if item.get_closest_marker("cpp"):
        return "cpp"
    return None


# ---------------------------------------------------------------- unit tier


@contextlib.contextmanager
def _counting_spawns(started: list):
    """subprocess.Popen records what it starts into `started`, for this block only."""
    real = subprocess.Popen.__init__

    def counting(self, *args, **kwargs):
        started.append(args[0] if args else kwargs.get("args"))
        real(self, *args, **kwargs)

    subprocess.Popen.__init__ = counting
    try:
        yield
    finally:
        subprocess.Popen.__init__ = real


def _audit_unit(item):
    """Runs one phase of a test; a unit test that starts a process in it (or in
    a fixture it sets up) is in the wrong tier and fails. Other tiers run unwatched."""
    if not item.get_closest_marker("unit") or item.get_closest_marker("cpp"):
        return (yield)
    started = []
    with _counting_spawns(started):
        result = yield
    if started:
        raise AssertionError(f"{item.nodeid} is in the unit tier but started processes "
                             f"{started[:3]}: mark it with the tier it belongs to")
    return result


pytest_runtest_setup = pytest.hookimpl(wrapper=True)(_audit_unit)
pytest_runtest_call = pytest.hookimpl(wrapper=True)(_audit_unit)


# ---------------------------------------------------------------- schedule log


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With HVD_TEST_SCHEDULE=FILE, each test's worker, start and end (setup to
    teardown) go to FILE as JSON lines: scripts/test_schedule.py shows how the
    xdist workers were kept busy and where one waited on the other."""
    path = os.environ.get("HVD_TEST_SCHEDULE")
    start = time.time()
    try:
        return (yield)
    finally:
        if path:
            record = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                      "test": item.nodeid, "start": start, "end": time.time()}
            with open(path, "a") as f:
                f.write(json.dumps(record) + "\n")


# ---------------------------------------------------------------- shared Ray


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """The shared local Ray stops once this process has no Ray test left next:
    idle, its raylet, GCS and pooled workers still cost about 2 CPU-seconds a
    minute, and the Ray tests run first (conftest's order), so it would idle
    through the rest of the session."""
    if "ray_harness" not in sys.modules or not item.get_closest_marker("ray"):
        return
    if nextitem is None or not nextitem.get_closest_marker("ray"):
        sys.modules["ray_harness"].release_shared_ray()


# ---------------------------------------------------------------- rank pools


def pytest_sessionfinish(session, exitstatus):
    import rank_pool

    rank_pool.close_all()
    if "ray_harness" in sys.modules:
        sys.modules["ray_harness"].release_shared_ray()


def pytest_terminal_summary(terminalreporter):
    import gpu_device
    import rank_pool

    ran_gpu_files = any(getattr(report, "nodeid", "").startswith("tests/gpu/")
                        for reports in terminalreporter.stats.values() for report in reports)
    if ran_gpu_files and gpu_device.DEVICE == "cpu":
        terminalreporter.write_line("tests/gpu: no GPU here, so the GPU test files ran their "
                                    "rank code on the CPU path (tests/harness/gpu_device.py)")

    if rank_pool.stats["jobs"]:
        terminalreporter.write_line(
            f"rank pools: {rank_pool.stats['jobs']} pooled jobs on "
            f"{rank_pool.stats['pools_started']} pools started")
