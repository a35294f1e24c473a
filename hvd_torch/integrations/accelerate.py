"""Hugging Face Accelerate (and the Transformers Trainer, which runs on it) on the
"hvd" torch.distributed backend (docs/integrations.md, "Accelerate").

    from hvd_torch.integrations.accelerate import accelerator
    acc = accelerator()            # an accelerate.Accelerator whose process group is hvd's

Why a helper: on CPU, Accelerate picks the backend itself. PartialState maps every
multi-process CPU job to "gloo" (or "mpi"), and refuses any other name it is given
("Your assigned backend hvd is not available, please use gloo"; accelerate 1.15,
state.py, _prepare_backend), so neither `PartialState(cpu=True, backend="hvd")`, nor
`InitProcessGroupKwargs(backend="hvd")`, nor `TrainingArguments(ddp_backend="hvd")`
gets there. What Accelerate does support is a process group that already exists:
before it creates one, it checks `torch.distributed.is_initialized()` and, if so,
takes the rank and size from that group. So partial_state() creates the default group
on "hvd" first (env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, which
`accelerate launch --multi_gpu`, torchrun and hvdrun all set), then lets Accelerate
adopt it. We rejected patching Accelerate's backend choice: the adopted group is the
documented path and survives Accelerate's own releases.

Accelerate still records "gloo" as the backend of a CPU job it adopted. The label
matters in one place: accelerate.utils.gather uses all_gather_into_tensor for any
backend but "gloo" (and a list all_gather for gloo, which has no such op). hvd has
it, so we set the label to "hvd", which also makes `print(state)` tell the truth.

On CUDA (cpu=False) Accelerate keeps a backend it is given, and creates the group
itself: PartialState(backend="hvd"). Not tested (no GPU where this was written).

Accelerate is imported only when these functions run: hvd_torch does not need it.
"""

from __future__ import annotations

import datetime

import torch.distributed as dist  # hvd_torch's import (our package) registered "hvd"

from hvd_torch import config

BACKEND = "hvd"


def partial_state(cpu: bool = True, timeout: datetime.timedelta | None = None):
    """Accelerate's PartialState on the "hvd" backend; call it before Accelerator(),
    PartialState() or TrainingArguments create theirs (it is a per-process singleton).

    cpu=True: creates the default process group on "hvd" if none exists (timeout goes
    to init_process_group), then PartialState(cpu=True), which adopts it. Without a
    launcher (no RANK/WORLD_SIZE: a plain `python script.py`) there is no group to
    make, and Accelerate runs the script as one process, as it would on gloo.
    cpu=False: PartialState(backend="hvd") (CUDA; untested).
    """
    from accelerate import PartialState

    group_kwargs = {"timeout": timeout} if timeout else {}
    if not cpu:
        return PartialState(backend=BACKEND, **group_kwargs)
    if not dist.is_initialized() and _launched():
        if PartialState._shared_state:
            raise ValueError("hvd_torch.integrations.accelerate.partial_state(): Accelerate's "
                             "state already exists without a process group; call this before "
                             "Accelerator(), PartialState() or TrainingArguments create it")
        dist.init_process_group(BACKEND, **group_kwargs)
    if dist.is_initialized() and dist.get_backend() != BACKEND:
        raise ValueError(f"hvd_torch.integrations.accelerate.partial_state(): the default process "
                         f"group already runs on {dist.get_backend()!r}, not {BACKEND!r}; create "
                         f"it with init_process_group({BACKEND!r}), or leave it to this function")
    state = PartialState(cpu=True)
    if dist.is_initialized():
        state.backend = BACKEND  # Accelerate wrote "gloo" for the group it adopted (see above)
    return state


def accelerator(cpu: bool = True, **accelerator_kwargs):
    """An accelerate.Accelerator(cpu=cpu, **accelerator_kwargs) on the "hvd" backend
    (partial_state() first). An InitProcessGroupKwargs handler among the kwargs has no
    effect: the group exists by then."""
    from accelerate import Accelerator

    partial_state(cpu=cpu)
    return Accelerator(cpu=cpu, **accelerator_kwargs)


def _launched() -> bool:
    """Whether a launcher set torch.distributed's env:// variables for this process."""
    launch = config.Launch.from_environment()
    return launch.rank is not None and launch.world_size is not None
