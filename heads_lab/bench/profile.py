"""`heads-lab bench --profile {train,greedy,beam}`: where the time of a training step or of
decoding goes, from torch.profiler. A few steps (or decoding runs) after a warm-up are recorded:
the Chrome trace goes to a file (chrome://tracing, ui.perfetto.dev), and the top operators and
kernels by self time — device time on a GPU, CPU time on a CPU — make a table with their calls,
milliseconds per step and share of the step, so anyone can see what holds a step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from heads_lab.bench.measure import Variant, Workload, _optimizer, train_step
from heads_lab.config.schemas import ModelConfig
from heads_lab.model.decode import beam_search, greedy
from heads_lab.training.captured import CapturedLoss
from heads_lab.training.device import autocast, synchronize

WHAT = ("train", "greedy", "beam")


def run(model: ModelConfig, work: Workload, precision: str, what: str = "train", steps: int = 5,
        warmup: int = 2, rows: int = 25, trace: Path | None = None,
        talking_heads_path: str | None = None, capture: bool = False) -> dict[str, Any]:
    """Profile `steps` repetitions of `what` (a training step, greedy or beam-4 decoding of the
    workload's batch) of the model; returns the top `rows` operators by self time. `capture`:
    the captured training step (trainer.capture: forward, loss and backward compiled as one,
    CUDA graphs on a GPU), as a GPU run trains by default; compiled in the warm-up."""
    if what not in WHAT:
        raise ValueError(f"--profile {what}: choose one of {', '.join(WHAT)}")
    device = work.torch_device
    if capture and what != "train":
        raise ValueError(f"--profile {what} --capture: only a training step is captured")
    v = Variant(f"{model.attention.value} h={model.heads}" + (" captured" if capture else ""),
                model, precision, talking_heads_path=talking_heads_path, capture=capture)
    torch.manual_seed(0)
    net = v.build(work.vocab, device)
    src, tgt_in, tgt_out = work.tensors(0)
    opt = _optimizer(net, False) if what == "train" else None
    net.train(what == "train")
    captured = CapturedLoss(net, net, 0.1, precision, device) if capture else None

    def once() -> None:
        with v.path():
            if what == "train":
                train_step(net, opt, precision, src, tgt_in, tgt_out, captured=captured)
                return
            with autocast(device, precision), torch.no_grad():
                if what == "greedy":
                    greedy(net, src, work.length + 1, True, min_len=work.length)
                else:
                    beam_search(net, src, 4, 0.6, work.length + 1, True, min_len=work.length)
        synchronize(device)

    for _ in range(warmup):
        once()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            with record_function(f"{what} {i}"):
                once()
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    return {"what": what, "variant": v.name, "precision": precision, "device": str(device),
            "steps": steps, "batch": work.batch, "length": work.length,
            "trace": str(trace) if trace else None, **top(prof, steps, device.type, rows)}


def top(prof, steps: int, device_type: str, rows: int) -> dict[str, Any]:
    """The operators and kernels with the most self time (device time on a GPU), per step."""
    on_device = device_type == "cuda"
    events = [e for e in prof.key_averages() if not e.key.startswith(("train ", "greedy ",
                                                                      "beam "))]

    def self_us(e) -> float:
        return (getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
                if on_device else e.self_cpu_time_total)

    total = sum(self_us(e) for e in events) or 1.0
    ranked = sorted(events, key=self_us, reverse=True)[:rows]
    return {"clock": "device" if on_device else "cpu", "total_ms_per_step": total / 1e3 / steps,
            "rows": [{"name": e.key, "calls_per_step": e.count / steps,
                      "self_ms_per_step": self_us(e) / 1e3 / steps,
                      "share": self_us(e) / total} for e in ranked]}
