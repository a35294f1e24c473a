"""hvd-torch as a torch.distributed backend named "hvd" (docs/torch_distributed.md).

Importing hvd_torch registers it (and so does the torch.backends entry point,
hvd_torch_autoload, in a process that never imports hvd_torch)::

    import hvd_torch                      # or: import hvd_torch.distributed
    dist.init_process_group("hvd")        # DDP, FSDP2, dist.all_reduce, ... on our engine

One engine, two APIs: if hvd.init() has run, the process group uses its engine;
otherwise creating the group starts it, meeting the other ranks through the store
torch.distributed gives the backend (rank 0 serves hvd's rendezvous store and
publishes its address there; never its secret: store_rendezvous.py). Destroying the group leaves the engine
running: hvd.shutdown() (or the end of the process) stops it.

hvd.init() under torchrun (RANK, WORLD_SIZE, ... and no HOROVOD_RANK) meets the
other ranks the same way, through torch's TCPStore: torchrun's agent store when
torchrun runs the job (TORCHELASTIC_USE_AGENT_STORE), else one that rank 0 serves on
MASTER_PORT + 1 (MASTER_PORT itself stays free for init_process_group's env://):
hvd_torch/store_rendezvous.py does both.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from hvd_torch import _C, basics, config, exceptions, store_rendezvous
from hvd_torch.error_translation import PeerFailure

__all__ = ["BACKEND"]

BACKEND = "hvd"

def _start_timeout() -> float:
    return config.Launch.from_environment().start_timeout_s()


# Every rank of the default group posts "hvd" under this prefix of the group's store
# before it meets the others (see _check_backends).
_BACKEND_KEY = "hvd_torch/backend/"
# How long a rank waits for the others' keys before it first looks for ranks that run
# another backend; each later look waits twice as long, up to _BACKEND_SLICE_MAX.
_BACKEND_SLICE = 0.5
_BACKEND_SLICE_MAX = 8.0


def _gloo_key(rank: int) -> str:
    """Where torch's Gloo backend posts `rank`'s address in the group's store: its first
    context's "0/" prefix and gloo's connectFullMesh key (torch 2.x).  Only a shortcut
    for naming a Gloo rank at once: if gloo renames it, _check_backends still ends at
    the start timeout."""
    return f"0/{rank}"


def _check_backends(store, rank: int, size: int) -> None:
    """Raises hvd_torch.exceptions.RefusedError (ranks that disagree, docs/errors.md)
    naming every rank and what it asked for, unless every rank of the default group
    calls init_process_group("hvd").

    Without it, a rank that asked for "gloo" would leave the hvd ranks waiting in the
    engine's rendezvous until HOROVOD_START_TIMEOUT, told only that it did not join.
    A job that agrees pays one key and one wait per rank.  While ranks are missing,
    each waiting rank checks every rank's key (and Gloo's) after 0.5 s, then at
    doubling intervals up to 8 s: a rank running Gloo's rendezvous is named at the
    first look; one that posts nothing is named at the start timeout.  Keys left by
    an earlier hvd group on a reused store make the check pass without proof; the
    engine's own rendezvous then fails at the start timeout, as it did before."""
    store.set(f"{_BACKEND_KEY}{rank}", BACKEND)
    keys = [f"{_BACKEND_KEY}{r}" for r in range(size)]
    deadline = time.monotonic() + _start_timeout()
    wait = _BACKEND_SLICE
    while True:
        remaining = deadline - time.monotonic()
        try:
            store.wait(keys, datetime.timedelta(seconds=max(min(wait, remaining), 0.01)))
            return
        except PeerFailure:
            raise  # the store itself is gone
        except RuntimeError:  # the wait timed out (FileStore's is no DistStoreError)
            pass
        wait = min(2 * wait, _BACKEND_SLICE_MAX)
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        # A Gloo key under this rank's own number is left from an earlier Gloo group on
        # a reused store (torchrun's agent store, store=): then no Gloo key proves a
        # rank runs Gloo now.
        stale = store.check([_gloo_key(rank)])
        gloo = [] if stale else [r for r in missing if store.check([_gloo_key(r)])]
        if missing and (gloo or remaining <= 0):
            silent = (f"no backend posted within {_start_timeout():g} s (HOROVOD_START_TIMEOUT): "
                      "another one than hvd, or not started")
            groups = {BACKEND: [r for r in range(size) if r not in missing], "gloo": gloo,
                      silent: [r for r in missing if r not in gloo]}  # fmt: skip
            raise _different_backends("init_process_group", groups, rank)


