"""Where a forward runs and in which precision: one definition for every stage (search, evaluation, throughput)."""
from __future__ import annotations

import contextlib
import os
from typing import Literal, Union

import torch

Precision = Literal["auto", "bf16", "32"]


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity, e.g. a SLURM allocation; else the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform (macOS, Windows)
        return os.cpu_count() or 1


def resolve_device(device: Union[str, torch.device, None] = None) -> torch.device:
    """The given device, else CUDA when available, else CPU.

    Raises:
        ConfigError: a CUDA device this machine does not have.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and (not torch.cuda.is_available() or (resolved.index or 0) >= torch.cuda.device_count()):
        from .errors import ConfigError

        have = f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available() else "no CUDA device"
        raise ConfigError(f"device {device} is not available on this machine ({have}); use cpu or an existing device")
    return resolved


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


class PeakMemory:
    """The peak memory of a stretch of work, in MiB: CUDA's max allocated on a GPU, the process's peak resident set
    size on CPU (Linux's ``VmHWM``, reset at :meth:`start` where the kernel allows, else the peak since the
    process started).

    Args:
        device: where the work runs.
    """

    kinds = {"cuda": "CUDA max allocated", "cpu": "process peak RSS"}

    def __init__(self, device: Union[str, torch.device]):
        self.device = torch.device(device)
        self.kind = self.kinds["cuda" if self.device.type == "cuda" else "cpu"]

    def start(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # resets the peak resident set size (Linux >= 4.0)
            except OSError:
                pass
        return self

    def peak_mb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
