"""The head/MLP split of cost budgets: head ratios chosen once (by the pipeline's fitness), read for any budget.

A parameter or FLOPs budget can be met by many (mlp_ratio, head_ratio) pairs. The pipeline chooses the
head ratio for a grid of kept fractions of the dense model (and for every budget a run asks for), per
metric, and records them here. Any later budget of that metric is cut at the head ratio of its kept
fraction: the recorded one where there is one, else interpolated linearly between the two nearest
recorded fractions (the nearest end outside the grid). Budgets of other kinds (ratio pairs, latency)
and metrics without recorded points follow the default schedule.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Optional

#: Kept fractions closer than this are the same budget (``1 - 0.4`` and ``0.6``).
TOLERANCE = 1e-9
METRICS = ("params", "flops")


@dataclass
class SplitTable:
    """Chosen head ratios by metric and kept fraction: ``{"params": [(keep, head_ratio), ...], "flops": [...]}``.

    Args:
        points: per metric, ``(kept fraction of the dense cost, head ratio)`` pairs (sorted on construction).
    """

    points: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        points: dict[str, list[tuple[float, float]]] = {}
        for metric, pairs in self.points.items():
            for keep, head_ratio in pairs:
                self._insert(points.setdefault(metric, []), float(keep), float(head_ratio))
        self.points = points

    @staticmethod
    def _insert(pairs: list[tuple[float, float]], keep: float, head_ratio: float) -> None:
        index = bisect.bisect_left(pairs, (keep - TOLERANCE, -1.0))
        if index < len(pairs) and abs(pairs[index][0] - keep) <= TOLERANCE:
            pairs[index] = (pairs[index][0], head_ratio)
        else:
            pairs.insert(index, (keep, head_ratio))

    def add(self, metric: str, keep: float, head_ratio: float) -> None:
        """Record the head ratio chosen for ``metric`` at kept fraction ``keep`` (replacing an earlier one)."""
        if metric not in METRICS:
            raise ValueError(f"split metric must be one of {METRICS}, got {metric!r}")
        self._insert(self.points.setdefault(metric, []), float(keep), float(head_ratio))

    def records(self, metric: str, keep: float) -> bool:
        """Whether a head ratio was chosen for ``metric`` at ``keep`` itself (not interpolated)."""
        return any(abs(k - keep) <= TOLERANCE for k, _ in self.points.get(metric, []))

    def head_ratio(self, metric: str, keep: float) -> Optional[float]:
        """The head ratio for ``metric`` at ``keep``: recorded, interpolated, or the nearest end; None if none."""
        pairs = self.points.get(metric)
        if not pairs:
            return None
        keeps = [k for k, _ in pairs]
        index = bisect.bisect_left(keeps, keep - TOLERANCE)
        if index < len(pairs) and abs(keeps[index] - keep) <= TOLERANCE:
            return pairs[index][1]
        if index == 0:
            return pairs[0][1]
        if index == len(pairs):
            return pairs[-1][1]
        (k0, h0), (k1, h1) = pairs[index - 1], pairs[index]
        return h0 + (h1 - h0) * (keep - k0) / (k1 - k0)

    def __len__(self) -> int:
        return sum(len(pairs) for pairs in self.points.values())

    def to_dict(self) -> dict[str, list[list[float]]]:
        """JSON-ready: ``{"params": [[keep, head_ratio], ...], ...}``."""
        return {metric: [[k, h] for k, h in pairs] for metric, pairs in self.points.items()}

    @classmethod
    def from_dict(cls, data: Optional[dict[str, Any]]) -> "SplitTable":
        """Inverse of :meth:`to_dict`."""
        return cls({str(metric): [(float(k), float(h)) for k, h in pairs] for metric, pairs in (data or {}).items()})
