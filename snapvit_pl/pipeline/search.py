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
    tens of generations, searching the logarithms of the coefficients (step 0.5, i.e. factors of about
    e^0.5), 8 candidates per generation, 150 evaluations.

    Args:
        optimizer: ``snes`` (separable NES) or ``xnes`` (the paper's full-covariance xNES).
        max_evaluations: fitness evaluations (candidates); 0 keeps the initial coefficients.
        max_time: wall-clock limit of the search in seconds (None: none); the search stops before
            a generation it predicts would end past the limit.
        popsize: candidates per generation (None: ``4 + floor(3 ln D)``, the NES papers' choice; 8 gives a
            short search more generations).
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
    max_evaluations: int = 150
    max_time: Optional[float] = None
    popsize: Optional[int] = 8
    sigma: float = 0.5
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
    """A search that can be continued exactly, also in the middle of a generation.

    Attributes:
        optimizer: the optimiser's state at the start of the current generation (before its ``ask``).
        initial_fitness: fitness of the initial coefficients.
        pending: fitness of the current generation's candidates evaluated so far (NaN: not yet), or None
            at a generation boundary.
        seconds: search time spent so far, over every process of the run.
        evaluations_per_rank: evaluations each DDP rank has made so far, over every process of the run.
    """

    optimizer: dict[str, Any]
    initial_fitness: float
    pending: Optional[list[float]] = None
    seconds: float = 0.0
    evaluations_per_rank: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "initial_fitness": self.initial_fitness, "pending": self.pending,
                "seconds": self.seconds, "evaluations_per_rank": list(self.evaluations_per_rank)}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> "SearchProgress":
        return cls(state["optimizer"], float(state["initial_fitness"]), state.get("pending"),
                   float(state.get("seconds", 0.0)), list(state.get("evaluations_per_rank", [])))


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
    on_progress: Optional[Callable[[SearchProgress], None]] = None,
    on_generation: Optional[Callable[[EvolutionStrategy, torch.Tensor, torch.Tensor], None]] = None,
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
        resume: progress saved by an interrupted run (continue it instead of starting afresh), on any
            number of ranks.
        on_progress: called with the progress to save after every round of evaluations (one per rank)
            and at the end of every generation: what ``resume`` continues from.
        on_generation: called after every generation with the optimiser, the candidates and their
            fitness values (logging).
        progress: show a progress bar (rank 0).

    Returns:
        the best coefficients (the initial ones unless a candidate beat them) and the search's statistics.
    """
    mean = initial_coefficients(len(local.head_scores), local.heads_per_block, *settings.initial_range)
    if settings.max_evaluations == 0:
        return SearchResult(mean, evaluations_per_rank=[0] * world_size)
    started = time.perf_counter()
    previous_s = resume.seconds if resume is not None else 0.0
    fitness = EmbeddingFitness(model, images, local, settings.sparsity_pairs, settings.pca_components, settings.batch_size)
    es = settings.strategy(mean)
    pending: Optional[list[float]] = None
    if resume is not None:
        es.load_state_dict(resume.optimizer)
        initial_fitness, pending = resume.initial_fitness, resume.pending
    else:
        initial_fitness = fitness(mean)
    resumed_at = es.evaluations + sum(not math.isnan(v) for v in pending or []) if resume is not None else None
    first_evaluation, setup_s = es.evaluations, time.perf_counter() - started  # setup_s: PCA + initial evaluation
    counts = list(resume.evaluations_per_rank) if resume is not None else []
    counts += [0] * (max(world_size, len(counts)) - len(counts))
    bar = tqdm(total=settings.max_evaluations, initial=resumed_at or 0, desc="search", dynamic_ncols=True,
               disable=not progress or rank != 0)
    stopped_by = "max_evaluations"

    def progress_now(optimizer_state: dict[str, Any], values: Optional[torch.Tensor]) -> SearchProgress:
        return SearchProgress(optimizer_state, initial_fitness, None if values is None else values.tolist(),
                              previous_s + time.perf_counter() - started, list(counts))

    def evaluated(index: int, value: float) -> None:
        bar.update(world_size)

    def out_of_time() -> bool:
        """Would the next generation end past ``max_time``? Decided on the slowest rank's clock, so every
        DDP rank stops at the same generation."""
        if settings.max_time is None:
            return False
        elapsed = previous_s + time.perf_counter() - started
        done = es.evaluations - first_evaluation
        per_evaluation = (time.perf_counter() - started - setup_s) / done if done else setup_s
        predicted = torch.tensor([elapsed + per_evaluation * es.popsize / world_size], dtype=torch.float64)
        if world_size > 1:
            predicted = all_gather(predicted).max()
        return float(predicted) > settings.max_time

    while es.evaluations < settings.max_evaluations:
        if pending is None and out_of_time():
            stopped_by = "max_time"
            break
        before = es.state_dict()
        candidates = es.ask()[: settings.max_evaluations - es.evaluations]

        done = [0 if pending is None else sum(not math.isnan(v) for v in pending)]  # evaluated in this generation

        def round_done(values: torch.Tensor) -> None:
            now = int((~torch.isnan(values)).sum())
            for slot in range(now - done[0]):  # a round's candidates go to ranks 0, 1, ... in order
                counts[slot] += 1
            done[0] = now
            if on_progress is not None:
                on_progress(progress_now(before, values))

        values = evaluate_population(candidates, lambda x: fitness(settings.to_coefficients(x)), rank, world_size,
                                     all_gather, on_evaluation=evaluated, known=pending, on_round=round_done)
        pending = None
        es.tell(candidates, values)
        bar.set_postfix(best=f"{es.best_fitness:.4f}", sigma=f"{es.sigma:.3f}")
        if on_progress is not None:
            on_progress(progress_now(es.state_dict(), None))
        if on_generation is not None:
            on_generation(es, candidates, values)
    bar.close()
    improved = es.best_x is not None and es.best_fitness < initial_fitness
    return SearchResult(
        settings.to_coefficients(es.best_x) if improved else mean.float(), es.evaluations, es.generation,
        initial_fitness, min(es.best_fitness, initial_fitness), counts, fitness.forward_seconds,
        [dict(h) for h in es.history], resumed_at, stopped_by, previous_s + time.perf_counter() - started,
    )


def search_snapshots(
    model: nn.Module, images: torch.Tensor, local: ElasticScores, settings: SearchSettings, budgets: Sequence[int],
) -> dict[int, SearchResult]:
    """One search continued up to each evaluation budget in turn (for ablations): ``{budget: result}``.

    A generation in progress at an intermediate budget is cut short there, as ``max_evaluations`` does.
    """
    results: dict[int, SearchResult] = {}
    saved: Optional[SearchProgress] = None

    def keep(state: SearchProgress) -> None:
        nonlocal saved
        if state.pending is None:
            saved = state

    for budget in sorted(budgets):
        results[budget] = run_search(model, images, local, replace(settings, max_evaluations=budget), resume=saved,
                                     on_progress=keep)
    return results
