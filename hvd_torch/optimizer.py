"""DistributedOptimizer: averages gradients over ranks while backward runs.

Horovod's wrapper (horovod.torch.DistributedOptimizer, 0.28.1 semantics): a
hook on every parameter starts an in-place async allreduce of its gradient the
moment autograd has accumulated it, so communication overlaps the rest of
backward; step() waits for every allreduce and then runs the wrapped
optimizer's own step.

Threading: the hooks run on whichever thread runs backward (for CPU tensors,
the thread that called backward()); step(), synchronize() and zero_grad() run
on the training thread. One lock guards the bookkeeping they share.
"""

import contextlib
import threading
import warnings
import weakref

import torch

from hvd_torch.basics import Adasum, Average, Max, Min, Product, Sum, is_initialized
from hvd_torch.compression import Compression, _CastCompressor
from hvd_torch.ops import (allreduce_async_, global_process_set, sparse_allreduce_async,
                           synchronize)
from hvd_torch.optimizer_wrapping import adopt, require_init_for

_PENDING_MESSAGE = (
    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
    "optimizer.synchronize(). This is prohibited as it can cause a race condition."
)
# Horovod's warning, word for word, for scripts that filter on it.
_STEP_AFTER_SYNCHRONIZE = (
    "optimizer.step() called without optimizer.skip_synchronize() context after "
    "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
    "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in your code."
)
_TOO_MANY_PASSES = (
    "Gradients were computed more than backward_passes_per_step times before call to step(). "
    "Increase backward_passes_per_step to accumulate gradients locally."
)


class _InFlight:
    """One submitted gradient allreduce: what synchronize() must wait for and undo."""

    __slots__ = ("handle", "buffer", "ctx", "target", "sparse")

    def __init__(self, handle, buffer, ctx, target, sparse):
        self.handle = handle
        self.buffer = buffer  # the tensor the allreduce writes into
        self.ctx = ctx  # the compressor's context for decompress()
        self.target = target  # the gradient the result belongs in
        self.sparse = sparse  # target is a sparse gradient reduced as dense


