"""The search loop of the cross-block coefficients (one per block's MLP, one per head): resumable, DDP-shared."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

from ..elastic.scores import ElasticScores, initial_coefficients
from ..progress import Progress, ProgressMode
from .base import EvolutionStrategy
from .fitness import EmbeddingFitness
from .population import AllGather, evaluate_population
from .settings import SearchSettings


@dataclass
class SearchResult:
    """What the coefficient search found.

    Attributes:
        coefficients: ``[B + total heads]`` best coefficients (the initial ones unless the search beat them).
        evaluations: fitness evaluations made.
        generations: optimiser generations (updates) made.
        initial_fitness: fitness of the initial coefficients (None when the search did not run).
        best_fitness: best fitness seen, the initial one included (None when the search did not run).
        evaluations_per_rank: evaluations each DDP rank made, over every process of the run.
        forward_s: seconds inside the fitness forwards in this process (the search's floor).
        history: one entry per generation (``evaluations``, ``best_fitness``, ``sigma``, ...).
        resumed_at: evaluations already made when this process resumed the search (None: not resumed).
        stopped_by: what ended the search: ``max_evaluations`` or ``max_time``.
        seconds: wall time of the search, over every process of the run (a resumed run included).
    """

    coefficients: torch.Tensor
    evaluations: int = 0
    generations: int = 0
    initial_fitness: Optional[float] = None
    best_fitness: Optional[float] = None
    evaluations_per_rank: list[int] = field(default_factory=list)
    forward_s: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)
    resumed_at: Optional[int] = None
    stopped_by: str = "max_evaluations"
    seconds: float = 0.0

    @property
    def improved_on_initial(self) -> bool:
        return self.initial_fitness is not None and self.best_fitness is not None and self.best_fitness < self.initial_fitness

    def summary(self) -> dict[str, Any]:
        """What the search found, JSON-ready, from its inputs only (no timings, no share of each DDP rank: an
        interrupted and resumed run, or one on more processes, records the same summary as an uninterrupted single
        process); the elastic artifact and the report keep it."""
        return {
            "evaluations": self.evaluations, "generations": self.generations, "initial_fitness": self.initial_fitness,
            "best_fitness": self.best_fitness, "improved_on_initial": self.improved_on_initial,
            "stopped_by": self.stopped_by,
        }


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
    progress: ProgressMode | bool = False,
    fitness: Optional[EmbeddingFitness] = None,
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
        progress: show progress (a :class:`snapvit_pl.progress.Progress` mode, on rank 0 only).
        fitness: the run's fitness over ``images`` and ``local`` (its dense embeddings and PCA), if already built.

    Returns:
        the best coefficients (the initial ones unless a candidate beat them) and the search's statistics.
    """
    mean = initial_coefficients(len(local.head_scores), local.heads_per_block, *settings.initial_range)
    if settings.max_evaluations == 0:
        return SearchResult(mean, evaluations_per_rank=[0] * world_size)
    started = time.perf_counter()
    previous_s = resume.seconds if resume is not None else 0.0
    fitness = fitness or EmbeddingFitness(model, images, local, settings, rank=rank, world_size=world_size,
                                          all_gather=all_gather)
    forward_before = fitness.forward_seconds
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
    bar = Progress("search", settings.max_evaluations, progress if rank == 0 else "off", unit="eval",
                   initial=resumed_at or 0)
    stopped_by = "max_evaluations"

    def progress_now(optimizer_state: dict[str, Any], values: Optional[torch.Tensor]) -> SearchProgress:
        return SearchProgress(optimizer_state, initial_fitness, None if values is None else values.tolist(),
                              previous_s + time.perf_counter() - started, list(counts))

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
            bar.update(now - done[0])  # (a last round of fewer candidates than ranks counts what it evaluated)
            done[0] = now
            if on_progress is not None:
                on_progress(progress_now(before, values))

        values = evaluate_population(candidates, lambda x: fitness(settings.to_coefficients(x)), rank, world_size,
                                     all_gather, known=pending, on_round=round_done)
        pending = None
        es.tell(candidates, values)
        bar.set(best=round(es.best_fitness, 5), sigma=round(es.sigma, 4))
        if on_progress is not None:
            on_progress(progress_now(es.state_dict(), None))
        if on_generation is not None:
            on_generation(es, candidates, values)
    bar.close()
    improved = es.best_x is not None and es.best_fitness < initial_fitness
    return SearchResult(
        settings.to_coefficients(es.best_x) if improved else mean.float(), es.evaluations, es.generation,
        initial_fitness, min(es.best_fitness, initial_fitness), counts, fitness.forward_seconds - forward_before,
        [dict(h) for h in es.history], resumed_at, stopped_by, previous_s + time.perf_counter() - started,
    )


def search_snapshots(
    model: nn.Module, images: torch.Tensor, local: ElasticScores, settings: SearchSettings, budgets: Sequence[int],
    on_generation: Optional[Callable[[EvolutionStrategy, torch.Tensor, torch.Tensor], None]] = None,
) -> dict[int, SearchResult]:
    """One search continued up to each evaluation budget in turn (for ablations and benchmarks): ``{budget: result}``;
    each result's ``seconds`` covers the search up to its budget.

    A generation in progress at an intermediate budget is cut short there, as ``max_evaluations`` does.
    ``on_generation`` is called after every generation, as by :func:`run_search`.
    """
    results: dict[int, SearchResult] = {}
    saved: Optional[SearchProgress] = None

    def keep(state: SearchProgress) -> None:
        nonlocal saved
        if state.pending is None:
            saved = state

    for budget in sorted(budgets):
        results[budget] = run_search(model, images, local, replace(settings, max_evaluations=budget), resume=saved,
                                     on_progress=keep, on_generation=on_generation)
    return results
