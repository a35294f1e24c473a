"""`python -m hvd_torch.doctor` (also `hvdrun --check-build`): is this installation sane?

It prints what was built (Horovod's --check-build table: frameworks, controllers,
tensor operations), the torch the extension was built against beside the running
one, the machine's cores and network interfaces, then runs checks, each one line:

    OK       what was checked
    PROBLEM: what is wrong
             hint: what to do

The checks: the build record matches the running torch (and the extension matches
its record), no HOROVOD_* variable would be refused at init(), and an allreduce, a
broadcast and an error message on 1 and on 2 processes started through hvdrun on
this machine (loop-back), each bounded in time. The last line is the verdict; the
exit status is 0 when every check passed, 1 otherwise.

With a stale build (the extension was compiled against another torch) the
extension is never loaded: `import hvd_torch` hands over to this module before it
would load (build_record.stale()), and the report says what differs and how to
rebuild. This module imports only the standard library and build_record at the
top, so that it can run from a half-imported package.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
import sys
import time

from hvd_torch import build_record

__all__ = ["main"]

COLLECTIVE_TIMEOUT_S = 90.0  # per loop-back run; a 2-rank job normally takes a few seconds

# Run by every rank of the loop-back jobs: known inputs, checked outputs.
_LOOPBACK = """
import torch
import hvd_torch as hvd
hvd.init()
n, r = hvd.size(), hvd.rank()
total = hvd.allreduce(torch.full((1024,), float(r + 1)), op=hvd.Sum, name="doctor.allreduce")
assert torch.equal(total, torch.full((1024,), n * (n + 1) / 2.0)), total[:4]
root = hvd.broadcast(torch.tensor([10.0 * r + 7.0]), root_rank=0, name="doctor.broadcast")
assert root.item() == 7.0, root
# An extension with a private libstdc++ cuts error messages short, or crashes here.
try:
    hvd.synchronize(987654)
    raise AssertionError("synchronize() of an unknown handle did not raise")
except ValueError as e:
    assert "987654" in str(e), f"error messages come out cut short: {e}"
plane = hvd._C.backend_name()
print(f"doctor-ok rank {r} of {n}: allreduce {total[0].item():g} plane={plane}", flush=True)
hvd.shutdown()
"""


class Report:
    def __init__(self, out=None):
        self.out = out or sys.stdout
        self.problems = 0

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def ok(self, what: str) -> None:
        self.line(f"OK       {what}")

    def problem(self, what: str, hint: str) -> None:
        self.problems += 1
        self.line(f"PROBLEM: {what}")
        for i, text in enumerate(hint.splitlines()):
            self.line(f"         {'hint: ' if i == 0 else '      '}{text}")


def _mark(flag: bool) -> str:
    return "[X]" if flag else "[ ]"


def _built_features(record: dict | None, ext) -> dict:
    """What was compiled: from the loaded extension when it is safe to load, else
    from the build record."""
    if ext is not None:
        shm = getattr(ext, "shm_built", None)
        return {"gloo": ext.gloo_built(), "nccl": ext.nccl_built(), "cuda": ext.cuda_built(),
                "shm": bool(shm()) if shm else None}
    record = record or {}
    return {"gloo": True, "nccl": bool(record.get("nccl_built")),
            "cuda": bool(record.get("cuda_built")), "shm": None}


def _print_check_build(report: Report, features: dict) -> None:
    """Horovod's --check-build table, for hvd-torch."""
    report.line("Available Frameworks:")
    report.line(f"    {_mark(False)} TensorFlow\n    {_mark(True)} PyTorch\n"
                f"    {_mark(False)} MXNet")
    report.line("\nAvailable Controllers:")
    report.line(f"    {_mark(False)} MPI\n    {_mark(True)} Gloo")
    report.line("\nAvailable Tensor Operations:")
    for name, flag in (("NCCL", features["nccl"]), ("DDL", False), ("CCL", False),
                       ("MPI", False), ("Gloo", features["gloo"])):
        report.line(f"    {_mark(flag)} {name}")
    shm = features["shm"]
    report.line(f"\nCUDA tensors: {'built' if features['cuda'] else 'not built'}; "
                f"shared-memory plane: {'built' if shm else 'not built'}")


def _describe(facts: dict) -> str:
    abi = facts.get("cxx11_abi")
    cuda = facts.get("torch_cuda", facts.get("cuda_version"))
    return (f"torch {facts.get('torch_version')}, CUDA {cuda or 'none'}, "
            f"C++11 ABI {'?' if abi is None else int(bool(abi))}")


def _interfaces() -> list[str]:
    from hvdrun.network import NetworkError, interface_address

    out = []
    for _, name in socket.if_nameindex():
        try:
            out.append(f"{name} {interface_address(name)}")
        except NetworkError:
            out.append(f"{name} (no IPv4 address)")
    return out


def _print_machine(report: Report) -> None:
    report.line("\nMachine:")
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    report.line(f"  {platform.system()} {platform.machine()}, Python {platform.python_version()}, "
                f"{os.cpu_count()} CPU cores ({usable} usable by this process), "
                f"host {socket.gethostname()}")
    try:
        report.line(f"  interfaces: {', '.join(_interfaces())}")
    except OSError as e:
        report.line(f"  interfaces: cannot list them ({e})")