class _DistributedOptimizer:
    """Placed in front of the wrapped optimizer's class in the MRO (see
    DistributedOptimizer), so super() reaches the original step()/zero_grad().

    Attribute names follow Horovod's (_handles, _parameter_names,
    _allreduce_delay, backward_passes_per_step, ...) for code that reads them.
    """

    # ------------------------------------------------------------ set-up

    def _hvd_init(self, named_parameters, compression, backward_passes_per_step, op,
                  gradient_predivide_factor, groups, sparse_as_dense, process_set):
        self._compression = compression
        # Our cast compressors decompress by a widening copy_ (see _finish).
        self._casts = isinstance(compression, type) and issubclass(compression, _CastCompressor)
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set

        params = [p for group in self.param_groups for p in group["params"]]
        # Kept for add_param_group(): names for parameters added later.
        self._named_parameters = None if named_parameters is None else list(named_parameters)
        self._parameter_names = _parameter_names(params, self._named_parameters)
        # Only parameters that need a gradient take part (Horovod's rule).
        self._requires_update = []
        self._allreduce_delay = {}
        # p -> None (waiting for more passes or for its group) or _InFlight.
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        self._hvd_lock = threading.Lock()
        # Groups are checked before any hook goes on a parameter.
        self._groups, self._p_to_group = _make_groups(
            groups, [p for p in params if p.requires_grad])
        self._group_ready = [set() for _ in self._groups]
        self._hook_handles = []
        self._unhooked = []  # parameters waiting for init() (see _hook)
        self._hook(params)

    def _hook(self, params):
        """Registers the gradient hook on those of `params` that require grad."""
        if not is_initialized():
            # Built before hvd.init() (a Ray actor's constructor, say): whether this
            # rank is in the process set is not known yet. The hooks go on at the
            # first step() or synchronize() after init(), which reduces that step's
            # gradients itself; a step() before init() raises (require_init_for).
            self._unhooked.extend(params)
            return
        if not self.process_set.included():
            # A rank outside the set steps on its own gradients, as in Horovod
            # (its synchronize() does nothing): nothing to hook.
            return
        # The hooks hold the optimizer weakly: once the user drops it, they do nothing.
        ref = weakref.ref(self)
        for p in params:
            if p.requires_grad:
                self._requires_update.append(p)
                self._allreduce_delay[p] = self.backward_passes_per_step
                self._hook_handles.append(p.register_post_accumulate_grad_hook(_make_hook(ref, p)))

    # ------------------------------------------------------------ hooks

    def _grad_ready(self, p):
        """Runs when autograd has accumulated p.grad for this backward pass."""
        with self._hvd_lock:
            if self._allreduce_delay[p] <= 0:
                raise AssertionError(_TOO_MANY_PASSES)
            if p.grad.requires_grad:
                raise RuntimeError(
                    f"DistributedOptimizer: the gradient of '{self._parameter_names[p]}' "
                    "requires grad (backward(create_graph=True)); higher-order gradients are "
                    "not supported")
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] > 0:
                self._handles[p] = None  # accumulate locally; reduce on the last pass
                return
            g = self._p_to_group.get(p)
            if g is None:
                try:
                    self._handles[p] = self._submit(p)
                except Exception:
                    self._allreduce_delay[p] += 1  # this pass did not count
                    raise
                return
            # Grouped: nothing leaves until every member has its gradient; then
            # all of them are submitted back to back, so the engine sees them
            # ready together and fuses them.
            self._handles[p] = None
            ready = self._group_ready[g]
            ready.add(p)
            if len(ready) == len(self._groups[g]):
                for q in self._groups[g]:
                    self._handles[q] = self._submit(q)
                ready.clear()

    def _submit(self, p):
        """Starts the allreduce of p.grad (zeros if p has none: see the docstring)."""
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grad = p.grad
        sparse = grad.is_sparse
        if sparse and not self.sparse_as_dense:
            # Horovod's sparse path: allgather indices and values (names on
            # the wire as Horovod's: allgather.<parameter>.indices/.values).
            if self.op not in (Average, Sum):
                raise ValueError(
                    f"DistributedOptimizer: parameter '{self._parameter_names[p]}' has a sparse "
                    f"gradient, which reduces with Average or Sum only (op={self.op})")
            handle = sparse_allreduce_async(grad, "allgather." + self._parameter_names[p],
                                            self.op, process_set=self.process_set)
            return _InFlight(handle, None, None, grad, False)
        if sparse:
            dense = grad.to_dense()
        else:
            dense = grad
        buffer, ctx = self._compression.compress(dense)
        op, prescale, postscale = self._reduction()
        handle = allreduce_async_(buffer, name="allreduce." + self._parameter_names[p], op=op,
                                  prescale_factor=prescale, postscale_factor=postscale,
                                  process_set=self.process_set)
        return _InFlight(handle, buffer, ctx, grad, sparse)

    def _reduction(self):
        """(op, prescale, postscale): gradient_predivide_factor f splits Average
        into a Sum of grad/f scaled by f/size afterwards (Horovod's split)."""
        f = self.gradient_predivide_factor
        if self.op == Average and f != 1.0:
            return Sum, 1.0 / f, f / self.process_set.size()
        return self.op, 1.0, 1.0

    def _finish(self, p, work):
        if work.buffer is None:  # sparse allreduce: the result is a new sparse tensor
            p.grad = synchronize(work.handle)
            return
        synchronize(work.handle)
        if work.buffer is work.target:
            return  # reduced in place, nothing to copy
        if not work.sparse and self._casts and work.ctx == work.target.dtype:
            # A cast compressor: copy_ widens while it copies, so the full-width
            # temporary that decompress() would allocate (page faults dominate
            # for large tensors) is never made.
            work.target.copy_(work.buffer)
            return
        result = self._compression.decompress(work.buffer, work.ctx)
        if work.sparse:
            # Back to the layout the optimizer expects (as Horovod does).
            p.grad = result.to_sparse()
        else:
            work.target.copy_(result)

    # ------------------------------------------------------------ public API

    def synchronize(self):
        """Waits until every gradient is averaged; starts the missing ones first.

        A parameter whose gradient never arrived this step (unused, or fewer
        than backward_passes_per_step passes) is reduced now: with a zero
        gradient if it has none. Every rank does the same, so the ranks that
        did compute it are not left waiting.
        """
        self._hook_deferred("synchronize")
        if not self.process_set.included():
            self._synchronized = True
            return
        with self._hvd_lock:
            error = None
            try:
                for p in self._requires_update:
                    if (p in self._handles or p.requires_grad) and self._handles.get(p) is None:
                        self._handles[p] = self._submit(p)
            except Exception as e:  # noqa: BLE001  (raised below, after the submitted ones)
                error = e
            # Wait for everything that was submitted even after a failure, so no
            # operation stays in flight under a name the next step will reuse.
            for p, work in self._handles.items():
                if work is None:
                    continue
                try:
                    self._finish(p, work)
                except Exception as e:  # noqa: BLE001
                    error = error or e
            self._reset()
            self._synchronized = True
            if error is not None:
                raise error

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Makes step() skip its synchronize(), for code that synchronized itself:

            loss.backward()
            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        self._hook_deferred("step")
        loss = None
        if closure is not None:
            # The closure's backward must be reduced before the update, so it
            # runs here rather than inside the wrapped step() (Horovod passes it
            # on and steps with gradients that are still in flight).
            with torch.enable_grad():
                loss = closure()
        if self._should_synchronize and self._synchronized:
            warnings.warn(_STEP_AFTER_SYNCHRONIZE, stacklevel=2)
        if self._should_synchronize and not (self._synchronized and not self._handles):
            # (Already synchronized and no backward since: the gradients are
            # averaged; reducing them again would be wasted work, or wrong for
            # Sum. Horovod warns as above and reduces them again.)
            self.synchronize()
        self._synchronized = False
        super().step()
        return loss

    def zero_grad(self, set_to_none=True):
        if self._handles:
            raise AssertionError(_PENDING_MESSAGE)
        return super().zero_grad(set_to_none)

    def load_state_dict(self, state_dict):
        # Nothing may stay in flight: the next step reuses the names.
        with self._hvd_lock:
            for work in self._handles.values():
                if work is not None:
                    synchronize(work.handle)
            self._reset()
        self._synchronized = False
        return super().load_state_dict(state_dict)

    def add_param_group(self, param_group):
        """The wrapped add_param_group(), and the new parameters are averaged too
        (ungrouped). With named_parameters, they must be named there."""
        super().add_param_group(param_group)
        if "_hvd_lock" not in self.__dict__:
            return  # the wrapped class's own constructor (not reached by DistributedOptimizer)
        params = [p for group in self.param_groups for p in group["params"]]
        new = self.param_groups[-1]["params"]
        try:
            names = _parameter_names(params, self._named_parameters)
        except ValueError:
            self.param_groups.pop()
            raise
        for p in new:
            self._parameter_names[p] = names[p]
        self._hook(new)

    def _hook_deferred(self, what):
        """Hooks the parameters set aside before init(); raises if init() has
        still not been called. One list check per step once hooked."""
        require_init_for(what)
        if self._unhooked:
            params, self._unhooked = self._unhooked, []
            self._hook(params)

    def set_backward_passes_per_step(self, passes):
        _check_passes(passes)
        with self._hvd_lock:
            self.backward_passes_per_step = passes
            for p in self._allreduce_delay:
                self._allreduce_delay[p] = passes

    def _reset(self):
        self._handles.clear()
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        for ready in self._group_ready:
            ready.clear()


