"""Dropout whose random numbers are cheap on CPU.

torch's CPU dropout draws one random number per element (bernoulli_), which made dropout ~14 %
of a training step here. This draws one 64-bit number per four elements and splits it into four
15-bit lanes (the low 15 bits of each 16-bit lane of a uniform value in [0, 2^63) are uniform),
keeping an element when its lane is ≥ round(p · 2^15): p is exact to 1/32768. It uses torch's
generator, so a seed fixes the masks. On GPUs torch's own fused kernel is used.

The mask is applied by a small autograd function that keeps it as a 0/1 tensor of x's dtype for
the backward pass: multiplying by a bool mask made autograd convert it on every use (a copy in
the forward and again in the backward). The result is bit-identical to x * mask * scale.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

LANES, SCALE = 4, 1 << 15


def keep_mask(shape: torch.Size, p: float, device: torch.device,
              dtype: torch.dtype = torch.bool) -> Tensor:
    """A mask of `shape`, each element 1 (True) with probability 1 - p (to 1/32768), else 0;
    written straight into `dtype` (the comparison fills a float tensor with no extra copy)."""
    n = shape.numel()
    draws = torch.empty((n + LANES - 1) // LANES, dtype=torch.int64, device=device).random_()
    lanes = draws.view(torch.int16)[:n] & 0x7FFF
    out = torch.empty(shape, dtype=dtype, device=device)
    return torch.ge(lanes.view(shape), round(p * SCALE), out=out)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout: zero each element with probability p, scale the rest by 1 / (1 - p)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    mask, scale = keep_mask(x.shape, p, x.device, x.dtype), 1.0 / (1.0 - p)
    if x.dtype in (torch.float32, torch.float64):  # the scale is exact here: fold it into the
        return _ApplyMask.apply(x, mask.mul_(scale), 1.0)  # mask, one pass less each way
    return _ApplyMask.apply(x, mask, scale)


class _ApplyMask(torch.autograd.Function):
    """y = x · mask · scale with the mask (x's dtype) saved for the backward pass. In fp32/fp64
    the mask already holds 0 or 1 / (1 - p) (bit-identical to scaling afterwards, since
    1 · s = s); in bf16 it holds 0/1 and the scale is applied in place as a scalar, so the
    exact 1 / (1 - p) is kept."""

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        y = x * mask
        return y.mul_(scale) if scale != 1.0 else y

    @staticmethod
    def backward(ctx, grad: Tensor):
        (mask,) = ctx.saved_tensors
        g = grad * mask
        return (g.mul_(ctx.scale) if ctx.scale != 1.0 else g), None, None
