"""Evaluations split across DDP ranks: a search generation (every candidate exactly once, resumable mid-way) and
any list of jobs shared by cost (the split choice)."""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

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


def share_by_cost(costs: Sequence[float], world_size: int) -> list[int]:
    """The rank of each job: largest cost first, each to the rank with the least work so far (ties: the lowest rank);
    the same on every rank."""
    owner, load = [0] * len(costs), [0.0] * world_size
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        owner[index] = min(range(world_size), key=lambda r: (load[r], r))
        load[owner[index]] += costs[index]
    return owner


def evaluate_shared(
    jobs: Sequence[Any],
    evaluate: Callable[[Any], torch.Tensor],
    sizes: Sequence[int],
    costs: Sequence[float],
    rank: int = 0,
    world_size: int = 1,
    all_gather: Optional[AllGather] = None,
) -> list[torch.Tensor]:
    """Evaluate every job once, the jobs shared across DDP ranks by cost, and give every rank every result.

    Jobs go to ranks by :func:`share_by_cost`; then one gather. A job's result does not depend on the rank that
    computes it, so the results are those of a single process, bit for bit.

    Args:
        jobs: identical on every rank.
        evaluate: job -> 1-D tensor of ``sizes[i]`` values (any float dtype, any device).
        sizes: the length of each job's result.
        costs: the relative cost of each job (e.g. images x FLOPs).
        rank, world_size, all_gather: as :func:`evaluate_population`.

    Returns:
        each job's result, float64 on the CPU, identical on every rank.
    """
    if world_size > 1 and all_gather is None:
        raise ValueError("world_size > 1 needs an all_gather function")
    owner = share_by_cost(costs, world_size)
    results: list[Optional[torch.Tensor]] = [None] * len(jobs)
    mine = [i for i in range(len(jobs)) if owner[i] == rank]
    for index in mine:
        results[index] = evaluate(jobs[index]).detach().to("cpu", torch.float64).reshape(-1)
    if world_size == 1:
        return results  # type: ignore[return-value]
    lengths = [sum(sizes[i] for i in range(len(jobs)) if owner[i] == r) for r in range(world_size)]
    flat = torch.full((max(lengths + [1]),), math.nan, dtype=torch.float64)
    if mine:
        flat[: lengths[rank]] = torch.cat([results[i] for i in mine])
    gathered = all_gather(flat).reshape(world_size, -1).cpu().to(torch.float64)
    offsets = [0] * world_size
    for index in range(len(jobs)):
        r = owner[index]
        results[index] = gathered[r, offsets[r]: offsets[r] + sizes[index]].clone()
        offsets[r] += sizes[index]
    return results  # type: ignore[return-value]
