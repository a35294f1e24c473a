"""Broadcasting model and optimizer state, and any picklable object.

Horovod's helpers (horovod.torch.functions), with one deliberate difference:
broadcast_optimizer_state() never runs an optimizer step. Horovod's version
steps the optimizer once with zero gradients so that every rank has state
tensors to receive into, which changes e.g. Adam's moments and step count on
the root too. Here the root sends the layout of its state_dict() instead, the
other ranks build matching tensors from it, and the tensors are broadcast in
place; the root's state is only read.

Every function here is a collective: every rank of the process set must call
it, with the same arguments apart from the data.
"""

import pickle

import torch

from hvd_torch.basics import rank
from hvd_torch.ops import allgather, broadcast_, broadcast_async_, global_process_set, synchronize


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrites every rank's tensors with root_rank's, in place.

    params: a dict of name -> tensor (model.state_dict(), which also carries
    buffers such as BatchNorm statistics) or an iterable of (name, tensor)
    pairs (model.named_parameters()) or of bare tensors (model.parameters()).
    Each tensor is broadcast under the name 'broadcast.<name>' (bare tensors
    get the engine's automatic names); all broadcasts run asynchronously and
    the call returns when every one has finished.
    """
    if isinstance(params, dict):
        items = list(params.items())
    elif isinstance(params, (str, bytes, torch.Tensor)) or not hasattr(params, "__iter__"):
        raise ValueError(f"invalid params of type: {type(params)}")
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    for name, p in items:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"broadcast_parameters: '{name}' is a {type(p).__name__}, "
                            "not a tensor")
    with torch.no_grad():  # in place into leaves that require grad
        handles, seen = [], set()
        for name, p in items:
            # model.state_dict() lists a tied weight once per owner; send it once.
            key = (p.data_ptr(), p.dtype, tuple(p.shape), p.stride(), p.storage_offset())
            if p.numel() and key in seen:
                continue
            seen.add(key)
            handles.append(broadcast_async_(p, root_rank,
                                            None if name is None else f"broadcast.{name}",
                                            process_set=process_set))
        _wait_all(handles)


def _load_keeping_groups(optimizer, state_dict):
    """optimizer.load_state_dict(state_dict), keeping its param_group dicts.

    load_state_dict installs new group dicts. Anything that holds the old ones
    would then change hyperparameters nobody reads: an LR scheduler built on an
    optimizer before DistributedOptimizer wrapped it (the wrapper shares the
    original's groups) would move the learning rate on the root only, and the
    ranks' weights would drift apart. So the loaded values go into the old dicts.
    """
    groups = optimizer.param_groups
    optimizer.load_state_dict(state_dict)
    for old, new in zip(groups, optimizer.param_groups):
        old.update(new)  # new["params"] holds the same parameter tensors
    optimizer.param_groups = groups


def broadcast_optimizer_state(optimizer, root_rank, process_set=global_process_set):
    """Makes every rank's optimizer state equal to root_rank's, without a step.

    Works for any optimizer whose state_dict() holds tensors, numbers and
    containers of them (SGD, Adam, AdamW, RMSprop, Adagrad, ...), and for a
    DistributedOptimizer. Afterwards every rank's optimizer.state_dict()
    equals the root's: the same state for the same parameters (state the root
    does not have is dropped) and the same param_groups hyperparameters (lr,
    momentum, betas, ...). The root's state is not modified.

    Protocol: the root broadcasts its state_dict() with every tensor replaced
    by its shape and dtype (broadcast_object); every rank checks that its
    optimizer has the same parameter groups, and the ranks agree on the
    outcome (allgather_object) so that a mismatch raises a ValueError on every
    rank before any state changes; the other ranks load that layout with
    zero-filled tensors (load_state_dict) and then every tensor is broadcast
    in place ('broadcast.optimizer_state.<path>'). Cost: two broadcasts and two
    allgathers of a few hundred bytes, then one broadcast per state tensor
    (for Adam, two per parameter plus the step counts).
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"broadcast_optimizer_state needs a torch.optim.Optimizer, "
                        f"got {type(optimizer).__name__}")
    is_root = rank() == root_rank
    state_dict = optimizer.state_dict() if is_root else None
    sent = (_strip(state_dict), _param_shapes(optimizer)) if is_root else None
    layout, root_shapes = broadcast_object(sent, root_rank, name="optimizer_state.layout",
                                           process_set=process_set)

    problem = None if is_root else _layout_mismatch(optimizer, layout, root_shapes)
    problems = allgather_object(problem, name="optimizer_state.check", process_set=process_set)
    failed = [(r, p) for r, p in enumerate(problems) if p is not None]
    if failed:
        raise ValueError("broadcast_optimizer_state: root rank %d's optimizer state does not fit "
                         "the optimizer on %s" % (root_rank, "; ".join(
                             f"rank {r} ({p})" for r, p in failed)))

    error = None
    if not is_root:
        try:
            _load_keeping_groups(optimizer, _zeros_from(layout, optimizer))
            state_dict = optimizer.state_dict()  # the live tensors to receive into
        except Exception as e:  # noqa: BLE001  (raised after the broadcasts, see below)
            error, state_dict = e, None
    wanted = dict(_tensors(layout))
    targets = {} if state_dict is None else dict(_tensors(state_dict))
    if not is_root:
        for path, spec in wanted.items():
            t = targets.get(path)
            if t is None or t.shape != spec.shape or t.dtype != spec.dtype:
                # Never leave the root waiting: receive into scratch, fail after.
                targets[path] = torch.empty(spec.shape, dtype=spec.dtype)
                error = error or ValueError(
                    f"broadcast_optimizer_state: after load_state_dict, '{path}' on rank {rank()} "
                    f"is {None if t is None else (list(t.shape), t.dtype)}, not "
                    f"{(list(spec.shape), spec.dtype)}")
    with torch.no_grad():
        _wait_all([broadcast_async_(targets[path], root_rank,
                                    f"broadcast.optimizer_state.{path}",
                                    process_set=process_set) for path in wanted])
    if error is not None:
        raise error


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's `obj` on every rank (the root gets its own object back).

    The object is pickled on the root; its length, then its bytes, are
    broadcast as 'broadcast.<name>.sz' and 'broadcast.<name>.t'. Other ranks'
    `obj` is ignored (pass None). Unlike Horovod, the default name does not
    depend on obj's type, which differs between the root and the other ranks.
    """
    name = name or "object"
    if rank() == root_rank:
        payload = torch.frombuffer(bytearray(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)),
                                   dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, f"broadcast.{name}.sz", process_set=process_set)
    if rank() != root_rank:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, f"broadcast.{name}.t", process_set=process_set)
    if rank() == root_rank:
        return obj
    return pickle.loads(payload.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's `obj`, in rank order.

    Each rank pickles its object; the lengths, then the bytes, are gathered as
    'allgather.<name>.sz' and 'allgather.<name>.t'.
    """
    name = name or "object"
    payload = torch.frombuffer(bytearray(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)),
                               dtype=torch.uint8)
    lengths = allgather(torch.tensor([payload.numel()], dtype=torch.int64),
                        name=f"allgather.{name}.sz", process_set=process_set)
    data = allgather(payload, name=f"allgather.{name}.t", process_set=process_set).numpy()
    out, start = [], 0
    for n in lengths.tolist():
        out.append(pickle.loads(data[start:start + n].tobytes()))
        start += n
    return out


