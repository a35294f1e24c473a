"""How a DistributedOptimizer takes over a torch optimizer, for both kinds
(optimizer.py's gradient averaging and adasum_optimizer.py's delta reduction).

The wrapped optimizer is an instance of a subclass of the original's class with
the hvd mixin in front in the MRO, so isinstance checks and LR schedulers keep
working and super().step() is the original's. It adopts the original's
attributes instead of re-running its __init__, which would reset the state and
the defaults. Neither kind steps before init(): a rank would train alone.
"""

from hvd_torch.basics import require_init

_BEFORE_INIT = (
    "no gradient has been averaged over the ranks, and stepping now would train this rank "
    "alone. Call hvd.init() before the first step() (building the optimizer before init() is "
    "fine: its gradient hooks go on at the first step() or synchronize() after init())"
)

_CLASSES = {}  # (mixin, optimizer class) -> the subclass


def require_init_for(what):
    """A wrapped optimizer never steps unsynchronised without a word."""
    require_init(f"DistributedOptimizer.{what}()", _BEFORE_INIT)


def subclass(mixin, base, module):
    """`base` with `mixin` in front, made once per pair. Same name as the wrapped
    class, as in Horovod: repr() and logs read the same."""
    key = (mixin, base)
    if key not in _CLASSES:
        _CLASSES[key] = type(base.__name__, (mixin, base),
                             {"__module__": module, "__doc__": base.__doc__})
    return _CLASSES[key]


def adopt(mixin, optimizer, module):
    """A new, not yet initialised, wrapped instance sharing `optimizer`'s
    defaults, param_groups, state and hooks. Instance attributes that would
    shadow the mixin's methods are left behind: an LR scheduler built on the
    original stores a wrapper of the original's step() as an instance attribute."""
    cls = subclass(mixin, type(optimizer), module)
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update({k: v for k, v in optimizer.__dict__.items()
                             if k not in mixin.__dict__})
    return wrapped
