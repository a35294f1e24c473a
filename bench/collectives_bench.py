"""Every collective, hvd-torch against torch.distributed (gloo) and optionally MPI,
in one run, in the spirit of nccl-tests.

    python bench/collectives_bench.py -np 2                   (make bench: + --mpi, 4 B..256 MiB)
    python bench/collectives_bench.py -np 2 -b 4 -e 64M -f 4 --ops allreduce,allgather \\
        --iters 200 --warmup 5 --reps 5 --dtype float32 --many 100x1K,1000x4K --json out.json
    python bench/collectives_bench.py -np 2 --mpi             (adds Open MPI, vader BTL)

Without --worker the script starts itself on N ranks, through hvdrun, or with --mpi
through mpirun (bench/setup.sh installs Open MPI and mpi4py), and shows rank 0's
output; `hvdrun -np N python bench/collectives_bench.py` runs the worker directly.
All libraries live in the same rank processes and are measured in the same run,
size by size, their timed sets interleaved so that a noisy neighbour slows all
alike. bench/README.md describes every column; in short:

  hvd X / hvd X_     hvd-torch's functional and in-place forms (a fixed name per
                     op and size, as in training, so the response cache is in play)
  torch              torch.distributed on a gloo process group (the call is named
                     in the table heading)
  mpi                mpi4py on numpy views of the same buffers, Open MPI's
                     shared-memory BTL (--mca pml ob1 --mca btl self,vader)

Each timed set runs `iters` iterations over distinct pre-filled buffers; every
result is checked after the set (a wrong answer fails the run). A set's time is
the slowest rank's; the reported time is the median over --reps sets.
Iterations shrink with size (at most --iters, about 64 MiB per set, at least 3).

  algbw = size / time;  busbw = algbw x nccl-tests' factor (2(n-1)/n allreduce,
          (n-1)/n allgather, reducescatter, alltoall, 1 broadcast)
  torch/X = torch time / X's time, mpi/X likewise: above 1 means X is faster.

The many-tensor section (--many KxS,...) times K async allreduces of S bytes then a
wait for all, against one flat allreduce of K x S bytes, per library; the forms issuing
K ops run fewer iterations a set (about 2000 ops), the others as many as a flat op. The run ends
with issue #13's targets, each PASS or FAIL (the exit code stays 0), writes the JSON
and, next to it, a PNG of busbw against size (when matplotlib is installed).
"""

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The checkout this script lives in, before any installed copy.
sys.path[1:1] = [p for p in (ROOT,) if p not in sys.path]

import collectives  # noqa: E402  (after the path fix-up)
import report  # noqa: E402
from sizes import parse_size  # noqa: E402

SET_BUDGET_BYTES = 64 << 20  # bytes per timed set (bounds the buffers and the run time)
MANY_SET_BUDGET_OPS = 2000  # ops per timed set in the many-tensor section
MIN_ITERS = 3
ENGINE_WARMUP_OPS = 2000  # 4-byte allreduces after each engine start (fresh_engine)
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8")