def _check_record(report: Report, record: dict | None, now: dict, ext) -> None:
    if record is None:
        report.problem("the extension has no build record (hvd_torch/_build_info.py): it was built "
                       "before hvd-torch recorded builds, or copied without it",
                       build_record.rebuild_hint())
        return
    found = build_record.problems(record, now)
    for difference in found:
        report.problem(f"the extension was built for another torch: {difference}",
                       build_record.rebuild_hint())
    if found:
        return
    compiled = ext.built_with_torch() if ext is not None else None
    recorded_base = str(record.get("torch_version", "")).split("+")[0]
    if compiled not in (None, "unknown") and compiled != recorded_base:
        report.problem(f"the build record says torch {record.get('torch_version')} but the "
                       f"extension was compiled against torch {compiled}'s headers",
                       build_record.rebuild_hint())
        return
    report.ok(f"the extension was built for the running torch ({_describe(now)})")


def _check_environment(report: Report) -> None:
    from hvd_torch import config, horovod_env

    found = horovod_env._problems(config.horovod_variables())
    for text in found:
        report.problem(f"init() would refuse {text}",
                       "unset it, or see docs/compat.md, 'Environment variables'")
    if not found:
        report.ok("no HOROVOD_* variable that init() would refuse")


def _loopback(report: Report, nranks: int) -> None:
    command = [sys.executable, "-m", "hvdrun", "-np", str(nranks), "--start-timeout", "30",
               sys.executable, "-c", _LOOPBACK]
    what = f"{nranks}-process allreduce, broadcast and error through hvdrun on this machine"
    start = time.monotonic()
    try:
        proc = subprocess.run(command, capture_output=True, text=True,
                              timeout=COLLECTIVE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        report.problem(f"{what}: no result after {COLLECTIVE_TIMEOUT_S:g} s",
                       "the ranks hang: check that local TCP connections on 127.0.0.1 work "
                       "(a firewall, a proxy in LD_PRELOAD) and that no HOROVOD_GLOO_IFACE "
                       "names a missing interface\n" + _tail((e.stdout or b"").decode()
                                                             if isinstance(e.stdout, bytes)
                                                             else (e.stdout or "")))
        return
    elapsed = time.monotonic() - start
    oks = proc.stdout.count("doctor-ok")
    if proc.returncode == 0 and oks == nranks:
        planes = sorted(set(re.findall(r"plane=(\w+)", proc.stdout)))
        report.ok(f"{what} ({elapsed:.1f} s; data plane: {', '.join(planes)})")
        return
    output = proc.stdout + proc.stderr
    if "error messages come out cut short" in output:
        hint = ("the extension carries its own copy of libstdc++ (its compiler found only the "
                "static archive): rebuild with CC=/usr/bin/gcc CXX=/usr/bin/g++ "
                "(docs/gpu.md, 'Building')")
    elif nranks == 1:
        hint = "the extension or the engine fails on its own: see the output below"
    else:
        hint = ("one rank works but two cannot meet: check that local TCP connections on "
                "127.0.0.1 work and that HOROVOD_GLOO_IFACE, if set, names an interface here")
    report.problem(f"{what}: exit status {proc.returncode}, {oks} of {nranks} ranks succeeded",
                   hint + "\n" + _tail(output))


def _tail(text: str, lines: int = 8) -> str:
    kept = [ln for ln in text.strip().splitlines() if ln.strip()][-lines:]
    return "\n".join("> " + ln for ln in kept) if kept else "> (no output)"


def main(stale_build: list[str] | None = None, out=None) -> int:
    """Prints the report; returns the exit status (0: every check passed).

    stale_build: the differences build_record.stale() found, when the extension must
    not be loaded; then the loop-back checks are skipped."""
    report = Report(out)
    record = build_record.recorded()
    now = build_record.running()
    ext = None
    load_error = None
    if not stale_build:
        try:
            from hvd_torch import _C as ext
        except ImportError as e:
            load_error = str(e)
    report.line("hvd-torch doctor")
    report.line("")
    _print_check_build(report, _built_features(record, ext))
    report.line("\nBuild:")
    report.line(f"  built with  {_describe(record) if record else '(no build record)'}")
    report.line(f"  running     {_describe(now)}")
    package = os.path.dirname(os.path.abspath(build_record.__file__))
    report.line(f"  package     {package}")
    if ext is not None:
        report.line(f"  extension   {ext.__file__} (torch headers {ext.built_with_torch()}; "
                    f"Gloo from {ext.gloo_library_path()})")
    _print_machine(report)
    report.line("\nChecks:")
    if stale_build and not build_record.extension_present():
        report.problem("the C++ extension hvd_torch._C is not built",
                       build_record.rebuild_hint().replace("rebuild it", "build it"))
    else:
        _check_record(report, record, now, ext)
    if load_error is not None:
        report.problem(f"the extension does not load: {load_error}", build_record.rebuild_hint())
    _check_environment(report)
    if ext is not None:
        _loopback(report, 1)
        _loopback(report, 2)
    else:
        report.line("SKIPPED  the loop-back collectives: the extension cannot be loaded safely")
    report.line("")
    if report.problems:
        report.line(f"Verdict: PROBLEM: {report.problems} problem(s) found; the hints above say "
                    f"what to do")
        return 1
    report.line("Verdict: OK: hvd-torch is built for this torch and runs collectives here")
    return 0


if __name__ == "__main__":
    sys.exit(main())
