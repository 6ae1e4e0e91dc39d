"""A pruning run's folder: the check a command makes before anything heavy is imported (:func:`check_run_folder`,
no torch), and :class:`RunFolder`, the whole policy (created, locked, refused, overwritten, given up), which
``prune.py``, the Python API and a composed Trainer share.

A run folder may hold the user's own files too (a ``models/README.md``, notes beside the report, a figure of their own
in ``plots/``). Overwriting an earlier run replaces every file the earlier run wrote (its results, progress, models,
plots, logs: none may stay beside the new run's) and nothing else.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import ConfigError
from .lock import DirectoryLock
from .names import (
    CONFIG_FILE, FIGURE_NAMES, LOCK_FILE, REPORT_FILE, RESULT_FILES, RESUME_FILE, RUN_DIR_NAMES, RUN_SUBFOLDERS, SCORES_FILE,
)


def resumable(run_dir: Path) -> Path:
    """The saved config of the interrupted run in ``run_dir`` (what ``--resume`` continues from).

    Raises:
        ConfigError: not a run folder, or a finished run's.
    """
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"{run_dir} has no {CONFIG_FILE}: --resume takes the directory of an interrupted prune.py run")
    if (run_dir / REPORT_FILE).exists():
        raise ConfigError(f"{run_dir} already finished ({REPORT_FILE} exists); nothing to resume")
    return run_dir / CONFIG_FILE


@dataclass(frozen=True)
class FolderHints:
    """How a refusal names the ways out, in the words of the caller (the command line's options by default).

    Args:
        folder: the option or argument that names the folder.
        overwrite: how to allow replacing an earlier run.
        resume: how to continue an interrupted run in the folder (``{folder}``: its path); empty: no such way.
    """

    folder: str = "--out_dir"
    overwrite: str = "pass --overwrite true"
    resume: str = ""


def check_run_folder(out_dir: Path, overwrite: bool, scores_file: str = SCORES_FILE, locked: bool = False,
                     hints: FolderHints = FolderHints()) -> None:
    """Refuse a folder another run is writing in now (unless ``locked``: this process holds its lock), or, unless
    ``overwrite``, one that holds what a run would replace: an earlier run's results, an interrupted run's progress,
    or files of its own (a folder that is not a run's). Nothing to refuse in a folder that does not exist.

    Raises:
        ConfigError: one line naming the folder, what is in it and the ways out.
    """
    if not out_dir.is_dir():
        return
    holder = None if locked else DirectoryLock.holder(out_dir)
    if holder is not None:  # a run is writing there now: neither an earlier result nor an interrupted run
        raise ConfigError(f"{out_dir} is in use by another run ({holder}); wait until it ends, or choose another "
                          f"{hints.folder}")
    if overwrite:
        return
    inside = not Path(scores_file).is_absolute() and ".." not in Path(scores_file).parts  # (else refused later)
    names = (*RESULT_FILES, scores_file) if inside else RESULT_FILES
    existing = [name for name in dict.fromkeys(names) if (out_dir / name).exists()]
    interrupted = (out_dir / RESUME_FILE).exists() and not (out_dir / REPORT_FILE).exists()
    if existing and not interrupted:
        raise ConfigError(f"{out_dir} already holds results ({', '.join(existing)}); {hints.overwrite} to replace "
                          f"them or choose another {hints.folder}")
    if interrupted:
        resume = f"continue it with {hints.resume.format(folder=out_dir)}, or " if hints.resume else ""
        raise ConfigError(f"{out_dir} holds an interrupted run ({RESUME_FILE}); {resume}{hints.overwrite} to start "
                          f"again there, or choose another {hints.folder}")
    other = sorted(p.name for p in out_dir.iterdir() if p.name != DirectoryLock.FILE)
    if other:
        shown = ", ".join(other[:4]) + (" ..." if len(other) > 4 else "")
        raise ConfigError(f"{out_dir} is not empty ({shown}) and holds no run to continue: a run writes into a new or "
                          f"empty directory; choose another {hints.folder}, or {hints.overwrite} to write there (a "
                          "run's files are replaced, other files kept)")


def written_by_a_run(out_dir: Path, scores_file: str) -> list[Path]:
    """The files and folders in ``out_dir`` that a pruning run writes (those that exist): its top-level files and
    ``scores_file``, every pruned checkpoint folder in ``models/``, the report's figures in ``plots/``, the TensorBoard
    event files and hparams in ``tensorboard/``."""
    found: list[Path] = []
    for name in dict.fromkeys((*RUN_DIR_NAMES, scores_file)):
        path = out_dir / name
        if name in (LOCK_FILE, *RUN_SUBFOLDERS) or Path(name).is_absolute() or ".." in Path(name).parts:
            continue
        if os.path.lexists(path):
            found.append(path)
    models, plots, logs = (out_dir / name for name in RUN_SUBFOLDERS)
    if models.is_dir() and not models.is_symlink():
        from ..models.checkpoint import is_checkpoint_dir  # (torch: not for the check a command makes first)

        found += sorted(p for p in models.iterdir() if p.is_dir() and not p.is_symlink() and is_checkpoint_dir(p))
    if plots.is_dir() and not plots.is_symlink():
        found += sorted(p for p in (plots / f"{name}.png" for name in FIGURE_NAMES) if os.path.lexists(p))
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


class RunFolder:
    """A pruning run's folder, held while the run writes in it: created, locked (one run at a time, whatever the
    timing), refused when it holds another run's results, an interrupted run or files of the user's (unless
    ``overwrite``: then what the earlier run wrote is removed first, and nothing else), released on every exit path;
    a run that fails before it saved any progress leaves nothing behind (:meth:`abandon`). ``prune.py``, a
    :class:`~snapvit_pl.pipeline.Pipeline` given a run folder and a hand-composed Trainer
    (:class:`snapvit_pl.lightning.PruningModule`) hold their folders through it.

    Args:
        path: the folder.
        overwrite: replace an earlier run there.
        scores_file: the elastic scores' file name in it.
        resume: the run continues the interrupted run of this folder (nothing is checked or removed).
        hints: how refusals name the ways out (the caller's options).

    Example::

        with RunFolder("runs/prune/mine", overwrite=True) as folder:
            ...  # write the run's files into folder.path
    """

    def __init__(self, path: str | Path, overwrite: bool = False, scores_file: str = SCORES_FILE,
                 resume: bool = False, hints: FolderHints = FolderHints()):
        self.path, self.overwrite, self.scores_file, self.resume, self.hints = \
            Path(path), overwrite, scores_file, resume, hints
        self.created = False
        self._lock: Optional[DirectoryLock] = None
        self._before: Optional[set[str]] = None  # what the folder held once this run had it (open)
        self._ours = False  # opened once: the folder is this run's, taking it again checks nothing

    def check(self) -> None:
        """Refuse now what :meth:`open` would refuse (nothing is created or taken)."""
        if not (self.resume or self._ours):
            check_run_folder(self.path, self.overwrite, self.scores_file, hints=self.hints)

    def open(self) -> "RunFolder":
        """Create the folder, take its lock, check it again under the lock (another run may have finished there since
        :meth:`check`) and, with ``overwrite``, remove what an earlier run wrote; returns ``self``.

        Raises:
            ConfigError: the folder is in use, or holds what this run may not replace (the lock is given back).
        """
        if not self._ours:
            self.created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            self._lock = DirectoryLock(self.path, self.hints.folder).acquire()
            if not (self.resume or self._ours):
                check_run_folder(self.path, self.overwrite, self.scores_file, locked=True, hints=self.hints)
                if self.overwrite and not self.created:
                    clear_run_dir(self.path, self.scores_file)
                self._before = set() if self.created else {p.name for p in self.path.iterdir()} - {DirectoryLock.FILE}
            self._ours = True
        except BaseException:
            self.close()
            if self.created:  # a folder this call made stays only if another run uses it (its lock file is in it)
                try:
                    self.path.rmdir()
                except OSError:
                    pass
            raise
        return self

    @property
    def held(self) -> bool:
        return self._lock is not None

    def close(self) -> None:
        """Give the folder up (its lock); what was written stays."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def abandon(self) -> bool:
        """The run failed: give the folder up and, unless it saved progress a resume continues from, remove what it
        wrote (the folder too, when this run made it). Returns whether progress was kept."""
        from .resume import has_progress

        if not self.held:  # never this run's (refused, or another run holds it): nothing to undo
            return False
        if has_progress(self.path):  # progress a resume continues from
            self.close()
            return True
        if self._before is None:  # (the folder of a run this one continues: nothing of it is undone)
            self.close()
            return False
        # what this run wrote is removed while the lock is still held (no other run can have started in the folder),
        # then the lock is given up; a folder this run made goes last, unless another run has taken it since
        for path in self.path.iterdir():
            if path.name != DirectoryLock.FILE and path.name not in self._before:
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        self.close()
        if self.created:
            try:
                self.path.rmdir()
            except OSError:  # another run's lock (or files) in it now: the folder is that run's
                pass
        return False

    def __enter__(self) -> "RunFolder":
        return self.open()

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is not None:
            self.abandon()
        else:
            self.close()
