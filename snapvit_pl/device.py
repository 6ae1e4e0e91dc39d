"""Where a forward runs and in which precision: one definition for every stage (search, evaluation, throughput)."""
from __future__ import annotations

import contextlib
import os
import time
from typing import Literal, Optional, Union

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
    from .errors import ConfigError

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"device {device!r} is not a device name; give cpu, cuda or cuda:N (e.g. cuda:0)") from None
    if resolved.type == "cuda" and (not torch.cuda.is_available() or (resolved.index or 0) >= torch.cuda.device_count()):
        have = f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available() else "no CUDA device"
        raise ConfigError(f"device {device} is not available on this machine ({have}); use cpu or an existing device")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device {device} is not available on this machine (no Apple MPS); use cpu")
    if resolved.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device {device!r}: snapvit-pl computes on cpu, cuda or mps; give one of those")
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


def available_memory(device: Union[str, torch.device]) -> Optional[int]:
    """Bytes free on ``device`` now: CUDA's free memory, a CPU's available memory (Linux ``MemAvailable``); None where
    it cannot be read."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
    return None


class ForwardTimer:
    """Time spent inside ``with timer:`` blocks, without waiting for the device at each one: on CUDA each block
    records a pair of events, read (one synchronisation) by :meth:`seconds`; elsewhere the wall clock.

    Args:
        device: where the timed work runs.
    """

    def __init__(self, device: Union[str, torch.device]):
        self.device = torch.device(device)
        self.reset()

    def reset(self, seconds: float = 0.0) -> None:
        self._seconds, self._events, self._start = float(seconds), [], None

    def __enter__(self) -> "ForwardTimer":
        if self.device.type == "cuda":
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((self._start, end))
        else:
            self._seconds += time.perf_counter() - self._start

    def seconds(self) -> float:
        if self._events:
            self._events[-1][1].synchronize()
            self._seconds += sum(start.elapsed_time(end) for start, end in self._events) / 1000
            self._events.clear()
        return self._seconds


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


#: Operators that make the host wait for an accelerator: a value read back (``.item()``, ``bool(t)``, ``int(t)``), or
#: an output whose size depends on the data (boolean-mask indexing, ``nonzero``, ``bincount``, ``unique``, ...).
SYNCING_OPERATORS = frozenset({
    "_local_scalar_dense", "nonzero", "argwhere", "masked_select", "bincount", "_unique", "_unique2", "unique_dim",
    "unique_consecutive", "equal", "is_nonzero", "histc",
})


class HostSyncs:
    """Counts host synchronisations in a stretch of code, on any device: :data:`SYNCING_OPERATORS`, indexing with a
    boolean mask, ``repeat_interleave`` with tensor repeats, and the copies to the host (``.cpu()``, ``.tolist()``,
    ``.numpy()``) -- what would each wait for a GPU, counted on a CPU too. Use as a context manager::

        with HostSyncs() as syncs:
            greedy_order(...)
        assert syncs.count <= 2, syncs.operators

    With ``device``, the blocking copies *to* that device are counted too (``Tensor.to`` / ``Tensor.cuda`` naming
    it without ``non_blocking=True``, ``torch.tensor`` / ``torch.as_tensor`` made on it): the host waits for an
    accelerator before each. On a CPU such a copy costs nothing, so name the CPU as ``device`` to count, in a test,
    the explicit moves a GPU would wait for (a move of a tensor already there counts as well: an upper bound).

    On CUDA, ``torch.cuda.set_sync_debug_mode("error")`` is the stricter check of the real device.
    """

    _COPIES = ("cpu", "tolist", "numpy", "item")

    def __init__(self, device: Optional[torch.device | str] = None):
        from collections import Counter

        self.operators: "Counter[str]" = Counter()
        self.device = None if device is None else torch.device(device)
        self._patched: dict[str, object] = {}
        self._created: dict[str, object] = {}
        self._mode = None

    def _is_target(self, device: object) -> bool:
        if device is None or isinstance(device, torch.dtype):
            return False
        if isinstance(device, torch.Tensor):
            device = device.device
        try:
            device = torch.device(device)
        except (TypeError, RuntimeError):
            return False
        return device.type == self.device.type and device.index in (None, self.device.index)

    @property
    def count(self) -> int:
        return sum(self.operators.values())

    def __enter__(self) -> "HostSyncs":
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func._overloadpacket.__name__
                if name in SYNCING_OPERATORS or (name in ("index", "index_put", "index_put_") and any(
                        isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()) if i is not None)) \
                        or (name == "repeat_interleave" and func._overloadname == "Tensor"
                            and (kwargs or {}).get("output_size") is None):
                    counter.operators[name] += 1
                return func(*args, **(kwargs or {}))

        for method in self._COPIES:
            original = getattr(torch.Tensor, method)
            self._patched[method] = original

            def wrapped(tensor, *args, _original=original, _name=method, **kwargs):
                if _name != "item":  # .item() is counted as _local_scalar_dense
                    counter.operators[f"Tensor.{_name}"] += 1
                return _original(tensor, *args, **kwargs)
            setattr(torch.Tensor, method, wrapped)
        if self.device is not None:
            self._count_copies_to_device()
        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def _count_copies_to_device(self) -> None:
        counter = self
        for method in ("to", "cuda"):
            original = getattr(torch.Tensor, method)
            self._patched[method] = original

            def moved(tensor, *args, _original=original, _name=method, **kwargs):
                target = kwargs.get("device", args[0] if args else None)
                if _name == "cuda":
                    target = torch.device("cuda", target) if isinstance(target, int) else (target or "cuda")
                blocking = not kwargs.get("non_blocking", any(a is True for a in args[1:]))
                if blocking and counter._is_target(target):
                    counter.operators[f"Tensor.{_name} (to the device)"] += 1
                return _original(tensor, *args, **kwargs)
            setattr(torch.Tensor, method, moved)
        for function in ("tensor", "as_tensor"):
            original = getattr(torch, function)
            self._created[function] = original

            def made(*args, _original=original, _name=function, **kwargs):
                if counter._is_target(kwargs.get("device")):
                    counter.operators[f"torch.{_name} (on the device)"] += 1
                return _original(*args, **kwargs)
            setattr(torch, function, made)

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        for method, original in self._patched.items():
            setattr(torch.Tensor, method, original)
        for function, original in self._created.items():
            setattr(torch, function, original)
        self._patched.clear()
        self._created.clear()
