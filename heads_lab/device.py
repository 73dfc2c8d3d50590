"""Where a run computes: the device, and its precision (bf16 autocast where the hardware has
native bf16)."""

from __future__ import annotations

import torch

from heads_lab.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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
