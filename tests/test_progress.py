"""Progress outside a terminal is log lines (stage, done/total, elapsed, ETA, the stage's own fields), not bars."""
import io
import re

import pytest

from snapvit_pl.progress import Progress, resolve_mode


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_without_a_terminal_progress_is_log_lines_every_interval():
    stream = io.StringIO()
    with Progress("search", 8, "auto", unit="eval", interval=0, stream=stream) as bar:
        for i in range(4):
            bar.update(2, best=0.05 - 0.01 * i)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4 and all(line.startswith("[snapvit] search: ") for line in lines)  # the last: "done"
    assert re.fullmatch(r"\[snapvit\] search: 2/8 evals \(25%\), elapsed 0:00, ETA 0:00, best 0\.05", lines[0])
    assert lines[-1].startswith("[snapvit] search: 8/8 evals (100%), elapsed 0:00, done, best 0.02")
    assert "\r" not in stream.getvalue()


def test_lines_are_rate_limited_and_the_end_is_always_written():
    stream = io.StringIO()
    with Progress("importance", None, "lines", unit="batch", interval=3600, stream=stream) as bar:
        for _ in range(100):
            bar.update(loss=1.5)
    assert stream.getvalue().splitlines() == ["[snapvit] importance: 100 batches, elapsed 0:00, done, loss 1.5"]


def test_modes():
    assert resolve_mode("auto", FakeTerminal()) == "bar" and resolve_mode("auto", io.StringIO()) == "lines"
    assert resolve_mode(False) == "off" and resolve_mode("lines", FakeTerminal()) == "lines"
    stream = io.StringIO()
    with Progress("export", 2, "off", stream=stream) as bar:
        bar.update(2)
    assert stream.getvalue() == ""
    with pytest.raises(ValueError, match="--progress must be one of"):
        resolve_mode("loud")


def test_a_stage_cut_short_says_stopped_not_done():
    stream = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        with Progress("export", 4, "lines", unit="model", interval=3600, stream=stream) as bar:
            bar.update(1)
            raise KeyboardInterrupt
    assert stream.getvalue().splitlines() == ["[snapvit] export: 1/4 models (25%), elapsed 0:00, stopped"]


def test_the_line_interval_variable_is_a_number_of_seconds(monkeypatch):
    from snapvit_pl.errors import ConfigError
    from snapvit_pl.progress import LINE_INTERVAL, line_interval

    monkeypatch.delenv("SNAPVIT_PROGRESS_INTERVAL", raising=False)
    assert line_interval() == LINE_INTERVAL
    monkeypatch.setenv("SNAPVIT_PROGRESS_INTERVAL", "2.5")
    assert line_interval() == 2.5 and Progress("x", 3, "lines", stream=io.StringIO()).interval == 2.5
    for bad in ("abc", "-1", "nan", "inf"):
        monkeypatch.setenv("SNAPVIT_PROGRESS_INTERVAL", bad)
        with pytest.raises(ConfigError, match="SNAPVIT_PROGRESS_INTERVAL"):
            line_interval()
