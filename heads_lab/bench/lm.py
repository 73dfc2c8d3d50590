"""`heads-lab bench --lm`: language-model training and generation speed, heads-lab's decoder-only
model (task=lm) beside peers at the same dims, in one run.

At the LM studies' size (d_model 256, 4 layers, d_ff 1024, vocab 4000; 8 blocks × 256 tokens a
step, dropout 0.1) plus any `model.*` overrides: training tokens/s, GFLOP/s and MFU against this
machine's measured matmul ceiling, and greedy generation tokens/s (`new` tokens after a BOS, every
row the same length), for heads-lab's model with multi-head attention at h ∈ {1, 8, 32},
grouped-query (kv_heads=2), multi-query (kv_heads=1) and talking heads at h = 8; a nanoGPT-style
model in plain PyTorch (bench.baseline.PlainGPT: the same function at the same dims, generating
without a cache as nanoGPT does); with `peers`, Hugging Face's GPT-2 and Llama (and Llama with
kv_heads=2) built from their configs (bench.baseline.HFCausalPeer), generating with their cache.

Every row trains by the same step (forward, summed cross-entropy — no label smoothing, as the LM
recipe — backward, heads-lab's AdamW step), so the rows differ by their implementation: each
model's own layers, dropout and output loss (heads-lab's fused, chunked one; the peers' full
logits). Dropout is not the same work everywhere: heads-lab and the nanoGPT-style model drop the
embeddings, each residual branch and the feed-forward's inner activation; GPT-2 drops the
embeddings and residual branches only; Llama drops nothing (it has attention dropout alone, 0
here). FLOPs are counted per row by torch.utils.flop_counter on one forward pass with SDPA's math
path (its fused CPU kernel goes uncounted otherwise; a training step: 3×), so a peer with more
work at the same dims (Llama's three-matrix feed-forward) is credited for it. Rows take turns
(each turn runs two steps and times the second, so drift on a shared machine hits all alike);
each number is a median. Generation: every row runs `new` decoding steps after a BOS (heads-lab's
last one its forced EOS), greedy, a forward pass per step.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from heads_lab.bench.baseline import LM_PEERS
from heads_lab.config.schemas import AttentionKind, ModelConfig, TrainerConfig
from heads_lab.data.tokenizer import BOS
from heads_lab.model import LanguageModel
from heads_lab.model.decode import greedy
from heads_lab.training.device import autocast, matmul_ceiling, synchronize
from heads_lab.training.optim import optimizer

BASE = dict(d_model=256, d_ff=1024, layers=4, dropout=0.1, max_positions=512, heads=8)
MHA8 = "mha h=8"


@dataclass
class LMWorkload:
    """A fixed batch of `batch` blocks of `length` tokens (BOS + text), vocab `vocab`, on
    `device`; generation: `new` tokens after a BOS for each of the `batch` rows."""

    batch: int = 8
    length: int = 256
    vocab: int = 4000
    new: int = 64
    device: str = "cpu"

    def tensors(self, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)  # drawn on CPU: every device gets the same batch
        tokens = torch.randint(4, self.vocab, (self.batch, self.length + 1), generator=g)
        tokens[:, 0] = BOS
        device = torch.device(self.device)
        return tokens[:, :-1].to(device), tokens[:, 1:].reshape(-1).to(device)


@dataclass
class LMRow:
    name: str
    model: ModelConfig
    precision: str = "fp32"
    peer: str | None = None  # None: heads-lab's LanguageModel; else bench.baseline.LM_PEERS
    times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    def build(self, vocab: int, device: torch.device) -> torch.nn.Module:
        if self.peer is None:
            return LanguageModel(self.model, vocab).to(device)
        return LM_PEERS[self.peer](self.model, vocab).to(device)


def rows(model: ModelConfig, quick: bool = False, peers: bool = False,
         precision: str = "fp32") -> list[LMRow]:
    """heads-lab's rows (quick: h = 8 and kv_heads = 1 only), the plain PyTorch peer at h = 8,
    and with `peers` GPT-2 and Llama at h = 8 and Llama with kv_heads = 2."""
    def with_(**kw) -> ModelConfig:
        return dataclasses.replace(model, **kw)

    def mha(heads: int, kv_heads: int | None = None) -> ModelConfig:  # d_k = d_model / h
        return with_(heads=heads, kv_heads=kv_heads, attention=AttentionKind.mha, head_dim=None)

    ours = [LMRow(MHA8, mha(8), precision), LMRow("mha h=8 kv_heads=1", mha(8, 1), precision)]
    if not quick:
        talking = with_(heads=8, attention=AttentionKind.talking_heads, head_dim=None)
        ours = [LMRow("mha h=1", mha(1), precision), ours[0], LMRow("mha h=32", mha(32), precision),
                LMRow("mha h=8 kv_heads=2", mha(8, 2), precision), ours[1],
                LMRow("talking_heads h=8", talking, precision)]
    out = ours + [LMRow("nanoGPT-style h=8", mha(8), precision, peer="plain")]
    if peers:
        out += [LMRow("HF GPT-2 h=8", mha(8), precision, peer="gpt2"),
                LMRow("HF Llama h=8", mha(8), precision, peer="llama"),
                LMRow("HF Llama h=8 kv_heads=2", mha(8, 2), precision, peer="llama")]
    return out


def lm_step(model, opt, precision: str, tokens: torch.Tensor, target: torch.Tensor) -> float:
    """One training step: summed cross-entropy of the next token, backward, the optimiser's
    step; returns the loss per token (reading it waits for the device)."""
    with autocast(tokens.device, precision):
        hidden = model.decode(tokens)
        loss, _ = model.loss(hidden.reshape(-1, hidden.shape[-1]), target, 0.0)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item() / target.numel()


def forward_flops(model, tokens: torch.Tensor) -> float:
    """FLOPs of one forward pass over `tokens` with the output layer, by torch's counter, SDPA
    through its math path (whose products the counter sees; the fused CPU kernel it misses)."""
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model.logits(model.decode(tokens))
    return float(counter.get_total_flops())


def generate(row: LMRow, model, work: LMWorkload, use_cache: bool = True) -> list[list[int]]:
    """`work.new` greedy decoding steps after a BOS for each of `work.batch` rows: heads-lab's
    decoder (cached or not; EOS held back but at the last step, its length limit), a peer's own
    `generate`."""
    start = torch.full((work.batch, 1), BOS, dtype=torch.long, device=torch.device(work.device))
    if row.peer is not None:
        return model.generate(start, work.new)
    empty = start[:, :0]  # a language model reads no source
    return greedy(model, empty, work.new, use_cache, min_len=work.new)


def generation_throughput(row: LMRow, model, work: LMWorkload, use_cache: bool = True,
                          reps: int = 3) -> tuple[float, list[list[int]]]:
    """Generated tokens/s (median of `reps` after one warm-up) and the tokens."""
    times, out = [], []
    with torch.no_grad(), autocast(torch.device(work.device), row.precision):
        for _ in range(reps + 1):
            started = time.perf_counter()
            out = generate(row, model, work, use_cache)
            synchronize(torch.device(work.device))
            times.append(time.perf_counter() - started)
    return work.batch * work.new / statistics.median(times[1:]), out


def run(model: ModelConfig, work: LMWorkload | None = None, steps: int = 10, warmup: int = 3,
        quick: bool = False, peers: bool = False, decode: bool = True, precision: str = "fp32",
        log=print, per_turn: int = 2, seed: int = 0) -> dict:
    """Measure every row; returns {'rows': [...], 'ceilings': ..., 'workload': ..., ...}."""
    work = work or LMWorkload()
    device = torch.device(work.device)
    ceiling = matmul_ceiling(torch.bfloat16 if precision == "bf16" else torch.float32,
                             device=device)
    log(f"matmul ceiling ({precision}): {ceiling:.0f} GFLOP/s")
    table = rows(model, quick, peers, precision)
    tokens, target = work.tensors(seed)
    recipe = TrainerConfig(optimizer="adamw", lr=1e-3, adam_betas=[0.9, 0.95], adam_eps=1e-8,
                           weight_decay=0.1)
    built = []
    for row in table:
        torch.manual_seed(seed)
        net = row.build(work.vocab, device).train()
        built.append((row, net, optimizer(net, recipe)))
    log(f"training {len(table)} models, taking turns: {warmup} warm-up + {steps} measured steps "
        f"of {work.batch} × {work.length} tokens")
    for i in range(warmup + steps):
        for row, net, opt in built:
            for _ in range(per_turn):  # time the last: caches as a run's next step finds them
                started = time.perf_counter()
                row.losses.append(lm_step(net, opt, row.precision, tokens, target))
                elapsed = time.perf_counter() - started
            if i >= warmup:
                row.times.append(elapsed)
    per_step = work.batch * work.length
    results = []
    for row, net, _ in built:
        net.eval()
        flops = 3 * forward_flops(net, tokens) / per_step
        step_s = statistics.median(row.times)
        result = {"name": row.name, "peer": row.peer, "precision": row.precision,
                  "params": sum(p.numel() for p in net.parameters()), "step_s": step_s,
                  "tokens_per_s": per_step / step_s, "flops_per_token": flops,
                  "gflops_per_s": flops * per_step / step_s / 1e9,
                  "mfu": flops * per_step / step_s / 1e9 / ceiling, "losses": row.losses,
                  "generation": "cached" if row.peer != "plain" else "no cache (nanoGPT's)"}
        if decode:
            result["generate_tokens_per_s"], out = generation_throughput(row, net, work)
            if row.name == MHA8:
                result["generate_uncached_tokens_per_s"], plain = generation_throughput(
                    row, net, work, use_cache=False)
                result["cache_identical"] = out == plain
        log(f"  {row.name}: {result['tokens_per_s']:,.0f} tok/s")
        results.append(result)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"lm": True, "rows": results, "ceiling": ceiling, "precision": precision,
            "workload": dataclasses.asdict(work), "steps": steps, "warmup": warmup,
            "threads": torch.get_num_threads(), "device": device_name,
            "model": {k: getattr(model, k) for k in ("d_model", "d_ff", "layers", "dropout",
                                                    "max_positions")}}
