"""Which GPU this rank uses, and which data plane moves its CUDA tensors.

hvd.init() calls configure() in builds with CUDA (hvd.cuda_built()). The rank's
GPU is `local_rank % visible GPUs` (Horovod's convention: with one GPU per
rank, torch.cuda.set_device(hvd.local_rank())). CUDA tensors move through
NCCL when `HOROVOD_GPU_OPERATIONS` is NCCL (the default when built) and no two
ranks share a physical GPU (NCCL refuses two ranks on one device); otherwise
through Gloo, staged in pinned host memory. Every rank computes the same
answer from one allgather of each rank's (host, physical GPU) at init.
"""

from __future__ import annotations

import socket

import torch

from hvd_torch import _C, config

GPU_OPERATIONS = "HOROVOD_GPU_OPERATIONS"
CHOICES = ("NCCL", "GLOO")


def requested_operations() -> str:
    """HOROVOD_GPU_OPERATIONS, validated (hvd.init() calls it before the engine
    starts, in every build); NCCL by default when built."""
    raw = config.Gpu.from_environment().requested_operations
    choice = raw or ("NCCL" if _C.nccl_built() else "GLOO")
    if choice not in CHOICES:
        raise ValueError(f"{GPU_OPERATIONS}={raw!r}: hvd-torch moves CUDA tensors with NCCL "
                         "or GLOO (host-staged)")
    # A CPU-only build moves no CUDA tensor: asking for NCCL there changes nothing.
    if choice == "NCCL" and _C.cuda_built() and not _C.nccl_built():
        raise ValueError(f"{GPU_OPERATIONS}=NCCL, but this build of hvd_torch has no NCCL "
                         "(hvd.nccl_built() is False): install the nvidia-nccl wheel torch uses "
                         f"and rebuild, or set {GPU_OPERATIONS}=GLOO")
    return choice


def _gather_strings(value: str, name: str) -> list[str]:
    """Every rank's string, in rank order (two small allgathers)."""
    data = torch.tensor(list(value.encode()), dtype=torch.uint8)
    lengths = torch.ops.hvd_torch.allgather(torch.tensor([data.numel()]), f"{name}.lengths")
    blob = torch.ops.hvd_torch.allgather(data, f"{name}.bytes").tolist()
    out, at = [], 0
    for n in lengths.tolist():
        out.append(bytes(blob[at:at + n]).decode())
        at += n
    return out


def configure() -> None:
    """Sets this rank's GPU and plane in the extension (a collective: every rank calls it)."""
    if not _C.cuda_built():
        return
    choice = requested_operations()
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = _C.local_rank() % count if count else -1
    physical = config.Gpu.from_environment().physical_gpu(device)
    identity = f"{socket.gethostname()}/{physical}" if count else ""
    # Ranks without a GPU take part too, so the collective always matches.
    identities = [i for i in _gather_strings(identity, "hvd_torch.gpu_identity") if i]
    shared = len(set(identities)) < len(identities)
    _C.configure_gpu(device, choice == "NCCL" and not shared and device >= 0)


def plane() -> str:
    """'nccl', 'gloo' (host-staged) or 'none': how this rank moves CUDA tensors now."""
    if _C.gpu_device() < 0:
        return "none"
    return "nccl" if _C.gpu_uses_nccl() else "gloo"
