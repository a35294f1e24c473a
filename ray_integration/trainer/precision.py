"""Mixed precision for the trainer: torch.autocast and a gradient scaler that
work with hvd.DistributedOptimizer.

use_fp16=True means float16 on a GPU and bfloat16 on a CPU (CPUs have no fast
float16 matmul; bfloat16 has float32's range). The scaler is used on both:
bfloat16 would train without it, but keeping it makes the CPU path the same
code as the GPU one, so the CPU tests exercise what GPU users run.

Order with a DistributedOptimizer (Horovod's AMP recipe): the scaled
gradients are averaged over ranks first (optimizer.synchronize()), then the
scaler unscales and checks them for inf/NaN and steps. Every rank then sees
the same averaged gradients, so every rank skips the same steps and the
scales stay equal across ranks.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["MixedPrecision"]


class MixedPrecision:
    """Autocast and loss scaling for one worker, or a pass-through when off."""

    def __init__(self, enabled: bool, device: torch.device):
        self.enabled = enabled
        self.device_type = device.type
        self.dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
        self.scaler = torch.amp.GradScaler(device.type) if enabled else None
        self._stepped = False

    def autocast(self):
        """The forward pass's context: autocast when enabled, else nothing."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.enabled else loss).backward()

    def step(self, optimizer) -> None:
        if not self.enabled:
            optimizer.step()
            return
        optimizer.synchronize()  # average the scaled gradients before unscaling
        with optimizer.skip_synchronize():
            self.scaler.step(optimizer)  # unscales, skips the step on inf/NaN
        self._stepped = True

    def end_batch(self) -> None:
        """Adjusts the scale once per batch, after all of its optimizer steps
        (torch's rule for several optimizers); nothing if none stepped."""
        if self.enabled and self._stepped:
            self.scaler.update()
        self._stepped = False

    def state_dict(self) -> dict | None:
        return self.scaler.state_dict() if self.enabled else None

    def load_state_dict(self, state: dict | None) -> None:
        if self.enabled and state:
            self.scaler.load_state_dict(state)
