"""The optimiser and its schedule: Adam or AdamW (fused where PyTorch has the kernel; parameter
groups of their own for gates and position biases; AdamW decays the weight matrices and
embeddings only, as nanoGPT and GPT-2's recipe do) and, after linear warm-up, the
inverse-square-root schedule (Vaswani et al. 2017, section 5.3) or a cosine (Loshchilov & Hutter
2017) down to a floor at the last step."""

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


def cosine(warmup: int, total: int, floor: float) -> Callable[[int], float]:
    """LR multiplier of update `step` (1-based): linear warm-up to 1 at step `warmup`, then
    floor + (1 − floor) · (1 + cos(π · (step − warmup) / (total − warmup))) / 2, reaching `floor`
    at step `total` (and staying there past it)."""

    def factor(step: int) -> float:
        if warmup > 0 and step < warmup:
            return step / warmup
        span = max(total - warmup, 1)
        done = min(max(step - warmup, 0) / span, 1.0)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * done))

    return factor


def schedule(cfg) -> Callable[[int], float]:
    """trainer.schedule's multiplier of update `step` (1-based)."""
    if cfg.schedule == "cosine":
        return cosine(cfg.warmup_steps, cfg.max_steps, cfg.min_lr)
    return inverse_sqrt(cfg.warmup_steps)


def optimizer(model: torch.nn.Module, cfg, extra: ExtraLoss | None = None):
    """trainer.optimizer: `adam` as below, or `adamw`: decoupled weight decay on the weight
    matrices and embeddings (parameters of 2 or more dims), none on biases, norms, gates and
    position biases."""
    betas, args = tuple(cfg.adam_betas), (cfg.lr, tuple(cfg.adam_betas), cfg.adam_eps)
    if cfg.optimizer != "adamw":
        return adam(model, *args, cfg.weight_decay, cfg.position_bias_lr, extra)
    device = next(model.parameters()).device.type
    impl = {"fused": True} if device in ("cpu", "cuda") else {"foreach": True}
    special = list(extra.param_groups(cfg.lr)) if extra is not None else []
    biases = [p for name, p in model.named_parameters() if name.endswith("position_bias")]
    if biases:
        special.append((biases, cfg.position_bias_lr or cfg.lr))
    taken = {id(p) for params, _ in special for p in params}
    rest = [p for p in model.parameters() if id(p) not in taken]
    groups = [{"params": [p for p in rest if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}]
    groups += [{"params": params, "lr": group_lr, "weight_decay": 0.0}
               for params, group_lr in special]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=betas,
                             eps=cfg.adam_eps, **impl)


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
