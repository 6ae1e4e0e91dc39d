"""Data-free scorers: weight magnitude, LAMP and seeded random scores (baselines)."""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Optional

import torch
from torch import Tensor

from ..errors import CheckpointError
from ..models.units import UnitGroup
from ..ranges import PositiveFloat, Seed, check_arguments
from ..seeding import resolve_seed
from .base import LocalScores, Rows, Scorer, ScoringError, head_rows, neuron_rows, unit_sum


class _DataFree(Scorer):
    """No data, no accumulators: ``update``/``reduce`` do nothing, ``compute`` reads the weights."""

    requires_data = False

    def state_dict(self) -> dict[str, Any]:
        return {"scorer": self.name}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("scorer") != self.name:
            raise CheckpointError(f"scorer state of {state.get('scorer')} cannot resume {self.name}")


class _WeightScorer(_DataFree):
    """Scores each unit from its weight rows (q, k, v rows for heads; fc1 rows for neurons)."""

    @torch.no_grad()
    def compute(self) -> LocalScores:
        self._require_bound()
        return LocalScores([self._score(b.heads, head_rows(b.heads, "qkv")) for b in self.blocks],
                           [self._score(b.neurons, neuron_rows(b.neurons)) for b in self.blocks])

    @abstractmethod
    def _score(self, group: UnitGroup, rows: list[Rows]) -> Tensor:
        """One score per unit of ``group`` from its weight ``rows``."""


def _powered(group: UnitGroup, rows: list[Rows], p: float) -> Tensor:
    """Per unit, sum of ``|w|^p`` over its rows ``[U]`` (float64)."""
    return unit_sum([r.view(r.weight.detach(), group).double().abs().pow(p) for r in rows])


class Magnitude(_WeightScorer):
    """p-norm of each unit's input weights.

    A neuron's rows are its ``fc1`` row(s) (both halves of a gated MLP); a head's rows are its
    q, k and v rows of the attention input projection: all the weights that produce the head's
    attention pattern and values (biases excluded). Heads, like neurons, all have the same
    number of weights, so the norms compare across blocks.

    Args:
        p: norm order (> 0).
    """

    name = "magnitude"

    def __init__(self, p: PositiveFloat = 2):
        if not p > 0:
            raise ScoringError(f"magnitude: p must be > 0, got {p}")
        self.p = p

    def _score(self, group: UnitGroup, rows: list[Rows]) -> Tensor:
        return _powered(group, rows, self.p).pow(1 / self.p)


def lamp(squared_magnitudes: Tensor) -> Tensor:
    """LAMP scores ``m_i^2 / sum_{j: m_j >= m_i} m_j^2`` (ties share a score); the largest is 1."""
    m2 = squared_magnitudes.double()
    descending = m2.sort(descending=True).values
    at_least = m2.numel() - torch.searchsorted(descending.flip(0), m2)  # #{j: m_j >= m_i}
    return m2 / descending.cumsum(0)[at_least - 1].clamp_min(torch.finfo(torch.float64).tiny)


class LAMP(_WeightScorer):
    """LAMP (Lee et al. 2021) on the structured units' squared L2 magnitudes, per block.

    Rows as in :class:`Magnitude`; within each block's heads (and each block's neurons),
    ``score_i = m_i^2 / sum_{j: m_j >= m_i} m_j^2``: scores lie in (0, 1], the block's largest
    unit scores 1, which makes scores comparable across blocks of different weight scales.
    """

    name = "lamp"

    def __init__(self):
        pass

    def _score(self, group: UnitGroup, rows: list[Rows]) -> Tensor:
        return lamp(_powered(group, rows, 2))


class RandomScorer(_DataFree):
    """Uniform random scores in [0, 1) from a seeded generator (identical on every process).

    Args:
        seed: generator seed; None: prune.py's seed_everything (0 from Python).
    """

    name = "random"

    def __init__(self, seed: Optional[Seed] = None):
        check_arguments(RandomScorer.__init__, locals(), "importance.scorer.init_args", skip={"self"})
        self.seed = resolve_seed(seed)

    def compute(self) -> LocalScores:
        self._require_bound()
        generator = torch.Generator().manual_seed(int(self.seed))
        heads, neurons = [], []
        for block in self.blocks:
            heads.append(torch.rand(block.heads.num_units, generator=generator))
            neurons.append(torch.rand(block.neurons.num_units, generator=generator))
        return LocalScores(heads, neurons)
