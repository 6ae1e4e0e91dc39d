"""Stage 2: the search of the cross-block coefficients (one per block's MLP, one per head)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from ..elastic.scores import ElasticScores, initial_coefficients
from ..errors import ConfigError
from ..search.fitness import DEFAULT_SPARSITY_PAIRS, EmbeddingFitness
from ..search.population import AllGather, evaluate_population
from ..search.xnes import XNES
from .state import SearchResult


@dataclass
class SearchSettings:
    """How the coefficients are searched (defaults: the paper's, METHOD section 2).

    Args:
        max_evaluations: fitness evaluations (candidates); 0 keeps the initial coefficients.
        popsize: candidates per generation (default ``4 + floor(3 ln D)``).
        sigma: initial step size.
        seed: seed of the search (identical on every DDP rank).
        num_images: images of the fitness set (plain views of the pruning data).
        batch_size: forward batch size of the fitness.
        pca_components: PCA dimension of the embeddings.
        sparsity_pairs: (mlp_ratio, head_ratio) pairs averaged by the fitness.
        initial_range: the initial coefficients go linearly from the first to the last block.
    """

    max_evaluations: int = 50
    popsize: Optional[int] = None
    sigma: float = 1.0
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
        if self.popsize is not None and self.popsize < 2:
            problems.append(f"popsize must be >= 2 (or null for the default), got {self.popsize}")
        if not (self.sigma > 0 and math.isfinite(self.sigma)):
            problems.append(f"sigma must be a positive number, got {self.sigma}")
        if not self.sparsity_pairs:
            problems.append("sparsity_pairs must hold at least one (mlp_ratio, head_ratio) pair")
        if problems:
            raise ConfigError("search: " + "; ".join(problems))
        self.sparsity_pairs = [tuple(float(v) for v in pair) for pair in self.sparsity_pairs]
        self.initial_range = tuple(float(v) for v in self.initial_range)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings (the record in the report and the elastic artifact)."""
        return {k: list(map(list, v)) if k == "sparsity_pairs" else (list(v) if isinstance(v, tuple) else v)
                for k, v in asdict(self).items()}


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
    on_generation: Optional[Callable[[SearchProgress, XNES, torch.Tensor, torch.Tensor], None]] = None,
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
    fitness = EmbeddingFitness(model, images, local, settings.sparsity_pairs, settings.pca_components, settings.batch_size)
    es = XNES(mean, sigma=settings.sigma, popsize=settings.popsize, seed=settings.seed)
    if resume is not None:
        es.load_state_dict(resume.optimizer)
        initial_fitness = resume.initial_fitness
    else:
        initial_fitness = fitness(mean)
    resumed_at = es.evaluations if resume is not None else None
    bar = tqdm(total=settings.max_evaluations, initial=es.evaluations, desc="search", dynamic_ncols=True,
               disable=not progress or rank != 0)
    local_evaluations = 0

    def evaluated(index: int, value: float) -> None:
        nonlocal local_evaluations
        local_evaluations += 1
        bar.update(world_size)

    while es.evaluations < settings.max_evaluations:
        candidates = es.ask()[: settings.max_evaluations - es.evaluations]
        values = evaluate_population(candidates, fitness, rank, world_size, all_gather, on_evaluation=evaluated)
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
        (es.best_x if improved else mean).float(), es.evaluations, es.generation, initial_fitness,
        min(es.best_fitness, initial_fitness), per_rank, fitness.forward_seconds, [dict(h) for h in es.history], resumed_at,
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
