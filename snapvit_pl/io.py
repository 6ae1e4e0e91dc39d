"""Files: every artifact is written to a temporary name, then renamed into place (atomic output); user paths are
resolved against the shipped data too (the presets in ``configs/``, the demo's model in ``assets/``)."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from .errors import CheckpointError, ConfigError, SnapViTError, os_error, storage_error

_PACKAGE = Path(__file__).resolve().parent
#: The folder holding the shipped ``configs/`` (the presets) and ``assets/`` (the demo's model): the installed
#: package itself (a wheel ships them as ``snapvit_pl/configs``, ``snapvit_pl/assets``: pyproject.toml's
#: package-dir), or in a checkout (``python prune.py``, an editable install) the project root beside ``snapvit_pl/``.
DATA_ROOT = _PACKAGE if (_PACKAGE / "configs").is_dir() else _PACKAGE.parent


def resolve_path(path: str | os.PathLike) -> Path:
    """A user path; a relative one missing from the working directory is looked up in the shipped data
    (:data:`DATA_ROOT`) too, so the paths the presets name (``assets/...``) work from anywhere, installed or not."""
    path = Path(path).expanduser()
    if not path.is_absolute() and not path.exists() and (DATA_ROOT / path).exists():
        return DATA_ROOT / path
    return path


def special_file(path: str | os.PathLike) -> Optional[str]:
    """What ``path`` is when it exists but is neither a regular file nor a directory (following links): ``a named pipe
    (FIFO)``, ``a socket``, ``a device``; None otherwise. Reading such a file can block for ever (a FIFO nobody writes
    to), so every reader of a user's path refuses it first."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return None


def weights_file(path: str | os.PathLike) -> Path:
    """The existing weights file ``path`` names (:func:`resolve_path`).

    Raises:
        CheckpointError: there is no such file.
    """
    resolved = resolve_path(path)
    if resolved.is_dir():
        raise CheckpointError(f"checkpoint_path {resolved} is a directory; give a weights file (a pruned checkpoint "
                              "directory is read by --checkpoint / load_pruned)")
    if special_file(resolved) is not None:
        raise CheckpointError(f"checkpoint_path {resolved} is {special_file(resolved)}, not a weights file; give a "
                              "weights file")
    if not resolved.is_file():
        raise CheckpointError(f"checkpoint file not found: {resolved}; pass an existing weights file as checkpoint_path")
    return resolved