def parse_many(text):
    """'100x1K,1000x4K' -> [(100, 1024), (1000, 4096)]; '' -> []."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        k, sep, s = item.upper().partition("X")
        if not sep or not k.isdigit() or int(k) < 1:
            raise argparse.ArgumentTypeError(f"not KxS: {item!r} (e.g. 100x1K)")
        out.append((int(k), parse_size(s)))
    return out


def parse_ops(text):
    ops = [o.strip() for o in text.split(",") if o.strip()]
    bad = [o for o in ops if o not in collectives.OPS]
    if bad or not ops:
        raise argparse.ArgumentTypeError(
            f"unknown op(s) {', '.join(bad) or repr(text)}; choose from {','.join(collectives.OPS)}"
        )
    return ops


def parse_args(argv=None, prog=None):
    p = argparse.ArgumentParser(
        prog=prog,
        description="Collectives: hvd-torch vs torch.distributed gloo (and MPI), same run.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="torch/X = torch time / X time (> 1: X faster); see bench/README.md",
    )
    p.add_argument("-np", "--num-proc", type=int, default=None,
                   help="ranks to start (default 2; under hvdrun or mpirun: the job's size)")
    p.add_argument("-b", "--min-bytes", type=parse_size, default=parse_size("4"))
    p.add_argument("-e", "--max-bytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--factor", type=int, default=4, help="size multiplier per step")
    p.add_argument("--ops", type=parse_ops, default=list(collectives.OPS),
                   help=f"comma-separated (default {','.join(collectives.OPS)})")
    p.add_argument("-n", "--iters", type=int, default=200,
                   help="iterations per timed set for small sizes (fewer for large)")
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed iterations per size")
    p.add_argument("-r", "--reps", type=int, default=5, help="timed sets per size; median")
    p.add_argument("-d", "--dtype", choices=DTYPES, default="float32")
    p.add_argument("--many", type=parse_many, default=parse_many("100x1K,1000x4K,161x256K"),
                   help="KxS,...: K allreduces of S bytes vs one of K*S ('' to skip)")
    p.add_argument("--mpi", action="store_true",
                   help="start the ranks with mpirun and add Open MPI's column (needs mpi4py)")
    p.add_argument("--mpi-args", default="",
                   help="more mpirun options, e.g. '--mca mpi_yield_when_idle 1'")
    p.add_argument("--json", default=None,
                   help="results file (default bench/results/collectives_<np>.json)")
    p.add_argument("--plot", default=None, help="PNG of busbw vs size (default: next to --json)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)  # fmt: skip
    if args.factor < 2:
        p.error("--factor must be at least 2")
    if args.min_bytes > args.max_bytes:
        p.error("--min-bytes is larger than --max-bytes")
    if min(args.iters, args.reps) < 1 or args.warmup < 0:
        p.error("--iters and --reps must be positive, --warmup not negative")
    return args


# ---------------------------------------------------------------- launcher side


def open_mpi_version():
    """mpirun's version line when mpirun is Open MPI's, else None."""
    if shutil.which("mpirun") is None:
        return None
    out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    first = (out.splitlines() or [""])[0]
    return first if "Open MPI" in first else None


def mpi_available():
    """Why --mpi cannot run here, or None when it can."""
    import importlib.util

    if open_mpi_version() is None:
        return "no Open MPI mpirun on PATH (make bench-setup installs Debian's)"
    if importlib.util.find_spec("mpi4py") is None:
        return f"mpi4py is not installed for {sys.executable} (make bench-setup)"
    return None


def mpirun_command(num_proc, script_cmd, extra=""):
    """mpirun on this machine: ranks unbound (as hvdrun starts them), ob1 over Open MPI's
    shared-memory BTL (vader in 4.x, sm in 5.x), never UCX, so MPI moves its data the
    way the comparison claims."""
    shm = "sm" if " 5." in open_mpi_version() else "vader"
    cmd = ["mpirun", "-np", str(num_proc), "--bind-to", "none",
           "--mca", "pml", "ob1", "--mca", "btl", f"self,{shm}"]  # fmt: skip
    if num_proc > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for name in ("PATH", "PYTHONPATH", "HVD_BENCH_STORE", "HVD_BENCH_SECRET"):
        cmd += ["-x", name]
    return cmd + shlex.split(extra) + script_cmd


def launch(args, argv):
    """Runs this script with --worker on N ranks; rank 0's stdout is shown unprefixed."""
    num_proc = args.num_proc or 2
    json_path = os.path.abspath(
        args.json or os.path.join(HERE, "results", f"collectives_{num_proc}.json")
    )
    script = [sys.executable, os.path.abspath(__file__), *argv, "--worker", "--json", json_path]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    why_not = mpi_available() if args.mpi else None
    if args.mpi and why_not is None:
        from hvdrun.store import KVStoreServer, make_secret, secret_to_hex

        # hvd-torch meets its peers through hvdrun's store, served here; each rank
        # takes its rank and size from mpirun (OMPI_COMM_WORLD_*), see adopt_mpirun_rank.
        secret = make_secret()
        with KVStoreServer("127.0.0.1", 0, secret) as store:
            env.update(HVD_BENCH_STORE=store.address, HVD_BENCH_SECRET=secret_to_hex(secret),
                       OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            return run_forwarding_signals(mpirun_command(num_proc, script, args.mpi_args), env)
    if args.mpi:
        print(f"# note: no MPI column: {why_not}", flush=True)
    cmd = [sys.executable, "-m", "hvdrun", "-np", str(num_proc), *script]
    return run_forwarding_signals(cmd, env, strip="[0]<stdout>:")


def run_forwarding_signals(cmd, env, strip=None):
    """Runs the launcher (hvdrun or mpirun), which stops its ranks on SIGTERM: a
    SIGTERM sent to this process (a test's timeout) is passed on, not left to orphan them.
    strip: a prefix removed from the launcher's output lines (hvdrun's rank 0 tag)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, bufsize=1)
    previous = signal.signal(signal.SIGTERM, lambda signum, _: proc.send_signal(signum))
    try:
        with proc.stdout:
            for line in proc.stdout:
                sys.stdout.write(line.removeprefix(strip) if strip else line)
                sys.stdout.flush()
        return proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------------- worker side


def adopt_mpirun_rank():
    """Under mpirun (launch() with --mpi), hvd-torch's rank environment from Open MPI's."""
    if "HOROVOD_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" not in os.environ:
        return
    if "HVD_BENCH_STORE" not in os.environ:
        raise SystemExit("under mpirun, start this as `python bench/collectives_bench.py --mpi "
                         "-np N ...`: it serves hvd-torch's rendezvous store and runs mpirun")
    from hvdrun.env import horovod_env
    from hvdrun.store import secret_from_hex

    host, port = os.environ["HVD_BENCH_STORE"].rsplit(":", 1)
    e = os.environ
    os.environ.update(horovod_env(
        int(e["OMPI_COMM_WORLD_RANK"]), int(e["OMPI_COMM_WORLD_SIZE"]), host, int(port),
        secret_from_hex(e["HVD_BENCH_SECRET"]),
        local_rank=int(e["OMPI_COMM_WORLD_LOCAL_RANK"]),
        local_size=int(e["OMPI_COMM_WORLD_LOCAL_SIZE"]),
    ))  # fmt: skip


def byte_sizes(args):
    n, out = args.min_bytes, []
    while n <= args.max_bytes:
        out.append(n)
        n *= args.factor
    return out


def iterations(args, nbytes, ops_per_iter=1):
    most = min(args.iters, SET_BUDGET_BYTES // nbytes, MANY_SET_BUDGET_OPS // ops_per_iter)
    return max(MIN_ITERS, most)


def available_memory():
    """Bytes the kernel could give us now (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_shortfall(env, nbytes, iters):
    """Why a case of `iters` iterations of nbytes does not fit in this host's memory, or
    None. A case holds its input and expected result and, per iteration, an input, an
    output and a functional form's result, and the libraries add scratch space of about
    two more copies: (4 + 3 x iters) x nbytes per rank (3.25 GiB at 256 MiB; measured peak
    4.3 GiB, hence the 70% margin). All ranks decide together (an allreduce of the
    verdict), since each must skip the same sizes; small cases are not asked about."""
    need = (4 + 3 * iters) * nbytes
    if need < (256 << 20):
        return None
    free = available_memory()
    share = free // env.hvd.local_size() if free is not None else need * 2
    fits = env.torch.tensor([int(need <= 0.7 * share)], dtype=env.torch.int32)
    if env.hvd.allreduce(fits, name="bench.fits", op=env.hvd.Min).item():
        return None
    return (f"skipped: needs about {need / 2**30:.1f} GiB per rank, "
            f"{share / 2**30:.1f} GiB available per rank on this host")  # fmt: skip


def timed_set(case, impl, iters):
    """Seconds for `iters` iterations of impl on this rank, starting together after a
    barrier; the results are checked after the clock stops."""
    case.prepare()
    impl.barrier()
    start = time.perf_counter()
    results = [impl.run(j) for j in range(iters)]
    seconds = time.perf_counter() - start
    case.check(impl.key, results)
    return seconds


def measure(case, impls, env, tag):
    """{impl key: [seconds per iteration of each set, the slowest rank's]}."""
    args, hvd, torch = env.args, env.hvd, env.torch
    for impl in impls:
        if warmup := min(args.warmup, impl.iters or case.iters):
            timed_set(case, impl, warmup)
    times = [[] for _ in impls]
    for _ in range(args.reps):
        for i, impl in enumerate(impls):  # interleaved: noise lands on every library
            iters = impl.iters or case.iters
            times[i].append(timed_set(case, impl, iters) / iters)
    # Collectives finish together, but barriers don't: a set takes the slowest rank's time.
    slowest = hvd.allreduce(torch.tensor(times, dtype=torch.float64), name=tag, op=hvd.Max)
    return {impl.key: slowest[i].tolist() for i, impl in enumerate(impls)}


def summarize(set_times, nbytes, factor):
    t = statistics.median(set_times)
    algbw = nbytes / t / 1e9
    return {
        "time_us": t * 1e6,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * factor,
        "set_times_us": [x * 1e6 for x in set_times],
        "checked": True,  # a wrong result raises before we get here
    }


def fresh_engine(env):
    """Restarts hvd-torch's engine, so that a section starts with an empty response cache,
    as a job using only that section's names would: the cache holds at most
    HOROVOD_CACHE_CAPACITY (1024) names and never evicts one, so the names of earlier
    sections would push the 1000-tensor case past it.

    Then warms the new engine up, as a job's first steps would: its first operations
    fault in its shared memory and start its threads, which cost the first size's sets
    several microseconds an op (the first size was the slowest of a run, by up to 3x).
    """
    env.hvd.shutdown()
    env.hvd.init()
    one = env.torch.ones(1)
    for _ in range(ENGINE_WARMUP_OPS):
        env.hvd.allreduce_(one, name="bench.warmup", op=env.hvd.Sum)


def torch_process_group(torch, dist, hvd):
    """A gloo group on 127.0.0.1; rank 0's store takes a free port, sent by hvd.broadcast."""
    rank, size = hvd.rank(), hvd.size()
    # wait_for_workers=False: the others learn the port only after this returns.
    store = (
        dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
        if rank == 0
        else None
    )
    port = torch.tensor([store.port if store else 0], dtype=torch.int64)
    port = int(hvd.broadcast(port, root_rank=0, name="bench.store_port").item())
    if store is None:
        store = dist.TCPStore("127.0.0.1", port, size, is_master=False)
    # Loopback, as hvd-torch's own Gloo uses: the hostname may resolve to anything.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)


def import_mpi(args, notes):
    """mpi4py's MPI, initialised, or None (with a note saying why)."""
    if not args.mpi:
        return None
    if "OMPI_COMM_WORLD_SIZE" not in os.environ:
        notes.append("no MPI column: the ranks were not started by mpirun")
        return None
    if args.dtype not in collectives.MPI_DTYPES:
        notes.append(f"no MPI column: MPI has no {args.dtype}")
        return None
    import mpi4py

    mpi4py.rc.thread_level = "funneled"  # only the main thread calls MPI
    from mpi4py import MPI

    return MPI


@dataclasses.dataclass
class Env:
    """What every section needs: the arguments, the libraries, this rank, rank 0's log."""

    args: argparse.Namespace
    hvd: object
    torch: object
    dist: object
    MPI: object  # None without --mpi
    dtype: object
    itemsize: int
    rank: int
    size: int
    log: object
    notes: list  # lines for the JSON's "notes"


def run_op(env, op, torch_call):
    """One op's table: every size, every library form; returns its rows."""
    fresh_engine(env)
    factor = collectives.BUSBW_FACTORS[op](env.size)
    mpi_call = collectives.MPI_CALLS[op] if env.MPI is not None else None
    table, rows, seen = report.OpTable(op, env.size, torch_call, mpi_call), [], set()
    for nbytes in byte_sizes(env.args):
        count = collectives.op_count(op, nbytes // env.itemsize, env.size)
        if count in seen:  # small sizes that round to the same count
            continue
        seen.add(count)
        iters = iterations(env.args, count * env.itemsize)
        if skip := memory_shortfall(env, count * env.itemsize, iters):
            env.notes.append(f"{op} {count * env.itemsize} B {skip}")
            env.log(f"  {count * env.itemsize:>10} {count:>10} {skip}")
            continue
        case = collectives.Case(env.torch, op, count, env.dtype, iters, env.rank, env.size)
        impls = collectives.hvd_impls(env.hvd, case) + [collectives.torch_impl(env.dist, case)]
        if env.MPI is not None:
            impls += collectives.mpi_impls(env.MPI, case)
        times = measure(case, impls, env, f"bench.times.{op}")
        row = {"op": op, "bytes": case.nbytes, "count": count, "iters": iters,
               "results": {k: summarize(t, case.nbytes, factor) for k, t in times.items()}}
        row["ratios"] = report.ratios(row["results"])  # fmt: skip
        if in_place := report.in_place_mpi_ratios(row["results"]):
            row["in_place_mpi_ratios"] = in_place
        rows.append(row)
        if not table.printed:
            env.log(table.header([i.key for i in impls]))
        env.log(table.row(row))
    return rows


def run_many(env):
    """The many-tensor section: K allreduces of S bytes vs one of K x S, per library."""
    if env.args.many:
        env.log(report.many_header(env.size, env.MPI is not None))
    factor, entries = collectives.BUSBW_FACTORS["allreduce"](env.size), []
    for tensors, nbytes in env.args.many:
        fresh_engine(env)
        count = max(1, nbytes // env.itemsize)
        # K separate ops cost per op: their sets are bounded by ops, the others' by bytes.
        iters = iterations(env.args, tensors * count * env.itemsize)
        k_iters = iterations(env.args, tensors * count * env.itemsize, tensors)
        if skip := memory_shortfall(env, tensors * count * env.itemsize, iters):
            env.notes.append(f"many {tensors}x{count * env.itemsize} B {skip}")
            env.log(f"  {tensors:>6}x{report.fmt_bytes(count * env.itemsize):<5} {skip}")
            continue
        case = collectives.ManyCase(env.torch, tensors, count, env.dtype, iters, k_iters,
                                    env.rank, env.size)  # fmt: skip
        impls = collectives.many_impls(case, env.hvd, env.dist, env.MPI)
        times = measure(case, impls, env, "bench.times.many")
        entry = {"tensors": tensors, "bytes": count * env.itemsize, "iters": iters,
                 "k_iters": case.k_iters,
                 "results": {k: summarize(t, case.nbytes, factor) for k, t in times.items()}}
        entry["ratios"] = report.many_ratios(entry["results"])  # fmt: skip
        entries.append(entry)
        env.log(report.many_row(entry))
    return entries


def describe_mpi(MPI, args):
    if MPI is None:
        return None
    # "Open MPI v4.1.4, package: Debian OpenMPI, ident: ..., repo rev: ...\0"
    library = ", ".join(MPI.Get_library_version().replace("\0", "").split(", ")[:2])
    transport = "pml ob1, btl self + shared memory (vader/sm)"
    return {"library": library.strip(), "mpi4py": sys.modules["mpi4py"].__version__,
            "transport": transport + (f", {args.mpi_args}" if args.mpi_args else "")}  # fmt: skip


def worker(args):
    import torch
    import torch.distributed as dist

    notes = []
    MPI = import_mpi(args, notes)
    adopt_mpirun_rank()
    import hvd_torch as hvd

    load_start = os.getloadavg()
    hvd.init()
    torch.set_num_threads(1)  # one thread per rank: the ranks share the machine's cores
    rank, size = hvd.rank(), hvd.size()
    if args.num_proc is not None and args.num_proc != size:
        raise SystemExit(f"-np {args.num_proc} but the job has {size} ranks")
    torch_process_group(torch, dist, hvd)
    dtype = getattr(torch, args.dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    log = print if rank == 0 else (lambda *a, **k: None)
    mpi_info = describe_mpi(MPI, args)
    log(f"# hvd-torch {hvd.__version__}, torch {torch.__version__}, {size} ranks on "
        f"{platform.node()} ({os.cpu_count()} CPUs), dtype {args.dtype}, warmup {args.warmup}, "
        f"median of {args.reps} sets; load average {load_start[0]:.2f}")  # fmt: skip
    planes = {"data": hvd._C.backend_name(), "control": hvd._C.control_plane()}
    log(f"# hvd-torch planes: data {planes['data']}, control {planes['control']}")
    if mpi_info:
        log(f"# mpi: {mpi_info['library']}, mpi4py {mpi_info['mpi4py']}, {mpi_info['transport']}")
    for note in notes:
        log(f"# note: {note}")

    torch_calls = {op: name for op, (name, _) in collectives.torch_ops(dist).items()}
    env = Env(args, hvd, torch, dist, MPI, dtype, itemsize, rank, size, log, notes)
    rows = [row for op in args.ops for row in run_op(env, op, torch_calls[op])]
    many = run_many(env)

    result = {
        "benchmark": "collectives",
        "np": size,
        "dtype": args.dtype,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "hvd_torch": hvd.__version__,
        # The source tree the ranks imported (bench/ab_builds.py checks it).
        "hvd_torch_tree": os.path.dirname(os.path.dirname(os.path.abspath(hvd.__file__))),
        "planes": planes,
        "torch": torch.__version__,
        "mpi": mpi_info,
        "torch_calls": torch_calls,
        "settings": {"warmup": args.warmup, "reps": args.reps, "max_iters": args.iters,
                     "set_budget_bytes": SET_BUDGET_BYTES, "many_set_budget_ops":
                     MANY_SET_BUDGET_OPS, "min_iters": MIN_ITERS, "torch_threads": 1},
        "notes": notes,
        "rows": rows,
        "many": many,
    }  # fmt: skip
    result["targets"] = report.targets(result)
    for line in report.targets_lines(result):
        log(line)
    if rank == 0:
        write_outputs(result, args, log)
    dist.destroy_process_group()
    return 0


def write_outputs(result, args, log):
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    log(f"# results: {args.json}")
    png = args.plot or os.path.splitext(args.json)[0] + ".png"
    why_not = report.plot(result, png)
    log(f"# plot: {png}" if why_not is None else f"# note: no plot ({why_not})")


def main(argv=None, prog=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv, prog)
    # Started by hvdrun or mpirun without --worker: this process is already a rank.
    if args.worker or "HOROVOD_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:
        if args.json is None:
            size = os.environ.get("HOROVOD_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE", "1")
            args.json = os.path.join(HERE, "results", f"collectives_{size}.json")
        return worker(args)
    return launch(args, argv)


if __name__ == "__main__":
    sys.exit(main())