def _different_backends(call: str, ranks_by_backend: dict, rank: int):
    """The error for ranks of `call` that asked for different backends (docs/errors.md):
    each backend (or what stands for it) with its ranks; empty lists are left out."""
    return exceptions.RefusedError(
        f"hvd backend (torch.distributed): the ranks of {call} asked for different backends: "
        + "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {what}"
                    for what, rs in ranks_by_backend.items() if rs)
        + f" (this is rank {rank}); every rank must pass the same backend")


def _create_backend(options, backend_options):
    """torch.distributed's creator for "hvd" (register_backend, extended API)."""
    rank, size = options.group_rank, options.group_size
    ranks = list(options.global_ranks_in_group)
    if not ranks:  # the default group, which every rank creates at once
        _check_backends(options.store, rank, size)
    if not basics.is_initialized():
        if ranks:
            raise RuntimeError("hvd backend (torch.distributed): the hvd engine is not running "
                               "(was hvd.shutdown() called?); re-create the default group")
        if config.Launch.from_environment().horovod_rank is None:  # else hvdrun's (or Ray's)
            store_rendezvous.rendezvous_env(options.store, rank, size)
        basics.init()
        store_rendezvous.remove_secret_files()
    world = basics.size()
    process_set = 0
    if not ranks:  # the default group: one rank of it per engine rank
        if (rank, size) != (basics.rank(), world):
            raise ValueError(
                f"hvd backend (torch.distributed): init_process_group(rank={rank}, "
                f"world_size={size}) disagrees with the running hvd engine (rank "
                f"{basics.rank()} of {world}): the default group must be the engine's ranks")
        ranks = list(range(world))
    elif ranks != list(range(world)):
        registered = _subgroup_sets.get(tuple(ranks))
        if registered is None or registered.process_set_id is None:
            raise NotImplementedError(
                f"hvd backend (torch.distributed): no hvd process set for new_group(ranks="
                f"{ranks}). A subgroup maps to an hvd process set, which every rank registers "
                "together, so it needs new_group called on every rank with sorted ranks (the "
                "default); use_local_synchronization=True or sort_ranks=False cannot be "
                "supported. Alternatively use a Gloo group: dist.new_group(ranks, "
                "backend=\"gloo\")")
        process_set = registered.process_set_id
    return _C.c10d_backend(rank, size, process_set, ranks, str(options.group_id))


# new_group(ranks) on the "hvd" backend: torch creates a group's backend on its
# members only, while an hvd process set is registered by every rank (a collective
# over the global set). torch's new_group (and DeviceMesh, which calls it for every
# subgroup on every rank) runs on every rank, so we register the set there, before
# torch creates the group; the creator above then finds it. Sets are kept for the
# engine's life and reused when the same ranks come again.
_subgroup_sets = {}


def _uses_hvd(backend) -> bool:
    if backend is None:
        return dist.is_initialized() and "hvd" in str(dist.get_backend())
    return "hvd" in str(backend).lower()


