"""Exception types whose message is meant for the user: one line naming the problem and the fix.

The command-line entry points print these without a traceback (unless ``--verbose``) and exit
non-zero; any other exception is a bug and keeps its traceback.
"""


class SnapViTError(Exception):
    """Base class of every user-facing error raised by snapvit-pl."""


class UnsupportedModelError(SnapViTError, TypeError):
    """The model (or one of its blocks) is not an architecture the surgery knows."""


class PruningSpecError(SnapViTError, ValueError):
    """A selection of units, a ratio or a budget is invalid for the model."""


class CheckpointError(SnapViTError, ValueError):
    """A checkpoint or elastic-score file is missing, corrupt, or belongs to another model."""


class DataError(SnapViTError, ValueError):
    """A data set root, layout or file is missing or unreadable."""


class ConfigError(SnapViTError, ValueError):
    """A command-line or YAML setting is invalid or conflicts with existing files."""


class StorageError(SnapViTError, OSError):
    """A file could not be written or read: no space left, a file-size limit, no permission, a read-only disk."""


def storage_error(err: OSError, path: "str | None" = None, needed: "int | None" = None,
                  written: "int | None" = None) -> StorageError:
    """The one mapping of an operating-system error to a line for the user: the path, what went wrong, and (disk
    full, file-size limit) the space needed and the space free there."""
    import errno
    import os
    import shutil

    path = path or err.filename or "a file"
    reason = err.strerror or str(err) or type(err).__name__
    if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        folder = os.path.dirname(os.path.abspath(path))
        while folder and not os.path.isdir(folder) and os.path.dirname(folder) != folder:
            folder = os.path.dirname(folder)
        try:
            free = f"{_size(shutil.disk_usage(folder).free)} free in {folder}"
        except OSError:
            free = "free space unknown"
        need = (f"it needs about {_size(needed)}" if needed else
                f"it needs more than the {_size(written)} written" if written else "it needs more space")
        need = f"{need}, {free}"
        fix = ("raise the file-size limit (ulimit -f) or write elsewhere" if err.errno == errno.EFBIG else
               "free some space there or choose another output location")
        return StorageError(f"cannot write {path}: {reason} ({need}); {fix}")
    fixes = {errno.EACCES: "check its permissions or choose another location",
             errno.EPERM: "check its permissions or choose another location",
             errno.EROFS: "the file system is read-only; choose a writable location",
             errno.ENOENT: "check the path", errno.EISDIR: "give a file path, not a directory",
             errno.ENOTDIR: "a part of the path is a file, not a directory; check the path"}
    return StorageError(f"{path}: {reason}; {fixes.get(err.errno, 'check the path and the disk')}")


def _size(num_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(num_bytes) < 1000 or unit == "TB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1000
    return ""


def field_error(source: object, field: str, found: object, allowed: str, fix: str = "") -> "CheckpointError":
    """The one error of a file's field that breaks its schema: the file, the field, what was found (shortened) and
    what is allowed, then the fix."""
    shown = repr(found) if len(repr(found)) <= 60 else repr(found)[:57] + "..."
    return CheckpointError(f"{source}: {field} is {shown}, expected {allowed}{'; ' + fix if fix else ''}")


def config_error(err: BaseException, command: str) -> "ConfigError":
    """A configuration parser's (jsonargparse) error as one line: the deepest key named and why it was refused."""
    import re

    message = str(err)
    keys = re.findall(r'(?:Parser key|key) "([^"]+)"', message)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    given = None
    reason = lines[0] if lines else type(err).__name__
    nested = [i for i, line in enumerate(lines) if line.startswith(("Parser key", "- Problem with given class_path"))]
    if nested and nested[-1] + 1 < len(lines):  # the deepest refusal's own reason
        reason = lines[nested[-1] + 1]
    if reason.startswith("Does not validate against any of the Union subtypes"):  # Optional[X]: why not an X
        reason = next((line[2:] for line in lines if line.startswith("- Not of type")), reason)
        given = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Given value:")), None)
    restricted = re.match(r"Not of type \w+: (?:(\S+) )?does not conform to restriction (.+)", reason)
    if restricted:  # a constrained number type (snapvit_pl.ranges): "-1 is out of range: must be > 0"
        value = restricted.group(1) or (given if nested and "Union" in message else None)
        bounds = " and ".join(re.sub(r"^v([<>]=?)", r"\1 ", part) for part in restricted.group(2).split(" and "))
        reason = f"{value + ' is ' if value else ''}out of range: must be {bounds}"
    elif reason.startswith("Not of type ") and ": " in reason:  # the type's own message (Budget.parse's) is the reason
        reason = reason.split(": ", 1)[1]
    keys = [k for k in keys if not k.startswith("--")]
    key = ".".join(keys)
    if len(keys) > 1 and "class_path" in message:  # a subclass's argument: --data.init_args.batch_size
        key = f"{keys[0]}.init_args.{'.'.join(keys[1:])}"
    where = f"--{key}: " if key and key not in reason else ""
    return ConfigError(f"{where}{reason.rstrip('.')}; see {command} --help for the accepted values")


def exit_with_error(err: BaseException, verbose: bool = False) -> int:
    """The one error exit of every command line: print ``error: <message>`` as a single line and return
    status 2, or re-raise ``err`` (with its traceback) when ``verbose`` (``--verbose``, ``SNAPVIT_VERBOSE=1``)."""
    import os
    import sys

    if verbose or os.environ.get("SNAPVIT_VERBOSE"):
        raise err

    message = " ".join(str(err).split()) or type(err).__name__
    print(f"error: {message}", file=sys.stderr)
    return 2
