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
