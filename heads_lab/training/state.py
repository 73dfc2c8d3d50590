"""What the training loop returns (TrainResult), where it stands (TrainState, saved in every
checkpoint for an exact resume), the ways it stops early (Preempted, PeerLost, Diverged), and the
extra loss term it accepts (ExtraLoss: Hard Concrete gates' λ·L0)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from heads_lab.errors import HeadsLabError


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
    stopped_by: str = "max_steps"  # what ended training: max_steps, max_epochs, max_time, patience
    best_step: int | None = None  # the step of the best validation loss (checkpoints/best.pt)
    # the largest peak memory (MB) of the processes that trained this run, as of its last
    # checkpoint: a resumed run's own process may have done little (an evaluation only)
    peak_mem_mb: float = 0.0
    # train(keep_best=True): the best validation's weights (best_step's), a copy on the host
    best_weights: dict[str, torch.Tensor] | None = field(default=None, repr=False)


@dataclass
class TrainState:
    """Where training stands: everything besides model/optimizer/schedule/RNG that a resumed
    run needs to continue exactly (it is saved in every checkpoint)."""

    step: int = 0
    epoch: int = 0
    update: int = 0  # the next update's index in this epoch's batch order
    tokens: int = 0
    train_seconds: float = 0.0
    last_loss: float = float("nan")
    window: dict[str, float] = field(default_factory=lambda: empty_window())
    history: list[dict[str, float]] = field(default_factory=list)
    valid: dict[str, float] = field(default_factory=dict)
    best_valid: float = math.inf
    best_step: int | None = None
    skipped: int = 0
    bad_in_row: int = 0
    since_best: int = 0  # validations since the last new best (trainer.patience)
    peak_mem_mb: float = 0.0  # the largest peak of the processes so far, at each save (MB)


class Preempted(HeadsLabError):
    """A stop signal arrived; a checkpoint was saved and the run can be resumed."""

    def __init__(self, signal_name: str, step: int, path: Path | None):
        where = f"checkpoint {path}" if path else "no checkpoint (checkpoints are off)"
        self.stopped = f"stopped by {signal_name} at step {step}; saved {where}"
        super().__init__(f"{self.stopped}; run the same command with hydra.run.dir=<this run dir> "
                         "to resume")
        self.signal_name, self.step = signal_name, step


class PeerLost(HeadsLabError):
    """A data-parallel peer died, froze past trainer.dist_timeout_s or lost its connection."""

    def __init__(self, step: int, rank: int, world: int, err: BaseException, last: Path | None):
        cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        cause = cause.split("] ", 1)[-1].split(". ")[0]  # no source location, no advice
        saved = f"; the newest checkpoint is {last}" if last else ""
        super().__init__(f"data-parallel training stopped at step {step} (rank {rank} of {world}): "
                         f"a peer was lost: {cause[:300]}{saved}; run the same command on every "
                         "node again to resume")


class Diverged(HeadsLabError):
    """Too many non-finite steps in a row."""


def empty_window() -> dict[str, float]:
    return {"loss": 0.0, "nll": 0.0, "tokens": 0, "seconds": 0.0}


class ExtraLoss(Protocol):
    """A term added to the loss once per update (Hard Concrete gates' λ·L0): its value, the
    metrics it logs, and its parameters with their own learning rates."""

    def loss(self) -> torch.Tensor: ...

    def metrics(self) -> dict[str, float]: ...

    def param_groups(self, lr: float) -> list[tuple[list[torch.nn.Parameter], float]]: ...
