"""What every command line shares: one dialect (jsonargparse, as LightningCLI), one error exit, one logger block.

The dialect, for every command (``prune``, ``train``, ``extract``, ``evaluate``, ``deploy``, ``hub``):

- options are ``--group.key value`` (or ``--group.key=value``), values in YAML (``true``, ``[1, 2]``, ``{a: 1}``);
- ``--config FILE`` reads a YAML of the same keys (repeatable, the last wins); a config written for another
  snapvit-pl command is accepted: the sections this command does not use (e.g. a ``prune.py`` config's
  ``search:`` given to ``evaluate``) are left out, anything else unknown is refused; ``--config NAME`` reads the
  shipped preset of that name (``configs/prune/NAME.yaml``, for ``train`` / ``pretrain`` ``configs/train/``), from
  any working directory (:func:`resolve_config`); a file with a top-level ``base:`` (a path relative to its folder,
  or a list) reads those files first, its own settings over them (:func:`config_layers`);
- ``--print_config`` prints the resolved configuration and exits;
- ``--verbose true`` (or a bare ``--verbose``) shows the traceback of errors; without it an error the user can
  fix is one ``error:`` line and exit status 2.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from ..errors import (
    ConfigError, SnapViTError, config_error, env_verbose, exit_with_error, os_error, out_of_memory, storage_error,
    user_error_in,
)
from ..config_files import config_action, configs_first, resolve_configs
from ..lightning.trainer_policy import ignore_expected_warnings


# Expected in a pruning run (no optimiser, no validation loop: snapvit_pl.lightning.trainer_policy), and the CLI's own.
ignore_expected_warnings()
warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter")

_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")

#: Set while a command runs through the ``snapvit-pl`` dispatcher (:func:`snapvit_pl.cli.main`): its messages then
#: name ``snapvit-pl prune``, not ``python prune.py``.
_DISPATCHED: list[bool] = [False]


@contextmanager
def dispatched() -> Iterator[None]:
    """Commands run inside this block were started as ``snapvit-pl COMMAND`` (:func:`program`)."""
    before, _DISPATCHED[0] = _DISPATCHED[0], True
    try:
        yield
    finally:
        _DISPATCHED[0] = before


def program(command: str) -> str:
    """How the user started ``command`` (``"python prune.py"``, ``"snapvit-pl prune"`` or the ``snapvit-pl X`` of
    any other command), for its usage line, its help and the commands its messages suggest: ``python prune.py`` /
    ``python train.py`` only when the process runs those scripts (or calls their entry points directly), else the
    installed command."""
    name = command.split()[-1].removesuffix(".py")
    script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if name in ("prune", "train") and not _DISPATCHED[0] and script != "snapvit-pl":
        return f"python {name}.py"
    return f"snapvit-pl {name}"


#: The parser a command built last (:func:`remember_parser`): what a misspelt option is matched against.
_PARSERS: list[Any] = []


def remember_parser(parser: Any) -> Any:
    """Keep ``parser`` (a command's, once built) for the "did you mean" of an unknown option; returns it."""
    _PARSERS[:] = [parser]
    return parser


def last_parser() -> Any:
    """The parser a command built last (None before any)."""
    return _PARSERS[0] if _PARSERS else None


def pop_verbose(argv: list[str], keep: bool = True) -> tuple[list[str], bool]:
    """Read ``--verbose`` before parsing (errors of the parsing itself need it): ``--verbose``, ``--verbose true``,
    ``--verbose=false``; returns the arguments with it written ``--verbose=<value>`` (removed unless ``keep``) and
    the value (``SNAPVIT_VERBOSE=1`` also turns it on)."""
    out, verbose, i = [], env_verbose(), 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--verbose" or arg.startswith("--verbose="):
            value = arg.split("=", 1)[1] if "=" in arg else None
            if value is None and i + 1 < len(argv) and argv[i + 1].lower() in _TRUE + _FALSE:
                value, i = argv[i + 1], i + 1
            value = "true" if value is None else value.lower()
            if value not in _TRUE + _FALSE:
                raise ConfigError(f"--verbose takes true or false, got {value!r}")
            verbose = value in _TRUE
            if keep:
                out.append(f"--verbose={'true' if verbose else 'false'}")
        else:
            out.append(arg)
        i += 1
    return out, verbose


def run_command(body: Callable[[list[str]], int], argv: Optional[Sequence[str]], command: str,
                cleanup: Optional[Callable[[], None]] = None, keep_verbose: bool = True,
                batch_options: Sequence[str] = (), presets: str = "prune",
                finished: Optional[Callable[[], Optional[str]]] = None) -> int:
    """Run a command's ``body(argv)``; an error the user can fix (or a bad option) becomes one ``error:`` line and
    status 2 (``cleanup`` runs first), unless ``--verbose`` asks for the traceback (``keep_verbose``: the command's
    parser reads ``--verbose`` too). Running out of memory is such an error: its line names ``batch_options``; so is
    an I/O failure whatever library raised it (the folder the command said it writes, :func:`writing_to`, is named
    when the error does not say which file). Ctrl+C ends it with one line and status 130, unless ``finished``
    says (a line to print) that everything the command makes was written before the signal came: then the
    command ends as finished, status 0. A reader of the standard output that goes away
    (``| head -1``) changes nothing: the rest of the output is dropped. ``body`` gets ``argv`` with its ``--config``
    values first and each one the file it names (a preset's name of the kind ``presets``: its shipped file,
    :func:`resolve_configs`)."""
    if argv is None:
        reexec_in_utf8_mode()  # (the process's own command line only)
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = False
    _WRITING[0] = None
    with tolerate_closed_output():
        try:
            check_environment()
            argv, verbose = pop_verbose(argv, keep_verbose)
            return body(resolve_configs(configs_first(argv), presets))
        except KeyboardInterrupt:
            done = finished() if finished is not None else None
            if done:  # every result written already: the signal changed nothing
                print(done, file=sys.stderr)
                return 0
            if cleanup is not None:
                cleanup()
            print(f"interrupted: {program(command)} stopped before it finished (Ctrl+C); run it again", file=sys.stderr)
            return 130
        except (SnapViTError, argparse.ArgumentError) as err:
            if cleanup is not None:
                cleanup()
            return exit_with_error(err if isinstance(err, SnapViTError) else config_error(err, command, last_parser()),
                                   verbose)
        except Exception as err:  # noqa: BLE001 - what is not the user's to fix keeps its traceback (re-raised)
            mapped = _user_facing(err, batch_options)
            if mapped is None:
                raise
            if cleanup is not None:
                cleanup()
            if mapped is not err and mapped.__cause__ is None:
                mapped.__cause__ = err  # --verbose shows where it happened
            return exit_with_error(err if verbose else mapped, verbose)


#: The folder the running command writes (:func:`writing_to`).
_WRITING: list[Optional[Path]] = [None]


def writing_to(folder: str | Path) -> None:
    """Say which folder the running command writes its files in: an I/O failure whose error names no file (a library
    writing a log, a checkpoint) is reported in it, with that folder's free space."""
    _WRITING[0] = Path(folder)


def _user_facing(err: Exception, batch_options: Sequence[str]) -> Optional[BaseException]:
    """The error the user can act on behind ``err`` (None: a bug, whose traceback is kept): an error of the project
    that an instantiation wrapper re-raised (jsonargparse's TypeError / ValueError), an I/O failure (whatever library
    raised it: ``OSError``, safetensors' ``SafetensorError``), or running out of memory."""
    if isinstance(err, (TypeError, ValueError)):
        cause = user_error_in(err)
        if cause is not None:
            return cause
    failure = os_error(err)
    if failure is not None:
        return storage_error(failure, where=None if _WRITING[0] is None else str(_WRITING[0]))
    if isinstance(err, MemoryError) or ("torch" in sys.modules and out_of_memory(err)):
        first = " ".join(str(err).split())[:160]
        hint = f"lower {', '.join(batch_options)}" if batch_options else "use a smaller model or a larger device"
        return ConfigError(f"out of memory ({first}); {hint}")
    return None


def check_environment() -> None:
    """Refuse, before anything is imported or read, what the process's environment makes impossible: a working
    directory that was deleted (torch would not even load), and the project's environment variables set to values
    they do not take (``SNAPVIT_VERBOSE``, ``SNAPVIT_PROGRESS_INTERVAL``)."""
    from ..progress import line_interval

    try:
        os.getcwd()
    except OSError as err:
        raise ConfigError(f"the working directory no longer exists ({err.strerror or err}): it was deleted or moved; "
                          "cd into an existing directory and run the command again") from None
    env_verbose()
    line_interval()


def reexec_in_utf8_mode() -> None:
    """Start this command again in Python's UTF-8 mode when the locale's file-system encoding is ASCII (``LC_ALL=C``
    with ``PYTHONUTF8=0``): there, a non-ASCII path (``--out_dir``, a data root, one in a config) is undecodable, and
    the configuration's YAML cannot carry it. In UTF-8 mode the same bytes name the same files. ``PYTHONUTF8=1`` is
    set for it, so that the processes it starts (a multi-device run's) are in UTF-8 mode too."""
    import codecs

    try:
        ascii_fs = codecs.lookup(sys.getfilesystemencoding()).name == "ascii"
    except LookupError:
        return
    if not ascii_fs or sys.flags.utf8_mode or not getattr(sys, "orig_argv", None):
        return
    os.environ["PYTHONUTF8"] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


class _ClosedPipeTolerant:
    """A standard stream whose reader may go away: once a write fails with a broken pipe, the stream's descriptor is
    pointed at ``/dev/null`` and everything else written is dropped, so the command's outcome is what it would have
    been (``prune.py ... | head -1`` finishes its run and exits 0)."""

    def __init__(self, stream: Any):
        self._stream, self.gone = stream, False

    def _drop(self) -> None:
        self.gone = True
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
        except (OSError, ValueError, AttributeError):  # no descriptor (a test's capture): nothing to redirect
            pass

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def reopen_closed_standard_streams() -> None:
    """Point standard input, output and error at ``/dev/null`` where the process was started with them closed
    (``prune.py >&-``, as some schedulers and daemons start commands). Python then sets ``sys.stdout`` (or
    ``sys.stderr``) to None, and the first file the command opens would take the free descriptor 1 or 2, so that
    anything written to standard output (by a library, by a process it starts) would land in that file."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))


@contextmanager
def tolerate_closed_output() -> Iterator[None]:
    """Standard output and error as :class:`_ClosedPipeTolerant` streams for the duration of a command (a closed
    one first reopened on ``/dev/null``, :func:`reopen_closed_standard_streams`)."""
    reopen_closed_standard_streams()
    streams = {name: getattr(sys, name) for name in ("stdout", "stderr")}
    guarded = {name: stream if isinstance(stream, _ClosedPipeTolerant) else _ClosedPipeTolerant(stream)
               for name, stream in streams.items()}
    for name, stream in guarded.items():
        setattr(sys, name, stream)
    try:
        yield
    finally:
        for name, stream in streams.items():
            if getattr(sys, name) is guarded[name]:
                setattr(sys, name, stream)


def help_formatter():
    """jsonargparse's help formatter, keeping the line breaks of the description and the examples."""
    from jsonargparse import DefaultHelpFormatter

    class HelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
        pass

    return HelpFormatter


def describe(doc: str, width: int = 100) -> str:
    """A command module's docstring as its help's description: whole paragraphs, each filled to ``width``
    columns, without the ``literal`` markup."""
    import textwrap

    paragraphs = [" ".join(p.replace("``", "").split()) for p in doc.strip().split("\n\n")]
    return "\n\n".join(textwrap.fill(p, width, break_on_hyphens=False) for p in paragraphs if p)


def show_declared(parser: Any, hints: dict[str, Any]) -> None:
    """Append each option's declared range or choices (``hints``: option -> annotation,
    :func:`snapvit_pl.ranges.declared_hints`) to its help: the parser reads the annotation without them and would
    print ``type: int`` alone (the settings check the range, once, as they are built)."""
    from ..ranges import describe_range, range_types

    for action in parser._actions:
        found = range_types(hints.get(action.dest))
        if found and action.help is not None:
            action.help = f"{action.help.rstrip().rstrip('.')}; {' or '.join(describe_range(kind) for kind in found)}"


def command_parser(prog: str, doc: str, sections: Iterable[str], epilog: Optional[str] = None):
    """A jsonargparse parser in the project's dialect: ``--config`` (any command's YAML), ``--print_config``,
    ``--verbose``; add the command's own groups, named as in ``prune.py``. ``doc``: the command module's docstring
    (the help's description)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog=prog, description=describe(doc), epilog=epilog, exit_on_error=False,
                            formatter_class=help_formatter())
    parser.add_argument("--config", action=config_action(sections), help="a YAML of these options (or a config of "
                        "another snapvit-pl command: the sections this one does not use are left out), or the name "
                        "of a shipped preset (e.g. dino_vitb16: configs/prune/dino_vitb16.yaml)")
    parser.add_argument("--verbose", type=bool, default=False, help="show the traceback of errors (or set SNAPVIT_VERBOSE=1)")
    return remember_parser(parser)


def tensorboard_logger(save_dir: str | Path, **options: Any) -> dict[str, Any]:
    """The one TensorBoard logger of the project's runs: ``<save_dir>/tensorboard`` (no version subfolder)."""
    return {"class_path": "pytorch_lightning.loggers.TensorBoardLogger",
            "init_args": {"save_dir": str(save_dir), "name": "tensorboard", "version": "", **options}}
