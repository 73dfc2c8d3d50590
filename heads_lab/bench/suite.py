"""`heads-lab bench`: the standard speed table and its targets, in one run.

At the small config (d_model 256, 3+3 layers, d_ff 1024, vocab 8000, 64 pairs × 20 tokens,
dropout 0.1, Adam) plus any `model.*` overrides: training tokens/s, GFLOP/s and MFU against this
machine's measured matmul ceiling, peak memory, and decoding sentences/s (greedy and beam 4, with
and without the key/value cache) for multi-head attention at h ∈ {1, 2, 4, 8, 16, 32}, talking
heads at 8 and 32, multi-query (kv_heads=1), bf16 autocast, and torch.nn.Transformer.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from heads_lab.bench.measure import (
    Variant,
    Workload,
    decode_throughput,
    peak_memory_mb,
    train_throughput,
)
from heads_lab.config.compose import cache_dir
from heads_lab.config.schemas import (
    AttentionKind,
    CleaningConfig,
    ModelConfig,
    Multi30kDataConfig,
    PathsConfig,
)
from heads_lab.config.variants import VARIANTS
from heads_lab.data import prepare
from heads_lab.data.batching import epoch_batches, padding_fraction
from heads_lab.training.device import matmul_ceiling, native_bf16

BASE = dict(d_model=256, d_ff=1024, encoder_layers=3, decoder_layers=3, dropout=0.1)
MHA8 = "mha h=8"


def variants(model: ModelConfig, quick: bool = False, precision: str = "fp32",
             compile: bool = False, bf16: bool = True, capture_all: bool = False,
             peers: bool = False) -> list[Variant]:
    """Every row in fp32 plus each variant at h = 8 in bf16 (the CPU table; `bf16=False`, a CPU
    without native bf16, leaves the bf16 rows out: emulated, they took over ten minutes); with
    `precision="bf16"` (a GPU's table) every row in bf16, torch.nn.Transformer too, plus
    multi-head h = 8 in fp32 for the loss-curve check. `compile`: multi-head h = 8 twice more,
    with its training forward compiled (trainer.compile=true) and with forward, loss and backward
    compiled as one (trainer.capture: CUDA graphs on a GPU, as a GPU run trains by default);
    `capture_all` too: every variant's quick rows (multi-head h = 1, 8, 32 and kv_heads=1,
    talking heads h = 8 and 32) captured (each compiles: minutes on a GPU). `peers`: Hugging
    Face's Marian at h = 8 as well (bench.baseline.MarianPeer; the hf extra), and with `compile`
    torch.nn.Transformer and Marian through torch.compile too, as their users would speed them
    up."""
    def with_(**kw) -> ModelConfig:
        return dataclasses.replace(model, **kw)

    main = precision
    out = [Variant("torch.nn.Transformer h=8", with_(heads=8), precision=main, baseline=True)]
    other = []
    for name, entry in VARIANTS.items():  # each attention variant's own rows (heads_lab.config.variants)
        kind = AttentionKind(name)
        out += [Variant(label, with_(attention=kind, **kw), precision=main)
                for label, kw in entry.bench(quick)]
        if main == "fp32" and bf16:
            other += [Variant(f"{name} h=8 bf16", with_(attention=kind, heads=8), precision="bf16")]
    if main == "bf16":
        other.append(Variant("mha h=8 fp32", with_(heads=8)))
    if peers:
        other.append(Variant("Marian h=8", with_(heads=8), precision=main, baseline=True,
                             peer="marian"))
    if compile and peers:
        other += [Variant(f"{name} h=8 compiled", with_(heads=8), precision=main, baseline=True,
                          peer=peer, compile=True)
                  for name, peer in (("torch.nn.Transformer", "torch.nn"), ("Marian", "marian"))]
    if compile:
        other.append(Variant(f"{MHA8} compiled", with_(heads=8), precision=main, compile=True))
        rows = [(name, label, kw) for name, entry in VARIANTS.items()
                for label, kw in entry.bench(True) if capture_all or label == MHA8]
        other += [Variant(f"{label} captured", with_(attention=AttentionKind(name), **kw),
                          precision=main, capture=True) for name, label, kw in rows]
    if not quick or main == "bf16":  # talking heads through one fused kernel (the GPU's table
        # too, quick or not: model.kernels.folded_talking_heads is measured there)
        other.append(Variant("talking_heads h=8 folded", with_(
            attention=AttentionKind.talking_heads, heads=8), precision=main,
            talking_heads_path="folded"))
    return out + other


def run(model: ModelConfig, steps: int = 10, warmup: int = 3, quick: bool = False,
        peak: bool = True, decode: bool = True, log=print, work: Workload | None = None,
        precision: str = "fp32", compile: bool = False, capture_all: bool = False,
        peers: bool = False) -> dict:
    """Measure everything; returns {'rows': [...], 'ceilings': ..., 'padding': ..., 'targets': ...}.
    `work` sets the batch and the device (default: 64 × 20 tokens on CPU); `precision` the
    table's main precision (see `variants`)."""
    work = work or Workload()
    device = work.torch_device
    ceilings = {"fp32": matmul_ceiling(torch.float32, device=device),
                "bf16": matmul_ceiling(torch.bfloat16, device=device)}
    log(f"matmul ceilings (GFLOP/s): fp32 {ceilings['fp32']:.0f}, bf16 {ceilings['bf16']:.0f}")
    bf16 = device.type == "cuda" or native_bf16()
    if not bf16:
        log("bf16 rows left out: this CPU has no native bf16 (AVX512-BF16 or AMX), so bf16 "
            "products are emulated, tens of times slower than fp32")
    vs = variants(model, quick, precision, compile, bf16, capture_all, peers)
    log(f"training {len(vs)} variants, taking turns: {warmup} warm-up + {steps} measured steps")
    rows = train_throughput(vs, work, steps=steps, warmup=warmup)
    for row, v in zip(rows, vs):
        row["mfu"] = row["gflops_per_s"] / ceilings[v.precision]
        if peak:
            row["peak_mb"] = peak_memory_mb(v, work)
        # decoding stays eager: the mha h=8 row is this one's (Marian's: its generate, cached)
        if decode and not (v.compile or v.capture):
            caches = ((True,) if v.peer == "marian" else (False,)) if v.baseline else (
                (True, False) if v.name == MHA8 else (True,))
            for use_cache in caches:
                suffix = "" if use_cache else "_uncached"
                row[f"greedy{suffix}"], g = decode_throughput(v, work, 1, use_cache)
                row[f"beam4{suffix}"], b = decode_throughput(v, work, 4, use_cache)
                row[f"outputs{suffix}"] = (g, b)
        log(f"  {row['name']}: {row['tokens_per_s']:,.0f} tok/s")
    by = {r["name"]: r for r in rows}
    if decode:
        mha = by[MHA8]
        mha["cache_identical"] = mha.pop("outputs") == mha.pop("outputs_uncached")
    for r in rows:
        r.pop("outputs", None)
        r.pop("outputs_uncached", None)
    padding = multi30k_padding()
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"rows": rows, "ceilings": ceilings, "padding": padding,
            "targets": targets(by, padding, decode, precision, device.type),
            "threads": torch.get_num_threads(), "device": device_name, "precision": precision,
            "workload": dataclasses.asdict(work), "steps": steps, "warmup": warmup}


