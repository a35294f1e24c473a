"""Batch normalization whose batch statistics span every rank (horovod.torch.SyncBatchNorm).

In training mode each rank normalizes its own samples with the mean and
variance of the *global* batch (all ranks' samples together), so a model
trained on n ranks with per-rank batch b behaves like one trained on a batch
of n*b: the running statistics, the output and the gradients are those of
torch.nn.BatchNorm applied to the concatenated batch. Ranks may hold different
numbers of samples, even none.

Algorithm and cost per layer and step, for C channels on n ranks:

- forward: each rank computes its per-channel count, mean and M2 (sum of
  squared deviations from its own mean) in at least float32, and one
  allgather of a (1, 2C+1) float64 row gives every rank all of them. Every
  rank then combines them with Chan et al.'s pairwise formula,
      mean = sum(n_r m_r) / N,   M2 = sum(M2_r) + sum(n_r (m_r - mean)^2),
  in float64 and in rank order, so all ranks get bit-identical statistics.
  Unlike E[x^2] - E[x]^2 from global sums, this does not lose the variance to
  cancellation when |mean| >> std.
- backward: with xhat = (x - mean) * invstd, the input gradient needs two
  global per-channel sums, sum(dy) and sum(dy * xhat); one Sum-allreduce of a
  2C vector provides them:
      dx = weight * invstd * (dy - sum(dy)/N - xhat * sum(dy * xhat)/N).
  The weight and bias gradients are this rank's sums (sum(dy * xhat) and
  sum(dy)), as in Horovod and torch.nn.SyncBatchNorm: the optimizer's gradient
  allreduce combines them like every other parameter's. When the input needs
  no gradient, backward does not communicate.

Both collectives are named ("sync_batch_norm.stats", "sync_batch_norm.grad")
and synchronous, so they match across ranks by name even while a
DistributedOptimizer's gradient allreduces are in flight; the engine's response
cache keys on the full request (name and shape), so layers of different widths
sharing a name are each negotiated once.

Eval mode (and a job of one rank, or no hvd.init()) is plain
torch.nn.BatchNorm: no communication. With track_running_stats=False, eval
normalizes with the local batch's statistics, as torch.nn.SyncBatchNorm does
(Horovod synchronizes there too; a rank evaluating alone would then hang).
"""

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from hvd_torch import basics
from hvd_torch.ops import allgather, allreduce

_STATS_NAME = "sync_batch_norm.stats"
_GRAD_NAME = "sync_batch_norm.grad"


def _compute_dtype(dtype):
    """Statistics and the normalization run in at least float32 (float16 and
    bfloat16 inputs included), in float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


class _SyncBatchNormFunction(torch.autograd.Function):
    """y = (x - mean) * invstd * weight + bias with global batch statistics.

    Not twice differentiable. Called on the autograd thread in backward; every
    rank must call forward and backward the same number of times, in the same
    order relative to its other SyncBatchNorm layers.
    """

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum):
        channels = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        shape = [1, channels] + [1] * (input.dim() - 2)
        dtype = _compute_dtype(input.dtype)
        x = input.to(dtype)

        count = input.numel() // channels if channels else 0
        if count > 0:
            var, mean = torch.var_mean(x, dim=dims, correction=0)
            m2 = var.double() * count
            mean = mean.double()
        else:  # this rank has no samples: it contributes nothing
            mean = torch.zeros(channels, dtype=torch.float64, device=input.device)
            m2 = torch.zeros(channels, dtype=torch.float64, device=input.device)
        count_t = torch.tensor([float(count)], dtype=torch.float64, device=input.device)
        row = torch.cat([count_t, mean, m2])
        stats = allgather(row.unsqueeze(0), name=_STATS_NAME)  # (size, 2C+1), rank order

        counts = stats[:, :1]
        total = float(counts.sum())
        if total <= 1:
            # Every rank sees the same total, so every rank raises: none hangs.
            raise ValueError(
                f"SyncBatchNorm: expected more than 1 value per channel when training, "
                f"got {int(total)} over all ranks (this rank's input has shape "
                f"{list(input.shape)}; per-rank counts {[int(c) for c in counts.flatten()]})"
            )
        means, m2s = stats[:, 1 : channels + 1], stats[:, channels + 1 :]
        global_mean = (counts * means).sum(0) / total
        global_m2 = m2s.sum(0) + (counts * (means - global_mean) ** 2).sum(0)
        invstd = torch.rsqrt(global_m2 / total + eps)

        if running_mean is not None:
            # torch.nn.BatchNorm's update, with the unbiased global variance.
            running_mean.mul_(1 - momentum).add_(global_mean.to(running_mean.dtype), alpha=momentum)
            unbiased = global_m2 / (total - 1)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)

        mean_c = global_mean.to(dtype)
        invstd_c = invstd.to(dtype)
        y = (x - mean_c.view(shape)) * invstd_c.view(shape)
        if weight is not None:
            y = y * weight.to(dtype).view(shape) + bias.to(dtype).view(shape)
        ctx.save_for_backward(input, weight, mean_c, invstd_c)
        ctx.total = total
        return y.to(input.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        input, weight, mean, invstd = ctx.saved_tensors
        channels = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        shape = [1, channels] + [1] * (input.dim() - 2)
        dtype = mean.dtype

        dy = grad_output.to(dtype)
        xhat = (input.to(dtype) - mean.view(shape)) * invstd.view(shape)
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)

        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            sums = allreduce(torch.cat([sum_dy, sum_dy_xhat]), name=_GRAD_NAME, op=basics.Sum)
            mean_dy = (sums[:channels] / ctx.total).view(shape)
            mean_dy_xhat = (sums[channels:] / ctx.total).view(shape)
            scale = invstd if weight is None else invstd * weight.to(dtype)
            grad_input = (dy - mean_dy - xhat * mean_dy_xhat) * scale.view(shape)
            grad_input = grad_input.to(input.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = sum_dy_xhat.to(weight.dtype)
        if weight is not None and ctx.needs_input_grad[2]:
            grad_bias = sum_dy.to(weight.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the global batch of all ranks (Horovod's API).

    Takes inputs of shape (N, C), (N, C, L), (N, C, H, W) or more dimensions,
    with the arguments of torch.nn.BatchNorm2d. See the module docstring for
    the algorithm and its cost.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(
                f"SyncBatchNorm: expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training or not basics.is_initialized() or basics.size() == 1:
            return super().forward(input)
        if input.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm: expected {self.num_features} channels (dimension "
                             f"1), got input of shape {list(input.shape)}")

        # torch.nn.BatchNorm's bookkeeping: momentum None is a cumulative average.
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        track = self.track_running_stats and self.running_mean is not None
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias,
            self.running_mean if track else None, self.running_var if track else None,
            self.eps, factor,
        )

    @classmethod
    def convert_sync_batchnorm(cls, module):
        """Returns `module` with every torch.nn.BatchNorm*d replaced by a
        SyncBatchNorm holding the same parameters and buffers (like
        torch.nn.SyncBatchNorm.convert_sync_batchnorm)."""
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats)
            if module.affine:
                with torch.no_grad():
                    converted.weight = module.weight
                    converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.training = module.training
            if hasattr(module, "qconfig"):
                converted.qconfig = module.qconfig
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child))
        return converted
