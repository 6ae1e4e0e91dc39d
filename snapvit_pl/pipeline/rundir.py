"""What a pruning run writes in its run folder, and so what ``--overwrite true`` may remove there: only that.

A run folder may hold the user's own files too (a ``models/README.md``, notes beside the report, a figure of their own
in ``plots/``). Overwriting an earlier run replaces every file the earlier run wrote (its results, progress, models,
plots, logs: none may stay beside the new run's) and nothing else.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..models.checkpoint import is_checkpoint_dir
from .plots import FIGURES
from .settings import RUN_DIR_NAMES

#: Folders of a run folder whose contents the run writes file by file (beside anything of the user's).
RUN_SUBFOLDERS = ("models", "plots", "tensorboard")


def written_by_a_run(out_dir: Path, scores_file: str) -> list[Path]:
    """The files and folders in ``out_dir`` that a pruning run writes (those that exist): its top-level files and
    ``scores_file``, every pruned checkpoint folder in ``models/``, the report's figures in ``plots/``, the TensorBoard
    event files and hparams in ``tensorboard/``."""
    found: list[Path] = []
    for name in dict.fromkeys((*RUN_DIR_NAMES, scores_file)):
        path = out_dir / name
        if name in (".lock", *RUN_SUBFOLDERS) or Path(name).is_absolute() or ".." in Path(name).parts:
            continue
        if os.path.lexists(path):
            found.append(path)
    models, plots, logs = (out_dir / name for name in RUN_SUBFOLDERS)
    if models.is_dir() and not models.is_symlink():
        found += sorted(p for p in models.iterdir() if p.is_dir() and not p.is_symlink() and is_checkpoint_dir(p))
    if plots.is_dir() and not plots.is_symlink():
        found += sorted(p for p in (plots / f"{name}.png" for name in FIGURES) if os.path.lexists(p))
    if logs.is_dir() and not logs.is_symlink():
        found += sorted(p for p in logs.iterdir()
                        if p.name.startswith("events.out.tfevents.") or p.name == "hparams.yaml")
    return found


def clear_run_dir(out_dir: Path, scores_file: str) -> None:
    """Remove what a new run in ``out_dir`` replaces (``--overwrite true``): :func:`written_by_a_run`, then the run's
    folders that this leaves empty; every other file stays."""
    for path in written_by_a_run(out_dir, scores_file):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    for name in RUN_SUBFOLDERS:
        folder = out_dir / name
        if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            folder.rmdir()
