"""Evaluating one generation, split across DDP ranks: every candidate exactly once, resumable mid-way."""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch

AllGather = Callable[[torch.Tensor], torch.Tensor]  # [k] on this rank -> [world_size, k]


def evaluate_population(
    candidates: torch.Tensor,
    fitness: Callable[[torch.Tensor], float],
    rank: int = 0,
    world_size: int = 1,
    all_gather: Optional[AllGather] = None,
    on_evaluation: Optional[Callable[[int, float], None]] = None,
    known: Optional[Sequence[float]] = None,
    on_round: Optional[Callable[[torch.Tensor], None]] = None,
) -> torch.Tensor:
    """Fitness of every candidate, in rounds: in each round every rank evaluates one of the candidates left.

    After each round the values are gathered, so every rank knows every value evaluated so far,
    and ``on_round`` can save them: a generation interrupted mid-way resumes with ``known``
    (the values saved, NaN where not evaluated yet) and evaluates only the rest, on any number
    of ranks.

    Args:
        candidates: ``[n, D]``, identical on every rank (same seed).
        fitness: candidate ``[D]`` -> float.
        rank: this process's rank.
        world_size: number of processes; > 1 needs ``all_gather``.
        all_gather: gathers a ``[k]`` tensor from every rank into ``[world_size, k]``.
        on_evaluation: called with (candidate index, fitness) for each local evaluation.
        known: values already evaluated (NaN: not yet), e.g. from an interrupted run.
        on_round: called with the ``[n]`` values so far (NaN: not yet) after every round.

    Returns:
        ``[n]`` float64 fitness, identical on every rank.
    """
    n = candidates.shape[0]
    if world_size > 1 and all_gather is None:
        raise ValueError("world_size > 1 needs an all_gather function")
    values = torch.full((n,), math.nan, dtype=torch.float64)
    if known is not None:
        values[: len(known)] = torch.as_tensor(list(known), dtype=torch.float64)[:n]
    todo = [i for i in range(n) if math.isnan(float(values[i]))]
    for start in range(0, len(todo), world_size):
        batch = todo[start : start + world_size]
        mine = torch.tensor([math.nan], dtype=torch.float64)
        if rank < len(batch):
            mine[0] = float(fitness(candidates[batch[rank]]))
            if on_evaluation is not None:
                on_evaluation(batch[rank], float(mine[0]))
        gathered = all_gather(mine).reshape(world_size).cpu().to(torch.float64) if world_size > 1 else mine
        for slot, index in enumerate(batch):
            values[index] = gathered[slot]
        if on_round is not None:
            on_round(values.clone())
    return values