@contextmanager
def atomic_path(path: str | os.PathLike, overwrite: bool = True, replaces: Optional[Callable[[Path], bool]] = None,
                size: Optional[int] = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``.

    Works for files and directories. On any exception the temporary file or directory is
    removed, so ``path`` is either its old self or complete, never half-written. What is renamed
    into place gets the permissions the umask gives new files (the temporary directory itself is
    private, and some writers create 0600 files).

    A directory already at ``path`` is never removed unless ``replaces(path)`` says it is one this kind of
    writer made (an earlier pruned checkpoint): anything else there is refused (``ConfigError``) before
    anything is written. Running out of space (or into a file-size limit) is a ``StorageError`` naming
    ``path`` and the space needed (``size``, or what was written before the disk filled up).
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} already exists; pass overwrite=True (or --overwrite true) to replace it")
    replace_dir = path.is_dir()
    if replace_dir and (path.is_symlink() or replaces is None or not replaces(path)):
        kind = "a link to a directory" if path.is_symlink() else "a directory"
        what = "a file path" if replaces is None else "a new path (it is not one this writer made)"
        raise ConfigError(f"{path} is {kind}; nothing was written there: give {what}")
    target = None
    created = next((p for p in reversed(path.parents) if not p.exists()), None)  # the first folder this makes
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        target = tmp / path.name
        yield target
        _follow_umask(target)
        if replace_dir:
            trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, trash / path.name)
            os.replace(target, path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(target, path)
    except BaseException as err:
        written = _written(target)
        if target is not None:
            shutil.rmtree(target.parent, ignore_errors=True)
        if created is not None:  # the folders made for it, if empty again
            for folder in [path.parent, *path.parent.parents][:len(path.parent.parts) - len(created.parent.parts)]:
                try:
                    folder.rmdir()
                except OSError:
                    break
        failure = None if isinstance(err, SnapViTError) else os_error(err)  # whatever library raised it
        if failure is not None:
            raise storage_error(failure, str(path), needed=size if failure.errno in _FULL else None,
                                written=written) from err
        raise
    finally:
        if target is not None:
            shutil.rmtree(target.parent, ignore_errors=True)


#: The errors of a full disk or a file-size limit (what ``size`` / the bytes written are reported for).
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _written(target: Optional[Path]) -> Optional[int]:
    """Bytes written at ``target`` so far (a lower bound of what it needs)."""
    if target is None or not target.exists():
        return None
    files = [target] if target.is_file() else [p for p in target.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) or None


CHECKSUM_KEY = "sha256"


def content_digest(data: Any) -> str:
    """sha256 of a nested structure: mappings (by key), lists and tuples, tensors (dtype, shape, bytes) and JSON
    values. The same content gives the same digest whether it was read back from JSON (string keys, lists) or from
    ``torch.load``; other objects count by their type only."""
    digest = hashlib.sha256()
    _feed(digest, data)
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, Mapping):
        digest.update(b"{")
        for key in sorted(value, key=str):
            _feed(digest, str(key))
            _feed(digest, value[key])
        digest.update(b"}")
    elif isinstance(value, (list, tuple)):
        digest.update(b"[")
        for item in value:
            _feed(digest, item)
        digest.update(b"]")
    elif _is_tensor(value):
        import torch

        tensor = value.detach().cpu().contiguous().reshape(-1)
        digest.update(f"T{tensor.dtype}{tuple(value.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy())  # the buffer itself, no copy
    elif value is None or isinstance(value, (str, int, float, bool)):
        digest.update(json.dumps(value).encode())
    else:
        digest.update(f"<{type(value).__qualname__}>".encode())


def _is_tensor(value: Any) -> bool:
    """A torch tensor (without importing torch for JSON-only data)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def with_checksum(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with its :func:`content_digest` added under :data:`CHECKSUM_KEY`."""
    return {**data, CHECKSUM_KEY: content_digest(data)}


def check_version(version: Any, current: int, path: str | os.PathLike, fix: str) -> None:
    """Refuse a file whose format version is not ``current``: a newer one (upgrade snapvit-pl), an older one (its
    checks are not this version's: no older format is read without them; ``fix`` rewrites the file), or none.

    Raises:
        CheckpointError: naming ``path``, the version found and the fix.
    """
    if isinstance(version, int) and not isinstance(version, bool) and version > current:
        raise CheckpointError(f"{path} has format version {version}, newer than this snapvit-pl reads ({current}); "
                              "upgrade snapvit-pl to read it")
    if version != current or isinstance(version, bool):
        found = "no format version" if version is None else f"format version {version!r}"
        raise CheckpointError(f"{path} has {found}; this snapvit-pl reads version {current} only (older files lack "
                              f"its checksums); {fix}")


def verify_checksum(data: dict[str, Any], path: str | os.PathLike, fix: str, required: bool = True) -> dict[str, Any]:
    """``data`` without its checksum, after checking it (``CheckpointError`` naming ``path`` and ``fix`` when it
    does not match, or is missing where ``required``): the one reader of what :func:`with_checksum` wrote."""
    data = dict(data)
    recorded = data.pop(CHECKSUM_KEY, None)
    if recorded is None and not required:
        return data
    if recorded is None:
        raise CheckpointError(f"{path} carries no checksum (damaged, or written by an older snapvit-pl); {fix}")
    if recorded != content_digest(data):
        raise CheckpointError(f"{path} does not match its checksum (damaged or modified since it was written); {fix}")
    return data


def sha256_file(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


def write_bytes(path: str | os.PathLike, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path``: a plain write, whose failure is an ``OSError`` with its errno (what a library's own
    writer may not say: torch's names none), for bytes serialised in memory first."""
    with open(path, "wb") as f:
        f.write(data)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path, size=len(text.encode())) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically."""
    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def _writable(directory: Path) -> Optional[str]:
    """Why a file cannot be created in ``directory`` (None: it can), found by creating (and removing) one."""
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=directory):
            return None
    except OSError as err:
        return err.strerror or str(err)


def _check_ancestors(path: Path, option: str) -> None:
    """The nearest existing ancestor of ``path`` must be a directory this process can write in."""
    ancestor = path.parent
    while not ancestor.exists() and ancestor.parent != ancestor:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"{option} {path} lies under the file {ancestor}; choose a path in a directory")
    reason = _writable(ancestor)
    if reason is not None:
        raise ConfigError(f"{option} {path} cannot be created: {ancestor} is not writable ({reason}); choose a "
                          "writable location")


def check_output_dir(path: str | Path, option: str) -> Path:
    """Refuse, before anything is written, an output directory that cannot be one: a file, under a file, or not
    writable (nor its nearest existing ancestor)."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise ConfigError(f"{option} {path} is a symbolic link to {os.readlink(path)}, which does not exist; create "
                          "that directory, or choose another path")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path} is a file, not a directory; choose a directory path")
    if path.is_dir():
        reason = _writable(path)
        if reason is not None:
            raise ConfigError(f"{option} {path} is not writable ({reason}); choose a writable directory")
    else:
        _check_ancestors(path, option)
    return path


def check_output_file(path: str | Path, option: str, overwrite: Optional[bool] = True,
                      ours: Optional[Callable[[Path], bool]] = None) -> Path:
    """Refuse, before anything is written, an output file that cannot be written (a directory, under a file, in
    a read-only directory, a named pipe) or that exists without ``overwrite``; ``overwrite`` None (the default of
    ``--overwrite``): an existing file is replaced only when ``ours(path)`` says this command wrote it."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a directory; give a file path")
    if special_file(path) is not None:
        raise ConfigError(f"{option} {path} is {special_file(path)}, not a file; give a file path")
    if path.exists() and overwrite is None and not (ours is not None and ours(path)):
        raise ConfigError(f"{option} {path} exists and was not written by this command; pass --overwrite true to "
                          "replace it or choose another path")
    if path.exists() and overwrite is False:
        raise ConfigError(f"{option} {path} exists; pass --overwrite true to replace it or choose another path")
    _check_ancestors(path, option)
    return path