def _check_group_backends(backend) -> None:
    """Raises hvd_torch.exceptions.RefusedError on every rank that reaches it, naming each
    rank's backend, when the ranks of a job whose default group is "hvd" ask one
    new_group() for different backends.  Without it, the ranks that asked for "hvd"
    would wait in the process set registration (a collective of every rank) and those
    that asked for Gloo in Gloo's rendezvous, each until its timeout.

    Every rank posts its backend under the call's number in the default group's store
    and reads the others'; a rank that posts nothing (hvd_torch not imported there) is
    named at HOROVOD_START_TIMEOUT.  Jobs whose default group is not "hvd" are left
    alone unless this rank asks for "hvd"."""
    # torch's number for the group this call creates: every rank calls new_group in one
    # order, and destroying the default group counts from 0 again.  (Internal to torch:
    # if it goes, the check does, and a mismatch waits for the timeouts again.)
    call = getattr(dist.distributed_c10d._world, "group_count", None)
    if call is None:
        return
    default = str(dist.get_backend()).lower()
    asked = default if backend is None else str(backend).lower()
    if BACKEND not in default and BACKEND not in asked:
        return
    store = dist.distributed_c10d._get_default_store()
    rank, size = dist.get_rank(), dist.get_world_size()
    # The restart count: torchrun's agent store outlives a restart, and with it the keys.
    prefix = f"hvd_torch/new_group/{config.Launch.from_environment().attempt}/{call}/"
    store.set(f"{prefix}{rank}", asked)
    keys = [f"{prefix}{r}" for r in range(size)]
    try:
        store.wait(keys, datetime.timedelta(seconds=_start_timeout()))
    except PeerFailure:
        raise
    except RuntimeError:  # timed out: some rank posted nothing
        pass
    by_backend: dict[str, list[int]] = {}
    for r, key in enumerate(keys):
        what = store.get(key).decode() if store.check([key]) else (
            f"nothing posted within {_start_timeout():g} s (HOROVOD_START_TIMEOUT)")
        by_backend.setdefault(what, []).append(r)
    if len(by_backend) > 1:
        raise _different_backends(f"new_group() (torch's group '{call}')", by_backend, rank)


def _wrap_new_group_with_tag(original):
    import functools
    import inspect

    signature = inspect.signature(original)

    @functools.wraps(original)
    def _new_group_with_tag(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
        except TypeError:
            return original(*args, **kwargs)
        ranks = a.get("ranks")
        if dist.is_initialized() and not a.get("use_local_synchronization"):
            _check_group_backends(a.get("backend"))
        if (ranks and _uses_hvd(a.get("backend")) and not a.get("use_local_synchronization")
                and a.get("sort_ranks", True)):
            from hvd_torch import process_sets

            key = tuple(sorted(ranks))
            if basics.is_initialized() and list(key) != list(range(basics.size())):
                known = _subgroup_sets.get(key)
                if known is None or known.process_set_id is None:
                    _subgroup_sets[key] = process_sets.add_process_set(list(key))
        return original(*args, **kwargs)

    _new_group_with_tag._hvd_wrapped = True
    return _new_group_with_tag


def _register():
    # Registered already: by an earlier import, or by the lazy creator of the
    # torch.backends entry point (hvd_torch_autoload), which this one replaces.
    plugin = getattr(dist.Backend, "_plugins", {}).get(BACKEND.upper())
    if plugin is not None and not getattr(plugin.creator_fn, "hvd_autoload", False):
        return
    # CUDA tensors too where this build moves them (NCCL or host-staged, as
    # hvd.allreduce does): init_process_group("hvd") then serves both devices.
    devices = ["cpu", "cuda"] if _C.cuda_built() else ["cpu"]
    dist.Backend.register_backend(BACKEND, _create_backend, extended_api=True, devices=devices)
    from torch.distributed import distributed_c10d

    original = getattr(distributed_c10d, "_new_group_with_tag", None)
    if original is not None and not getattr(original, "_hvd_wrapped", False):
        distributed_c10d._new_group_with_tag = _wrap_new_group_with_tag(original)


if dist.is_available():
    _register()

del torch
