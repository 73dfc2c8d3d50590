"""`heads-lab bench --depth`: the cost side of Liu et al. 2021 ("Multi-head or Single-head?").

A shallow multi-head model (L layers of h heads, head_dim d/h, FFN d_ff) and the deep single-head
model that splits each of its layers into h single-head layers (L·h layers of one head of the same
head_dim, FFN d_ff/h) attend with the same number of heads and have the same parameters and FLOPs
(up to the extra LayerNorms). What differs is depth: tokens/s and memory as batch size and
sentence length grow, each point measured in a process of its own (fp32, on the CPU), plotted to a
PNG. Memory is the training's own: the process's peak resident memory above what it held once
torch was imported, before the model was built (it still counts the runtime's first allocations,
about 100 MB on a CPU and the same for both models)."""

from __future__ import annotations

import dataclasses
import multiprocessing
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from heads_lab.bench.measure import Workload, _optimizer, train_step
from heads_lab.config.cost import parameter_count
from heads_lab.config.schemas import ModelConfig
from heads_lab.model import Transformer


def pair(shallow: ModelConfig) -> tuple[ModelConfig, ModelConfig]:
    """The shallow multi-head model and its deep single-head twin."""
    h = shallow.heads
    if shallow.d_ff % h:
        raise ValueError(f"d_ff={shallow.d_ff} must be divisible by heads={h} to split layers")
    deep = dataclasses.replace(shallow, heads=1, head_dim=shallow.d_head, kv_heads=None,
                               d_ff=shallow.d_ff // h, encoder_layers=shallow.encoder_layers * h,
                               decoder_layers=shallow.decoder_layers * h)
    return shallow, deep


def _status(key: str) -> float:
    """A /proc/self/status memory line (VmRSS, VmHWM) in MB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key + ":"))


def _reset_peak() -> None:
    """Start VmHWM again from the current resident set (Linux ≥ 4.0: clear_refs 5); where that
    is refused the peak keeps torch's import, which the baseline then takes off only roughly."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _point(model: dict, work: dict, steps: int, out) -> None:
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), model))
    _reset_peak()
    start = _status("VmRSS")
    w = Workload(**work)
    torch.manual_seed(0)
    net = Transformer(cfg, w.vocab).train()
    opt = _optimizer(net)
    tensors = w.tensors()
    times = []
    for i in range(2 + steps):
        started = time.perf_counter()
        train_step(net, opt, "fp32", *tensors)
        if i >= 2:
            times.append(time.perf_counter() - started)
    out.put((w.batch * w.length / statistics.median(times), _status("VmHWM") - start))


def measure(cfg: ModelConfig, work: Workload, steps: int) -> tuple[float, float]:
    """(tokens/s, peak MB above the process's start) of a fresh process training `cfg` on
    `work`; RuntimeError where that process fails."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    spec = dataclasses.asdict(cfg)
    spec = {k: (v.value if hasattr(v, "value") else v) for k, v in spec.items()}
    proc = ctx.Process(target=_point, args=(spec, dataclasses.asdict(work), steps, out))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"bench --depth: the point batch={work.batch} length={work.length} of "
                           f"{cfg.encoder_layers}+{cfg.decoder_layers} layers × {cfg.heads} heads "
                           f"failed in its process (exit code {proc.exitcode}; its error is above)")
    return out.get(timeout=5)


def run(shallow: ModelConfig, batches=(16, 32, 64, 128), lengths=(10, 20, 40, 80),
        steps: int = 5, log=print) -> dict:
    models = dict(zip(("shallow", "deep"), pair(shallow)))
    params = {name: parameter_count(cfg, Workload().vocab)["total"] for name, cfg in models.items()}
    log(f"shallow {shallow.encoder_layers}+{shallow.decoder_layers} layers × {shallow.heads} heads "
        f"({params['shallow']:,} params) vs deep {models['deep'].encoder_layers}+"
        f"{models['deep'].decoder_layers} layers × 1 head ({params['deep']:,} params)")
    points = []
    for axis, values in (("batch", batches), ("length", lengths)):
        for value in values:
            work = Workload(batch=value if axis == "batch" else 64,
                            length=value if axis == "length" else 20)
            for name, cfg in models.items():
                tps, peak = measure(cfg, work, steps)
                points.append({"axis": axis, "value": value, "model": name, "tokens_per_s": tps,
                               "peak_mb": peak})
                log(f"  {axis}={value} {name}: {tps:,.0f} tok/s, {peak:,.0f} MB")
    return {"params": params, "points": points,
            "models": {k: {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
                       for k, v in models.items()}}


def plot(result: dict, path: Path) -> None:
    import matplotlib  # lazy: start-up time (matplotlib)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: start-up time (matplotlib)

    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex="col")
    labels = {"shallow": f"shallow multi-head ({result['params']['shallow'] / 1e6:.2f} M)",
              "deep": f"deep single-head ({result['params']['deep'] / 1e6:.2f} M)"}
    for col, (axis, xlabel) in enumerate((("batch", "batch size (pairs of 20 tokens)"),
                                          ("length", "sentence length (batch of 64)"))):
        for name, style in (("shallow", "o-"), ("deep", "s--")):
            pts = [p for p in result["points"] if p["axis"] == axis and p["model"] == name]
            xs = [p["value"] for p in pts]
            axes[0][col].plot(xs, [p["tokens_per_s"] for p in pts], style, label=labels[name])
            axes[1][col].plot(xs, [p["peak_mb"] for p in pts], style, label=labels[name])
        axes[1][col].set_xlabel(xlabel)
        axes[0][col].set_xscale("log", base=2)
    axes[0][0].set_ylabel("training target tokens/s")
    axes[1][0].set_ylabel("training's peak memory (MB)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Liu et al. 2021: same heads and parameters, shallow vs deep (fp32, CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
