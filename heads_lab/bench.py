"""Training throughput of model variants measured side by side: the variants take turns step by
step (so drift on a shared machine hits all alike), and each reports the median of its steps
after warm-up. A benchmark, not a test: nothing asserts a speed."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from heads_lab.config import ModelConfig
from heads_lab.cost import Lengths, account
from heads_lab.model import Transformer, label_smoothed_loss
from heads_lab.train import autocast


@dataclass
class Variant:
    name: str
    model: ModelConfig
    precision: str = "fp32"
    times: list[float] = field(default_factory=list)


@dataclass
class Workload:
    """A fixed synthetic batch: `batch` pairs of `length` tokens, no padding (bench config of
    the speed issue: 64 pairs of 20 tokens, vocab 8000)."""

    batch: int = 64
    length: int = 20
    vocab: int = 8000


def train_throughput(variants: list[Variant], work: Workload, steps: int = 10, warmup: int = 3,
                     seed: int = 0) -> list[dict[str, float]]:
    """Target tokens/s per variant (median over `steps` after `warmup`), with FLOPs/token and
    achieved GFLOP/s from the analytic cost account."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, work.vocab, (work.batch, work.length), generator=g)
    tgt_in = torch.randint(4, work.vocab, (work.batch, work.length), generator=g)
    tgt_out = torch.randint(4, work.vocab, (work.batch * work.length,), generator=g)
    runs = []
    for v in variants:
        torch.manual_seed(seed)
        model = Transformer(v.model, work.vocab).train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                               foreach=True)
        runs.append((v, model, opt))
    for i in range(warmup + steps):
        for v, model, opt in runs:  # take turns, so machine drift hits every variant alike
            started = time.perf_counter()
            with autocast(torch.device("cpu"), v.precision):
                hidden = model.decode(tgt_in, model.encode(src))
                loss, _ = label_smoothed_loss(model.logits(hidden).view(-1, work.vocab), tgt_out,
                                              0.1)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i >= warmup:
                v.times.append(time.perf_counter() - started)
    tokens = work.batch * work.length
    results = []
    for v, _, _ in runs:
        step_s = statistics.median(v.times)
        flops = account(v.model, work.vocab, Lengths(work.length, work.length))["flops_per_token"]
        results.append({"name": v.name, "step_s": step_s, "tokens_per_s": tokens / step_s,
                        "flops_per_token": flops["train"],
                        "gflops_per_s": flops["train"] * tokens / step_s / 1e9})
    return results
