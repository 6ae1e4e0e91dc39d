"""One writer per run folder: :class:`DirectoryLock`."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from ..errors import ConfigError, storage_error
from .names import LOCK_FILE


class DirectoryLock:
    """An exclusive lock on a run directory (the file ``.lock`` in it, ``fcntl.flock``): held while a run uses the
    directory, released when the run ends, however it ends: the operating system drops the lock of a killed
    process, so a stale lock never blocks a resume.

    Args:
        directory: the run directory (it must exist).
        what: how the refusal names the directory's option (``--out_dir``).
    """

    FILE = LOCK_FILE

    def __init__(self, directory: str | os.PathLike, what: str = "--out_dir"):
        self.path, self.what = Path(directory) / self.FILE, what
        self._file: Any = None

    #: Attempts at taking the lock when the file locked was removed in the meantime (each a holder's release).
    ATTEMPTS = 8

    def acquire(self) -> "DirectoryLock":
        """Take the lock, or refuse (``ConfigError``) while another process holds it.

        The lock is the ``flock`` of the file the path names *now*: a holder's release removes the file before it
        lets go, so a process that opened the old file and locks it after the release holds nothing; it sees that
        the path no longer names the file it locked (another inode, or none) and tries again on the new one.
        """
        import fcntl

        for _ in range(self.ATTEMPTS):
            try:
                handle = open(self.path, "a+")
            except OSError as err:
                raise storage_error(err, str(self.path)) from err
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                handle.close()
                raise ConfigError(f"{self.path.parent} is in use by another run ({holder}); wait until it ends, or "
                                  f"choose another {self.what}") from None
            if self._names(handle):
                break
            handle.close()  # locked a file a release had removed: the lock is the one the path names now
        else:
            raise ConfigError(f"{self.path.parent} is taken and given up by other runs again and again; wait until "
                              f"they end, or choose another {self.what}")
        self._file = handle
        try:  # who holds it, for the refusal of a second run (the lock itself is the flock)
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} on {os.uname().nodename}")
            handle.flush()
        except OSError as err:  # a full disk: no lock file left behind
            self.release()
            raise storage_error(err, str(self.path)) from err
        return self

    def _names(self, handle: Any) -> bool:
        """Whether the lock's path still names the file ``handle`` has open (the same inode on the same device)."""
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(handle.fileno())
        return (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev)

    @classmethod
    def holder(cls, directory: str | os.PathLike) -> Optional[str]:
        """Who holds the lock of ``directory`` now (``pid N on HOST``), or None when no process does (or the
        directory has no lock file); takes nothing."""
        import fcntl

        try:
            handle = open(Path(directory) / cls.FILE)
        except OSError:
            return None
        with handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return handle.read().strip() or "another process"
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            return None

    def release(self) -> None:
        """Give the lock up: remove its file while still holding it, then let go (a process that opened the file
        before it was removed finds, once it locks it, that the path names another file or none: :meth:`acquire`)."""
        if self._file is not None:
            self.path.unlink(missing_ok=True)
            try:
                self._file.close()
            except OSError:  # what a full disk did not take; the file is gone already
                pass
            self._file = None

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
