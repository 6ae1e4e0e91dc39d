"""Stage 2: the search of the cross-block coefficients (one per block's MLP, one per head)."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Literal, Optional, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from ..elastic.scores import ElasticScores, initial_coefficients
from ..errors import ConfigError
from ..search.fitness import DEFAULT_SPARSITY_PAIRS, EmbeddingFitness
from ..search.base import EvolutionStrategy
from ..search.population import AllGather, evaluate_population
from ..search.snes import SNES
from ..search.xnes import XNES
from .state import SearchResult

OPTIMIZERS = {"snes": SNES, "xnes": XNES}


@dataclass
class SearchSettings:
    """How the coefficients are searched.

    The paper's settings are ``SearchSettings.paper()``: xNES, step size 1 on the coefficients
    themselves, the default population, 50 evaluations. The defaults here differ where the paper's
    barely move in short budgets (see docs/method.md): a separable NES whose step sizes adapt within
    tens of generations, searching the logarithms of the coefficients.

    Args:
        optimizer: ``snes`` (separable NES) or ``xnes`` (the paper's full-covariance xNES).
        max_evaluations: fitness evaluations (candidates); 0 keeps the initial coefficients.
        max_time: wall-clock limit of the search in seconds (None: none); the search stops before
            a generation it predicts would end past the limit.
        popsize: candidates per generation (default ``4 + floor(3 ln D)``).
        sigma: initial step size (on the log coefficients with ``parametrization: log``).
        parametrization: ``log`` searches log |coefficient| (multiplicative steps), ``linear`` the
            coefficient itself (the paper; the unit score uses its absolute value).
        seed: seed of the search (identical on every DDP rank).
        num_images: images of the fitness set (plain views of the pruning data).
        batch_size: forward batch size of the fitness.
        pca_components: PCA dimension of the embeddings.
        sparsity_pairs: (mlp_ratio, head_ratio) pairs averaged by the fitness.
        initial_range: the initial coefficients go linearly from the first to the last block.
    """

    optimizer: Literal["snes", "xnes"] = "snes"
    max_evaluations: int = 50
    max_time: Optional[float] = None
    popsize: Optional[int] = None
    sigma: float = 1.0
    parametrization: Literal["log", "linear"] = "log"
    seed: int = 0
    num_images: int = 1000
    batch_size: int = 64
    pca_components: int = 192
    sparsity_pairs: list[tuple[float, float]] = field(default_factory=lambda: [tuple(p) for p in DEFAULT_SPARSITY_PAIRS])
    initial_range: tuple[float, float] = (1.2, 0.8)

    def __post_init__(self) -> None:
        problems = [f"{name} must be >= {low}, got {getattr(self, name)}" for name, low in
                    (("max_evaluations", 0), ("num_images", 1), ("batch_size", 1), ("pca_components", 1))
                    if getattr(self, name) < low]
        if self.optimizer not in OPTIMIZERS:
            problems.append(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.parametrization not in ("log", "linear"):
            problems.append(f"parametrization must be 'log' or 'linear', got {self.parametrization!r}")
        if self.max_time is not None and not self.max_time > 0:
            problems.append(f"max_time must be a positive number of seconds (or null), got {self.max_time}")
        if self.popsize is not None and self.popsize < 2:
            problems.append(f"popsize must be >= 2 (or null for the default), got {self.popsize}")
        if not (self.sigma > 0 and math.isfinite(self.sigma)):
            problems.append(f"sigma must be a positive number, got {self.sigma}")
        if not self.sparsity_pairs:
            problems.append("sparsity_pairs must hold at least one (mlp_ratio, head_ratio) pair")
        if self.parametrization == "log" and min(self.initial_range) <= 0:
            problems.append(f"initial_range must be positive with parametrization log, got {list(self.initial_range)}")
        if problems:
            raise ConfigError("search: " + "; ".join(problems))
        self.sparsity_pairs = [tuple(float(v) for v in pair) for pair in self.sparsity_pairs]
        self.initial_range = tuple(float(v) for v in self.initial_range)

    @classmethod
    def paper(cls, **overrides: Any) -> "SearchSettings":
        """The paper's search (METHOD section 2): xNES on the coefficients, sigma 1, default population."""
        return cls(**{"optimizer": "xnes", "sigma": 1.0, "parametrization": "linear", "popsize": None,
                      "max_evaluations": 50, **overrides})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings (the record in the report and the elastic artifact)."""
        return {k: list(map(list, v)) if k == "sparsity_pairs" else (list(v) if isinstance(v, tuple) else v)
                for k, v in asdict(self).items()}

    def strategy(self, coefficients: torch.Tensor) -> EvolutionStrategy:
        """The optimiser, started at ``coefficients`` (in the search's parametrization)."""
        return OPTIMIZERS[self.optimizer](self.to_search_space(coefficients), sigma=self.sigma, popsize=self.popsize,
                                          seed=self.seed)

    def to_search_space(self, coefficients: torch.Tensor) -> torch.Tensor:
        return coefficients.double().abs().log() if self.parametrization == "log" else coefficients.double()

    def to_coefficients(self, x: torch.Tensor) -> torch.Tensor:
        """A point of the search space as coefficients (float32)."""
        return (x.exp() if self.parametrization == "log" else x).float()


@dataclass
class SearchProgress:
    """A search that can be continued exactly: the optimiser state and the fitness of the initial coefficients."""

    optimizer: dict[str, Any]
    initial_fitness: float

    def to_dict(self) -> dict[str, Any]:
        return {"xnes": self.optimizer, "initial_fitness": self.initial_fitness}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> "SearchProgress":
        return cls(state["xnes"], float(state["initial_fitness"]))


def run_search(
    model: nn.Module,
    images: torch.Tensor,
    local: ElasticScores,
    settings: SearchSettings,
    *,
    rank: int = 0,
    world_size: int = 1,
    all_gather: Optional[AllGather] = None,
    resume: Optional[SearchProgress] = None,
    on_generation: Optional[Callable[[SearchProgress, EvolutionStrategy, torch.Tensor, torch.Tensor], None]] = None,
    progress: bool = False,
) -> SearchResult:
    """Search the coefficients that rescale ``local``'s scores, minimising the embedding-drift fitness.

    Under DDP every rank calls this with the same settings: each evaluates its share of every
    generation (each candidate exactly once) and the fitness values are gathered, so all ranks
    make identical updates.

    Args:
        model: the dense base model (eval mode; never modified).
        images: the fitness images ``[N, C, H, W]``.
        local: local scores and keep ratios (its coefficients are ignored).
        settings: see :class:`SearchSettings`.
        rank, world_size, all_gather: DDP rank, number of ranks, and a gather of a ``[k]`` tensor
            into ``[world_size, k]`` (needed when ``world_size > 1``).
        resume: progress saved by an interrupted run (continue it instead of starting afresh).
        on_generation: called after every generation with the progress to save, the optimiser, and
            the generation's candidates and fitness values (logging, resume).
        progress: show a progress bar (rank 0).

    Returns:
        the best coefficients (the initial ones unless a candidate beat them) and the search's statistics.
    """
    mean = initial_coefficients(len(local.head_scores), local.heads_per_block, *settings.initial_range)
    if settings.max_evaluations == 0:
        return SearchResult(mean, evaluations_per_rank=[0] * world_size)
    started = time.perf_counter()
    fitness = EmbeddingFitness(model, images, local, settings.sparsity_pairs, settings.pca_components, settings.batch_size)
    es = settings.strategy(mean)
    if resume is not None:
        es.load_state_dict(resume.optimizer)
        initial_fitness = resume.initial_fitness
    else:
        initial_fitness = fitness(mean)
    resumed_at = es.evaluations if resume is not None else None
    first_evaluation, setup_s = es.evaluations, time.perf_counter() - started  # setup_s: PCA + initial evaluation
    bar = tqdm(total=settings.max_evaluations, initial=es.evaluations, desc="search", dynamic_ncols=True,
               disable=not progress or rank != 0)
    local_evaluations = 0
    stopped_by = "max_evaluations"

    def evaluated(index: int, value: float) -> None:
        nonlocal local_evaluations
        local_evaluations += 1
        bar.update(world_size)

    def out_of_time() -> bool:
        """Would the next generation end past ``max_time``? Decided on the slowest rank's clock, so every
        DDP rank stops at the same generation."""
        if settings.max_time is None:
            return False
        elapsed = time.perf_counter() - started
        done = es.evaluations - first_evaluation
        per_evaluation = (elapsed - setup_s) / done if done else setup_s  # before any: the initial evaluation's time
        predicted = torch.tensor([elapsed + per_evaluation * es.popsize / world_size], dtype=torch.float64)
        if world_size > 1:
            predicted = all_gather(predicted).max()
        return float(predicted) > settings.max_time

    while es.evaluations < settings.max_evaluations:
        if out_of_time():
            stopped_by = "max_time"
            break
        candidates = es.ask()[: settings.max_evaluations - es.evaluations]
        values = evaluate_population(candidates, lambda x: fitness(settings.to_coefficients(x)), rank, world_size,
                                     all_gather, on_evaluation=evaluated)
        es.tell(candidates, values)
        bar.set_postfix(best=f"{es.best_fitness:.4f}", sigma=f"{es.sigma:.3f}")
        if on_generation is not None:
            on_generation(SearchProgress(es.state_dict(), initial_fitness), es, candidates, values)
    bar.close()
    per_rank = [local_evaluations]
    if world_size > 1:
        per_rank = all_gather(torch.tensor([float(local_evaluations)])).flatten().long().tolist()
    improved = es.best_x is not None and es.best_fitness < initial_fitness
    return SearchResult(
        settings.to_coefficients(es.best_x) if improved else mean.float(), es.evaluations, es.generation,
        initial_fitness, min(es.best_fitness, initial_fitness), per_rank, fitness.forward_seconds,
        [dict(h) for h in es.history], resumed_at, stopped_by,
    )


def search_snapshots(
    model: nn.Module, images: torch.Tensor, local: ElasticScores, settings: SearchSettings, budgets: Sequence[int],
) -> dict[int, SearchResult]:
    """One search continued up to each evaluation budget in turn (for ablations): ``{budget: result}``.

    A generation in progress at an intermediate budget is cut short there, as ``max_evaluations`` does.
    """
    results: dict[int, SearchResult] = {}
    progress: Optional[SearchProgress] = None

    def keep(state: SearchProgress, *_: object) -> None:
        nonlocal progress
        progress = state

    for budget in sorted(budgets):
        results[budget] = run_search(model, images, local, replace(settings, max_evaluations=budget), resume=progress,
                                     on_generation=keep)
    return results
