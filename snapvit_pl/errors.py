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


def os_error(err: BaseException) -> "OSError | None":
    """The operating-system error behind ``err``, whatever library raised it: ``err`` itself, one in its chain of
    causes, or one a library reports in a type of its own (safetensors' ``SafetensorError: ... No space left on device
    (os error 28)``); None when it is not an I/O failure."""
    import os
    import re

    seen: set[int] = set()
    current: "BaseException | None" = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and not isinstance(current, SnapViTError) and current.errno is not None:
            return current
        found = re.search(r"\(os error (\d+)\)|\[Errno (\d+)\]", str(current))
        if found and not isinstance(current, SnapViTError):
            code = int(found.group(1) or found.group(2))
            return OSError(code, os.strerror(code))
        current = current.__cause__ or current.__context__
    return None


def user_error_in(err: BaseException) -> "SnapViTError | None":
    """The first error meant for the user in ``err``'s chain of causes (what an instantiation wrapper re-raised)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, SnapViTError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is a CUDA out-of-memory error or a failed CPU allocation."""
    import torch

    message = str(err)
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and ("CUDA out of memory" in message or "can't allocate memory" in message))


def storage_error(err: OSError, path: "str | None" = None, needed: "int | None" = None,
                  written: "int | None" = None, where: "str | None" = None) -> StorageError:
    """The one mapping of an operating-system error to a line for the user: the path, what went wrong, and (disk
    full, file-size limit) the space needed and the space free on that file's device. ``where``: the folder being
    written when the error does not say which file (the free space is that folder's, never the working
    directory's)."""
    import errno
    import os
    import shutil

    path = path or err.filename or None
    folder = os.path.dirname(os.path.abspath(path)) if path else (os.path.abspath(where) if where else None)
    shown = path or (f"a file in {where}" if where else "a file (the error does not say which)")
    reason = err.strerror or str(err) or type(err).__name__
    if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        while folder and not os.path.isdir(folder) and os.path.dirname(folder) != folder:
            folder = os.path.dirname(folder)
        try:
            free = f"{_size(shutil.disk_usage(folder).free)} free in {folder}" if folder else "free space unknown"
        except OSError:
            free = "free space unknown"
        need = (f"it needs about {_size(needed)}" if needed else
                f"it needs more than the {_size(written)} written" if written else "it needs more space")
        need = f"{need}, {free}"
        fix = ("raise the file-size limit (ulimit -f) or write elsewhere" if err.errno == errno.EFBIG else
               "free some space there or choose another output location")
        return StorageError(f"cannot write {shown}: {reason} ({need}); {fix}")
    fixes = {errno.EACCES: "check its permissions or choose another location",
             errno.EPERM: "check its permissions or choose another location",
             errno.EROFS: "the file system is read-only; choose a writable location",
             errno.ENOENT: "check the path", errno.EISDIR: "give a file path, not a directory",
             errno.ENOTDIR: "a part of the path is a file, not a directory; check the path"}
    return StorageError(f"{shown}: {reason}; {fixes.get(err.errno, 'check the path and the disk')}")


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


def _expected(kind: str) -> str:
    """jsonargparse's name of an expected type as words: ``<class 'int'>`` -> ``an integer``,
    ``typing.Literal['auto']`` -> ``auto``."""
    import re

    words = {"int": "an integer", "float": "a number", "bool": "true or false", "NoneType": "null", "str": "text"}
    named = re.fullmatch(r"<class '(\w+)'>", kind)
    if named:
        return words.get(named.group(1), named.group(1))
    return " or ".join(re.findall(r"'([^']+)'", kind)) if kind.startswith("typing.Literal") else kind


