"""What collectives_bench.py measures: for each collective, the data every rank
starts with and must end with, and one callable per library and form.

Sizes follow nccl-tests: an op's size is its largest buffer on one rank, the
output of allgather, the input of reducescatter, the (equal) input and output
of alltoall; allgather, alltoall and reducescatter split it into one chunk per
rank, so their counts are multiples of the rank count.

Every input is small integers ((rank + 1) + i % 7 and the like), so every result
is exact in every dtype and a misplaced chunk shows up as a wrong value.

A Case holds `iters` distinct input buffers (and, for the forms that write into
a caller's tensor, as many output buffers), shared by every library measured at
that size: prepare() restores them before each timed set, check() compares every
result of the set with the expected tensor afterwards.
"""

OPS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
# nccl-tests' busbw = algbw x factor (PERFORMANCE.md there): the bytes each
# rank's link carries per byte of the op's size, with the optimal algorithm.
BUSBW_FACTORS = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "alltoall": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
}
SPLIT_OPS = ("allgather", "alltoall", "reducescatter")
# Ops whose torch/MPI forms write into a caller-provided output tensor.
OUTPUT_OPS = SPLIT_OPS
# Ops hvd-torch measures in place and out of place: MPI is measured in both forms too,
# so that each hvd form meets MPI's same form ("mpi" in place, "mpi out" into a
# separate buffer: Allreduce(send, recv); for Bcast, which has no such form, the root
# first copies its input into the output, as an out-of-place broadcast must).
TWO_FORM_OPS = ("allreduce", "broadcast")
# Element types MPI can carry from a numpy view (Open MPI has no 16-bit floats).
MPI_DTYPES = ("float32", "float64", "int32", "int64", "uint8", "int8")


