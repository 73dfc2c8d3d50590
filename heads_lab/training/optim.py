"""The optimiser and its schedule: Adam (fused where PyTorch has the kernel; parameter groups of
their own for gates and position biases) and the inverse-square-root schedule after linear
warm-up (Vaswani et al. 2017, section 5.3)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from heads_lab.training.state import ExtraLoss


def inverse_sqrt(warmup: int) -> Callable[[int], float]:
    """LR multiplier of update `step` (1-based): linear warm-up to 1 at step `warmup`, then
    sqrt(warmup / step); without warm-up, 1 / sqrt(step)."""

    def factor(step: int) -> float:
        if warmup <= 0:
            return 1.0 / math.sqrt(step)
        return min(step / warmup, math.sqrt(warmup / step))

    return factor


def adam(model: torch.nn.Module, lr: float, betas: tuple[float, float], eps: float,
         weight_decay: float = 0.0, position_bias_lr: float | None = None,
         extra: ExtraLoss | None = None) -> torch.optim.Adam:
    """Adam with PyTorch's fused kernel where it has one (CPU and CUDA: one pass over each
    parameter, ~3× faster than the multi-tensor path on CPU here), else the multi-tensor one.
    An extra loss term's parameters (Hard Concrete gates' log α) and relative-position biases
    get learning rates of their own: both are scalars that must travel several units, and Adam
    moves a parameter by about its learning rate per step whatever the gradient's size."""
    device = next(model.parameters()).device.type
    impl = {"fused": True} if device in ("cpu", "cuda") else {"foreach": True}
    special = list(extra.param_groups(lr)) if extra is not None else []
    biases = [p for name, p in model.named_parameters() if name.endswith("position_bias")]
    if biases:
        special.append((biases, position_bias_lr or lr))
    taken = {id(p) for params, _ in special for p in params}
    groups = [{"params": [p for p in model.parameters() if id(p) not in taken]}]
    groups += [{"params": params, "lr": group_lr, "weight_decay": 0.0} for params, group_lr in special]
    return torch.optim.Adam(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                            **impl)
