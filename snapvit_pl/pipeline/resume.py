"""Resumable runs: what the pipeline has done, saved atomically in the run directory (``resume_state.pt``).

The driver (:class:`snapvit_pl.pipeline.Pipeline`) writes it when a run starts (nothing done yet), once
the local scores are complete, and after every round of search evaluations, so a run killed at any
point loses at most one evaluation per rank (an importance pass cut short restarts). It holds no
pickled objects: tensors, numbers, strings and lists only; and a checksum of its content and of the run's
``config.yaml``, both checked when it is read back (a damaged file, or settings edited since, are refused).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from ..io import atomic_path, sha256_file, verify_checksum, with_checksum
from ..models.loading import UNREADABLE_CHECKPOINT

RESUME_FILE = "resume_state.pt"
CONFIG_FILE = "config.yaml"
_CONFIG_KEY = "config_sha256"


def save_resume_state(run_dir: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` (a :meth:`Pipeline.state_dict`) to ``run_dir/resume_state.pt`` atomically, with its checksum
    and that of the run's ``config.yaml`` (when there is one)."""
    config = Path(run_dir) / CONFIG_FILE
    state = with_checksum({**state, _CONFIG_KEY: sha256_file(config) if config.is_file() else None})
    with atomic_path(Path(run_dir) / RESUME_FILE) as tmp:
        torch.save(state, tmp)


def load_resume_state(run_dir: str | Path) -> dict[str, Any]:
    """Read the resume state of ``run_dir``; ``CheckpointError`` if missing, unreadable, damaged, or if the run's
    ``config.yaml`` changed since it was written."""
    path = Path(run_dir) / RESUME_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} not found: {run_dir} is not an interrupted prune.py run (nothing to resume)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except UNREADABLE_CHECKPOINT as err:
        if "weights_only" in str(err):  # torch refused a pickled object (its own text suggests running it)
            raise CheckpointError(f"{path} holds pickled Python objects, which snapvit-pl never loads (they could run "
                                  "code; prune.py writes tensors, numbers and strings only); start the run again "
                                  "(another --out_dir)") from None
        raise CheckpointError(f"{path} is unreadable ({str(err).splitlines()[0][:200]}); start the run again") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a resume state; start the run again")
    state = verify_checksum(state, path, "start the run again (another --out_dir)")
    config, recorded = Path(run_dir) / CONFIG_FILE, state.pop(_CONFIG_KEY, None)
    if recorded is not None and (not config.is_file() or sha256_file(config) != recorded):
        raise CheckpointError(f"{config} changed since the run started (edited or damaged): a resume keeps the run's "
                              "settings; restore the file, or start a new run (another --out_dir)")
    return state


def has_progress(run_dir: str | Path) -> bool:
    """Whether an interrupted run in ``run_dir`` saved any stage's progress (worth resuming)."""
    try:
        state = load_resume_state(run_dir)
    except CheckpointError:
        return False
    return state.get("local") is not None or state.get("search") is not None
