"""Numeric ranges and word choices as annotations: the one declaration of each setting's range or choices, and the
one check of it.

A field or argument annotated ``PositiveInt``, ``ClosedUnitInterval``, ... (``Annotated[int, Range(...)]``) or
``one_of("fitness", "schedule")`` (``Annotated[str, Choices(...)]``) is checked where the object is built
(:func:`check_fields` in a settings dataclass's ``__post_init__``, :func:`check_arguments` in a constructor): once per
value, whether it came from the command line, a YAML file or Python. The command lines' parser reads these
annotations as plain ``int`` / ``float`` / ``str`` (jsonargparse ignores ``Annotated`` metadata: it converts the text,
the object checks the range or the word), and their ``--help`` derives each option's range or choices from the same
declaration (:func:`range_types`, :func:`describe_range`).
"""
from __future__ import annotations

import math
import operator
import typing
from dataclasses import dataclass, fields, is_dataclass
from typing import Annotated, Any, Callable, Mapping, Optional

from .errors import ConfigError

_OPERATORS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


@dataclass(frozen=True)
class Range:
    """The numbers a setting accepts: its ``base`` (``int`` or ``float``) and ``limits`` (``((">", 0), ...)``, all
    of which hold)."""

    name: str
    base: type
    limits: tuple[tuple[str, Any], ...]

    def describe(self) -> str:
        """``"an integer > 0"``, ``"a number >= 0 and <= 1"``."""
        kind = "an integer" if self.base is int else "a number"
        return f"{kind} {' and '.join(f'{op} {bound}' for op, bound in self.limits)}"

    def admits(self, value: Any) -> bool:
        """Whether ``value`` is a finite number of the base kind within every limit (a bool is no number)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.base is int and not (isinstance(value, int) or float(value).is_integer()):
            return False
        return math.isfinite(value) and all(_OPERATORS[op](value, bound) for op, bound in self.limits)


@dataclass(frozen=True)
class Choices:
    """The words a setting accepts."""

    words: tuple[str, ...]

    def describe(self) -> str:
        """``"one of fitness, schedule"``."""
        return f"one of {', '.join(self.words)}"

    def admits(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.words


def one_of(*words: str) -> Any:
    """A setting that is one of ``words`` (``Annotated[str, Choices(words)]``): declared here, checked by
    :func:`check_value` as the object is built."""
    return Annotated[str, Choices(tuple(words))]


def _ranged(name: str, base: type, *limits: tuple[str, Any]) -> Any:
    return Annotated[base, Range(name, base, tuple(limits))]


PositiveInt = _ranged("PositiveInt", int, (">", 0))
NonNegativeInt = _ranged("NonNegativeInt", int, (">=", 0))
PositiveFloat = _ranged("PositiveFloat", float, (">", 0))
NonNegativeFloat = _ranged("NonNegativeFloat", float, (">=", 0))
#: A float in [0, 1].
ClosedUnitInterval = _ranged("ClosedUnitInterval", float, (">=", 0), ("<=", 1))
#: A float in (0, 1).
OpenUnitInterval = _ranged("OpenUnitInterval", float, (">", 0), ("<", 1))
#: A float in [0, 1) (a smoothing, a grid spacing where 0 means none).
HalfOpenUnitInterval = _ranged("HalfOpenUnitInterval", float, (">=", 0), ("<", 1))
#: The seeds accepted everywhere (NumPy's seeds are 32-bit).
SEED_RANGE = (0, 2**32 - 1)
#: A seed: an int in :data:`SEED_RANGE`.
Seed = _ranged("Seed", int, (">=", SEED_RANGE[0]), ("<=", SEED_RANGE[1]))
#: An int of at least 2 (a population).
AtLeastTwo = _ranged("AtLeastTwo", int, (">=", 2))

__all__ = ["AtLeastTwo", "Choices", "ClosedUnitInterval", "HalfOpenUnitInterval", "NonNegativeFloat",
           "NonNegativeInt", "OpenUnitInterval", "PositiveFloat", "PositiveInt", "Range", "SEED_RANGE", "Seed", "bounds",
           "check_arguments", "check_fields", "check_value", "declared_hints", "describe_range", "one_of", "range_types"]


def range_types(hint: Any) -> tuple[Range | Choices, ...]:
    """The ranges and choices an annotation declares (``Optional[PositiveInt]`` -> ``(Range("PositiveInt", ...),)``)."""
    if typing.get_origin(hint) is Annotated:
        return tuple(meta for meta in hint.__metadata__ if isinstance(meta, (Range, Choices)))
    return tuple(found for part in typing.get_args(hint) if typing.get_origin(hint) is typing.Union
                 for found in range_types(part))


def describe_range(kind: Any) -> str:
    """``PositiveInt`` (or its :class:`Range`) -> ``"an integer > 0"``; ``one_of("a", "b")`` -> ``"one of a, b"``."""
    return kind.describe() if isinstance(kind, (Range, Choices)) else \
        " or ".join(r.describe() for r in range_types(kind))


def bounds(hint: Any) -> list[list[Any]]:
    """An annotation's limits as ``[[">", 0], ["<", 1]]``; empty without a declared range."""
    return [[op, bound] for found in range_types(hint) if isinstance(found, Range) for op, bound in found.limits]