def config_error(err: BaseException, command: str, parser: object = None) -> "ConfigError":
    """A configuration parser's (jsonargparse) error as one line: the deepest key named and why it was refused; for
    a misspelt option (of the command, ``parser``'s, or of a class given by ``class_path``: ``--data.init_args.rot``)
    the likely-meant one."""
    import re

    unknown = _misspelt_option(str(err), parser)
    if unknown is not None:
        return ConfigError(f"{unknown}see {command} --help for the options")

    message = str(err)
    keys = re.findall(r'(?:Parser key|key) "([^"]+)"', message)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    reason = lines[0] if lines else type(err).__name__
    nested = [i for i, line in enumerate(lines) if line.startswith(("Parser key", "- Problem with given class_path"))]
    if nested and nested[-1] + 1 < len(lines):  # the deepest refusal's own reason
        reason = lines[nested[-1] + 1]
    if reason.startswith("Does not validate against any of the Union subtypes"):  # what each subtype expected
        given = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Given value:")), None)
        expected = [_expected(line[len("- Expected a "):]) for line in lines if line.startswith("- Expected a ")]
        reason = next((line[2:] for line in lines if line.startswith("- Not of type")), None) or (
            f"expected {' or '.join(expected)}, got {given!r}" if expected and given is not None else reason)
    elif reason.startswith("Expected a ") and ". Got value: " in reason:  # a number or a bool that is none
        kind, value = reason[len("Expected a "):].split(". Got value: ", 1)
        reason = f"expected {_expected(kind)}, got {value!r}"
    if reason.startswith("Not of type ") and ": " in reason:  # the type's own message (Budget.parse's) is the reason
        reason = reason.split(": ", 1)[1]
    keys = [k for k in keys if not k.startswith("--")]
    key = ".".join(keys)
    if len(keys) > 1 and "class_path" in message:  # a subclass's argument: --data.init_args.batch_size
        key = f"{keys[0]}.init_args.{'.'.join(keys[1:])}"
    where = f"--{key}: " if key and key not in reason else ""
    return ConfigError(f"{where}{reason.rstrip('.')}; see {command} --help for the accepted values")


def _misspelt_option(message: str, parser: object) -> "str | None":
    """``--key: no such option; did you mean --other? `` for a parser's refusal of an unknown option (an unrecognized
    argument of ``parser``, or an argument that the class named by ``class_path`` does not take); None otherwise."""
    import difflib
    import re

    given = re.match(r"unrecognized arguments: (--[\w.\-]+)", message)
    if given is not None:
        option = given.group(1)
        known = sorted(_parser_options(parser))
    else:
        refused = re.search(r"Option '([^']+)' is not accepted", message)
        owner = re.search(r"Problem with given class_path '([\w.]+)'", message)
        group = re.findall(r'Parser key "([^"]+)"', message)
        if refused is None or owner is None or not group:
            return None
        prefix = f"--{group[0]}.init_args."
        option = prefix + refused.group(1)
        known = [prefix + name for name in sorted(_class_arguments(owner.group(1)))]
        if not known:
            return f"{option}: no such option of {owner.group(1)}; "
    close = difflib.get_close_matches(option, known, n=1, cutoff=0.75)
    return f"{option}: no such option; {'did you mean ' + close[0] + '? ' if close else ''}"


def _parser_options(parser: object) -> set:
    """The ``--options`` of an argparse / jsonargparse parser and of its subcommands' parsers."""
    options, stack, seen = set(), [parser], set()
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        options |= {o for o in getattr(current, "_option_string_actions", {}) if o.startswith("--")}
        for action in getattr(current, "_actions", []):
            stack.extend((getattr(action, "_name_parser_map", None) or {}).values())
    return options


def _class_arguments(class_path: str) -> set:
    """The constructor arguments of the class ``class_path`` names (through its bases' while it passes ``**kwargs``
    on); empty when it cannot be imported."""
    import importlib
    import inspect

    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return set()
    names: set = set()
    for klass in getattr(cls, "__mro__", ()):
        init = vars(klass).get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters.values()
        names |= {p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
    return names


def exit_with_error(err: BaseException, verbose: bool = False) -> int:
    """The one error exit of every command line: print ``error: <message>`` as a single line and return
    status 2, or re-raise ``err`` (with its traceback) when ``verbose`` (``--verbose``, ``SNAPVIT_VERBOSE=1``)."""
    import sys

    if verbose or env_verbose(strict=False):
        raise err

    message = " ".join(str(err).split()) or type(err).__name__
    print(f"error: {message}", file=sys.stderr)
    return 2


#: How an environment variable says yes or no (``SNAPVIT_VERBOSE=0`` is no).
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def env_verbose(strict: bool = True) -> bool:
    """Whether ``SNAPVIT_VERBOSE`` asks for tracebacks: ``1``/``true``/``yes``/``on``; unset, empty, ``0``,
    ``false``, ``no`` or ``off`` do not.

    Raises:
        ConfigError: (``strict``) any other value.
    """
    import os

    value = os.environ.get("SNAPVIT_VERBOSE", "").strip().lower()
    if value in TRUE_WORDS or value in FALSE_WORDS or not strict:
        return value in TRUE_WORDS
    raise ConfigError(f"SNAPVIT_VERBOSE={value!r} is neither on nor off; set it to 1 (show tracebacks) or 0, or unset it")
