"""op=hvd.Adasum on 1, 2, 3 and 4 ranks, against Adasum worked out here.

3 ranks exercise the fold of a rank beyond the largest power of two; 4 ranks
the two levels of the halving. Vectors have odd lengths so the halves differ.
"""

import sys
from pathlib import Path

import pytest
import torch

from dist_harness import launch_once  # noqa: E402

RANKS = [1, 2, 3, 4]
LENGTH = 1001


def _vector(rank, length=LENGTH, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randn(length, generator=g, dtype=torch.float64)


def _pair(a, b):
    """Adasum of two vectors, written out in float64."""
    a, b = a.double(), b.double()
    dot, aa, bb = a @ b, a @ a, b @ b
    ca = 1 - dot / (2 * aa) if aa >= 1e-8 else 1.0  # Horovod's "zero": |v|^2 < 1e-8
    cb = 1 - dot / (2 * bb) if bb >= 1e-8 else 1.0
    return ca * a + cb * b


def _reference(vectors):
    """Horovod's tree: 0 with 1, 2 with 3, then the pairs; rank p + i first
    folded into rank i when the count is not a power of two."""
    vs = [v.double() for v in vectors]
    p = 1
    while p * 2 <= len(vs):
        p *= 2
    for i in range(len(vs) - p):
        vs[i] = _pair(vs[i], vs[p + i])
    vs = vs[:p]
    while len(vs) > 1:
        vs = [_pair(vs[i], vs[i + 1]) for i in range(0, len(vs), 2)]
    return vs[0]


def _near_zero(rank):
    """Odd ranks: a vector with |v|^2 about 5e-9, which Adasum treats as zero."""
    return _vector(rank, 5) * (3e-5 if rank % 2 else 1.0)


def _rank_main():
    import hvd_torch as hvd

    torch.set_num_threads(1)
    res = {}
    try:
        hvd.allreduce(torch.ones(2), name="early", op=hvd.Adasum)
        res["before_init"] = None
    except ValueError as e:
        res["before_init"] = str(e)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    v = _vector(r)
    res["rand"] = hvd.allreduce(v, name="rand", op=hvd.Adasum)
    res["rand.input_kept"] = torch.equal(v, _vector(r))
    res["rand.fresh"] = res["rand"].data_ptr() != v.data_ptr()
    # Longer than the host's float64 chunk (adasum._CHUNK), in float32.
    res["big"] = hvd.allreduce(_vector(r, 200_001).float(), name="big", op=hvd.Adasum)
    res["same"] = hvd.allreduce(torch.linspace(-1, 2, 7), name="same", op=hvd.Adasum)
    onehot = torch.zeros(n + 3)
    onehot[r] = r + 1.0
    res["orthogonal"] = hvd.allreduce(onehot, name="orth", op=hvd.Adasum)
    res["scaled"] = hvd.allreduce(v, name="scaled", op=hvd.Adasum, prescale_factor=0.5,
                                  postscale_factor=3.0)
    res["shaped"] = hvd.allreduce(v[:1000].reshape(10, 4, 25), name="shaped", op=hvd.Adasum)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        res[f"dtype.{dtype}"] = hvd.allreduce(v.to(dtype), name=f"d.{dtype}", op=hvd.Adasum)
    res["fp16.compressed"] = hvd.allreduce(v.float(), name="comp", op=hvd.Adasum,
                                           compression=hvd.Compression.fp16)
    inplace = v.clone()
    res["inplace.returned_self"] = hvd.allreduce_(inplace, name="inplace", op=hvd.Adasum) \
        is inplace
    res["inplace"] = inplace
    handle = hvd.allreduce_async(v, name="async", op=hvd.Adasum)
    res["async.poll"] = hvd.poll(handle)
    res["async"] = hvd.synchronize(handle)
    inplace_async = v.clone()
    hvd.synchronize(hvd.allreduce_async_(inplace_async, name="async_", op=hvd.Adasum))
    res["async_"] = inplace_async
    res["unnamed"] = [hvd.allreduce(_vector(r, 5, seed=s), op=hvd.Adasum) for s in (1, 2)]
    res["tiny"] = [hvd.allreduce(_vector(r, k), name=f"tiny.{k}", op=hvd.Adasum)
                   for k in (0, 1, 3)]
    res["zeros"] = hvd.allreduce(torch.zeros(5) if r % 2 else _vector(r, 5).float(),
                                 name="zeros", op=hvd.Adasum)
    res["near_zero"] = hvd.allreduce(_near_zero(r), name="near_zero", op=hvd.Adasum)
    # Autograd: the gradient is the Adasum of the incoming gradients.
    x = _vector(r, 9).requires_grad_()
    y = hvd.allreduce(x, name="grad", op=hvd.Adasum)
    y.backward(_vector(r, 9, seed=3))
    res["grad"] = x.grad
    # Grouped: each tensor its own Adasum (mixed dtypes, an empty one), one unit.
    group = [_vector(r, 17), _vector(r, 4).float(), _vector(r, 0), _vector(r, 33, seed=4).half()]
    res["grouped"] = hvd.grouped_allreduce(group, name="grp", op=hvd.Adasum)
    copies = [t.clone() for t in group]
    hvd.grouped_allreduce_(copies, name="grp_", op=hvd.Adasum)
    res["grouped_"] = copies
    res["grouped_async"] = hvd.synchronize(
        hvd.grouped_allreduce_async(group, name="grp.async", op=hvd.Adasum))
    xs = [_vector(r, 6).requires_grad_(), _vector(r, 3, seed=5).requires_grad_()]
    ys = hvd.grouped_allreduce(xs, name="grp.grad", op=hvd.Adasum)
    (ys[0] @ _vector(r, 6, seed=6) + ys[1] @ _vector(r, 3, seed=7)).backward()
    res["grouped_grad"] = [x.grad for x in xs]
    # Each result a tensor of its own, not a view into one shared buffer.
    own = hvd.grouped_allreduce([_vector(r, 6), _vector(r, 3)], name="grp.own", op=hvd.Adasum)
    res["own_storage"] = [t.untyped_storage().nbytes() == t.numel() * t.element_size()
                          for t in own]
    if n >= 3:
        evens = hvd.add_process_set([0, 2])
        if r in (0, 2):
            res["set"] = hvd.allreduce(v, name="set", op=hvd.Adasum, process_set=evens)
        elif r == 1:
            try:
                hvd.allreduce(v, name="set.outsider", op=hvd.Adasum, process_set=evens)
                res["outsider"] = None
            except ValueError as e:
                res["outsider"] = str(e)
    try:
        hvd.allreduce(torch.ones(3, dtype=torch.int32), name="ints", op=hvd.Adasum)
        res["ints"] = None
    except ValueError as e:
        res["ints"] = str(e)
    try:
        torch.ops.hvd_torch.allreduce(torch.ones(2), "raw", hvd.Adasum, 1.0, 1.0, 0)
        res["raw"] = None
    except ValueError as e:
        res["raw"] = str(e)
    res["end"] = hvd.allreduce(torch.ones(1), name="end", op=hvd.Sum)
    return res


def _results(nranks):
    return launch_once(_rank_main, nranks, timeout=180)


def _close(got, want, tol=1e-10):
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.allclose(got.double(), want.double(), rtol=tol, atol=tol), \
        (got - want).abs().max()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nranks", RANKS)
def test_adasum_is_the_tree_of_pairs(nranks):
    results = _results(nranks)
    want = _reference([_vector(r) for r in range(nranks)])
    for r, res in enumerate(results):
        assert res["rand"].dtype == torch.float64
        _close(res["rand"], want)
        assert res["rand.input_kept"] and res["rand.fresh"]
        _close(res["big"], _reference([_vector(q, 200_001).float() for q in range(nranks)]),
               tol=1e-5)
        _close(res["scaled"], 1.5 * want)  # Adasum(k a, k b) = k Adasum(a, b)
        _close(res["inplace"], want)
        assert res["inplace.returned_self"]
        assert res["async.poll"] is True
        _close(res["async"], want)
        _close(res["async_"], want)
        _close(res["shaped"], _reference([_vector(q)[:1000] for q in range(nranks)])
               .reshape(10, 4, 25))
        for s, got in zip((1, 2), res["unnamed"]):
            _close(got, _reference([_vector(q, 5, seed=s) for q in range(nranks)]))
        for k, got in zip((0, 1, 3), res["tiny"]):
            _close(got, _reference([_vector(q, k) for q in range(nranks)]))
        _close(res["grad"], _reference([_vector(q, 9, seed=3) for q in range(nranks)]))
        assert res["end"].item() == nranks


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nranks", RANKS)
def test_adasum_averages_equal_vectors_and_adds_orthogonal_ones(nranks):
    for res in _results(nranks):
        _close(res["same"], torch.linspace(-1, 2, 7), tol=1e-6)
        assert res["same"].dtype == torch.float32
        # Orthogonal: the plain sum, rank r's value at index r.
        want = torch.zeros(nranks + 3)
        want[:nranks] = torch.arange(1, nranks + 1, dtype=torch.float32)
        _close(res["orthogonal"], want, tol=1e-6)
        # A zero vector adds nothing and takes nothing away.
        _close(res["zeros"], _reference([torch.zeros(5) if q % 2 else _vector(q, 5).float()
                                         for q in range(nranks)]), tol=1e-6)
        # So does one below Horovod's threshold (|v|^2 < 1e-8): coefficient 1,
        # where the exact formula would scale it by about -10^4.
        _close(res["near_zero"], _reference([_near_zero(q) for q in range(nranks)]), tol=1e-6)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nranks", RANKS)
def test_adasum_low_precision_dtypes_round_once(nranks):
    for res in _results(nranks):
        for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 1.6e-2),
                           (torch.float32, 1e-6)):
            got = res[f"dtype.{dtype}"]
            assert got.dtype == dtype
            want = _reference([_vector(q).to(dtype) for q in range(nranks)]).to(dtype)
            # One rounding of the float32 result: within one unit in the last place.
            assert torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
        comp = res["fp16.compressed"]
        assert comp.dtype == torch.float32
        want = _reference([_vector(q).half() for q in range(nranks)])
        assert torch.allclose(comp.double(), want, rtol=2e-3, atol=2e-3)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nranks", RANKS)
