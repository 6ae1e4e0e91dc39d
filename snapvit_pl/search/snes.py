"""Separable natural evolution strategy (SNES, Schaul, Glasmachers & Schmidhuber 2011) in plain torch.

The search distribution is N(mean, diag(sigma)^2) with one step size per coordinate. Each
generation draws z ~ N(0, I), candidates x = mean + sigma * z, and follows the natural gradient:

    mean  <- mean + eta_mu * sigma * sum_k u_k z_k
    sigma <- sigma * exp(eta_sigma / 2 * sum_k u_k (z_k^2 - 1))

Its default step-size learning rate, (3 + ln d) / (5 sqrt d) (0.21 for d = 42, 0.18 for d = 156),
is about 40x larger than xNES's full-covariance rate, so the step sizes adapt within tens of
generations: what a search of a few hundred evaluations needs.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor

from .base import EvolutionStrategy


def snes_learning_rate(dimension: int) -> float:
    """SNES's step-size learning rate (3 + ln d) / (5 sqrt d)."""
    return (3 + math.log(dimension)) / (5 * math.sqrt(dimension))


class SNES(EvolutionStrategy):
    """Seeded SNES minimiser with an ask/tell interface and exact resume.

    Args:
        mean: initial mean, shape [D]; fixes the dimension.
        sigma: initial step size of every coordinate (a float or a [D] tensor).
        popsize: candidates per generation (default 4 + floor(3 ln D)).
        eta_mu: mean learning rate.
        eta_sigma: step-size learning rate (default (3 + ln D) / (5 sqrt D)).
        seed: seed of the optimiser's own torch.Generator.
        dtype: floating dtype of the distribution and of the samples.
    """

    def __init__(
        self,
        mean: Tensor,
        sigma: float | Tensor = 1.0,
        popsize: Optional[int] = None,
        eta_mu: float = 1.0,
        eta_sigma: Optional[float] = None,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
    ):
        super().__init__(mean, popsize, seed, dtype)
        self.sigmas = torch.as_tensor(sigma, dtype=dtype).expand(self.dimension).clone()
        self.eta_mu = eta_mu
        self.eta_sigma = eta_sigma if eta_sigma is not None else snes_learning_rate(self.dimension)

    @property
    def sigma(self) -> float:
        """Geometric mean of the per-coordinate step sizes."""
        return float(self.sigmas.log().mean().exp())

    def _sample(self, z: Tensor) -> Tensor:
        return self.mean + self.sigmas * z

    def _standardize(self, samples: Tensor) -> Tensor:
        return (samples - self.mean) / self.sigmas

    def _update(self, z: Tensor, u: Tensor) -> None:
        self.mean = self.mean + self.eta_mu * self.sigmas * (u @ z)
        self.sigmas = self.sigmas * torch.exp(self.eta_sigma / 2 * (u @ (z * z - 1)))

    def _distribution_state(self) -> dict[str, Any]:
        return {"sigmas": self.sigmas.clone(), "eta_mu": self.eta_mu, "eta_sigma": self.eta_sigma}

    def _load_distribution_state(self, state: dict[str, Any]) -> None:
        self.sigmas = state["sigmas"].to(self.dtype).clone()
        self.eta_mu, self.eta_sigma = state["eta_mu"], state["eta_sigma"]
