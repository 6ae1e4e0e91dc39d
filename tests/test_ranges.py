"""Numeric ranges as annotations (snapvit_pl.ranges): one declaration, checked where the settings are built (from
the command line, a YAML file or Python alike), and shown in the help."""
import dataclasses
import typing

import pytest

from snapvit_pl.cli.help import load_options
from snapvit_pl.correction import CorrectionSettings
from snapvit_pl.data import ClassificationDataModule
from snapvit_pl.errors import ConfigError
from snapvit_pl.pipeline.settings import ExportSettings, PipelineSettings
from snapvit_pl.ranges import (ClosedUnitInterval, HalfOpenUnitInterval, PositiveInt, Seed, bounds, check_fields,
                               describe_range, range_types)
from snapvit_pl.scoring import GaussNewtonGreedy, Magnitude, OutputSensitivity, RandomScorer
from snapvit_pl.search import SearchSettings


def _plain_numbers(hints: dict) -> list[str]:
    """The numeric settings without a declared range: plain ``int`` / ``float`` (or Optional of them)."""
    def plain(hint):  # (a declared range is Annotated[int, Range(...)], never a bare int)
        args = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
        return any(a in (int, float) for a in args)
    return [name for name, hint in hints.items() if plain(hint)]


def test_every_numeric_setting_declares_its_range():
    settings = [type(f.default_factory()) for f in dataclasses.fields(PipelineSettings)]
    missing = {cls.__name__: _plain_numbers(typing.get_type_hints(cls, include_extras=True)) for cls in settings}
    for function in (ClassificationDataModule.__init__, OutputSensitivity.__init__, GaussNewtonGreedy.__init__,
                     RandomScorer.__init__):
        missing[function.__qualname__] = _plain_numbers(typing.get_type_hints(function, include_extras=True))
    assert not {k: v for k, v in missing.items() if v}, missing


def test_ranges_read_as_words_and_bounds():
    assert describe_range(PositiveInt) == "an integer > 0"
    assert describe_range(ClosedUnitInterval) == "a number >= 0 and <= 1"
    assert describe_range(HalfOpenUnitInterval) == "a number >= 0 and < 1"
    assert bounds(typing.Optional[Seed]) == [[">=", 0], ["<=", 2**32 - 1]] and bounds(int) == []
    assert [found.name for found in range_types(typing.Optional[PositiveInt])] == ["PositiveInt"]
    assert range_types(typing.Union[PositiveInt, typing.Literal["auto"]]) == range_types(PositiveInt)


@pytest.mark.parametrize("build, message", [
    (lambda: ExportSettings(split_step=1.0), "export.split_step must be a number > 0 and < 1, got 1.0"),
    (lambda: ExportSettings(mlp_multiple=0), "export.mlp_multiple must be an integer > 0, got 0"),
    (lambda: SearchSettings(seed=-1), "search.seed must be an integer >= 0 and <= 4294967295, got -1"),
    (lambda: SearchSettings(sigma=float("inf")), "search.sigma must be a finite number"),
    (lambda: CorrectionSettings(damp_fraction=-0.1), "correction.damp_fraction must be a number >= 0"),
    (lambda: OutputSensitivity(probes=-1), "importance.scorer.init_args.probes must be an integer >= 0"),
    (lambda: RandomScorer(seed=2**32), "importance.scorer.init_args.seed must be an integer >= 0"),
    (lambda: Magnitude(p=0), "p must be > 0"),
])
def test_python_construction_checks_the_same_ranges(build, message):
    with pytest.raises(ConfigError if "p must" not in message else ValueError, match=message.replace("(", r"\(")):
        build()


def test_check_fields_accepts_in_range_values_and_null():
    check_fields(SearchSettings(max_time=None, popsize=None), "search")
    check_fields(ExportSettings(split_grid=0.0, split_step=0.5), "export")


def test_the_help_shows_every_range_and_the_early_checks_none():
    """prune_options.json (rendered from the parser) shows each ranged option's range, from its annotation; the
    checks made before torch is imported (option names, kinds, paths) hold no range: the settings check it, once."""
    options = load_options()
    assert "ranges" not in options and options["kinds"]["export.split_step"] == "float"
    assert "--export.split_step X  (default: 0.1; a number > 0 and < 1)" in options["text"]
    assert "--search.popsize N  (default: 8; an integer >= 2 or null)" in options["text"]
