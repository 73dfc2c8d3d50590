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
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from heads_lab.config.schemas import TrainerConfig
from heads_lab.data import Split, collate, epoch_batches
from heads_lab.errors import CheckpointError
from heads_lab.model import Transformer
from heads_lab.training import checkpoint
from heads_lab.training.captured import CapturedLoss, capture_on, pad_batch
from heads_lab.training.checkpoint import Checkpoints
from heads_lab.training.device import autocast
from heads_lab.training.evaluate import perplexity
from heads_lab.training.language import lm_perplexity
from heads_lab.training.optim import optimizer, schedule
from heads_lab.training.parallel import Parallel, is_peer_failure
from heads_lab.training.state import (
    Diverged,
    ExtraLoss,
    PeerLost,
    Preempted,
    TrainResult,
    TrainState,
    empty_window,
)

log = logging.getLogger(__name__)

def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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
    extra: ExtraLoss | None = None,
    peak_mb: Callable[[], float] | None = None,
    keep_best: bool = False,
) -> TrainResult:
    """Train `model` in place until trainer.max_steps or max_epochs; validate every valid_every
    steps and at the end. `on_log(step, metrics)` receives train/* and valid/* metrics.
    With `checkpoints`, save every trainer.save_every steps and at the end, and (resume=auto)
    continue from the newest valid checkpoint. `stop_requested()` returning a signal name makes
    the loop save a checkpoint after the current update and raise Preempted. With `parallel`,
    this process is one rank of a data-parallel group (see heads_lab.training.parallel). `extra`:
    a term added to the loss once per update. `peak_mb()`: this process's peak memory so far,
    kept in every checkpoint as the largest of all the run's processes' (TrainResult's).
    `keep_best`: a copy of the weights at each new best validation, kept in memory
    (TrainResult.best_weights): eval.checkpoint=best without checkpoints on disk."""
    return Trainer(model, train_split, valid_split, cfg, seed, device, on_log, checkpoints,
                   stop_requested, parallel, extra, peak_mb, keep_best).run()


