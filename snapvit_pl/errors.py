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


def config_error(err: BaseException, command: str) -> "ConfigError":
    """A configuration parser's (jsonargparse) error as one line: the deepest key named and why it was refused."""
    import re

    message = str(err)
    keys = re.findall(r'(?:Parser key|key) "([^"]+)"', message)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    reason = lines[0] if lines else type(err).__name__
    nested = [i for i, line in enumerate(lines) if line.startswith(("Parser key", "- Problem with given class_path"))]
    if nested and nested[-1] + 1 < len(lines):  # the deepest refusal's own reason
        reason = lines[nested[-1] + 1]
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