def _make_hook(optimizer_ref, p):
    def hook(_param):
        optimizer = optimizer_ref()
        if optimizer is not None:
            optimizer._grad_ready(p)

    return hook


def _describe(params, p):
    return f"parameter #{next(i for i, q in enumerate(params) if q is p)} (shape {list(p.shape)})"


def _parameter_names(params, named_parameters):
    """p -> name: the user's names, or 'allreduce.noname.<i>' in parameter order.

    The allreduce of p is named 'allreduce.<name>': the name Horovod
    negotiates for it (Horovod's C++ layer adds the 'allreduce.' prefix). For
    unnamed parameters that is 'allreduce.allreduce.noname.<i>', which cannot
    collide with the engine's 'allreduce.noname.<n>' of an unnamed
    hvd.allreduce() issued while gradients are in flight (e.g. a loss average
    between backward() and step()).
    """
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}" for i, p in enumerate(params)}
    named = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    bad = [name for name, _ in named if not isinstance(name, str)]
    if bad:
        raise ValueError(f"named_parameters: names must be strings, got {bad[:5]!r}")
    seen, dups = set(), []
    for name, _ in named:
        if name in seen and name not in dups:
            dups.append(name)
        seen.add(name)
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. "
                         f"Found duplicates: {', '.join(dups)}")
    names = {}
    for name, p in named:
        names.setdefault(p, name)
    unnamed = [p for p in params if p not in names]
    if unnamed:
        raise ValueError(
            "named_parameters was specified, but one or more of the optimizer's parameters were "
            "not named: " + ", ".join(_describe(params, p) for p in unnamed))
    return {p: names[p] for p in params}