def test_grouped_adasum_reduces_each_tensor_on_its_own(nranks):
    def want(length, seed=0, dtype=torch.float64):
        return _reference([_vector(q, length, seed=seed).to(dtype) for q in range(nranks)])

    expected = [want(17), want(4, dtype=torch.float32), want(0),
                want(33, seed=4, dtype=torch.float16)]
    for res in _results(nranks):
        for form in ("grouped", "grouped_", "grouped_async"):
            got = res[form]
            assert [t.dtype for t in got] == [torch.float64, torch.float32, torch.float64,
                                              torch.float16], form
            _close(got[0], expected[0])
            _close(got[1], expected[1], tol=1e-5)
            assert got[2].numel() == 0
            assert torch.allclose(got[3].double(), expected[3], rtol=2e-3, atol=2e-3), form
        _close(res["grouped_grad"][0], want(6, seed=6))
        _close(res["grouped_grad"][1], want(3, seed=7))
        assert res["own_storage"] == [True, True]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nranks", [3, 4])
def test_adasum_over_a_process_set(nranks):
    results = _results(nranks)
    want = _reference([_vector(0), _vector(2)])
    for r, res in enumerate(results):
        if r in (0, 2):
            _close(res["set"], want)
        else:
            assert "set" not in res
        if r == 1:
            assert "rank 1 is not in process set" in res["outsider"], res["outsider"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nranks", [2, 3])
def test_adasum_misuse_is_a_clear_valueerror(nranks):
    for res in _results(nranks):
        assert "'ints'" in res["ints"] and "floating-point" in res["ints"], res["ints"]
        assert "int32" in res["ints"], res["ints"]
        assert "unsupported reduce op 2" in res["raw"] and "eager" in res["raw"], res["raw"]
        assert "before hvd_torch.init()" in res["before_init"], res["before_init"]


# ---------------------------------------------------------------- optimizer

STEPS, LR = 3, 0.05


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


def _loss(model, rank, step, device="cpu"):
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(8, 5, generator=g), torch.randn(8, 1, generator=g)
    return torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))


