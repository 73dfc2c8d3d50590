"""Measurements: training throughput of variants taking turns step by step (so drift on a shared
machine hits all alike, median after warm-up), decoding throughput, the matmul ceiling of this
machine, and a variant's peak memory in a process of its own. Benchmarks, not tests. On CPU or
a CUDA device (`Workload.device`); on CUDA every timing ends with a synchronize."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
from omegaconf import OmegaConf

from heads_lab.bench.baseline import PEERS
from heads_lab.config.cost import Lengths, account
from heads_lab.config.schemas import ModelConfig
from heads_lab.data.tokenizer import EOS
from heads_lab.model import Transformer, kernels
from heads_lab.model.decode import beam_search, greedy
from heads_lab.training.captured import CapturedLoss
from heads_lab.training.device import autocast, resolve_device, synchronize
from heads_lab.training.optim import adam

CPU = torch.device("cpu")


@dataclass
class Variant:
    name: str
    model: ModelConfig
    precision: str = "fp32"
    baseline: bool = False  # a peer at the same dims, not heads-lab's model: `peer`
    peer: str = "torch.nn"  # with baseline: bench.baseline.PEERS' torch.nn or marian
    compile: bool = False  # the training forward through torch.compile, as trainer.compile=true
    capture: bool = False  # forward, loss and backward compiled as one, as trainer.capture=true
    talking_heads_path: str | None = None  # "explicit" / "folded" (model.kernels); None: auto
    times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # per token, every step in order

    @contextlib.contextmanager
    def path(self):
        """Talking heads' path (kernels.TALKING_HEADS_PATH) as this row asks, while it runs."""
        before = kernels.TALKING_HEADS_PATH
        kernels.TALKING_HEADS_PATH = self.talking_heads_path or before
        try:
            yield
        finally:
            kernels.TALKING_HEADS_PATH = before

    def build(self, vocab: int, device: torch.device = CPU) -> torch.nn.Module:
        if self.baseline:
            return PEERS[self.peer](self.model, vocab).to(device)
        return Transformer(self.model, vocab).to(device)


@dataclass
class Workload:
    """A fixed batch of `batch` pairs of `length` tokens, no padding (the speed issue's small
    config: 64 pairs of 20 tokens, vocab 8000), on `device` (a name: "cpu", "cuda", "cuda:1")."""

    batch: int = 64
    length: int = 20
    vocab: int = 8000
    device: str = "cpu"

    @property
    def torch_device(self) -> torch.device:
        """The device, as a run resolves it (on CUDA, cuDNN out of fused attention: also in
        peak_memory_mb's fresh process, which inherits no such setting)."""
        return resolve_device(self.device)

    def tensors(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)  # drawn on CPU, so every device gets the same batch
        src = torch.randint(4, self.vocab, (self.batch, self.length), generator=g)
        src[:, -1] = EOS
        tgt_in = torch.randint(4, self.vocab, (self.batch, self.length), generator=g)
        tgt_out = torch.randint(4, self.vocab, (self.batch * self.length,), generator=g)
        return tuple(t.to(self.torch_device) for t in (src, tgt_in, tgt_out))


def train_step(model, opt, precision: str, src, tgt_in, tgt_out, net=None,
               captured: CapturedLoss | None = None) -> float:
    """One Adam step on the batch; returns the label-smoothed loss per target token (reading
    it back waits for the device, so a step's time is the step's). `net`: the model's compiled
    forward (trainer.compile), else the model's own encode/decode; `captured`: forward and loss
    as trainer.capture compiles them."""
    if captured is not None:
        loss, _ = captured(src, tgt_in, tgt_out)
    else:
        with autocast(src.device, precision):
            hidden = (net(src, tgt_in, hidden_only=True) if net is not None
                      else model.decode(tgt_in, model.encode(src)))
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
        model = v.build(work.vocab, work.torch_device).train()
        net = torch.compile(model, dynamic=True) if v.compile else None
        captured = (CapturedLoss(model, model, 0.1, v.precision, work.torch_device)
                    if v.capture else None)
        runs.append((v, model, _optimizer(model, v.baseline), net, captured))
    for i in range(warmup + steps):
        for v, model, opt, net, captured in runs:
            for _ in range(per_turn):
                started = time.perf_counter()
                with v.path():
                    loss = train_step(model, opt, v.precision, src, tgt_in, tgt_out, net,
                                      captured)
                elapsed = time.perf_counter() - started
                v.losses.append(loss)
            if i >= warmup:
                v.times.append(elapsed)
    tokens = work.batch * work.length
    results = []
    for v, *_ in runs:
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
    model = v.build(work.vocab, work.torch_device).eval()
    src, _, _ = work.tensors(seed)
    times, out = [], []
    for _ in range(reps + 1):  # the first run warms up
        started = time.perf_counter()
        with autocast(src.device, v.precision), v.path():
            if v.baseline and v.peer == "marian":  # its own generate, with its own cache
                out = model.generate(src, beam, work.length)
            elif beam == 1:
                out = greedy(model, src, work.length + 1, use_cache, min_len=work.length)
            else:
                out = beam_search(model, src, beam, 0.6, work.length + 1, use_cache,
                                  min_len=work.length)
        synchronize(src.device)
        times.append(time.perf_counter() - started)
    return work.batch / statistics.median(times[1:]), out


def _peak_child(variant: dict, work: dict, out) -> None:
    model = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), variant["model"]))
    v = Variant(variant["name"], model, variant["precision"], variant["baseline"],
                variant.get("peer", "torch.nn"),
                talking_heads_path=variant.get("talking_heads_path"))
    w = Workload(**work)
    torch.manual_seed(0)
    model = v.build(w.vocab, w.torch_device).train()
    opt = _optimizer(model, v.baseline)
    for _ in range(3):
        with v.path():
            train_step(model, opt, v.precision, *w.tensors())
    if w.torch_device.type == "cuda":
        out.put(torch.cuda.max_memory_allocated(w.torch_device) / 2**20)
        return
    with open("/proc/self/status") as f:
        out.put(next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")))


def peak_memory_mb(v: Variant, work: Workload) -> float:
    """Peak memory of a fresh process training this variant for 3 steps: resident (Linux) on
    CPU, CUDA allocations on a GPU."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    spec = json.loads(json.dumps({"name": v.name, "model": asdict(v.model), "precision": v.precision,
                                  "baseline": v.baseline, "peer": v.peer,
                                  "talking_heads_path": v.talking_heads_path},
                                 default=lambda e: e.value))
    proc = ctx.Process(target=_peak_child, args=(spec, asdict(work), out))
    proc.start()
    proc.join()
    return out.get(timeout=5) if proc.exitcode == 0 else float("nan")
