"""Budget-optimal splits: for a params / FLOPs / sparsity budget, how much to take from heads versus MLP neurons.

A cost budget can be met by many (mlp_ratio, head_ratio) pairs: more heads pruned and fewer
neurons, or the reverse. The default schedule (``head_ratio = mlp_ratio - 0.15``) fixes one. Here
each budget tries a few head ratios around the schedule's, solves the MLP ratio that meets the
budget for each, and keeps the split whose sub-network's embeddings drift least from the dense
model's (the search's label-free fitness, on the same images). The chosen head ratio is recorded
per budget in the elastic scores (``ElasticScores.splits``), so extraction stays deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from ..elastic.budget import Budget, CostModel, max_prune_ratio, resolve
from ..elastic.scores import ElasticScores
from ..errors import PruningSpecError
from ..search.fitness import EmbeddingFitness


@dataclass
class SplitChoice:
    """The split chosen for one cost budget and the candidates it was chosen from.

    Attributes:
        label: the budget's label.
        head_ratio: the chosen head ratio (the budget's MLP ratio follows from it).
        schedule_head_ratio: the default schedule's head ratio for this budget.
        candidates: ``(head_ratio, mlp_ratio, distance)`` of every feasible candidate.
    """

    label: str
    head_ratio: float
    schedule_head_ratio: float
    candidates: list[tuple[float, float, float]] = field(default_factory=list)


def split_candidates(center: float, count: int, step: float, max_head: float) -> list[float]:
    """``count`` head ratios spaced by ``step`` around ``center``, within ``[0, max_head]`` (the center included)."""
    offsets = [step * (i - (count - 1) / 2) for i in range(count)]
    values = {round(min(max(center + d, 0.0), max_head), 6) for d in offsets} | {round(center, 6)}
    return sorted(values)


@torch.no_grad()
def choose_splits(
    model: nn.Module,
    images: torch.Tensor,
    scores: ElasticScores,
    budgets: Sequence[Budget],
    *,
    candidates: int = 7,
    step: float = 0.1,
    pca_components: int = 192,
    batch_size: int = 64,
    mlp_multiple: int = 1,
    cost: Optional[CostModel] = None,
    on_choice: Optional[Callable[[SplitChoice], None]] = None,
) -> list[SplitChoice]:
    """Choose the head ratio of every cost budget in ``budgets`` by the embedding-drift fitness.

    Ratio-pair budgets already fix their split and are skipped. The schedule's own split is
    always a candidate, and it is kept on ties, so a choice never has a larger drift than the
    schedule's on these images.

    Args:
        model: the dense base model (never modified).
        images: the fitness images ``[N, C, H, W]`` (the search's).
        scores: the elastic scores (coefficients included); their recorded splits are ignored here.
        budgets: the budgets to split.
        candidates: head ratios tried per budget (spaced by ``step`` around the schedule's).
        step: spacing of the candidate head ratios.
        pca_components, batch_size: as for the search's fitness.
        mlp_multiple: MLP width rounding of the extraction.
        cost: the base model's :class:`CostModel`, if already built.
        on_choice: called with each finished choice (progress).
    """
    cost = cost or CostModel(model)
    fitness = EmbeddingFitness(model, images, scores, [(0.0, 0.0)], pca_components, batch_size)
    heads, neurons = scores.unified()
    max_head = max_prune_ratio(heads, scores.min_head_keep)
    keep = (scores.min_mlp_keep, scores.min_head_keep)
    choices = []
    for budget in budgets:
        if not budget.is_cost:  # a ratio pair fixes its own split
            continue
        _, _, schedule_h = resolve(budget, heads, neurons, cost, *keep, mlp_multiple)
        tried = []
        for h in split_candidates(schedule_h, candidates, step, max_head):
            try:
                subnet, m, h = resolve(budget, heads, neurons, cost, *keep, mlp_multiple, head_ratio=h)
            except PruningSpecError:
                continue  # this head ratio cannot meet the budget under the keep ratios
            tried.append((h, m, fitness.distance(subnet)))
        best = min(tried, key=lambda c: (c[2], abs(c[0] - schedule_h)))  # ties: the one nearest the schedule
        choice = SplitChoice(budget.label(), best[0], schedule_h, tried)
        choices.append(choice)
        if on_choice is not None:
            on_choice(choice)
    return choices
