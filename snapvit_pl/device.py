"""Where a forward runs and in which precision: one definition for every stage (search, evaluation, throughput)."""
from __future__ import annotations

import contextlib
from typing import Literal, Union

import torch

Precision = Literal["auto", "bf16", "32"]


def resolve_device(device: Union[str, torch.device, None] = None) -> torch.device:
    """The given device, else CUDA when available, else CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast_context(device: Union[str, torch.device], precision: Precision = "auto") -> contextlib.AbstractContextManager:
    """Autocast for a precision choice.

    Args:
        device: device the forward runs on.
        precision: ``"auto"`` (bf16 autocast on CUDA, fp32 elsewhere: CPU bf16 autocast is several
            times slower than fp32 on common CPUs), ``"bf16"`` (autocast on any device) or ``"32"``.
    """
    if precision not in ("auto", "bf16", "32"):
        raise ValueError(f"precision must be 'auto', 'bf16' or '32', got {precision!r}")
    device = torch.device(device)
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def synchronize(device: Union[str, torch.device]) -> None:
    """Wait for queued CUDA work on ``device`` (no-op elsewhere), so that wall-clock timings are true."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
