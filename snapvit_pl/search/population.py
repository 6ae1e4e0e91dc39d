"""Evaluating one xNES generation, split across DDP ranks: every candidate exactly once."""
from __future__ import annotations

from typing import Callable, Optional

import torch

AllGather = Callable[[torch.Tensor], torch.Tensor]  # [k] on this rank -> [world_size, k]


def evaluate_population(
    candidates: torch.Tensor,
    fitness: Callable[[torch.Tensor], float],
    rank: int = 0,
    world_size: int = 1,
    all_gather: Optional[AllGather] = None,
    on_evaluation: Optional[Callable[[int, float], None]] = None,
) -> torch.Tensor:
    """Fitness of every candidate; rank ``r`` evaluates candidates ``r, r + world_size, ...``.

    Args:
        candidates: ``[n, D]``, identical on every rank (same seed).
        fitness: candidate ``[D]`` -> float.
        rank: this process's rank.
        world_size: number of processes; > 1 needs ``all_gather``.
        all_gather: gathers a ``[k]`` tensor from every rank into ``[world_size, k]``.
        on_evaluation: called with (candidate index, fitness) for each local evaluation.

    Returns:
        ``[n]`` float64 fitness, identical on every rank.
    """
    n = candidates.shape[0]
    per_rank = -(-n // world_size)
    local = torch.full((per_rank,), float("nan"), dtype=torch.float64)
    for slot, index in enumerate(range(rank, n, world_size)):
        local[slot] = float(fitness(candidates[index]))
        if on_evaluation is not None:
            on_evaluation(index, float(local[slot]))
    if world_size == 1:
        return local[:n]
    if all_gather is None:
        raise ValueError("world_size > 1 needs an all_gather function")
    gathered = all_gather(local).reshape(world_size, per_rank).cpu()
    # gathered[r, s] holds candidate r + s * world_size
    return gathered.T.reshape(-1)[:n].to(torch.float64)
