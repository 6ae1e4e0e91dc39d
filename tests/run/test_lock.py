"""One writer per run folder (``snapvit_pl/run/lock.py``, and the folder's release in ``snapvit_pl/run/folder.py``)."""
import os

import pytest

from snapvit_pl.errors import StorageError
from snapvit_pl.run.lock import DirectoryLock


def test_a_lock_that_cannot_be_written_leaves_no_lock_file(tmp_path, monkeypatch):
    from faults import full_disk_on_flush

    full_disk_on_flush(monkeypatch)
    with pytest.raises(StorageError, match=".lock"):
        DirectoryLock(tmp_path).acquire()
    monkeypatch.undo()
    assert not (tmp_path / DirectoryLock.FILE).exists()
    with DirectoryLock(tmp_path):  # and the directory can be locked at once
        pass


def test_a_lock_has_one_holder_when_a_release_falls_between_anothers_open_and_its_flock(tmp_path, monkeypatch):
    """Issue 76: B opens .lock while A holds it; A releases (the file removed, then let go); B locks the removed
    file. B must not count as a holder of that file: C, which creates a new .lock, and B would both hold the folder.
    B notices that the path names another file (or none) and takes the lock the path names now; C is refused."""
    import fcntl

    from snapvit_pl.errors import ConfigError

    first = DirectoryLock(tmp_path).acquire()
    real_flock, calls = fcntl.flock, []

    def release_in_between(fd, operation):  # B's first flock: A's release happens between B's open and its flock
        calls.append(fd)
        if len(calls) == 1:
            first.release()
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", release_in_between)
    second = DirectoryLock(tmp_path).acquire()
    monkeypatch.undo()
    assert len(calls) == 2  # B locked the removed file, saw it, and locked the file the path names now
    with pytest.raises(ConfigError, match="in use by another run"):
        DirectoryLock(tmp_path).acquire()  # C: one holder, B
    assert DirectoryLock.holder(tmp_path) == f"pid {os.getpid()} on {os.uname().nodename}"
    second.release()
    with DirectoryLock(tmp_path):
        pass


def test_a_failed_run_removes_its_files_before_it_lets_the_folder_go(tmp_path, monkeypatch):
    """Issue 76: abandoning a run folder removed what it wrote after the release, when a newcomer may hold the
    folder and its new lock file. Now the files go while the lock is held, and the folder, made by the failed run,
    stays when a newcomer took it in between."""
    from snapvit_pl.run.folder import RunFolder

    folder = RunFolder(tmp_path / "run").open()
    (folder.path / "partial.json").write_text("{}")
    newcomer = []
    real_release = DirectoryLock.release

    def a_newcomer_takes_it(lock):
        assert not (folder.path / "partial.json").exists()  # removed while still held
        real_release(lock)
        newcomer.append(DirectoryLock(folder.path).acquire())

    monkeypatch.setattr(DirectoryLock, "release", a_newcomer_takes_it)
    assert folder.abandon() is False
    monkeypatch.undo()
    assert (folder.path / DirectoryLock.FILE).is_file() and DirectoryLock.holder(folder.path)  # the newcomer's
    newcomer[0].release()
    assert not any(folder.path.iterdir())