def multi30k_padding(max_tokens: int = 4096) -> float | None:
    """Padding fraction of length-bucketed Multi30k training batches (None without the data)."""
    root = Path(os.environ.get("HEADS_LAB_DATA", "/nonexistent"))
    if not any((r / "train.de.gz").is_file() or (r / "train.de").is_file()
               for r in (root, root / "multi30k")):
        return None
    corpus = prepare(Multi30kDataConfig(cleaning=CleaningConfig(max_ratio=None)),
                     cache_dir(PathsConfig()))
    train = corpus.splits["train"]
    return padding_fraction(train, epoch_batches(train, max_tokens, seed=1, epoch=0))


def targets(by: dict, padding: float | None, decode: bool, precision: str = "fp32",
            device: str = "cpu") -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) for each target of the speed issues: on CPU in fp32 (issue 20),
    on a GPU in bf16 (issue 37: ≥ 1.3× torch.nn.Transformer, ≥ 40 % MFU of the measured bf16
    ceiling)."""
    mha, torch_tf = by[MHA8], by["torch.nn.Transformer h=8"]
    mfu_goal = 0.4 if device == "cuda" else 0.5
    ratio = mha["tokens_per_s"] / torch_tf["tokens_per_s"]
    peers = {name: r for name, r in by.items() if name.startswith(("torch.nn.Transformer h=8",
                                                                    "Marian h=8"))}
    captured = by.get(f"{MHA8} captured")
    out = [
        (f"{precision} h=8 ≥ 1.3× torch.nn.Transformer", f"{ratio:.2f}×", ratio >= 1.3),
        (f"{precision} h=8 MFU ≥ {mfu_goal:.0%}", f"{mha['mfu']:.0%}", mha["mfu"] >= mfu_goal),
    ]
    if captured and len(peers) > 1:  # the bar: the captured step against every peer
        fastest = max(peers, key=lambda name: peers[name]["tokens_per_s"])
        ratio = captured["tokens_per_s"] / peers[fastest]["tokens_per_s"]
        out.append((f"h=8 captured ≥ 1.3× the fastest peer ({fastest})", f"{ratio:.2f}×",
                    ratio >= 1.3))
    if precision == "fp32" and f"{MHA8} bf16" not in by:  # a CPU without native bf16
        none = "n/a (no native bf16 on this CPU)"
        out += [("bf16 ≥ 1.4× fp32 (h=8)", none, None),
                ("bf16 loss curve within 2 % of fp32", none, None)]
        fp32_loss = bf16_loss = None
    elif precision == "fp32":
        bf16 = by[f"{MHA8} bf16"]
        out.append(("bf16 ≥ 1.4× fp32 (h=8)", f"{bf16['tokens_per_s'] / mha['tokens_per_s']:.2f}×",
                    bf16["tokens_per_s"] >= 1.4 * mha["tokens_per_s"]))
        fp32_loss, bf16_loss = mha["losses"], bf16["losses"]
    else:
        fp32_loss, bf16_loss = by[f"{MHA8} fp32"]["losses"], mha["losses"]
    if fp32_loss:
        gap = max(abs(a - b) / a for a, b in zip(fp32_loss, bf16_loss))
        out.append((f"bf16 loss curve within 2 % of fp32 ({len(fp32_loss)} steps, same init and "
                    f"batch)", f"max {gap:.2%}; loss {fp32_loss[0]:.2f} → {fp32_loss[-1]:.2f} "
                    f"(bf16 {bf16_loss[-1]:.2f})", gap <= 0.02))
    for h, goal in ((8, 0.85), (32, 0.7)):
        th, base = by.get(f"talking_heads h={h}"), by.get(f"mha h={h}")
        if th and base:
            ratio = th["tokens_per_s"] / base["tokens_per_s"]
            out.append((f"talking heads h={h} ≥ {goal}× mha", f"{ratio:.2f}×", ratio >= goal))
        th, base = by.get(f"talking_heads h={h} captured"), by.get(f"mha h={h} captured")
        if th and base:  # both captured: inductor may fuse the mixes with the softmax
            ratio = th["tokens_per_s"] / base["tokens_per_s"]
            out.append((f"talking heads h={h} captured ≥ 0.9× mha captured", f"{ratio:.2f}×",
                        ratio >= 0.9))
    if decode:
        for mode in ("greedy", "beam4"):
            ratio = mha[mode] / mha[f"{mode}_uncached"]
            out.append((f"{mode} with cache ≥ 3× without", f"{ratio:.1f}×", ratio >= 3))
        out.append(("cached outputs identical to uncached", str(mha["cache_identical"]),
                    mha["cache_identical"]))
    out.append(("Multi30k padding < 10 %", "n/a (no Multi30k under $HEADS_LAB_DATA)" if padding is None
                else f"{padding:.1%}", None if padding is None else padding < 0.10))
    return out