class Trainer:
    """One training run's loop, in named steps: resume, an update (forward and backward over
    its batches), the non-finite check, logging, validation, checkpoints."""

    def __init__(self, model, train_split, valid_split, cfg, seed, device, on_log, checkpoints,
                 stop_requested, parallel, extra, peak_mb=None, keep_best=False):
        self.model, self.train_split, self.valid_split = model, train_split, valid_split
        self.keep_best = keep_best
        self.best_weights: dict[str, torch.Tensor] | None = None
        self.cfg, self.seed, self.device, self.on_log = cfg, seed, device, on_log
        self.checkpoints, self.stop_requested = checkpoints, stop_requested
        self.parallel, self.extra, self.peak_mb = parallel, extra, peak_mb or (lambda: 0.0)
        self.net = parallel.wrap(model) if parallel else model  # DistributedDataParallel on ranks
        # trainer.capture compiles forward, loss and backward (training.captured); else
        # trainer.compile the training forward only: checkpoints, validation, decoding use `model`
        capture = capture_on(cfg, device, plain=extra is None and parallel is None)
        self.captured = (CapturedLoss(self.net, model, cfg.label_smoothing, cfg.precision, device)
                         if capture else None)
        if cfg.compile and not capture:
            self.net = torch.compile(self.net, dynamic=True)
        self.opt = optimizer(model, cfg, extra)
        factor = schedule(cfg)  # LambdaLR counts from 0 before the 1st update
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda done: factor(done + 1))
        self.max_steps = cfg.max_steps if cfg.max_steps is not None else math.inf
        self.max_epochs = cfg.max_epochs if cfg.max_epochs is not None else math.inf
        self.max_time = cfg.max_time if cfg.max_time is not None else math.inf
        self.world, self.rank = (parallel.world, parallel.rank) if parallel else (1, 0)
        self.p = TrainState()
        self.resumed_from: int | None = None
        self.device_skip = bool(self.opt.defaults.get("fused"))  # see clip_and_step
        self.read: list[float] = [math.nan, math.nan]
        if self.captured is not None:
            self.zero_grad()  # gradients allocated before the first captured backward

    def resume(self) -> None:
        """Continue from the newest valid checkpoint (resume=auto), if there is one."""
        state = self.checkpoints.resume_state() if self.checkpoints else None
        if state is None:
            return
        if state.get("world", 1) != self.world:
            raise CheckpointError(
                f"{self.checkpoints.last_path} was written by {state.get('world', 1)} "
                f"data-parallel process(es), not {self.world}; resume with the same number of "
                "processes")
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.p = TrainState(**state["progress"])
        checkpoint.set_rng_state(state["rng"])
        self.resumed_from = self.p.step

    def validate(self) -> bool:
        """Validate; True when this is the best validation loss so far."""
        p = self.p
        score = lm_perplexity if getattr(self.model, "task", None) == "lm" else perplexity
        with autocast(self.device, self.cfg.precision):
            p.valid = score(self.model, self.valid_split, self.cfg.max_tokens, self.device)
        metrics = {"valid/loss": p.valid["loss"], "valid/ppl": p.valid["ppl"]}
        if "bits_per_byte" in p.valid:  # a language model's text
            metrics["valid/bits_per_byte"] = p.valid["bits_per_byte"]
        p.history.append({"step": p.step, **metrics})
        self.on_log(p.step, metrics)
        if p.valid["loss"] < p.best_valid:
            p.best_valid = p.valid["loss"]
            p.best_step, p.since_best = p.step, 0
            if self.keep_best:  # on the host: the GPU's memory (and its peak) as without
                self.keep_best_weights()
            return True
        p.since_best += 1
        return False

    def keep_best_weights(self) -> None:
        """A copy of the weights on the host, allocated at the first best, overwritten after."""
        state = self.model.state_dict()
        if self.best_weights is None:
            self.best_weights = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        else:
            for k, v in state.items():
                self.best_weights[k].copy_(v.detach())

    def out_of_patience(self) -> bool:
        """trainer.patience validations in a row without a new best (the same on every rank:
        every rank validates on the same data)."""
        return self.cfg.patience is not None and self.p.since_best >= self.cfg.patience

    def save(self, best: bool = False) -> Path | None:
        if self.checkpoints is None:
            return None
        self.p.peak_mem_mb = max(self.p.peak_mem_mb, self.peak_mb())
        state = {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                 "scheduler": self.sched.state_dict(), "progress": asdict(self.p),
                 "rng": checkpoint.rng_state(), "vocab_size": self.model.vocab_size,
                 "world": self.world}
        return self.checkpoints.save(state, self.p.step, best)

    def forward_backward(self, group: list[np.ndarray]) -> tuple[torch.Tensor, int]:
        """Gradients of one update's batches (this rank's share); returns the summed (loss,
        NLL) over all ranks, on the device (no read back here: see `clip_and_step`), and the
        update's target tokens."""
        model, cfg, parallel = self.model, self.cfg, self.parallel
        world = self.world
        # rank r trains on batches r, r + world, ... of the update; a rank left without one
        # (a short last group) runs a batch with weight 0, so every rank all-reduces once
        mine, weight = ((group[self.rank::world], 1.0) if self.rank < len(group)
                        else (group[:1], 0.0))
        n_tokens = int(sum(self.train_split.scored_lens[ids].sum() for ids in group))  # all ranks
        losses = torch.zeros(2, dtype=torch.float64, device=self.device)
        for i, ids in enumerate(mine):
            batch = pad_batch(collate(self.train_split, ids), cfg.pad_multiple)
            if self.captured is None:
                keep, target = self.real_targets(batch)
            batch = batch.to(self.device)
            with parallel.no_sync(self.net, last=i == len(mine) - 1) if parallel else \
                    nullcontext():
                if self.captured is not None:
                    loss, nll = self.captured(batch.src, batch.tgt_in, batch.tgt_out)
                else:
                    with autocast(self.device, cfg.precision):
                        hidden = self.net(batch.src, batch.tgt_in, hidden_only=True)
                        hidden = hidden.flatten(0, 1).index_select(0, keep)
                        loss, nll = model.loss(hidden, target, cfg.label_smoothing)
                # the gradient of the mean over the whole update (DDP averages over ranks)
                (loss / (n_tokens / world) if weight else loss * 0.0).backward()
            if self.extra is not None and i == 0:  # once per update
                self.extra.loss().backward()
            losses += weight * torch.stack([loss.detach(), nll.detach()]).to(torch.float64)
        if parallel:
            losses = parallel.sum(losses)
        return losses, n_tokens

    def real_targets(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The real (non-pad) target positions of a host batch, flattened, and their tokens, on
        the device: found on the host, since a boolean mask on the device would make the host
        wait for it (the same rows, in the same order, as hidden[keep])."""
        keep = (batch.tgt_out != self.model.pad_id).flatten().nonzero().squeeze(1)
        target = batch.tgt_out.flatten()[keep]
        nb = self.device.type == "cuda"
        return keep.to(self.device, non_blocking=nb), target.to(self.device, non_blocking=nb)

    def clip_and_step(self, losses: torch.Tensor) -> bool:
        """Clip the gradient and apply the update, unless the loss or the gradient is not
        finite; True when it was applied. The check runs on the device: the fused optimizer
        skips a flagged update itself (the `found_inf` of PyTorch's AMP, which also takes
        back Adam's step count), so the host reads the step's losses and the flag once, after
        all of its work is queued (before, the loss was read per batch and the check waited
        for the clipping). A skipped update is counted, and trainer.max_bad_steps of them in
        a row stop the run with Diverged."""
        p, cfg = self.p, self.cfg
        clip = cfg.clip_norm if cfg.clip_norm > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        loss_ok = torch.isfinite(losses[0]).to(losses.dtype)
        ok = loss_ok * torch.isfinite(norm).to(losses.dtype)
        if self.device_skip:
            self.opt.found_inf = (1.0 - ok).float()  # read by the fused step: 1 skips it
            try:
                self.opt.step()
            finally:
                self.opt.found_inf = None
        stats = torch.cat([losses, torch.stack([ok, loss_ok])]).tolist()  # the one read back
        self.read = stats[:2]
        if stats[2]:
            if not self.device_skip:
                self.opt.step()
            self.sched.step()
            self.zero_grad()
            p.bad_in_row = 0
            return True
        self.zero_grad()
        p.skipped += 1
        p.bad_in_row += 1
        log.warning("step %d: non-finite %s; update skipped (%d in a row, %d in all)",
                    p.step + 1, "gradient" if stats[3] else "loss", p.bad_in_row, p.skipped)
        self.on_log(p.step, {"train/skipped_steps": p.skipped})
        if p.bad_in_row >= cfg.max_bad_steps:
            path = self.save()
            kept = f"; checkpoint {path} holds the weights from before it" if path else ""
            raise Diverged(
                f"training diverged: {p.bad_in_row} non-finite steps in a row after step "
                f"{p.step}{kept}; lower trainer.lr, raise trainer.warmup_steps or set "
                "trainer.clip_norm (e.g. 1.0), then start a new run")
        return False

    def zero_grad(self) -> None:
        """Gradients back to none, or with trainer.capture to zero in place: a captured
        backward's gradients live in its CUDA graph's memory, which the next micro-batch's
        replay overwrites, so they must accumulate into tensors allocated outside the graph
        (PyTorch's advice for gradient accumulation under CUDA graphs)."""
        if self.captured is None:
            self.opt.zero_grad(set_to_none=True)
            return
        for param in self.model.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            else:
                param.grad.zero_()

    def log_window(self, n_updates: int) -> None:
        """train/* metrics of the updates since the last log, every log_every steps."""
        p, w = self.p, self.p.window
        if not (p.step % self.cfg.log_every == 0 or p.step == self.max_steps):
            return
        p.last_loss = w["loss"] / w["tokens"]
        self.on_log(p.step, {
            "train/loss": p.last_loss,
            "train/nll": w["nll"] / w["tokens"],
            "train/ppl": math.exp(min(w["nll"] / w["tokens"], 50)),
            "train/lr": self.sched.get_last_lr()[0],
            "train/tokens_per_s": w["tokens"] / w["seconds"],
            "train/seconds": p.train_seconds,  # the updates' seconds so far (trainer.max_time's)
            "train/epoch": p.epoch + p.update / n_updates,
            **(self.extra.metrics() if self.extra is not None else {}),
        })
        p.window = empty_window()

    def after_update(self) -> None:
        """Validate, honour a stop signal (checkpoint, then Preempted) and save on schedule."""
        p, cfg = self.p, self.cfg
        best = False
        if p.step % cfg.valid_every == 0:
            best = self.validate()
            self.model.train()
        signal_name = self.stop_requested()
        if self.parallel:
            signal_name = self.parallel.any_stop(signal_name)
        if signal_name:
            raise Preempted(signal_name, p.step, self.save(best))
        periodic = cfg.save_every and p.step % cfg.save_every == 0
        if (best or periodic) and p.step < self.max_steps:  # the last step is saved in run()
            self.save(best)

    def epoch(self) -> None:
        """The updates left in the current epoch (or until max_steps)."""
        p = self.p
        per_update = self.cfg.update_freq * self.world  # batches in one update, all ranks
        batches = epoch_batches(self.train_split, self.cfg.max_tokens, self.seed, p.epoch)
        n_updates = math.ceil(len(batches) / per_update)  # a short last group is kept
        while (p.update < n_updates and p.step < self.max_steps and not self.out_of_time()
               and not self.out_of_patience()):
            group = batches[p.update * per_update : (p.update + 1) * per_update]
            started = time.perf_counter()
            losses, n_tokens = self.forward_backward(group)
            p.update += 1
            # reading the losses back waits for the step's queued device work: inside the
            # timed window, so that train_seconds, tok/s and trainer.max_time count it
            if not self.clip_and_step(losses):
                continue
            p.step += 1
            p.tokens += n_tokens
            loss, nll = self.read
            elapsed = time.perf_counter() - started
            p.train_seconds += elapsed
            w = p.window
            w["loss"] += loss
            w["nll"] += nll
            w["tokens"] += n_tokens
            w["seconds"] += elapsed
            self.log_window(n_updates)
            self.after_update()
        if p.update >= n_updates:
            p.epoch += 1
            p.update = 0

    def out_of_time(self) -> bool:
        """trainer.max_time spent (the updates' seconds); every data-parallel rank agrees."""
        if self.max_time == math.inf:
            return False
        out = self.p.train_seconds >= self.max_time
        if self.parallel:
            out = self.parallel.any_stop("max_time" if out else None) is not None
        return out

    def run(self) -> TrainResult:
        self.resume()
        p = self.p
        self.model.train()
        stopped = None
        try:
            while p.step < self.max_steps and p.epoch < self.max_epochs:
                stopped = ("max_time" if self.out_of_time() else
                           "patience" if self.out_of_patience() else None)
                if stopped:
                    break
                self.epoch()
        except (RuntimeError, torch.distributed.DistError) as err:
            if self.parallel is None or not is_peer_failure(err):
                raise
            last = self.checkpoints.last_path if self.checkpoints else None
            raise PeerLost(p.step, self.rank, self.world, err, last) from None
        if p.window["tokens"]:
            p.last_loss = p.window["loss"] / p.window["tokens"]
        best = False
        if not p.history or p.history[-1]["step"] != p.step:
            best = self.validate()
        elif p.best_step == p.step:
            best = True  # validated at this very step above, and it was the best
        self.save(best)
        return TrainResult(
            steps=p.step,
            epochs=p.tokens / max(self.train_split.target_tokens(), 1),
            train_loss=p.last_loss,
            tokens=p.tokens,
            train_seconds=p.train_seconds,
            tokens_per_s=p.tokens / max(p.train_seconds, 1e-9),
            valid=p.valid,
            history=p.history,
            skipped_steps=p.skipped,
            resumed_from=self.resumed_from,
            stopped_by=stopped or ("max_steps" if p.step >= self.max_steps else "max_epochs"),
            best_step=p.best_step, peak_mem_mb=p.peak_mem_mb, best_weights=self.best_weights,
        )
