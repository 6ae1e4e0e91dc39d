"""Exponential natural evolution strategy (xNES, Glasmachers et al. 2010) in plain torch.

The search distribution is N(mean, sigma^2 * B B^T). Each generation draws z ~ N(0, I) and
candidates x = mean + sigma * B z; the update follows the natural gradient of the expected
rank-shaped utility:

    G_delta = sum_k u_k z_k                 G_M = sum_k u_k (z_k z_k^T - I)
    G_sigma = tr(G_M) / d                   G_B = G_M - G_sigma I
    mean  <- mean + eta_mu * sigma * B G_delta
    sigma <- sigma * exp(eta_sigma / 2 * G_sigma)
    B     <- B expm(eta_B / 2 * G_B)

Fitness is minimised. Non-finite fitness values (NaN, +inf and -inf alike) rank below every
finite value and share the mean utility of the ranks they occupy, never become the best
solution, and are counted in ``nonfinite_evaluations``.
"""

import math
from typing import Callable, Optional

import torch
from torch import Tensor


def default_popsize(dimension: int) -> int:
    """Population size 4 + floor(3 ln d) from the xNES paper (19 for d=156)."""
    return 4 + int(math.floor(3 * math.log(dimension)))


def default_learning_rate(dimension: int) -> float:
    """Step-size and shape learning rate 3 (3 + ln d) / (5 d sqrt d) from the xNES paper."""
    return 3 * (3 + math.log(dimension)) / (5 * dimension * math.sqrt(dimension))


def xnes_utilities(n: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """Rank-based xNES utilities for ranks 1..n (best first); they sum to zero."""
    ranks = torch.arange(1, n + 1, dtype=dtype)
    raw = (math.log(n / 2 + 1) - torch.log(ranks)).clamp_min(0)
    return raw / raw.sum() - 1 / n


class XNES:
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
        self.mean = torch.as_tensor(mean, dtype=dtype).flatten().clone()
        self.dimension = self.mean.numel()
        eye = torch.eye(self.dimension, dtype=dtype)
        self.B = eye if covariance is None else torch.linalg.cholesky(torch.as_tensor(covariance, dtype=dtype))
        self.sigma = float(sigma)
        self.popsize = popsize or default_popsize(self.dimension)
        self.eta_mu = eta_mu
        self.eta_sigma = eta_sigma if eta_sigma is not None else default_learning_rate(self.dimension)
        self.eta_B = eta_B if eta_B is not None else default_learning_rate(self.dimension)
        self.dtype = dtype
        self.generator = torch.Generator().manual_seed(seed)
        self.evaluations = 0
        self.generation = 0
        self.nonfinite_evaluations = 0
        self.best_x: Optional[Tensor] = None
        self.best_fitness = math.inf
        self.history: list[dict] = []

    @property
    def A(self) -> Tensor:
        """Full covariance factor sigma * B (search covariance is A A^T)."""
        return self.sigma * self.B

    def ask(self) -> Tensor:
        """Draw one generation of candidates, shape [popsize, D]."""
        z = torch.randn(self.popsize, self.dimension, generator=self.generator, dtype=self.dtype)
        return self.mean + self.sigma * z @ self.B.T

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
        z = torch.linalg.solve(self.B, ((samples - self.mean) / self.sigma).T).T[order]
        u = xnes_utilities(n, self.dtype)
        num_nonfinite = int((~finite).sum())
        if num_nonfinite:
            u[n - num_nonfinite :] = u[n - num_nonfinite :].mean()
        eye = torch.eye(self.dimension, dtype=self.dtype)
        grad_delta = u @ z
        grad_M = (z.T * u) @ z - u.sum() * eye
        grad_sigma = torch.trace(grad_M) / self.dimension
        grad_B = grad_M - grad_sigma * eye
        self.mean = self.mean + self.eta_mu * self.sigma * self.B @ grad_delta
        self.sigma = self.sigma * math.exp(self.eta_sigma / 2 * float(grad_sigma))
        self.B = self.B @ torch.linalg.matrix_exp(self.eta_B / 2 * grad_B)

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

    def optimize(
        self,
        fn: Callable[[Tensor], float],
        max_evals: int,
        callback: Optional[Callable[["XNES"], Optional[bool]]] = None,
    ) -> tuple[Optional[Tensor], float]:
        """Run ask/evaluate/tell until `evaluations` reaches max_evals.

        Args:
            fn: fitness of ONE candidate (tensor [D]) -> float; called once per candidate.
            max_evals: total evaluation budget, counted from the optimiser's creation (so a
                resumed optimiser continues up to the same budget). The last generation is
                truncated to the remaining budget and still used for an update.
            callback: called with the optimiser after every generation; returning True stops.

        Returns:
            (best_x, best_fitness) over all evaluations so far.
        """
        while self.evaluations < max_evals:
            samples = self.ask()[: max_evals - self.evaluations]
            fitness = torch.tensor([float(fn(x)) for x in samples], dtype=self.dtype)
            self.tell(samples, fitness)
            if callback is not None and callback(self):
                break
        return self.best_x, self.best_fitness

    def state_dict(self) -> dict:
        """Full optimiser state (plain tensors and python values) for exact resume."""
        return {
            "mean": self.mean.clone(),
            "B": self.B.clone(),
            "sigma": self.sigma,
            "popsize": self.popsize,
            "eta_mu": self.eta_mu,
            "eta_sigma": self.eta_sigma,
            "eta_B": self.eta_B,
            "dtype": str(self.dtype).removeprefix("torch."),
            "generator_state": self.generator.get_state(),
            "evaluations": self.evaluations,
            "generation": self.generation,
            "nonfinite_evaluations": self.nonfinite_evaluations,
            "best_x": None if self.best_x is None else self.best_x.clone(),
            "best_fitness": self.best_fitness,
            "history": [dict(entry) for entry in self.history],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a state produced by state_dict(); later asks match the saved run bit for bit."""
        self.dtype = getattr(torch, state["dtype"])
        self.mean = state["mean"].to(self.dtype).clone()
        self.dimension = self.mean.numel()
        self.B = state["B"].to(self.dtype).clone()
        self.sigma = float(state["sigma"])
        self.popsize = int(state["popsize"])
        self.eta_mu, self.eta_sigma, self.eta_B = state["eta_mu"], state["eta_sigma"], state["eta_B"]
        self.generator.set_state(state["generator_state"])
        self.evaluations = int(state["evaluations"])
        self.generation = int(state["generation"])
        self.nonfinite_evaluations = int(state["nonfinite_evaluations"])
        self.best_x = None if state["best_x"] is None else state["best_x"].clone()
        self.best_fitness = float(state["best_fitness"])
        self.history = [dict(entry) for entry in state["history"]]
