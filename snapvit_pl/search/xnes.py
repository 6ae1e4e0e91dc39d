"""Exponential natural evolution strategy (xNES, Glasmachers et al. 2010) in plain torch.

The search distribution is N(mean, sigma^2 * B B^T). Each generation draws z ~ N(0, I) and
candidates x = mean + sigma * B z; the update follows the natural gradient of the expected
rank-shaped utility:

    G_delta = sum_k u_k z_k                 G_M = sum_k u_k (z_k z_k^T - I)
    G_sigma = tr(G_M) / d                   G_B = G_M - G_sigma I
    mean  <- mean + eta_mu * sigma * B G_delta
    sigma <- sigma * exp(eta_sigma / 2 * G_sigma)
    B     <- B expm(eta_B / 2 * G_B)

With the paper's learning rates, eta_sigma = eta_B = 3 (3 + ln d) / (5 d sqrt d) (0.015 for
d = 42, 0.0045 for d = 156), sigma and B barely move in a few hundred evaluations: in short
budgets xNES is close to a random search around its initial mean (see :class:`.snes.SNES`).
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor

from .base import EvolutionStrategy, default_popsize, xnes_utilities

__all__ = ["XNES", "default_learning_rate", "default_popsize", "xnes_utilities"]


def default_learning_rate(dimension: int) -> float:
    """Step-size and shape learning rate 3 (3 + ln d) / (5 d sqrt d) from the xNES paper."""
    return 3 * (3 + math.log(dimension)) / (5 * dimension * math.sqrt(dimension))


class XNES(EvolutionStrategy):
    """Seeded xNES minimiser with an ask/tell interface and exact resume.

    Args:
        mean: initial mean, shape [D]; fixes the dimension.
        sigma: initial step size.
        covariance: initial covariance [D, D] (identity if None); its Cholesky factor is the
            initial B, so the initial search covariance is sigma^2 * covariance.
        popsize: candidates per generation (default 4 + floor(3 ln D)).
        eta_mu: mean learning rate.
        eta_sigma: step-size learning rate (default 3 (3 + ln D) / (5 D sqrt D)).
        eta_B: shape learning rate (same default as eta_sigma).
        seed: seed of the optimiser's own torch.Generator.
        dtype: floating dtype of the distribution and of the samples.
    """

    def __init__(
        self,
        mean: Tensor,
        sigma: float = 1.0,
        covariance: Optional[Tensor] = None,
        popsize: Optional[int] = None,
        eta_mu: float = 1.0,
        eta_sigma: Optional[float] = None,
        eta_B: Optional[float] = None,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
    ):
        super().__init__(mean, popsize, seed, dtype)
        eye = torch.eye(self.dimension, dtype=dtype)
        self.B = eye if covariance is None else torch.linalg.cholesky(torch.as_tensor(covariance, dtype=dtype))
        self._sigma = float(sigma)
        self.eta_mu = eta_mu
        self.eta_sigma = eta_sigma if eta_sigma is not None else default_learning_rate(self.dimension)
        self.eta_B = eta_B if eta_B is not None else default_learning_rate(self.dimension)

    @property
    def sigma(self) -> float:
        return self._sigma

    @property
    def A(self) -> Tensor:
        """Full covariance factor sigma * B (search covariance is A A^T)."""
        return self._sigma * self.B

    def _sample(self, z: Tensor) -> Tensor:
        return self.mean + self._sigma * z @ self.B.T

    def _standardize(self, samples: Tensor) -> Tensor:
        return torch.linalg.solve(self.B, ((samples - self.mean) / self._sigma).T).T

    def _update(self, z: Tensor, u: Tensor) -> None:
        eye = torch.eye(self.dimension, dtype=self.dtype)
        grad_delta = u @ z
        grad_M = (z.T * u) @ z - u.sum() * eye
        grad_sigma = torch.trace(grad_M) / self.dimension
        grad_B = grad_M - grad_sigma * eye
        self.mean = self.mean + self.eta_mu * self._sigma * self.B @ grad_delta
        self._sigma = self._sigma * math.exp(self.eta_sigma / 2 * float(grad_sigma))
        self.B = self.B @ torch.linalg.matrix_exp(self.eta_B / 2 * grad_B)

    def _distribution_state(self) -> dict[str, Any]:
        return {"B": self.B.clone(), "sigma": self._sigma, "eta_mu": self.eta_mu, "eta_sigma": self.eta_sigma,
                "eta_B": self.eta_B}

    def _load_distribution_state(self, state: dict[str, Any]) -> None:
        self.B = state["B"].to(self.dtype).clone()
        self._sigma = float(state["sigma"])
        self.eta_mu, self.eta_sigma, self.eta_B = state["eta_mu"], state["eta_sigma"], state["eta_B"]
