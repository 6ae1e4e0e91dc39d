"""Fault injection shared by the tests: damaged files (one flipped bit at many places, a truncation)."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Iterator


def flipped_copies(path: Path, count: int = 40, seed: int = 0) -> Iterator[int]:
    """Flip one bit of ``path`` at ``count`` places spread over the whole file (header and payload), one at a time:
    yields each position with the file damaged there, and restores it afterwards."""
    original = path.read_bytes()
    rng = random.Random(seed)
    positions = sorted({rng.randrange(len(original)) for _ in range(count)} | {0, len(original) // 2, len(original) - 1})
    try:
        for position in positions:
            damaged = bytearray(original)
            damaged[position] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(damaged))
            yield position
    finally:
        path.write_bytes(original)


try:  # a Lightning callback the tests install by class path (faults.SigtermAt)
    import pytorch_lightning as _pl

    class SigtermAt(_pl.Callback):
        """Send this process SIGTERM (what a scheduler sends before preempting a job) after batch ``batch`` of
        epoch ``epoch``."""

        def __init__(self, epoch: int, batch: int):
            self.epoch, self.batch = epoch, batch

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            import os
            import signal

            if trainer.current_epoch == self.epoch and batch_idx == self.batch:
                os.kill(os.getpid(), signal.SIGTERM)
except ImportError:  # pragma: no cover
    pass


def disk_full_at(monkeypatch, target: str, call: int) -> list[int]:
    """Make the writer ``target`` (``"module.function"``, e.g. ``snapvit_pl.models.checkpoint.save_file``) run out of
    space on its ``call``-th call (1-based): it writes half of the file, then fails with ENOSPC, as a full disk does,
    raising what that writer raises (safetensors' ``save_file``: its own ``SafetensorError``, naming the OS error
    only in its message; any other: ``OSError``). Returns the list of calls made so far (for the test to check the
    fault happened)."""
    import errno
    import os
    from pathlib import Path

    import importlib

    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest importable module, then attributes
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
            break
        except ImportError:
            continue
    for attribute in parts[cut:-1]:
        owner = getattr(owner, attribute)
    module, name = owner, parts[-1]
    real = getattr(module, name)
    calls: list[int] = []

    def writer(*args, **kwargs):
        calls.append(len(calls) + 1)
        result = real(*args, **kwargs)
        if len(calls) == call:
            path = next(Path(a) for a in args if isinstance(a, (str, os.PathLike)) and Path(a).is_file())
            size = path.stat().st_size
            os.truncate(path, size // 2)
            if name == "save_file":
                from safetensors import SafetensorError

                raise SafetensorError(f"Error while serializing: I/O error: {os.strerror(errno.ENOSPC)} (os error "
                                      f"{errno.ENOSPC})")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return result

    monkeypatch.setattr(module, name, writer)
    return calls


def full_disk_on_flush(monkeypatch, where: str = "snapvit_pl.run.lock.open") -> None:
    """Files opened through ``where`` (default: ``open`` inside snapvit_pl.run.lock, the run lock) fail with ENOSPC
    when their buffer is written out, as on a full disk."""
    import builtins
    import errno

    class FullDisk:
        def __init__(self, handle):
            self.handle = handle

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    real_open = builtins.open
    monkeypatch.setattr(where, lambda *a, **k: FullDisk(real_open(*a, **k)), raising=False)
