"""Measurements: training throughput of variants taking turns step by step (so drift on a shared
machine hits all alike, median after warm-up), decoding throughput, the matmul ceiling of this
machine, and a variant's peak memory in a process of its own. Benchmarks, not tests."""

from __future__ import annotations

import json
import multiprocessing
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from heads_lab.cost import Lengths, account
from heads_lab.data.tokenizer import EOS
from heads_lab.decode import beam_search, greedy
from heads_lab.device import autocast
from heads_lab.model import Transformer
from heads_lab.schemas import ModelConfig
from heads_lab.train import adam

CPU = torch.device("cpu")


@dataclass
class Variant:
    name: str
    model: ModelConfig
    precision: str = "fp32"
    baseline: bool = False  # torch.nn.Transformer at the same dims
    times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # per token, every step in order

    def build(self, vocab: int) -> torch.nn.Module:
        if self.baseline:
            from heads_lab.bench.baseline import TorchTransformer

            return TorchTransformer(self.model, vocab)
        return Transformer(self.model, vocab)


@dataclass
class Workload:
    """A fixed batch of `batch` pairs of `length` tokens, no padding (the speed issue's small
    config: 64 pairs of 20 tokens, vocab 8000)."""

    batch: int = 64
    length: int = 20
    vocab: int = 8000

    def tensors(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        src = torch.randint(4, self.vocab, (self.batch, self.length), generator=g)
        src[:, -1] = EOS
        tgt_in = torch.randint(4, self.vocab, (self.batch, self.length), generator=g)
        tgt_out = torch.randint(4, self.vocab, (self.batch * self.length,), generator=g)
        return src, tgt_in, tgt_out


def train_step(model, opt, precision: str, src, tgt_in, tgt_out) -> float:
    """One Adam step on the batch; returns the label-smoothed loss per target token."""
    with autocast(CPU, precision):
        hidden = model.decode(tgt_in, model.encode(src))
        loss, _ = model.loss(hidden.reshape(-1, hidden.shape[-1]), tgt_out, 0.1)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item() / tgt_out.numel()


def _optimizer(model, baseline: bool = False) -> torch.optim.Optimizer:
    """heads-lab's Adam (fused) for our model; torch's default Adam, as a user of
    torch.nn.Transformer would write it, for the baseline."""
    if baseline:
        return torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    return adam(model, 1e-4, (0.9, 0.98), 1e-9)


def train_throughput(variants: list[Variant], work: Workload, steps: int = 10, warmup: int = 3,
                     seed: int = 0, per_turn: int = 2) -> list[dict]:
    """Target tokens/s per variant (median over `steps` after `warmup`), with the analytic
    FLOPs/token and the achieved GFLOP/s. Variants take turns, so drift on a shared machine hits
    all alike; each turn runs `per_turn` steps and times the last, so the timed step finds the
    caches as a training run's next step does rather than as another model left them."""
    src, tgt_in, tgt_out = work.tensors(seed)
    runs = []
    for v in variants:
        torch.manual_seed(seed)
        model = v.build(work.vocab).train()
        runs.append((v, model, _optimizer(model, v.baseline)))
    for i in range(warmup + steps):
        for v, model, opt in runs:
            for _ in range(per_turn):
                started = time.perf_counter()
                loss = train_step(model, opt, v.precision, src, tgt_in, tgt_out)
                elapsed = time.perf_counter() - started
                v.losses.append(loss)
            if i >= warmup:
                v.times.append(elapsed)
    tokens = work.batch * work.length
    results = []
    for v, _, _ in runs:
        step_s = statistics.median(v.times)
        flops = account(v.model, work.vocab, Lengths(work.length, work.length))["flops_per_token"]
        results.append({"name": v.name, "precision": v.precision, "step_s": step_s,
                        "tokens_per_s": tokens / step_s, "flops_per_token": flops["train"],
                        "gflops_per_s": flops["train"] * tokens / step_s / 1e9,
                        "losses": v.losses})
    return results


@torch.no_grad()
def decode_throughput(v: Variant, work: Workload, beam: int, use_cache: bool, reps: int = 3,
                      seed: int = 0) -> tuple[float, list[list[int]]]:
    """Sentences/s decoding `work.batch` sources into exactly `work.length` tokens each (EOS held
    back, so an untrained model costs what a trained one would); median of `reps`."""
    torch.manual_seed(seed)
    model = v.build(work.vocab).eval()
    src, _, _ = work.tensors(seed)
    times, out = [], []
    for _ in range(reps + 1):  # the first run warms up
        started = time.perf_counter()
        with autocast(CPU, v.precision):
            if beam == 1:
                out = greedy(model, src, work.length + 1, use_cache, min_len=work.length)
            else:
                out = beam_search(model, src, beam, 0.6, work.length + 1, use_cache,
                                  min_len=work.length)
        times.append(time.perf_counter() - started)
    return work.batch / statistics.median(times[1:]), out


CEILING_SHAPES = ((2048, 1024, 1024), (1024, 2048, 2048), (1280, 256, 1024), (1280, 1024, 256),
                  (1280, 256, 768), (1280, 8000, 256), (256, 1280, 8000))


def matmul_ceiling(dtype: torch.dtype, reps: int = 10) -> float:
    """GFLOP/s of the best of several matmuls, large ones and the bench model's own shapes
    (on this CPU the cache-sized ones run fastest): this machine's ceiling for `dtype`."""
    best = 0.0
    for m, k, n in CEILING_SHAPES:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        for _ in range(2):
            a @ b
        started = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = max(best, 2 * m * k * n * reps / (time.perf_counter() - started) / 1e9)
    return best


def _peak_child(variant: dict, work: dict, out) -> None:
    from omegaconf import OmegaConf

    model = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), variant["model"]))
    v = Variant(variant["name"], model, variant["precision"], variant["baseline"])
    w = Workload(**work)
    torch.manual_seed(0)
    model = v.build(w.vocab).train()
    opt = _optimizer(model, v.baseline)
    for _ in range(3):
        train_step(model, opt, v.precision, *w.tensors())
    with open("/proc/self/status") as f:
        out.put(next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")))


def peak_memory_mb(v: Variant, work: Workload) -> float:
    """Peak resident memory of a fresh process training this variant for 3 steps (Linux)."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    spec = json.loads(json.dumps({"name": v.name, "model": asdict(v.model), "precision": v.precision,
                                  "baseline": v.baseline}, default=lambda e: e.value))
    proc = ctx.Process(target=_peak_child, args=(spec, asdict(work), out))
    proc.start()
    proc.join()
    return out.get(timeout=5) if proc.exitcode == 0 else float("nan")
