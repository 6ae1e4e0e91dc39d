"""The run folder's rules, without torch (so that ``prune.py`` checks a folder before anything is imported): what
a pruning run's results and progress are called, and which folders a new run may not write in.

The whole policy, lock and overwrite included, is :class:`snapvit_pl.pipeline.rundir.RunFolder`, which ``prune.py``,
the Python API and a hand-composed Trainer (:class:`snapvit_pl.lightning.PruningModule`) share.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError
from .io import DirectoryLock

#: What marks a folder as holding a run's results (besides the scores file, whose name a run may choose).
RESULT_FILES = ("report.json", "elastic_scores.safetensors", "models")
#: What an interrupted run leaves to continue from (``snapvit_pl.pipeline.resume.RESUME_FILE``).
PROGRESS_FILE = "resume_state.pt"


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


def check_run_folder(out_dir: Path, overwrite: bool, scores_file: str = RESULT_FILES[1], locked: bool = False,
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
    interrupted = (out_dir / PROGRESS_FILE).exists() and not (out_dir / RESULT_FILES[0]).exists()
    if existing and not interrupted:
        raise ConfigError(f"{out_dir} already holds results ({', '.join(existing)}); {hints.overwrite} to replace "
                          f"them or choose another {hints.folder}")
    if interrupted:
        resume = f"continue it with {hints.resume.format(folder=out_dir)}, or " if hints.resume else ""
        raise ConfigError(f"{out_dir} holds an interrupted run ({PROGRESS_FILE}); {resume}{hints.overwrite} to start "
                          f"again there, or choose another {hints.folder}")
    other = sorted(p.name for p in out_dir.iterdir() if p.name != DirectoryLock.FILE)
    if other:
        shown = ", ".join(other[:4]) + (" ..." if len(other) > 4 else "")
        raise ConfigError(f"{out_dir} is not empty ({shown}) and holds no run to continue: a run writes into a new or "
                          f"empty directory; choose another {hints.folder}, or {hints.overwrite} to write there (a "
                          "run's files are replaced, other files kept)")
