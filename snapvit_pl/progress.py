"""Progress of long stages: a bar in a terminal, plain log lines in a cluster log, a pipe or a file.

Every stage that takes long (importance, search, split choice, correction, evaluation) reports through
:class:`Progress`. Where it goes depends on ``mode``:

- ``auto`` (default): a tqdm bar when standard error is a terminal, else log lines;
- ``bar``, ``lines``: always that;
- ``off``: nothing.

A log line is written at most every ``interval`` seconds (and once when the stage ends), e.g.::

    [snapvit] search: 40/150 (27%), elapsed 0:31, ETA 1:25, best 0.0421, sigma 0.45
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Literal, Optional, TextIO

ProgressMode = Literal["auto", "bar", "lines", "off"]
MODES = ("auto", "bar", "lines", "off")
#: Seconds between two log lines of one stage (``SNAPVIT_PROGRESS_INTERVAL`` overrides it).
LINE_INTERVAL = 10.0


def line_interval() -> float:
    """Seconds between two log lines: ``SNAPVIT_PROGRESS_INTERVAL`` when set, else :data:`LINE_INTERVAL`.

    Raises:
        ConfigError: the variable is not a number of seconds >= 0.
    """
    import math

    text = os.environ.get("SNAPVIT_PROGRESS_INTERVAL", "").strip()
    if not text:
        return LINE_INTERVAL
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        from .errors import ConfigError

        raise ConfigError(f"SNAPVIT_PROGRESS_INTERVAL={text!r} is not a number of seconds >= 0; give e.g. 10, or unset "
                          f"it (default {LINE_INTERVAL:g} s)")
    return seconds


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


#: Seconds between two readings of a bar's tensor fields (each reading waits for the device).
FIELDS_INTERVAL = 1.0


def _format(value: Any) -> str:
    if hasattr(value, "dim") and value.dim() == 0:  # a 0-d tensor: read here, when it is shown
        value = float(value)
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _plural(unit: str) -> str:
    return unit + ("es" if unit.endswith(("ch", "sh", "s", "x")) else "s")


#: What a mode becomes once resolved (``auto`` is a bar or lines): what :class:`Progress` shows in.
RESOLVED = ("bar", "lines", "off")


def resolve_mode(mode: ProgressMode | bool, stream: Optional[TextIO] = None) -> str:
    """``bar``, ``lines`` or ``off`` for a progress setting (``True`` means ``auto``, ``False`` means ``off``;
    ``auto``: a bar when ``stream``, default standard error, is a terminal). The one check of the setting: a run
    resolves it once (``prune.py`` as it parses, a :class:`~snapvit_pl.pipeline.Pipeline` as it is made) and hands
    the resolved mode on.

    Raises:
        ConfigError: not one of :data:`MODES`.
    """
    if mode is True:
        mode = "auto"
    elif mode is False or mode is None:
        mode = "off"
    if mode not in MODES:
        from .errors import ConfigError

        raise ConfigError(f"--progress must be one of {', '.join(MODES)}, got {mode!r}")
    if mode != "auto":
        return mode
    stream = stream or sys.stderr
    return "bar" if hasattr(stream, "isatty") and stream.isatty() else "lines"


def shown_mode(mode: ProgressMode | bool, stream: Optional[TextIO] = None) -> str:
    """A mode resolved already (:data:`RESOLVED`) as it is, any other setting resolved (:func:`resolve_mode`)."""
    return mode if isinstance(mode, str) and mode in RESOLVED else resolve_mode(mode, stream)


class Progress:
    """Progress of one stage (see the module docstring); use as a context manager or call :meth:`close`.

    Args:
        stage: the stage's name, printed first (``importance``, ``search``, ...).
        total: steps expected (None: unknown; no percentage or ETA then).
        mode: ``auto``, ``bar``, ``lines`` or ``off`` (``True``/``False``: ``auto``/``off``).
        unit: what a step is (``batch``, ``eval``, ``model``).
        initial: steps already done (a resumed stage).
        interval: seconds between log lines (default :data:`LINE_INTERVAL`).
        stream: where lines and bars go (default standard error).
    """

    def __init__(self, stage: str, total: Optional[int] = None, mode: ProgressMode | bool = "auto", *,
                 unit: str = "it", initial: int = 0, interval: Optional[float] = None,
                 stream: Optional[TextIO] = None):
        self.stage, self.total, self.unit = stage, total, unit
        self.stream = stream or sys.stderr
        self.mode = shown_mode(mode, self.stream)
        self.done, self.initial = initial, initial
        self.fields: dict[str, Any] = {}
        self.interval = interval if interval is not None else line_interval()
        self.started = time.perf_counter()
        self._last_line = self.started
        self._last_fields = -FIELDS_INTERVAL
        self._bar = None
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=stage, unit=unit, dynamic_ncols=True, file=self.stream)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        self.close(finished=kind is None)

    def update(self, steps: int = 1, **fields: Any) -> None:
        """``steps`` more done; ``fields`` (e.g. ``best=0.042``) are shown next to the count from now on."""
        self.done += steps
        self.fields.update(fields)
        if self._bar is not None:
            self._bar.update(steps)
            # a field may be a 0-d tensor on an accelerator (a scorer's per-batch loss): reading it waits for the
            # device, so it is read when shown, at most once per interval, never once per step
            now = time.perf_counter()
            if fields and (now - self._last_fields >= FIELDS_INTERVAL or not any(hasattr(v, "dim") for v in fields.values())):
                self._last_fields = now
                self._bar.set_postfix({k: _format(v) for k, v in self.fields.items()}, refresh=False)
        elif self.mode == "lines" and time.perf_counter() - self._last_line >= self.interval and not (
                self.total and self.done >= self.total):  # the last step's line is close()'s
            self._line()

    def set(self, **fields: Any) -> None:
        """Show ``fields`` without a step."""
        self.update(0, **fields)

    def close(self, finished: bool = True) -> None:
        """End the stage: the bar closes; in ``lines`` mode a last line says it is done (``finished``) or stopped (an
        interruption or an error)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.mode == "lines" and self.started is not None:
            self._line(finished=True if finished else None)
        self.mode = "off"

    def _line(self, finished: Optional[bool] = False) -> None:
        now = time.perf_counter()
        elapsed = now - self.started
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        parts = [f"{count} {self.unit if (self.total or self.done) == 1 else _plural(self.unit)}"]
        if self.total:
            parts[0] += f" ({100 * self.done / self.total:.0f}%)"
        parts.append(f"elapsed {_clock(elapsed)}")
        new = self.done - self.initial
        if finished is None:
            parts.append("stopped")
        elif finished:
            parts.append("done")
        elif self.total and new > 0:
            parts.append(f"ETA {_clock(elapsed / new * (self.total - self.done))}")
        parts += [f"{k} {_format(v)}" for k, v in self.fields.items()]
        print(f"[snapvit] {self.stage}: " + ", ".join(parts), file=self.stream, flush=True)
        self._last_line = now