def declared_hints(owner: Any, prefix: str) -> dict[str, Any]:
    """``{"prefix.name": annotation}`` of a dataclass's fields or a class's constructor arguments, with their declared
    ranges (a parser reads the annotations without them: what a ``--help`` shows them from)."""
    if is_dataclass(owner):
        hints = typing.get_type_hints(owner, include_extras=True)
    else:
        hints = {}
        for klass in reversed(owner.__mro__):  # a subclass's own arguments last (they win)
            if "__init__" in vars(klass) and klass is not object:
                try:
                    hints.update(typing.get_type_hints(klass.__init__, include_extras=True))
                except (NameError, TypeError, AttributeError, SyntaxError):
                    continue  # a foreign class whose annotations do not resolve: no ranges there
    return {f"{prefix}.{name}": hint for name, hint in hints.items() if name != "return"}


def _literals(hint: Any) -> set[Any]:
    """The words an annotation accepts besides its numbers (``Union[PositiveInt, Literal["auto"]]`` -> ``{"auto"}``)."""
    return {word for part in typing.get_args(hint) if typing.get_origin(part) is typing.Literal
            for word in typing.get_args(part)}


def check_value(name: str, value: Any, hint: Any) -> None:
    """The range or choice check: refuse ``value`` of the setting ``name`` outside the range or choices ``hint``
    declares (one :class:`ConfigError` naming the setting, the range and the value); None and the hint's words
    pass."""
    words = _literals(hint)
    if value is None or (isinstance(value, str) and value in words):
        return
    if bool in typing.get_args(hint):  # a switch, perhaps with words (``Union[bool, Literal["auto"]]``)
        if isinstance(value, bool):
            return
        if not range_types(hint):
            accepted = ["true", "false", *sorted(map(str, words))]
            raise ConfigError(f"{name} must be {', '.join(accepted[:-1])} or {accepted[-1]}, got {value!r}")
    for found in range_types(hint):
        if isinstance(found, Choices):
            if not found.admits(value):
                raise ConfigError(f"{name} must be {found.describe()}, got {value!r}")
        elif not found.admits(value):
            alternatives = "".join(f" or {word}" for word in sorted(map(str, words)))
            finite = isinstance(value, float) and not math.isfinite(value)
            raise ConfigError(f"{name} must be a finite number, got {value!r}" if finite else
                              f"{name} must be {found.describe()}{alternatives}, got {value!r}")


def check_fields(settings: Any, section: str) -> None:
    """Check a dataclass's fields against their annotations' ranges (one :class:`ConfigError` naming
    ``section.field``, the YAML key, and the range)."""
    assert is_dataclass(settings)
    hints = typing.get_type_hints(type(settings), include_extras=True)
    for item in fields(settings):
        check_value(f"{section}.{item.name}", getattr(settings, item.name), hints.get(item.name))


def check_arguments(function: Callable[..., Any], arguments: Mapping[str, Any], section: str,
                    skip: Optional[set[str]] = None) -> None:
    """Check ``arguments`` (e.g. an ``__init__``'s locals) against ``function``'s annotations' ranges (those that
    ``arguments`` holds)."""
    for name, hint in typing.get_type_hints(function, include_extras=True).items():
        if name != "return" and name not in (skip or ()) and name in arguments:
            check_value(f"{section}.{name}", arguments[name], hint)