def _train_main(device="cpu"):
    """Also tests/gpu/test_cuda_adasum.py's, with device "cuda"."""
    import hvd_torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    if device == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    model = _model().to(device)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    res = {"is_adam": isinstance(opt, torch.optim.Adam)}
    for step in range(STEPS):
        opt.zero_grad()
        _loss(model, hvd.rank(), step, device).backward()
        opt.synchronize()  # nothing to wait for; allowed, as in Horovod
        opt.step()
    res["devices"] = {p.device.type for p in model.parameters()}
    res["weights"] = [p.detach().cpu() for p in model.parameters()]
    try:
        with opt.skip_synchronize():
            pass
        res["skip"] = None
    except AssertionError as e:
        res["skip"] = str(e)
    return res


def _simulated_weights(nranks):
    """Each rank's Adam step from the common weights (its own Adam state),
    the deltas combined by _reference, for STEPS steps."""
    common = [p.detach().clone() for p in _model().parameters()]
    states = [None] * nranks
    for step in range(STEPS):
        deltas = []
        for r in range(nranks):
            model = _model()
            with torch.no_grad():
                for p, c in zip(model.parameters(), common):
                    p.copy_(c)
            opt = torch.optim.Adam(model.parameters(), lr=LR)
            if states[r] is not None:
                opt.load_state_dict(states[r])
            _loss(model, r, step).backward()
            opt.step()
            states[r] = opt.state_dict()
            deltas.append([p.detach() - c for p, c in zip(model.parameters(), common)])
        common = [c + _reference([d[i].reshape(-1) for d in deltas]).reshape(c.shape).float()
                  for i, c in enumerate(common)]
    return common


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_adasum_optimizer_combines_each_ranks_adam_update(nranks):
    results = launch_once(_train_main, nranks, timeout=180)
    want = _simulated_weights(nranks)
    for res in results:
        assert res["is_adam"]
        for got, expected in zip(res["weights"], want):
            assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6), (got - expected).abs().max()
        for got, first in zip(res["weights"], results[0]["weights"]):
            assert torch.equal(got, first)  # identical weights on every rank
        assert "not supported when using Adasum" in res["skip"], res["skip"]
    if nranks > 1:  # the ranks' data differ, so Adasum is not any one rank's step
        alone = _simulated_weights(1)
        assert not all(torch.allclose(a, b) for a, b in zip(alone, want))


