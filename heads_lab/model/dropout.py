"""Dropout whose random numbers are cheap on CPU.

torch's CPU dropout draws one random number per element (bernoulli_), which made dropout ~14 %
of a training step here. This draws one 64-bit number per four elements and splits it into four
15-bit lanes (the low 15 bits of each 16-bit lane of a uniform value in [0, 2^63) are uniform),
keeping an element when its lane is ≥ round(p · 2^15): p is exact to 1/32768. It uses torch's
generator, so a seed fixes the masks. On GPUs torch's own fused kernel is used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

LANES, SCALE = 4, 1 << 15


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> Tensor:
    """A bool mask of `shape`, each element True with probability 1 - p (to 1/32768)."""
    n = shape.numel()
    draws = torch.empty((n + LANES - 1) // LANES, dtype=torch.int64, device=device).random_()
    lanes = draws.view(torch.int16)[:n] & 0x7FFF
    return (lanes >= round(p * SCALE)).view(shape)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout: zero each element with probability p, scale the rest by 1 / (1 - p)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    return x * keep_mask(x.shape, p, x.device) * (1.0 / (1.0 - p))