def op_count(op, count, n):
    """Elements of the op's size buffer: a multiple of n (at least n) for split ops."""
    if op in SPLIT_OPS:
        return max(n, count // n * n)
    return max(1, count)


class Impl:
    """One library's form of an op. run(j) performs iteration j and returns the tensor
    that must equal the case's expected result; barrier() lines the ranks up. iters:
    iterations per timed set when fewer than the case's (a form issuing many ops)."""

    def __init__(self, key, lib, run, barrier, iters=None):
        self.key, self.lib, self.run, self.barrier = key, lib, run, barrier
        self.iters = iters


class Case:
    """One op at one size on this rank: input, expected result, the buffers."""

    def __init__(self, torch, op, count, dtype, iters, rank, size):
        self.op, self.count, self.iters = op, count, iters
        n, chunk = size, count // size
        pattern = torch.arange(count, dtype=torch.int64) % 7
        if op in ("allreduce", "reducescatter"):
            source = pattern + rank + 1
            total = n * pattern + n * (n + 1) // 2
            expected = total if op == "allreduce" else total[rank * chunk : (rank + 1) * chunk]
        elif op == "allgather":
            source = pattern[:chunk] + rank + 1
            expected = torch.cat([pattern[:chunk] + q + 1 for q in range(n)])
        elif op == "broadcast":  # root 0; the others start from zeros, so a no-op shows
            source = pattern + 1 if rank == 0 else torch.zeros_like(pattern)
            expected = pattern + 1
        elif op == "alltoall":  # chunk j of rank r goes to rank j: value r*n + j + 1 + k % 7
            k = torch.arange(chunk, dtype=torch.int64) % 7
            source = torch.cat([k + rank * n + j + 1 for j in range(n)])
            expected = torch.cat([k + j * n + rank + 1 for j in range(n)])
        else:
            raise ValueError(f"unknown op {op!r}")
        self.input = source.to(dtype)
        self.expected = expected.to(dtype)
        self.buffers = [self.input.clone() for _ in range(iters)]
        # Zero-filled before each set: every expected value is at least 1.
        self.outputs = (
            [torch.empty_like(self.expected) for _ in range(iters)] if op in OUTPUT_OPS else []
        )
        self.separate = []  # out-of-place outputs of a TWO_FORM_OPS op (separate_outputs)
        self.torch = torch

    def separate_outputs(self):
        """Output buffers apart from the inputs, made on first use (MPI's out-of-place
        form of an op whose result would otherwise land in its input)."""
        if not self.separate:
            self.separate = [self.torch.empty_like(self.expected) for _ in self.buffers]
        return self.separate

    @property
    def nbytes(self):
        big = self.expected if self.op == "allgather" else self.input
        return big.numel() * big.element_size()

    def prepare(self):
        for b in self.buffers:
            b.copy_(self.input)
        for o in self.outputs + self.separate:
            o.zero_()

    def check(self, label, results):
        for j, out in enumerate(results):
            if not self.torch.equal(out, self.expected):
                mismatch = (out != self.expected).nonzero()
                where = mismatch[0].item() if len(mismatch) else "shape"
                raise AssertionError(
                    f"{label} {self.op} of {self.count} x {self.input.dtype} is wrong "
                    f"(iteration {j}): first bad element {where}"
                )


def hvd_impls(hvd, case):
    """hvd-torch's forms: functional and, where it exists, in place."""
    op, bufs, tag = case.op, case.buffers, f"bench.{case.op}.{case.count}"
    forms = {
        "allreduce": [
            ("allreduce_", lambda j: hvd.allreduce_(bufs[j], name=tag + "_", op=hvd.Sum)),
            ("allreduce", lambda j: hvd.allreduce(bufs[j], name=tag, op=hvd.Sum)),
        ],
        "allgather": [("allgather", lambda j: hvd.allgather(bufs[j], name=tag))],
        "broadcast": [
            ("broadcast_", lambda j: hvd.broadcast_(bufs[j], 0, name=tag + "_")),
            ("broadcast", lambda j: hvd.broadcast(bufs[j], 0, name=tag)),
        ],
        "alltoall": [("alltoall", lambda j: hvd.alltoall(bufs[j], name=tag))],
        "reducescatter": [
            ("reducescatter", lambda j: hvd.reducescatter(bufs[j], name=tag, op=hvd.Sum))
        ],
    }[op]
    return [Impl(f"hvd {form}", "hvd", run, hvd.barrier) for form, run in forms]


def torch_ops(dist):
    """torch.distributed's single-tensor forms: torch 2.13 renamed all_gather_into_tensor
    and reduce_scatter_tensor to *_single (the old names warn); gloo runs all of them."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return {
        "allreduce": ("all_reduce", lambda out, b: dist.all_reduce(b) or b),
        "allgather": (gather.__name__, lambda out, b: gather(out, b) or out),
        "broadcast": ("broadcast", lambda out, b: dist.broadcast(b, src=0) or b),
        "alltoall": ("all_to_all_single", lambda out, b: dist.all_to_all_single(out, b) or out),
        "reducescatter": (scatter.__name__, lambda out, b: scatter(out, b) or out),
    }


def torch_impl(dist, case):
    _, fn = torch_ops(dist)[case.op]
    bufs, outs = case.buffers, case.outputs or case.buffers
    return Impl("torch", "torch", lambda j: fn(outs[j], bufs[j]), dist.barrier)


MPI_CALLS = {
    "allreduce": "Allreduce(IN_PLACE); mpi out: Allreduce(send, recv)",
    "allgather": "Allgather",
    "broadcast": "Bcast; mpi out: the root copies its input to the output, Bcast(output)",
    "alltoall": "Alltoall",
    "reducescatter": "Reduce_scatter_block",
}


def mpi_impls(MPI, case):
    """mpi4py's buffer forms on numpy views of the same tensors (no copies): "mpi",
    and for TWO_FORM_OPS also "mpi out", the out-of-place form."""
    impls = [mpi_impl(MPI, case)]
    if case.op not in TWO_FORM_OPS:
        return impls
    comm, bufs = MPI.COMM_WORLD, [b.numpy() for b in case.buffers]
    results = case.separate_outputs()
    outs = [o.numpy() for o in results]
    root = comm.Get_rank() == 0

    def run(j):
        if case.op == "allreduce":
            comm.Allreduce(bufs[j], outs[j], op=MPI.SUM)
        else:
            if root:
                outs[j][...] = bufs[j]
            comm.Bcast(outs[j], root=0)
        return results[j]

    return impls + [Impl("mpi out", "mpi", run, comm.Barrier)]


def mpi_impl(MPI, case):
    """mpi4py's buffer forms on numpy views of the same tensors (no copies)."""
    comm, op = MPI.COMM_WORLD, case.op
    bufs = [b.numpy() for b in case.buffers]
    outs = [o.numpy() for o in case.outputs]
    results = case.outputs or case.buffers

    def run(j):
        if op == "allreduce":
            comm.Allreduce(MPI.IN_PLACE, bufs[j], op=MPI.SUM)
        elif op == "allgather":
            comm.Allgather(bufs[j], outs[j])
        elif op == "broadcast":
            comm.Bcast(bufs[j], root=0)
        elif op == "alltoall":
            comm.Alltoall(bufs[j], outs[j])
        else:
            comm.Reduce_scatter_block(bufs[j], outs[j], op=MPI.SUM)
        return results[j]

    return Impl("mpi", "mpi", run, comm.Barrier)


class ManyCase:
    """K tensors of S bytes per iteration, as views into one flat buffer of K x S bytes,
    so the K-op and the flat forms reduce the same memory (allreduce, Sum). The forms
    issuing K ops run k_iters iterations a set (at most iters), the others iters."""

    def __init__(self, torch, tensors, count, dtype, iters, k_iters, rank, size):
        self.op, self.tensors, self.count, self.iters = "allreduce", tensors, count, iters
        self.k_iters = min(k_iters, iters)
        flat = Case(torch, "allreduce", tensors * count, dtype, iters, rank, size)
        self.flat = flat
        self.input, self.expected, self.buffers, self.outputs = (
            flat.input, flat.expected, flat.buffers, flat.outputs
        )
        self.views = [list(b.split(count)) for b in self.buffers]

    @property
    def nbytes(self):
        return self.flat.nbytes

    def prepare(self):
        self.flat.prepare()

    def check(self, label, results):
        self.flat.check(label, results)


def many_impls(case, hvd, dist, MPI=None):
    """K async allreduces then wait for all, and one flat allreduce, per library;
    for hvd-torch also the K tensors in one grouped_allreduce_ call."""
    tag = f"bench.many.{case.tensors}x{case.count}"
    bufs, views = case.buffers, case.views

    def hvd_k(j):
        handles = [
            hvd.allreduce_async_(v, name=f"{tag}.{i}", op=hvd.Sum) for i, v in enumerate(views[j])
        ]
        for h in handles:
            hvd.synchronize(h)
        return bufs[j]

    def hvd_grouped(j):
        hvd.grouped_allreduce_(views[j], name=f"{tag}.g", op=hvd.Sum)
        return bufs[j]

    def torch_k(j):
        for work in [dist.all_reduce(v, async_op=True) for v in views[j]]:
            work.wait()
        return bufs[j]

    impls = [
        Impl("hvd K", "hvd", hvd_k, hvd.barrier, case.k_iters),
        Impl("hvd grouped", "hvd", hvd_grouped, hvd.barrier),
        Impl("hvd flat", "hvd", lambda j: hvd.allreduce_(bufs[j], name=tag, op=hvd.Sum),
             hvd.barrier),
        Impl("torch K", "torch", torch_k, dist.barrier, case.k_iters),
        Impl("torch flat", "torch", lambda j: dist.all_reduce(bufs[j]) or bufs[j], dist.barrier),
    ]  # fmt: skip
    if MPI is not None:
        comm = MPI.COMM_WORLD
        np_bufs = [b.numpy() for b in bufs]
        np_views = [[v.numpy() for v in vs] for vs in views]

        def mpi_k(j):
            reqs = [comm.Iallreduce(MPI.IN_PLACE, v, op=MPI.SUM) for v in np_views[j]]
            MPI.Request.Waitall(reqs)
            return bufs[j]

        def mpi_flat(j):
            comm.Allreduce(MPI.IN_PLACE, np_bufs[j], op=MPI.SUM)
            return bufs[j]

        impls += [Impl("mpi K", "mpi", mpi_k, comm.Barrier, case.k_iters),
                  Impl("mpi flat", "mpi", mpi_flat, comm.Barrier)]  # fmt: skip
    return impls
