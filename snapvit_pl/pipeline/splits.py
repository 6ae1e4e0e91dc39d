"""Budget-optimal splits: for a params / FLOPs / sparsity budget, how much to take from heads versus MLP neurons.

A cost budget can be met by many (mlp_ratio, head_ratio) pairs: more heads pruned and fewer
neurons, or the reverse. The default schedule (``head_ratio = mlp_ratio - 0.15``) fixes one. Here
each budget tries a few head ratios around the schedule's, solves the MLP ratio that meets the
budget for each, and keeps the split whose sub-network's embeddings drift least from the dense
model's (the search's label-free fitness, on the same images).

The choice is made for every budget a run asks for and for a grid of kept parameter and FLOPs
fractions, and recorded in the elastic scores (:class:`snapvit_pl.elastic.SplitTable`): any budget
cut later (``scores.extract(model, flops=0.45)``, ``python -m snapvit_pl.extract``) takes the head
ratio recorded for its kept fraction, or interpolated between the two nearest.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from ..elastic.budget import Budget, CostModel, max_prune_ratio, resolve
from ..elastic.scores import ElasticScores
from ..elastic.splits import TOLERANCE, SplitTable
from ..errors import PruningSpecError
from ..progress import Progress, ProgressMode
from ..search.fitness import EmbeddingFitness
from ..search.settings import SearchSettings
from .settings import ExportSettings


@dataclass
class SplitChoice:
    """The split chosen for one cost budget and the candidates it was chosen from.

    Attributes:
        label: the budget's label (``sparsity0.4``, ``flops0.5``; ``params0.7`` for a grid point).
        metric: ``params`` or ``flops``: what the budget limits.
        keep: the kept fraction of the dense model's ``metric``.
        head_ratio: the chosen head ratio (the budget's MLP ratio follows from it).
        schedule_head_ratio: the default schedule's head ratio for this budget.
        candidates: ``(head_ratio, mlp_ratio, distance)`` of every feasible candidate.
        requested: a budget the run asked for (else a point of the grid).
    """

    label: str
    metric: str
    keep: float
    head_ratio: float
    schedule_head_ratio: float
    candidates: list[tuple[float, float, float]] = field(default_factory=list)
    requested: bool = False


def split_candidates(center: float, count: int, step: float, max_head: float) -> list[float]:
    """``count`` head ratios spaced by ``step`` around ``center``, within ``[0, max_head]`` (the center included)."""
    offsets = [step * (i - (count - 1) / 2) for i in range(count)]
    values = {round(min(max(center + d, 0.0), max_head), 6) for d in offsets} | {round(center, 6)}
    return sorted(values)


def split_points(budgets: Sequence[Budget], cost: CostModel, grid: float) -> list[tuple[str, str, float, bool]]:
    """``(label, metric, keep, requested)`` of every budget to split: the cost budgets asked for (latency budgets
    and ratio pairs excluded), then a grid of kept params and FLOPs fractions ``1 - grid, 1 - 2 grid, ...``
    (``grid`` 0: none); each point once."""
    points: list[tuple[str, str, float, bool]] = []

    def add(label: str, metric: str, keep: float, requested: bool) -> None:
        if not any(m == metric and abs(k - keep) <= TOLERANCE for _, m, k, _ in points):
            points.append((label, metric, keep, requested))

    for budget in budgets:
        point = budget.cost_point(cost)
        if point is not None:
            add(budget.label(), *point, True)
    if grid > 0:
        for i in range(1, int(round(1 / grid))):
            keep = round(1 - i * grid, 6)
            for metric in ("params", "flops"):
                add(f"{metric}{keep:g}", metric, keep, False)
    return points


@torch.no_grad()
def choose_splits(
    model: nn.Module,
    images: torch.Tensor,
    scores: ElasticScores,
    budgets: Sequence[Budget],
    search: SearchSettings,
    export: ExportSettings,
    cost: Optional[CostModel] = None,
    progress: ProgressMode | bool = False,
    on_choice: Optional[Callable[[SplitChoice], None]] = None,
) -> list[SplitChoice]:
    """Choose the head ratio of every cost budget in ``budgets`` (and of the grid ``export.split_grid``) by the
    embedding-drift fitness.

    Ratio-pair and latency budgets are skipped, and so are grid points the keep ratios make unreachable. The
    schedule's own split is always a candidate, and it is kept on ties, so a choice never has a larger drift
    than the schedule's on these images.

    Args:
        model: the dense base model (never modified).
        images: the fitness images ``[N, C, H, W]`` (the search's).
        scores: the elastic scores (coefficients included); their recorded splits are ignored here.
        budgets: the budgets asked for.
        search: the fitness's ``pca_components`` and ``batch_size``.
        export: ``split_candidates`` head ratios spaced by ``split_step`` around the schedule's; ``split_grid``;
            the extraction's ``mlp_multiple``.
        cost: the base model's :class:`CostModel`, if already built.
        progress: show progress (a :class:`snapvit_pl.progress.Progress` mode).
        on_choice: called with each finished choice.

    Returns:
        the choices; ``SplitTable`` of them: :func:`split_table`.

    Raises:
        PruningSpecError: a budget asked for that no candidate split can meet.
    """
    cost = cost or CostModel(model)
    fitness = EmbeddingFitness(model, images, scores, search, pairs=[(0.0, 0.0)])
    heads, neurons = scores.unified()
    max_head = max_prune_ratio(heads, scores.min_head_keep)
    keep_args = (scores.min_mlp_keep, scores.min_head_keep, export.mlp_multiple)
    points = split_points(budgets, cost, export.split_grid)
    choices = []
    with Progress("splits", len(points), progress, unit="budget") as bar:
        for label, metric, keep, requested in points:
            budget = Budget(params=keep) if metric == "params" else Budget(flops=keep)
            try:
                _, _, schedule_h = resolve(budget, heads, neurons, cost, *keep_args)
            except PruningSpecError:
                if requested:
                    raise
                bar.update()
                continue  # a grid point below what the keep ratios reach
            tried = []
            for h in split_candidates(schedule_h, export.split_candidates, export.split_step, max_head):
                try:
                    subnet, m, h = resolve(budget, heads, neurons, cost, *keep_args, head_ratio=h)
                except PruningSpecError:
                    continue  # this head ratio cannot meet the budget under the keep ratios
                tried.append((h, m, fitness.distance(subnet)))
            best = min(tried, key=lambda c: (c[2], abs(c[0] - schedule_h)))  # ties: the one nearest the schedule
            choice = SplitChoice(label, metric, keep, best[0], schedule_h, tried, requested)
            choices.append(choice)
            bar.update(best=round(best[2], 5))
            if on_choice is not None:
                on_choice(choice)
    return choices


def split_table(choices: Sequence[SplitChoice]) -> SplitTable:
    """The choices as the elastic scores record them."""
    table = SplitTable()
    for choice in choices:
        table.add(choice.metric, choice.keep, choice.head_ratio)
    return table
