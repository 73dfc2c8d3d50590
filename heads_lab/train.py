"""The training loop: Adam with inverse-square-root warm-up, label-smoothed cross entropy,
token-budget batches, periodic validation. It knows nothing of Hydra or the console: it reports
through the `on_log` callback and returns plain numbers."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from heads_lab.config import TrainerConfig
from heads_lab.data import Split, collate, epoch_batches
from heads_lab.evaluate import perplexity
from heads_lab.model import Transformer


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast(device: torch.device, precision: str):
    """bf16 autocast for `precision=bf16` (matmuls in bf16, weights, optimizer and loss in fp32),
    a no-op for fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def inverse_sqrt(warmup: int) -> Callable[[int], float]:
    """LR multiplier of update `step` (1-based): linear warm-up to 1 at step `warmup`, then
    sqrt(warmup / step); without warm-up, 1 / sqrt(step)."""

    def factor(step: int) -> float:
        if warmup <= 0:
            return 1.0 / math.sqrt(step)
        return min(step / warmup, math.sqrt(warmup / step))

    return factor


@dataclass
class TrainResult:
    steps: int
    epochs: float
    train_loss: float  # label-smoothed loss per target token over the last log interval
    tokens: int  # target tokens trained on
    train_seconds: float
    tokens_per_s: float
    valid: dict[str, float]  # last validation: loss (NLL per token) and ppl
    history: list[dict[str, float]]


def adam(model: torch.nn.Module, lr: float, betas: tuple[float, float], eps: float,
         weight_decay: float = 0.0) -> torch.optim.Adam:
    """Adam with PyTorch's fused kernel where it has one (CPU and CUDA: one pass over each
    parameter, ~3× faster than the multi-tensor path on CPU here), else the multi-tensor one."""
    device = next(model.parameters()).device.type
    impl = {"fused": True} if device in ("cpu", "cuda") else {"foreach": True}
    return torch.optim.Adam(model.parameters(), lr=lr, betas=betas, eps=eps,
                            weight_decay=weight_decay, **impl)


def train(
    model: Transformer,
    train_split: Split,
    valid_split: Split,
    cfg: TrainerConfig,
    seed: int,
    device: torch.device,
    on_log: Callable[[int, dict[str, float]], None] = lambda step, metrics: None,
) -> TrainResult:
    """Train `model` in place until trainer.max_steps or max_epochs; validate every valid_every
    steps and at the end. `on_log(step, metrics)` receives train/* and valid/* metrics."""
    opt = adam(model, cfg.lr, tuple(cfg.adam_betas), cfg.adam_eps, cfg.weight_decay)
    factor = inverse_sqrt(cfg.warmup_steps)  # LambdaLR counts from 0 before the first update
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda done: factor(done + 1))
    max_steps = cfg.max_steps if cfg.max_steps is not None else math.inf
    max_epochs = cfg.max_epochs if cfg.max_epochs is not None else math.inf
    step, epoch, tokens, train_seconds = 0, 0, 0, 0.0
    window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "seconds": 0.0}
    valid: dict[str, float] = {}
    history: list[dict[str, float]] = []
    last_loss = float("nan")
    tgt_lens = train_split.tgt_lens

    def validate() -> None:
        nonlocal valid
        with autocast(device, cfg.precision):
            valid = perplexity(model, valid_split, cfg.max_tokens, device)
        metrics = {"valid/loss": valid["loss"], "valid/ppl": valid["ppl"]}
        history.append({"step": step, **metrics})
        on_log(step, metrics)

    model.train()
    while step < max_steps and epoch < max_epochs:
        batches = epoch_batches(train_split, cfg.max_tokens, seed, epoch)
        n_updates = math.ceil(len(batches) / cfg.update_freq)  # a short last group is kept
        for u in range(n_updates):
            if step >= max_steps:
                break
            group = batches[u * cfg.update_freq : (u + 1) * cfg.update_freq]
            started = time.perf_counter()
            n_tokens = int(sum(tgt_lens[ids].sum() for ids in group))
            for ids in group:
                batch = collate(train_split, ids).to(device)
                keep = batch.tgt_out != model.pad_id  # score only real target positions
                with autocast(device, cfg.precision):
                    hidden = model.decode(batch.tgt_in, model.encode(batch.src))[keep]
                    loss, nll = model.loss(hidden, batch.tgt_out[keep], cfg.label_smoothing)
                (loss / n_tokens).backward()  # gradient of the mean over the whole update
                window["loss"] += loss.item()
                window["nll"] += nll.item()
            if cfg.clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            tokens += n_tokens
            elapsed = time.perf_counter() - started
            train_seconds += elapsed
            window["tokens"] += n_tokens
            window["seconds"] += elapsed
            if step % cfg.log_every == 0 or step == max_steps:
                last_loss = window["loss"] / window["tokens"]
                on_log(step, {
                    "train/loss": last_loss,
                    "train/nll": window["nll"] / window["tokens"],
                    "train/ppl": math.exp(min(window["nll"] / window["tokens"], 50)),
                    "train/lr": sched.get_last_lr()[0],
                    "train/tokens_per_s": window["tokens"] / window["seconds"],
                    "train/epoch": epoch + (u + 1) / n_updates,
                })
                window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "seconds": 0.0}
            if step % cfg.valid_every == 0:
                validate()
                model.train()
        else:
            epoch += 1
    if window["tokens"]:
        last_loss = window["loss"] / window["tokens"]
    if not history or history[-1]["step"] != step:
        validate()
    return TrainResult(
        steps=step,
        epochs=tokens / max(train_split.target_tokens(), 1),
        train_loss=last_loss,
        tokens=tokens,
        train_seconds=train_seconds,
        tokens_per_s=tokens / max(train_seconds, 1e-9),
        valid=valid,
        history=history,
    )