# ---------------------------------------------------------------- helpers


class _TensorSpec:
    """Stands for a tensor in the layout the root sends: its shape and dtype."""

    __slots__ = ("shape", "dtype", "on_cpu")

    def __init__(self, t):
        self.shape = tuple(t.shape)
        self.dtype = t.dtype
        self.on_cpu = t.device.type == "cpu"

    def __getstate__(self):
        return (self.shape, self.dtype, self.on_cpu)

    def __setstate__(self, state):
        self.shape, self.dtype, self.on_cpu = state


def _strip(value):
    """value with every tensor replaced by a _TensorSpec."""
    if isinstance(value, torch.Tensor):
        return _TensorSpec(value)
    if isinstance(value, dict):
        return type(value)((k, _strip(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return _rebuild(value, [_strip(v) for v in value])
    return value


def _rebuild(seq, items):
    """A list, tuple or namedtuple like `seq` holding `items`."""
    return type(seq)(*items) if hasattr(seq, "_fields") else type(seq)(items)


def _tensors(value, path=""):
    """(path, tensor or _TensorSpec) for every tensor in a nested structure."""
    if isinstance(value, (torch.Tensor, _TensorSpec)):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _tensors(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{path}.{i}" if path else str(i))


def _param_shapes(optimizer):
    return [[tuple(p.shape) for p in g["params"]] for g in optimizer.param_groups]


def _layout_mismatch(optimizer, layout, root_shapes):
    """Why root's layout cannot be loaded into `optimizer`, or None."""
    mine = _param_shapes(optimizer)
    if [len(g) for g in mine] != [len(g) for g in root_shapes]:
        return (f"parameters per group: root {[len(g) for g in root_shapes]}, "
                f"here {[len(g) for g in mine]}")
    for g, (theirs, ours) in enumerate(zip(root_shapes, mine)):
        for i, (a, b) in enumerate(zip(theirs, ours)):
            if a != b:
                return f"param_groups[{g}] parameter {i}: shape {list(a)} on root, {list(b)} here"
    return None


def _zeros_from(layout, optimizer):
    """The root's state_dict layout with zero tensors, ready for load_state_dict.

    A tensor the root keeps on the CPU (like Adam's 'step') is created on the
    CPU; any other on its parameter's device (load_state_dict moves it there anyway).
    """
    params = [p for g in optimizer.param_groups for p in g["params"]]
    index = {i: p for i, p in enumerate(params)}
    saved = [i for g in layout["param_groups"] for i in g["params"]]
    device_of = {s: index[k].device for k, s in enumerate(saved)}

    def build(value, device):
        if isinstance(value, _TensorSpec):
            return torch.zeros(value.shape, dtype=value.dtype,
                               device="cpu" if value.on_cpu else device)
        if isinstance(value, dict):
            return type(value)((k, build(v, device)) for k, v in value.items())
        if isinstance(value, (list, tuple)):
            return _rebuild(value, [build(v, device) for v in value])
        return value

    out = {k: build(v, "cpu") for k, v in layout.items() if k != "state"}
    out["state"] = {k: build(v, device_of.get(k, "cpu")) for k, v in layout["state"].items()}
    return out


def _wait_all(handles):
    """Synchronizes every handle, even after one fails; raises the first error."""
    error = None
    for h in handles:
        try:
            synchronize(h)
        except Exception as e:  # noqa: BLE001
            error = error or e
    if error is not None:
        raise error
