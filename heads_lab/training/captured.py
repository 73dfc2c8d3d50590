"""trainer.capture: the training step as compiled graphs with static shapes, for GPUs, where a
small model's step is dominated by fixed costs (kernel launches, host synchronisation, the
optimizer's many small kernels) rather than by its FLOPs.

What changes against the eager step (heads_lab.training.loop):
- forward, loss and backward run as one `torch.compile`d function (AOTAutograd compiles the
  backward with the forward); on CUDA with mode="reduce-overhead", so both are replayed as CUDA
  graphs (torch.compile's cudagraph trees: one recording per batch shape, replayed after);
- the loss is `F.cross_entropy(label_smoothing=ε, ignore_index=pad)` over every position of
  the padded batch (a fixed shape; the eager step scores `hidden[keep]`, whose length depends
  on the data, through its chunked fused output loss). The same loss, summed in another order;
- batches padded to multiples of trainer.pad_multiple (rows, source and target lengths; see
  `pad_batch`), so a run meets a few dozen shapes and records a graph for each once;
- the optimizer stays PyTorch's fused Adam (a few multi-tensor kernels, no host read), with the
  update skipped on the device on a non-finite loss or gradient (`found_inf`), and the loop reads
  its results back once per update, as the eager step does.
On CPU the same function is compiled with inductor's default mode: a step whose losses follow
the eager step's to float tolerance (tests/unit/test_train.py), and slower than eager on this
project's 2-core CPU, where it is for testing only."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from heads_lab.data.batching import Batch
from heads_lab.data.tokenizer import BOS, EOS, PAD
from heads_lab.training.device import autocast


def capture_on(cfg, device, plain: bool = True) -> bool:
    """Whether trainer.capture captures the step on `device`: true and false as set; auto on a
    CUDA device unless trainer.compile=true (the user asked for the compiled forward), off on a
    CPU (slower than eager there), and off where the training is not `plain` (head gates or
    data-parallel ranks: the captured step is not yet tested with them on a GPU)."""
    setting = str(cfg.capture).lower()
    if setting == "auto":
        return getattr(device, "type", str(device)) == "cuda" and not cfg.compile and plain
    return setting == "true"


def pad_batch(batch: Batch, multiple: int) -> Batch:
    """The batch padded to `multiple` rows and `multiple` source and target positions. Added rows
    are empty sentences (source EOS, target input BOS) whose targets are all padding: they take
    no part in the loss or the gradient, and no attention row of theirs is fully masked."""
    if multiple <= 1:
        return batch
    rows, s_len = batch.src.shape
    t_len = batch.tgt_in.shape[1]

    def up(n: int) -> int:
        return -(-n // multiple) * multiple

    R, S, T = up(rows), up(s_len), up(t_len)
    src = torch.full((R, S), PAD, dtype=batch.src.dtype)
    tgt_in = torch.full((R, T), PAD, dtype=batch.tgt_in.dtype)
    tgt_out = torch.full((R, T), PAD, dtype=batch.tgt_out.dtype)
    src[:rows, :s_len], tgt_in[:rows, :t_len], tgt_out[:rows, :t_len] = (
        batch.src, batch.tgt_in, batch.tgt_out)
    src[rows:, 0], tgt_in[rows:, 0] = EOS, BOS
    return Batch(np.asarray(batch.ids), src, tgt_in, tgt_out)


class CapturedLoss:
    """Forward and loss of a padded batch as one compiled function (see the module's text):
    `__call__(src, tgt_in, tgt_out)` returns the summed label-smoothed loss (with its graph) and
    the summed NLL (detached), both fp32, like the eager step's `model.loss`."""

    def __init__(self, net: torch.nn.Module, model: torch.nn.Module, eps: float, precision: str,
                 device: torch.device):
        self.net, self.model, self.eps = net, model, eps
        self.precision, self.device = precision, device
        mode = "reduce-overhead" if device.type == "cuda" else None
        self.compiled = torch.compile(self._loss, mode=mode)

    def _loss(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor]:
        with autocast(self.device, self.precision):
            hidden = self.net(src, tgt_in, hidden_only=True)
            logits = self.model.logits(hidden)
        flat, target = logits.float().flatten(0, 1), tgt_out.flatten()
        pad = self.model.pad_id
        loss = F.cross_entropy(flat, target, ignore_index=pad, label_smoothing=self.eps,
                               reduction="sum")
        nll = F.cross_entropy(flat.detach(), target, ignore_index=pad, reduction="sum")
        return loss, nll

    def __call__(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor]:
        if self.device.type == "cuda":  # a new iteration of cudagraph trees: the previous
            torch.compiler.cudagraph_mark_step_begin()  # step's outputs are not reused
        loss, nll = self.compiled(src, tgt_in, tgt_out)
        return loss, nll
