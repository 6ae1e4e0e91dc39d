"""What the natural evolution strategies share: rank-based utilities, the ask/tell loop, best-so-far, exact resume.

A strategy keeps a Gaussian search distribution. ``ask`` draws a generation of candidates; ``tell``
ranks their fitness (minimised), turns ranks into utilities and moves the distribution along the
natural gradient of the expected utility. Non-finite fitness values (NaN, +inf and -inf alike)
rank below every finite value and share the mean utility of the ranks they occupy, never become
the best solution, and are counted in ``nonfinite_evaluations``.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Optional

import torch
from torch import Tensor


def default_popsize(dimension: int) -> int:
    """Population size 4 + floor(3 ln d) from the NES papers (19 for d=156)."""
    return 4 + int(math.floor(3 * math.log(dimension)))


def xnes_utilities(n: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """Rank-based NES utilities for ranks 1..n (best first); they sum to zero."""
    ranks = torch.arange(1, n + 1, dtype=dtype)
    raw = (math.log(n / 2 + 1) - torch.log(ranks)).clamp_min(0)
    return raw / raw.sum() - 1 / n


class EvolutionStrategy(ABC):
    """Seeded minimiser with an ask/tell interface and exact resume; subclasses define the distribution.

    Args:
        mean: initial mean, shape [D]; fixes the dimension.
        popsize: candidates per generation (default 4 + floor(3 ln D)).
        seed: seed of the strategy's own torch.Generator.
        dtype: floating dtype of the distribution and of the samples.
    """

    def __init__(self, mean: Tensor, popsize: Optional[int], seed: int, dtype: torch.dtype):
        self.dtype = dtype
        self.mean = torch.as_tensor(mean, dtype=dtype).flatten().clone()
        self.dimension = self.mean.numel()
        self.popsize = popsize or default_popsize(self.dimension)
        self.generator = torch.Generator().manual_seed(seed)
        self.evaluations = 0
        self.generation = 0
        self.nonfinite_evaluations = 0
        self.best_x: Optional[Tensor] = None
        self.best_fitness = math.inf
        self.history: list[dict] = []

    # -- the distribution (subclasses) ----------------------------------------------------------
    @abstractmethod
    def _sample(self, z: Tensor) -> Tensor:
        """Candidates from standard normal draws ``z`` [n, D]."""

    @abstractmethod
    def _standardize(self, samples: Tensor) -> Tensor:
        """Inverse of :meth:`_sample`: the standard normal draws behind ``samples``."""

    @abstractmethod
    def _update(self, z: Tensor, u: Tensor) -> None:
        """Move the distribution, given draws ``z`` sorted best first and their utilities ``u``."""

    @property
    @abstractmethod
    def sigma(self) -> float:
        """The overall step size (for logging)."""

    @abstractmethod
    def _distribution_state(self) -> dict[str, Any]:
        """The subclass's part of :meth:`state_dict`."""

    @abstractmethod
    def _load_distribution_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`_distribution_state`."""

    # -- ask / tell -----------------------------------------------------------------------------
    def ask(self) -> Tensor:
        """Draw one generation of candidates, shape [popsize, D]."""
        z = torch.randn(self.popsize, self.dimension, generator=self.generator, dtype=self.dtype)
        return self._sample(z)

    def tell(self, samples: Tensor, fitness: Tensor) -> None:
        """Update the distribution from evaluated candidates (minimisation).

        Args:
            samples: candidates [n, D] (normally from ask(); n <= popsize is allowed, e.g. a
                generation truncated by the evaluation budget).
            fitness: fitness per candidate [n]; non-finite values rank worst.
        """
        samples = torch.as_tensor(samples, dtype=self.dtype)
        fitness = torch.as_tensor(fitness, dtype=self.dtype).flatten()
        finite = torch.isfinite(fitness)
        ranked_fitness = torch.where(finite, fitness, torch.full_like(fitness, math.inf))
        order = torch.sort(ranked_fitness, stable=True).indices
        n = fitness.numel()
        u = xnes_utilities(n, self.dtype)
        num_nonfinite = int((~finite).sum())
        if num_nonfinite:
            u[n - num_nonfinite :] = u[n - num_nonfinite :].mean()
        self._update(self._standardize(samples)[order], u)

        self.evaluations += n
        self.generation += 1
        self.nonfinite_evaluations += num_nonfinite
        best = int(order[0])
        if finite[best] and float(fitness[best]) < self.best_fitness:
            self.best_fitness = float(fitness[best])
            self.best_x = samples[best].clone()
        self.history.append({
            "generation": self.generation,
            "evaluations": self.evaluations,
            "generation_best": float(ranked_fitness[best]),
            "generation_median": float(ranked_fitness.median()),
            "best_fitness": self.best_fitness,
            "sigma": self.sigma,
        })

    # -- resume ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Full state (plain tensors and python values) for exact resume."""
        return {
            "kind": type(self).__name__,
            "mean": self.mean.clone(),
            "popsize": self.popsize,
            "dtype": str(self.dtype).removeprefix("torch."),
            "generator_state": self.generator.get_state(),
            "evaluations": self.evaluations,
            "generation": self.generation,
            "nonfinite_evaluations": self.nonfinite_evaluations,
            "best_x": None if self.best_x is None else self.best_x.clone(),
            "best_fitness": self.best_fitness,
            "history": [dict(entry) for entry in self.history],
            **self._distribution_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a state produced by state_dict(); later asks match the saved run bit for bit.

        Raises:
            ValueError: the state belongs to another kind of strategy.
        """
        kind = state.get("kind", "XNES")
        if kind != type(self).__name__:
            raise ValueError(f"a {kind} state cannot resume a {type(self).__name__}")
        self.dtype = getattr(torch, state["dtype"])
        self.mean = state["mean"].to(self.dtype).clone()
        self.dimension = self.mean.numel()
        self.popsize = int(state["popsize"])
        self.generator.set_state(state["generator_state"])
        self.evaluations = int(state["evaluations"])
        self.generation = int(state["generation"])
        self.nonfinite_evaluations = int(state["nonfinite_evaluations"])
        self.best_x = None if state["best_x"] is None else state["best_x"].clone()
        self.best_fitness = float(state["best_fitness"])
        self.history = [dict(entry) for entry in state["history"]]
        self._load_distribution_state(state)
