"""Where a run computes: the device, its precision (bf16 autocast where the hardware has native
bf16), and what it can give: the peak memory a stretch of work took, and the matmul ceiling
(GFLOP/s) that MFU is measured against."""

from __future__ import annotations

import ctypes
import gc
import os
import resource
import time

import torch

from heads_lab.errors import ConfigError


def resolve_device(name: str, setting: str = "trainer.device") -> torch.device:
    """The torch device `name` (auto: cuda where there is one, else cpu). A CUDA device that this
    machine lacks (no GPU, a CPU build of torch, an index past the last GPU) is refused in one
    line naming `setting`, before any work: torch would fail only at the first CUDA call, with a
    traceback."""
    try:
        device = torch.device(("cuda" if torch.cuda.is_available() else "cpu")
                              if name == "auto" else name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"{setting}={name} is not a device: use auto, cpu, cuda or cuda:N"
                          ) from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise ConfigError(f"{setting}={name}: no CUDA device here (torch "
                              f"{torch.__version__}); use {setting}=cpu, or auto")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"{setting}={name}: this machine has {count} CUDA device"
                              f"{'s' if count > 1 else ''} (cuda:0 to cuda:{count - 1}); "
                              f"use one of those, or {setting}=cuda")
        no_cudnn_attention()
    return device


def no_cudnn_attention() -> None:
    """Take cuDNN out of PyTorch's fused attention (SDPA) backends, for the whole process.

    On Hopper GPUs with a recent cuDNN, PyTorch tries cuDNN's attention first, and cuDNN builds
    an execution plan for every new shape of batch and length (a fraction of a second each).
    heads-lab's batches are packed by tokens, so nearly every batch has a shape of its own, and
    decoding changes length every step. Measured on an H200 (PyTorch 2.11, d_model 512, 6+6
    layers, three runs sharing it): the multi-head runs took about a minute for their first 200
    training steps with cuDNN in the order, and 17-19 s with it out (set by
    TORCH_CUDNN_SDPA_DEPRIORITIZED=1); h = 1, whose 512-wide head cuDNN does not take, took about
    20 s either way. The flash and memory-efficient kernels need no per-shape plan. Not a CPU
    matter: nothing changes there."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX). Without,
    PyTorch's CPU bf16 matmuls are emulated: a 512² matmul took 454 ms in bf16 against 11 ms in
    fp32 on an AVX2 EPYC, so a bf16 run would take tens of times longer than fp32."""
    cpu = torch.cpu
    return any(getattr(cpu, name, lambda: False)()
               for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def resolve_precision(device: torch.device, precision: str) -> str:
    """trainer.precision as a run computes it: `auto` is bf16 where bf16 is native (a CUDA
    device that supports it, a CPU with AVX512-BF16 or AMX) and fp32 elsewhere; fp32 and bf16
    stay as they are."""
    precision = str(getattr(precision, "value", precision))
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if device.type == "cpu" and native_bf16() else "fp32"


def check_precision(device: torch.device, precision: str) -> None:
    """Refuse bf16 on a CPU without native bf16, in one line naming the fix."""
    if precision == "bf16" and device.type == "cpu" and not native_bf16():
        raise ConfigError("trainer.precision=bf16: this CPU has no native bf16 (AVX512-BF16 or "
                          "AMX), so bf16 matrix products are emulated, tens of times slower than "
                          "fp32; add trainer.precision=fp32 (or auto: bf16 only where native), or "
                          "run on a GPU or a CPU with bf16")


def autocast(device: torch.device, precision: str):
    """bf16 autocast for `precision=bf16` (matmuls in bf16, weights, optimizer and loss in fp32),
    a no-op for fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU), so a timer reads the work's time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_freed_memory() -> None:
    """Hand memory that the process has freed back to the OS: glibc keeps freed heap blocks
    resident (a finished 24+24-layer job left ~1.5 GB in its reused joblib worker), so without this
    a worker's resident set at a job's start still holds the previous job's freed memory."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)  # glibc only; elsewhere there is nothing to trim
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak memory of a stretch of work: CUDA allocations on a GPU, else the process's peak
    resident set (reset at start where Linux allows, after the memory freed by earlier work is
    handed back, so a sweep's later jobs in a reused worker are measured alone)."""

    def __init__(self, device):
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        else:
            release_freed_memory()
            try:  # "5": reset the peak RSS (VmHWM) to the current RSS
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                pass

    def mb(self) -> float:
        if self.device.type == "cuda":
                return torch.cuda.max_memory_allocated(self.device) / 2**20
        if os.path.exists("/proc/self/status"):
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024  # kB
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# the matmul ceiling's shapes: on CPU large ones and the bench model's own; on CUDA large ones
CEILING_SHAPES = ((2048, 1024, 1024), (1024, 2048, 2048), (1280, 256, 1024), (1280, 1024, 256),
                  (1280, 256, 768), (1280, 8000, 256), (256, 1280, 8000))
CUDA_CEILING_SHAPES = ((8192, 8192, 8192), (4096, 4096, 4096), (16384, 4096, 4096))


def matmul_ceiling(dtype, reps: int = 10, device=None, budget_s: float = 10.0) -> float:
    """GFLOP/s of the best of several matmuls, large ones and the bench model's own shapes
    (on this CPU the cache-sized ones run fastest): this machine's ceiling for `dtype`. On CUDA,
    large products on random data (8192³ and the like; fp32 as PyTorch's default, without TF32),
    timed between synchronizes.

    Each shape's first product is the warm-up and times one product; then up to `reps` more
    are timed, as many as fit in what is left of `budget_s`, and a shape that would not fit
    once (at the best rate so far) is left out. A CPU without native bf16 runs bf16 products
    at 0.5–2 GFLOP/s (1.4 s for 1280×256×1024 on an AVX2 EPYC), where every shape ×
    13 products took over ten minutes; there the ceiling rests on the shapes that fit (at
    least the first). A fast machine measures every shape in a few seconds, as before."""
    device = device or torch.device("cpu")
    best = 0.0
    deadline = time.perf_counter() + budget_s
    shapes = CUDA_CEILING_SHAPES if device.type == "cuda" else CEILING_SHAPES
    for m, k, n in shapes:
        flops = 2 * m * k * n
        if best and flops / (best * 1e9) > deadline - time.perf_counter():
            continue  # even one product would overrun the budget
        a = torch.randn(m, k, dtype=dtype, device=device)
        b = torch.randn(k, n, dtype=dtype, device=device)
        synchronize(device)
        started = time.perf_counter()
        a @ b  # the warm-up, timed: a bound on the rate and the estimate for the reps
        synchronize(device)
        once = time.perf_counter() - started
        best = max(best, flops / once / 1e9)
        count = min(reps, int((deadline - time.perf_counter()) / once))
        if count < 1:
            continue
        started = time.perf_counter()
        for _ in range(count):
            a @ b
        synchronize(device)
        best = max(best, flops * count / (time.perf_counter() - started) / 1e9)
    return best
