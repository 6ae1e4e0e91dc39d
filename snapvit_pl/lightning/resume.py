"""Resumable pruning runs: the state of the stateful callbacks, saved atomically in the run directory.

``ImportanceCallback`` saves once its scores are complete and ``SearchCallback`` after every xNES
generation, so a run killed at any point loses at most one generation. ``prune.py --resume
RUN_DIR`` reloads the run's ``config.yaml`` and this file and continues; the result equals that
of an uninterrupted run with the same seed.
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from ..errors import CheckpointError
from ..io import atomic_path

RESUME_FILE = "resume_state.pt"


def save_resume_state(trainer: pl.Trainer) -> None:
    """Write ``{state_key: state_dict()}`` of every callback marked ``resumable`` (rank 0 only)."""
    if not trainer.is_global_zero:
        return
    state = {cb.state_key: cb.state_dict() for cb in trainer.callbacks if getattr(cb, "resumable", False)}
    with atomic_path(Path(trainer.default_root_dir) / RESUME_FILE) as tmp:
        torch.save(state, tmp)


def load_resume_state(run_dir: str | Path) -> dict[str, Any]:
    """Read the resume state of ``run_dir``; ``CheckpointError`` if missing or unreadable."""
    path = Path(run_dir) / RESUME_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} not found: {run_dir} is not an interrupted prune.py run (nothing to resume)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as err:
        raise CheckpointError(f"{path} is unreadable ({str(err).splitlines()[0][:200]}); start the run again") from err


def restore_callbacks(trainer: pl.Trainer, state: dict[str, Any]) -> None:
    """Hand each resumable callback its saved state."""
    for cb in trainer.callbacks:
        if getattr(cb, "resumable", False) and cb.state_key in state:
            cb.load_state_dict(state[cb.state_key])
