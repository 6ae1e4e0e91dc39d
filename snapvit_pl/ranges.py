"""Numeric ranges as types: the one declaration of each setting's range.

A field or argument annotated ``PositiveInt``, ``ClosedUnitInterval``, ... (jsonargparse's constrained types) is
refused out of range by the command line's parser, before any work, and its ``--help`` line names the type;
:func:`check_fields` and :func:`check_arguments` apply the same annotations to objects built from Python.
"""
from __future__ import annotations

import math
import operator
import re
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Callable, Mapping, Optional

from jsonargparse.typing import (  # re-exported: the project's range vocabulary
    ClosedUnitInterval, NonNegativeFloat, NonNegativeInt, OpenUnitInterval, PositiveFloat, PositiveInt,
    restricted_number_type,
)

from .errors import ConfigError

#: A float in [0, 1) (a smoothing, a grid spacing where 0 means none).
HalfOpenUnitInterval = restricted_number_type("HalfOpenUnitInterval", float, [(">=", 0.0), ("<", 1.0)],
                                              docstring="float restricted to be ≥0 and <1")
#: The seeds accepted everywhere (NumPy's seeds are 32-bit).
SEED_RANGE = (0, 2**32 - 1)
#: A seed: an int in :data:`SEED_RANGE`.
Seed = restricted_number_type("Seed", int, [(">=", SEED_RANGE[0]), ("<=", SEED_RANGE[1])],
                              docstring=f"int restricted to be ≥{SEED_RANGE[0]} and ≤{SEED_RANGE[1]}")
#: An int of at least 2 (a population).
AtLeastTwo = restricted_number_type("AtLeastTwo", int, [(">=", 2)], docstring="int restricted to be ≥2")

__all__ = ["AtLeastTwo", "ClosedUnitInterval", "HalfOpenUnitInterval", "NonNegativeFloat", "NonNegativeInt",
           "OpenUnitInterval", "PositiveFloat", "PositiveInt", "SEED_RANGE", "Seed", "bounds", "check_arguments", "plain", "check_fields", "describe_range",
           "range_types"]


def range_types(hint: Any) -> tuple[type, ...]:
    """The constrained number types in an annotation (``Optional[PositiveInt]`` -> ``(PositiveInt,)``)."""
    return tuple(kind for kind in typing.get_args(hint) or (hint,) if isinstance(kind, type)
                 and issubclass(kind, (int, float)) and kind not in (int, float, bool))


def describe_range(kind: type) -> str:
    """``PositiveInt`` -> ``"an integer > 0"``, ``ClosedUnitInterval`` -> ``"a number >= 0 and <= 1"``."""
    text = (kind.__doc__ or kind.__name__).replace("≥", ">=").replace("≤", "<=")
    text = text.replace("int restricted to be ", "an integer ").replace("float restricted to be ", "a number ")
    return re.sub(r"([<>]=?)(-?\d)", r"\1 \2", text)


def bounds(hint: Any) -> list[list[Any]]:
    """An annotation's range as ``[[">", 0], ["<", 1]]`` (what the help's option list records for the checks made
    before torch is imported); empty without a constrained type."""
    symbols = {operator.gt: ">", operator.ge: ">=", operator.lt: "<", operator.le: "<="}
    return [[symbols[op], bound] for kind in range_types(hint) for op, bound in getattr(kind, "_restrictions", ())
            if op in symbols]


def _check(name: str, value: Any, hint: Any) -> None:
    if value is None:
        return
    for kind in range_types(hint):
        try:
            kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be {describe_range(kind)}, got {value!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value!r}")


def plain(value: Any) -> Any:
    """``value`` with every constrained number (the parser makes ``PositiveInt(3)``, an ``int`` subclass) as a plain
    ``int`` / ``float``, through lists, tuples, mappings and jsonargparse namespaces (those in place): what a run
    records, pickles (``torch.load(weights_only=True)`` reads no foreign class) and hands to torch is plain data.
    (Instantiating a class from the parsed config casts its arguments again: :func:`check_fields` makes the settings
    dataclasses plain once more, the one place those values are kept and saved.)"""
    from jsonargparse import Namespace

    if isinstance(value, bool) or type(value) in (int, float):
        return value
    if isinstance(value, (int, float)):
        return int(value) if isinstance(value, int) else float(value)
    if isinstance(value, Namespace):
        for key, item in value.items():
            value[key] = plain(item)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(plain(item) for item in value)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


def check_fields(settings: Any, section: str) -> None:
    """Check a dataclass's fields against their annotations' ranges (one :class:`ConfigError` naming
    ``section.field``, the YAML key, and the range), and make them plain numbers (:func:`plain`)."""
    assert is_dataclass(settings)
    hints = typing.get_type_hints(type(settings))
    for item in fields(settings):
        _check(f"{section}.{item.name}", getattr(settings, item.name), hints.get(item.name))
        setattr(settings, item.name, plain(getattr(settings, item.name)))  # (the parser's PositiveInt(3) -> 3)


def check_arguments(function: Callable[..., Any], arguments: Mapping[str, Any], section: str,
                    skip: Optional[set[str]] = None) -> None:
    """Check ``arguments`` (e.g. an ``__init__``'s locals) against ``function``'s annotations' ranges."""
    for name, hint in typing.get_type_hints(function).items():
        if name != "return" and name not in (skip or ()):
            _check(f"{section}.{name}", arguments.get(name), hint)