def _make_groups(groups, params):
    """(list of member lists, p -> group index) for `groups` (Horovod's forms)."""
    if groups is None or (isinstance(groups, int) and not isinstance(groups, bool)
                          and groups == 0):
        return [], {}
    if isinstance(groups, int) and not isinstance(groups, bool) and groups > 0:
        # Contiguous runs of parameters in optimizer order, sizes differing by
        # at most one. Every rank builds the same model, so the same groups;
        # even if not, each allreduce is matched by name, so this only changes
        # when a rank submits, never whether the ranks agree.
        n = min(groups, len(params))
        q, r = divmod(len(params), n) if n else (0, 0)
        members, start = [], 0
        for i in range(n):
            stop = start + q + (1 if i < r else 0)
            members.append(params[start:stop])
            start = stop
    elif isinstance(groups, (list, tuple)):
        known = {p: True for p in params}
        members, seen = [], set()
        for group in groups:
            group = list(group)
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                if p not in known:
                    raise ValueError(
                        f"groups: a tensor of shape {list(p.shape)} is not a parameter of this "
                        "optimizer that requires grad")
                seen.add(id(p))
            if group:
                members.append(group)
    else:
        raise ValueError("groups should be a non-negative integer or a list of lists of "
                         f"torch.Tensor, got {groups!r}")
    return members, {p: g for g, group in enumerate(members) for p in group}


