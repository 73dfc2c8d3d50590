"""The training loop: Adam with inverse-square-root warm-up, label-smoothed cross entropy,
token-budget batches, periodic validation, checkpoints and exact resume, skipping of non-finite
steps, and a clean stop on preemption signals. It knows nothing of Hydra or the console: it
reports through the `on_log` callback and returns plain numbers."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from heads_lab import checkpoint
from heads_lab.checkpoint import Checkpoints
from heads_lab.config import TrainerConfig
from heads_lab.data import Split, collate, epoch_batches
from heads_lab.errors import CheckpointError, ConfigError, HeadsLabError
from heads_lab.evaluate import perplexity
from heads_lab.model import Transformer
from heads_lab.parallel import Parallel

log = logging.getLogger(__name__)

def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX). Without,
    PyTorch's CPU bf16 matmuls are emulated: a 512² matmul took 454 ms in bf16 against 11 ms in
    fp32 on an AVX2 EPYC, so a bf16 run would take tens of times longer than fp32."""
    cpu = torch.cpu
    return any(getattr(cpu, name, lambda: False)()
               for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def check_precision(device: torch.device, precision: str) -> None:
    """Refuse bf16 on a CPU without native bf16, in one line naming the fix."""
    if precision == "bf16" and device.type == "cpu" and not native_bf16():
        raise ConfigError("trainer.precision=bf16: this CPU has no native bf16 (AVX512-BF16 or "
                          "AMX), so bf16 matrix products are emulated, tens of times slower than "
                          "fp32; add trainer.precision=fp32 (or run on a GPU or a CPU with bf16)")


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
    skipped_steps: int = 0  # updates skipped for a non-finite loss or gradient
    resumed_from: int | None = None  # the step of the checkpoint this run continued from


@dataclass
class Progress:
    """Where training stands: everything besides model/optimizer/schedule/RNG that a resumed
    run needs to continue exactly (it is saved in every checkpoint)."""

    step: int = 0
    epoch: int = 0
    update: int = 0  # the next update's index in this epoch's batch order
    tokens: int = 0
    train_seconds: float = 0.0
    last_loss: float = float("nan")
    window: dict[str, float] = field(default_factory=lambda: _empty_window())
    history: list[dict[str, float]] = field(default_factory=list)
    valid: dict[str, float] = field(default_factory=dict)
    best_valid: float = math.inf
    skipped: int = 0
    bad_in_row: int = 0


class Preempted(HeadsLabError):
    """A stop signal arrived; a checkpoint was saved and the run can be resumed."""

    def __init__(self, signal_name: str, step: int, path: Path | None):
        where = f"checkpoint {path}" if path else "no checkpoint (checkpoints are off)"
        super().__init__(f"stopped by {signal_name} at step {step}; saved {where}; run the same "
                         "command with hydra.run.dir=<this run dir> to resume")
        self.signal_name = signal_name


class Diverged(HeadsLabError):
    """Too many non-finite steps in a row."""


def _empty_window() -> dict[str, float]:
    return {"loss": 0.0, "nll": 0.0, "tokens": 0, "seconds": 0.0}


def adam(model: torch.nn.Module, lr: float, betas: tuple[float, float], eps: float,
         weight_decay: float = 0.0, position_bias_lr: float | None = None) -> torch.optim.Adam:
    """Adam with PyTorch's fused kernel where it has one (CPU and CUDA: one pass over each
    parameter, ~3× faster than the multi-tensor path on CPU here), else the multi-tensor one.
    Hard Concrete gates (log α) and relative-position biases get learning rates of their own:
    both are scalars that must travel several units, and Adam moves a parameter by about its
    learning rate per step whatever the gradient's size."""
    device = next(model.parameters()).device.type
    impl = {"fused": True} if device in ("cpu", "cuda") else {"foreach": True}
    gates = getattr(model, "gates", None)
    special = []
    if gates is not None:
        special.append((list(gates.parameters()), gates.lr or lr))
    biases = [p for name, p in model.named_parameters() if name.endswith("position_bias")]
    if biases:
        special.append((biases, position_bias_lr or lr))
    taken = {id(p) for params, _ in special for p in params}
    groups = [{"params": [p for p in model.parameters() if id(p) not in taken]}]
    groups += [{"params": params, "lr": group_lr, "weight_decay": 0.0} for params, group_lr in special]
    return torch.optim.Adam(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                            **impl)


def train(
    model: Transformer,
    train_split: Split,
    valid_split: Split,
    cfg: TrainerConfig,
    seed: int,
    device: torch.device,
    on_log: Callable[[int, dict[str, float]], None] = lambda step, metrics: None,
    checkpoints: Checkpoints | None = None,
    stop_requested: Callable[[], str | None] = lambda: None,
    parallel: Parallel | None = None,
) -> TrainResult:
    """Train `model` in place until trainer.max_steps or max_epochs; validate every valid_every
    steps and at the end. `on_log(step, metrics)` receives train/* and valid/* metrics.
    With `checkpoints`, save every trainer.save_every steps and at the end, and (resume=auto)
    continue from the newest valid checkpoint. `stop_requested()` returning a signal name makes
    the loop save a checkpoint after the current update and raise Preempted. With `parallel`,
    this process is one rank of a data-parallel group (see heads_lab.parallel)."""
    net = parallel.wrap(model) if parallel else model  # DistributedDataParallel on ranks
    opt = adam(model, cfg.lr, tuple(cfg.adam_betas), cfg.adam_eps, cfg.weight_decay,
               cfg.position_bias_lr)
    factor = inverse_sqrt(cfg.warmup_steps)  # LambdaLR counts from 0 before the first update
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda done: factor(done + 1))
    max_steps = cfg.max_steps if cfg.max_steps is not None else math.inf
    max_epochs = cfg.max_epochs if cfg.max_epochs is not None else math.inf
    p = Progress()
    resumed_from = None
    state = checkpoints.resume_state() if checkpoints else None
    world, rank = (parallel.world, parallel.rank) if parallel else (1, 0)
    if state is not None and state.get("world", 1) != world:
        raise CheckpointError(
            f"{checkpoints.last_path} was written by {state.get('world', 1)} data-parallel "
            f"process(es), not {world}; resume with the same number of processes")
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        p = Progress(**state["progress"])
        checkpoint.set_rng_state(state["rng"])
        resumed_from = p.step
    tgt_lens = train_split.tgt_lens
    gates = model.gates
    per_update = cfg.update_freq * world  # batches in one update, over all ranks

    def validate() -> bool:
        """Validate; True when this is the best validation loss so far."""
        with autocast(device, cfg.precision):
            p.valid = perplexity(model, valid_split, cfg.max_tokens, device)
        metrics = {"valid/loss": p.valid["loss"], "valid/ppl": p.valid["ppl"]}
        p.history.append({"step": p.step, **metrics})
        on_log(p.step, metrics)
        if p.valid["loss"] < p.best_valid:
            p.best_valid = p.valid["loss"]
            return True
        return False

    def save(best: bool = False) -> Path | None:
        if checkpoints is None:
            return None
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                 "scheduler": sched.state_dict(), "progress": asdict(p),
                 "rng": checkpoint.rng_state(), "vocab_size": model.vocab_size, "world": world}
        return checkpoints.save(state, p.step, best)

    model.train()
    while p.step < max_steps and p.epoch < max_epochs:
        batches = epoch_batches(train_split, cfg.max_tokens, seed, p.epoch)
        n_updates = math.ceil(len(batches) / per_update)  # a short last group is kept
        while p.update < n_updates and p.step < max_steps:
            group = batches[p.update * per_update : (p.update + 1) * per_update]
            # rank r trains on batches r, r + world, ... of the update; a rank left without one
            # (a short last group) runs a batch with weight 0, so every rank all-reduces once
            mine, weight = (group[rank::world], 1.0) if rank < len(group) else (group[:1], 0.0)
            started = time.perf_counter()
            n_tokens = int(sum(tgt_lens[ids].sum() for ids in group))  # over all ranks
            losses = torch.zeros(2, dtype=torch.float64)
            for i, ids in enumerate(mine):
                batch = collate(train_split, ids).to(device)
                keep = batch.tgt_out != model.pad_id  # score only real target positions
                with parallel.no_sync(net, last=i == len(mine) - 1) if parallel else nullcontext():
                    with autocast(device, cfg.precision):
                        hidden = net(batch.src, batch.tgt_in, hidden_only=True)[keep]
                        loss, nll = model.loss(hidden, batch.tgt_out[keep], cfg.label_smoothing)
                    # the gradient of the mean over the whole update (DDP averages over ranks)
                    (loss / (n_tokens / world) if weight else loss * 0.0).backward()
                if gates is not None and i == 0:  # Hard Concrete head gates: + λ·L0, per update
                    (gates.l0_lambda * gates.penalty()).backward()
                losses += weight * torch.tensor([loss.item(), nll.item()], dtype=torch.float64)
            if parallel:
                losses = parallel.sum(losses)
            p.update += 1
            clip = cfg.clip_norm if cfg.clip_norm > 0 else math.inf
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if not (math.isfinite(losses[0].item()) and torch.isfinite(norm).item()):
                opt.zero_grad(set_to_none=True)
                p.skipped += 1
                p.bad_in_row += 1
                log.warning("step %d: non-finite %s; update skipped (%d in a row, %d in all)",
                            p.step + 1, "loss" if not math.isfinite(losses[0].item())
                            else "gradient", p.bad_in_row, p.skipped)
                on_log(p.step, {"train/skipped_steps": p.skipped})
                if p.bad_in_row >= cfg.max_bad_steps:
                    path = save()
                    kept = f"; checkpoint {path} holds the weights from before it" if path else ""
                    raise Diverged(
                        f"training diverged: {p.bad_in_row} non-finite steps in a row after step "
                        f"{p.step}{kept}; lower trainer.lr, raise trainer.warmup_steps or set "
                        "trainer.clip_norm (e.g. 1.0), then start a new run")
                continue
            p.bad_in_row = 0
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            p.step += 1
            p.tokens += n_tokens
            elapsed = time.perf_counter() - started
            p.train_seconds += elapsed
            w = p.window
            w["loss"] += losses[0].item()
            w["nll"] += losses[1].item()
            w["tokens"] += n_tokens
            w["seconds"] += elapsed
            if p.step % cfg.log_every == 0 or p.step == max_steps:
                p.last_loss = w["loss"] / w["tokens"]
                on_log(p.step, {
                    "train/loss": p.last_loss,
                    "train/nll": w["nll"] / w["tokens"],
                    "train/ppl": math.exp(min(w["nll"] / w["tokens"], 50)),
                    "train/lr": sched.get_last_lr()[0],
                    "train/tokens_per_s": w["tokens"] / w["seconds"],
                    "train/epoch": p.epoch + p.update / n_updates,
                    **({"train/l0": gates.penalty().item(),
                        "train/heads_open": float(sum((g > 0).sum()
                                                      for g in gates.test_gates().values()))}
                       if gates is not None else {}),
                })
                p.window = _empty_window()
            best = False
            if p.step % cfg.valid_every == 0:
                best = validate()
                model.train()
            signal_name = stop_requested()
            if parallel:
                signal_name = parallel.any_stop(signal_name)
            if signal_name:
                raise Preempted(signal_name, p.step, save(best))
            periodic = cfg.save_every and p.step % cfg.save_every == 0
            if (best or periodic) and p.step < max_steps:  # the last step is saved below
                save(best)
        if p.update >= n_updates:
            p.epoch += 1
            p.update = 0
    if p.window["tokens"]:
        p.last_loss = p.window["loss"] / p.window["tokens"]
    best = False
    if not p.history or p.history[-1]["step"] != p.step:
        best = validate()
    elif p.history[-1]["step"] == p.step and p.valid and p.valid["loss"] <= p.best_valid:
        best = True  # validated at this very step above, and it was the best
    save(best)
    return TrainResult(
        steps=p.step,
        epochs=p.tokens / max(train_split.target_tokens(), 1),
        train_loss=p.last_loss,
        tokens=p.tokens,
        train_seconds=p.train_seconds,
        tokens_per_s=p.tokens / max(p.train_seconds, 1e-9),
        valid=p.valid,
        history=p.history,
        skipped_steps=p.skipped,
        resumed_from=resumed_from,
    )