def _flat_pairs():
    """Two flat buffers of tensors of every kind _pair_stats and _combine tell
    apart: large pieces (one dot each), runs of small ones (one pass for all),
    empty tensors between them, zero, near-zero and equal vectors."""
    from hvd_torch.adasum import _SMALL

    sizes = [5000, 7, 0, 300, 1, 3 * _SMALL, 0, 0, 11, 2 * _SMALL - 1, 0, _SMALL, 4]
    xs = [_vector(0, k, seed=i) for i, k in enumerate(sizes)]
    ys = [_vector(1, k, seed=i) for i, k in enumerate(sizes)]
    xs[3], ys[4] = torch.zeros(300, dtype=torch.float64), xs[4]  # a zero vector; equal ones
    ys[8] = xs[8] * 1e-5  # |v|^2 below 1e-8: counts as zero
    return sizes, xs, ys


@pytest.mark.unit
def test_flat_buffer_stats_and_combine_are_each_tensors_own_adasum():
    """_pair_stats and _combine over any part of the flat buffer (a rank's half
    cuts through tensors) give each tensor its own dot products and Adasum."""
    import itertools

    from hvd_torch.adasum import _combine, _layout, _pair_stats

    sizes, xs, ys = _flat_pairs()
    bounds = list(itertools.accumulate(sizes, initial=0))
    a, b = torch.cat(xs), torch.cat(ys)

    def stats_of(lo, hi):
        return _pair_stats(a[lo:hi], b[lo:hi], _layout(bounds, lo, hi),
                           torch.zeros(len(sizes), 3, dtype=torch.float64))

    def combined(lo, hi, as_floats):
        return _combine(a[lo:hi], b[lo:hi], whole, _layout(bounds, lo, hi), as_floats)

    whole = stats_of(0, bounds[-1])
    for i, (x, y) in enumerate(zip(xs, ys)):
        torch.testing.assert_close(whole[i], torch.stack([x @ y, x @ x, y @ y]))
    want = torch.cat([_pair(x, y) for x, y in zip(xs, ys)])
    # Both forms of the coefficients: floats (host tensors) and tensors (the
    # GPU's, which never wait for it), here on the host.
    for as_floats in (True, False):
        torch.testing.assert_close(combined(0, bounds[-1], as_floats), want)
    for cut in (1, 2500, 5003, 5010, bounds[-1] // 2, bounds[-1] - 3):
        parts = [(0, cut), (cut, bounds[-1])]
        torch.testing.assert_close(sum(stats_of(lo, hi) for lo, hi in parts), whole)
        for as_floats in (True, False):
            got = torch.cat([combined(lo, hi, as_floats) for lo, hi in parts])
            torch.testing.assert_close(got, want)


@pytest.mark.unit
def test_rounding_noise_counts_as_zero_like_an_exact_zero():
    """Two opposite updates folded together leave rounding noise; it must
    combine like an exact zero (Horovod's 1e-8 threshold on |v|^2), or the
    result jumps with the last bit (found by test_cuda_adasum on 3 ranks)."""
    from hvd_torch.adasum import _combine, _layout, _pair_stats

    other = torch.tensor([0.05], dtype=torch.float64)
    layout = _layout([0, 1], 0, 1)
    for noise in (0.0, 1e-9, -1e-9, 9e-5):
        x = torch.tensor([noise], dtype=torch.float64)
        stats = _pair_stats(x, other, layout, torch.zeros(1, 3, dtype=torch.float64))
        # x's coefficient is 1 and other's 1 - x.other / (2 |other|^2): 0.05 + noise / 2.
        # Taken as nonzero, x would be scaled to cancel half of other: 0.025.
        for as_floats in (True, False):
            got = _combine(x, other, stats, layout, as_floats)
            torch.testing.assert_close(got.item(), 0.05 + noise / 2, rtol=0, atol=1e-12)