def _check_passes(passes):
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {passes!r}")


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps `optimizer` so that step() applies gradients averaged over all ranks.

    Returns an instance of a subclass of optimizer's class (isinstance checks
    and LR schedulers keep working) that shares the original's param_groups,
    defaults and state; use it instead of the original from then on.

    Every parameter with requires_grad gets a hook that, once backward has
    accumulated its gradient, starts an in-place async allreduce of p.grad
    named 'allreduce.<name>', so communication overlaps the rest of backward.
    step() calls synchronize() (waits for all of them) and then the wrapped
    step(). Gradient clipping and AMP unscaling go between the two:

        loss.backward()
        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        with optimizer.skip_synchronize():
            optimizer.step()

    (A step() after synchronize() with no backward in between does not reduce
    the gradients a second time, with or without skip_synchronize().)

    step(closure) runs the closure first, then synchronizes, then calls the
    wrapped step() without it; optimizers that evaluate the closure more than
    once per step (LBFGS) are not supported.

    It may be built before hvd.init() (in a Ray actor's constructor, say): the
    hooks then go on at the first step() or synchronize() after init(), which
    reduces that step's gradients itself. step() or synchronize() while init()
    has never been called raises a ValueError rather than train this rank alone.

    Parameters without a gradient. A parameter that requires grad but got no
    gradient this step on some rank (a branch not taken, a layer used only on
    some ranks) would leave the other ranks waiting for its allreduce. So, as
    in Horovod, synchronize() reduces it anyway: if p.grad is None it is first
    set to zeros on that rank. The result is the average over ranks of each
    rank's gradient, counting the rank without one as zero; if no rank
    computed it, p.grad becomes zeros (not None) and the wrapped optimizer
    steps with a zero gradient (momentum and weight decay still apply).
    Parameters whose requires_grad is False at step() are left alone.

    Arguments (Horovod's):
        named_parameters: (name, parameter) pairs, usually
            model.named_parameters(), covering every parameter of the
            optimizer; names must be unique. Without it, parameters are named
            'allreduce.noname.<i>' by their order in the optimizer (their
            allreduce: 'allreduce.allreduce.noname.<i>', as in Horovod), so
            every rank must build the optimizer with its parameters in the same
            order.
        compression: Compression.none, .fp16 or .bf16: the gradient is cast
            before the allreduce and cast back into p.grad after.
        backward_passes_per_step: gradients of this many backward passes are
            summed locally (PyTorch accumulates them) and reduced once, on the
            last pass. The result is the average over ranks of that local sum:
            scale each pass's loss by 1/passes to average over passes too.
            zero_grad() is refused between the passes.
        op: Average (default) or Sum (or Min, Max, Product). op=Adasum
            combines each rank's parameter update instead of its gradient
            (Horovod's delta optimizer: hvd_torch/adasum_optimizer.py);
            synchronize() then has nothing to do, skip_synchronize() raises,
            and gradient_predivide_factor is refused.
        gradient_predivide_factor: with op=Average, gradients are multiplied by
            1/f before the sum and by f/size after it (op Sum internally),
            which keeps low-precision sums in range.
        groups (num_groups is its deprecated name): an int n splits the
            parameters, in optimizer order, into n groups of consecutive
            parameters; a list of lists of parameters names the groups (the
            others stay ungrouped). hvd_torch has no grouped allreduce op yet,
            so a group is the promise that its members are submitted together,
            once every member has its gradient, as separate allreduces that the
            engine fuses; members without a gradient go at synchronize().
        sparse_as_dense: reduce sparse gradients (e.g. nn.Embedding(sparse=True))
            as dense tensors and turn the result back into a sparse gradient.
            Without it a sparse gradient goes through sparse_allreduce_async
            (an allgather of its indices and values, as Horovod does).
        process_set: the ranks that average gradients together (default: all);
            every rank of the set must train with this optimizer.
    """
    from hvd_torch import adasum_optimizer

    if isinstance(optimizer, (_DistributedOptimizer, adasum_optimizer._AdasumOptimizer)):
        raise ValueError("DistributedOptimizer: this optimizer is already a DistributedOptimizer")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer needs a torch.optim.Optimizer, got {optimizer!r}")
    if op is None:
        op = Average
    if op == Adasum:
        if gradient_predivide_factor != 1.0:
            raise ValueError("DistributedOptimizer: gradient_predivide_factor has no meaning with "
                             "op=Adasum (the updates, not the gradients, are combined)")
        _check_passes(backward_passes_per_step)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        names = _parameter_names(params, None if named_parameters is None
                                 else list(named_parameters))
        return adasum_optimizer.wrap(optimizer, names, compression, backward_passes_per_step,
                                     process_set)
    if op not in (Average, Sum, Min, Max, Product):
        raise ValueError(f"DistributedOptimizer: unknown reduce op {op!r}")
    if gradient_predivide_factor != 1.0:
        if op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if not gradient_predivide_factor > 0:
            raise ValueError("gradient_predivide_factor must be positive, got "
                             f"{gradient_predivide_factor!r}")
    _check_passes(backward_passes_per_step)
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups`",
                      DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups

    wrapped = adopt(_DistributedOptimizer, optimizer, __name__)
    wrapped._hvd_init(named_parameters, compression, backward_passes_per_step, op,
                      gradient_predivide_factor, groups, sparse_as_dense, process_set)
    return wrapped
