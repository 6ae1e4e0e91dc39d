"""Files: every artifact is written to a temporary name, then renamed into place (atomic output); user paths are
resolved against the snapvit-pl checkout too (the shipped assets)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .errors import CheckpointError

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def resolve_path(path: str | os.PathLike) -> Path:
    """A user path; a relative one missing from the working directory is looked up in the
    snapvit-pl checkout too, so the shipped assets (``assets/...``) work from anywhere."""
    path = Path(path).expanduser()
    if not path.is_absolute() and not path.exists() and (PROJECT_ROOT / path).exists():
        return PROJECT_ROOT / path
    return path


def weights_file(path: str | os.PathLike) -> Path:
    """The existing weights file ``path`` names (:func:`resolve_path`).

    Raises:
        CheckpointError: there is no such file.
    """
    resolved = resolve_path(path)
    if not resolved.is_file():
        raise CheckpointError(f"checkpoint file not found: {resolved}; pass an existing weights file as checkpoint_path")
    return resolved


@contextmanager
def atomic_path(path: str | os.PathLike, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``.

    Works for files and directories. On any exception the temporary file or directory is
    removed, so ``path`` is either its old self or complete, never half-written. What is renamed
    into place gets the permissions the umask gives new files (the temporary directory itself is
    private, and some writers create 0600 files).
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True (or --overwrite) to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    target = tmp / path.name
    try:
        yield target
        _follow_umask(target)
        if path.is_dir() and not path.is_symlink():
            trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, trash / path.name)
            os.replace(target, path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(target, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _follow_umask(target: Path) -> None:
    """Files 0666 and directories 0777, less the umask (e.g. 0644 / 0755), through a directory tree."""
    mask = _umask()
    for item in [target, *(target.rglob("*") if target.is_dir() else [])]:
        if not item.is_symlink():
            item.chmod((0o777 if item.is_dir() else 0o666) & ~mask)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically."""
    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


class DirectoryLock:
    """An exclusive lock on a run directory (the file ``.lock`` in it, ``fcntl.flock``): held while a run uses the
    directory, released when the run ends, however it ends: the operating system drops the lock of a killed
    process, so a stale lock never blocks a resume.

    Args:
        directory: the run directory (it must exist).
        what: how the refusal names the directory's option (``--out_dir``).
    """

    FILE = ".lock"

    def __init__(self, directory: str | os.PathLike, what: str = "--out_dir"):
        self.path, self.what = Path(directory) / self.FILE, what
        self._file: Any = None

    def acquire(self) -> "DirectoryLock":
        """Take the lock, or refuse (``ConfigError``) while another process holds it."""
        import fcntl

        from .errors import ConfigError

        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ConfigError(f"{self.path.parent} is in use by another run ({holder}); wait until it ends, or choose "
                              f"another {self.what}") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {os.uname().nodename}")
        handle.flush()
        self._file = handle
        return self

    def release(self) -> None:
        """Give the lock up (and remove its file)."""
        if self._file is not None:
            self.path.unlink(missing_ok=True)
            self._file.close()
            self._file = None

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
