"""Budget-optimal splits: for a params / FLOPs / sparsity budget, how much to take from heads versus MLP neurons.

A cost budget can be met by many (mlp_ratio, head_ratio) pairs: more heads pruned and fewer
neurons, or the reverse. The default schedule (``head_ratio = mlp_ratio - 0.15``) fixes one. Here
each budget tries a few head ratios around the schedule's, solves the MLP ratio that meets the
budget for each, and keeps the split whose sub-network's embeddings drift least from the dense
model's (the search's label-free fitness, on the same images).

The choice is made for every budget a run asks for and for a grid of kept parameter and FLOPs
fractions (every ``export.split_grid`` from one half of the dense cost down, every other one above it), and
recorded in the elastic scores (:class:`snapvit_pl.elastic.SplitTable`): any budget cut later
(``scores.extract(model, flops=0.45)``, ``python -m snapvit_pl.extract``) takes the head ratio recorded for its
kept fraction, or interpolated between the two nearest (or, given the run's images, races its own split:
:meth:`snapvit_pl.pipeline.Pipeline.from_run`).

What it costs (``benchmarks/results/split_choice.md`` measures it against trying every candidate on every image):

- candidates are raced (:mod:`snapvit_pl.search.race`): on a few fitness images first, on more only while they may
  still win; candidates with the same kept units are evaluated once;
- a budget asked for races its whole window of ``split_candidates`` head ratios from ``export.split_images`` images,
  settled as trying every candidate on every image would settle it;
- a grid point (a split recorded for later budgets) races only near where the best split should be: the split
  nearest the offset from the schedule chosen for the nearest budget asked for, and the nearest distinct split on
  each side, from ``MIN_IMAGES`` images; while the winner has a neighbour not raced yet, that neighbour enters (a
  descent of the drift across the window). A near tie there need not be settled: a candidate leaves once the
  leader is at most :data:`GRID_INDIFFERENCE` of its drift worse than it (at the race's confidence), and the race
  ends at :data:`GRID_IMAGES` images (the least drift on them wins);
- where the scores are the per-unit output sensitivity, a grid point starts from the minimum of the first-order
  estimate of the drift (half the removed units' scores) found from there; where that estimate is below
  :data:`FIRST_ORDER_DRIFT`, the first-order choice wins once it leads its two neighbours on ``MIN_IMAGES`` images;
- the races of a round run side by side, their evaluations shared across DDP ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from ..elastic.budget import Budget, CostModel, max_prune_ratio, rank_units, resolve
from ..elastic.scores import ElasticScores
from ..elastic.splits import TOLERANCE, SplitTable
from ..errors import PruningSpecError
from ..progress import Progress, ProgressMode
from ..search.fitness import EmbeddingFitness
from ..search.population import AllGather
from ..search.race import MIN_IMAGES, Entrant, Race, Racer
from ..search.settings import SearchSettings
from .settings import ExportSettings

#: A grid point whose first-order drift estimate (``1 - cos``) is below this takes the first-order choice once it leads
#: a first round of ``MIN_IMAGES`` images (measured to agree with the fitness there: benchmarks/results/split_choice.md).
FIRST_ORDER_DRIFT = 0.01
#: A grid point's race is over once the leader is at most this fraction of its drift worse than every other candidate
#: (:class:`snapvit_pl.search.race.Race`'s indifference zone): its splits only serve budgets cut later, interpolated
#: between grid points, and settling its near ties to the last image took over half of the grid's forwards
#: (benchmarks/results/split_choice.md measures the choices against the exhaustive ones).
GRID_INDIFFERENCE = 0.05
#: A grid point's race ends once its candidates have seen this many fitness images (two rounds), the least drift on
#: them winning: measured to leave the splits budgets cut later take unchanged while it cut the grid's forwards
#: (benchmarks/results/later_budgets.md).
GRID_IMAGES = 2 * MIN_IMAGES


@dataclass
class SplitChoice:
    """The split chosen for one cost budget and the candidates it was chosen from.

    Attributes:
        label: the budget's label (``sparsity0.4``, ``flops0.5``; ``params0.7`` for a grid point).
        metric: ``params`` or ``flops``: what the budget limits.
        keep: the kept fraction of the dense model's ``metric``.
        head_ratio: the chosen head ratio (the budget's MLP ratio follows from it).
        schedule_head_ratio: the default schedule's head ratio for this budget.
        candidates: ``(head_ratio, mlp_ratio, distance)`` of every candidate raced: its drift on the fitness images
            it was raced on.
        requested: a budget the run asked for (else a point of the grid).
        images: for each candidate, the fitness images its distance was measured on.
        criterion: ``fitness`` (raced on the fitness images) or ``first_order`` (the first-order estimate's choice,
            confirmed by leading the first round of its race).
    """

    label: str
    metric: str
    keep: float
    head_ratio: float
    schedule_head_ratio: float
    candidates: list[tuple[float, float, float]] = field(default_factory=list)
    requested: bool = False
    images: list[int] = field(default_factory=list)
    criterion: str = "fitness"


def split_candidates(center: float, count: int, step: float, max_head: float) -> list[float]:
    """``count`` head ratios spaced by ``step`` around ``center``, within ``[0, max_head]`` (the center included)."""
    offsets = [step * (i - (count - 1) / 2) for i in range(count)]
    values = {round(min(max(center + d, 0.0), max_head), 6) for d in offsets} | {round(center, 6)}
    return sorted(values)


#: Above this kept fraction the grid keeps every other point (``1 - grid, 1 - 3 grid, ...``): the splits chosen there
#: change little from point to point (interpolating them loses next to nothing), and their sub-networks are the
#: costliest to race (benchmarks/results/later_budgets.md measures both).
GRID_COARSE_ABOVE = 0.5

#: The grid's deepest point lies this far (a fraction of the dense cost) above the deepest cut the keep ratios allow.
DEEP_END_MARGIN = 0.01


def deepest_keep(heads: Sequence[torch.Tensor], neurons: Sequence[torch.Tensor], cost: CostModel,
                 min_mlp_keep: float, min_head_keep: float, mlp_multiple: int = 1) -> dict[str, float]:
    """The smallest kept fraction of the dense params and FLOPs the keep ratios allow (every unit they do not
    protect removed)."""
    budget = Budget(mlp_ratio=max_prune_ratio(neurons, min_mlp_keep), head_ratio=max_prune_ratio(heads, min_head_keep))
    subnet = resolve(budget, heads, neurons, cost, min_mlp_keep, min_head_keep, mlp_multiple)[0]
    return {"params": cost.params(subnet) / cost.dense_params, "flops": cost.flops(subnet) / cost.dense_flops}


def split_points(budgets: Sequence[Budget], cost: CostModel, grid: float,
                 deepest: Optional[dict[str, float]] = None) -> list[tuple[str, str, float, bool]]:
    """``(label, metric, keep, requested)`` of every budget to split: the cost budgets asked for (latency budgets
    and ratio pairs excluded), then a grid of kept params and FLOPs fractions ``1 - grid, 1 - 2 grid, ...``
    (``grid`` 0: none; above :data:`GRID_COARSE_ABOVE` only ``1 - grid, 1 - 3 grid, ...``) and, with ``deepest``
    (:func:`deepest_keep`), a point :data:`DEEP_END_MARGIN` above the deepest cut of each metric, so that a budget
    cut later between the last grid point and that cut is interpolated rather than given the last grid point's
    split; each point once."""
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
            if keep > GRID_COARSE_ABOVE and i % 2 == 0:
                continue  # the shallow end: every other point
            for metric in ("params", "flops"):
                add(f"{metric}{keep:g}", metric, keep, False)
        for metric, floor in (deepest or {}).items():
            keep = round(floor + DEEP_END_MARGIN, 4)
            if keep < 1 - grid:
                add(f"{metric}{keep:g}", metric, keep, False)
    return points


@dataclass
class _Candidate:
    head_ratio: float
    mlp_ratio: float
    entrant: Entrant


class _Point:
    """One budget to split: its window of candidate head ratios, resolved when first needed."""

    def __init__(self, index: int, label: str, metric: str, keep: float, requested: bool, schedule: float,
                 ratios: list[float], resolve_at: Callable[[float], Optional[tuple[float, float, object]]],  # (h, m, subnet)
                 cost: Callable[[object], float]):
        self.index, self.label, self.metric, self.keep, self.requested = index, label, metric, keep, requested
        self.schedule, self.ratios, self._resolve_at, self._cost = schedule, ratios, resolve_at, cost
        self._candidates: dict[int, Optional[_Candidate]] = {}

    def candidate(self, position: int) -> Optional[_Candidate]:
        """The candidate at ``position`` of the window (None: outside it, or its head ratio cannot meet the budget)."""
        if not 0 <= position < len(self.ratios):
            return None
        if position not in self._candidates:
            found = self._resolve_at(self.ratios[position])
            self._candidates[position] = None if found is None else _Candidate(
                found[0], found[1], Entrant(found[2], self._cost(found[2]), abs(found[0] - self.schedule), position))
        return self._candidates[position]

    def feasible(self, positions: Sequence[int]) -> list[_Candidate]:
        return [c for c in (self.candidate(p) for p in positions) if c is not None]

    def beyond(self, position: int, step: int, keys: set) -> Optional[_Candidate]:
        """The first feasible candidate from ``position`` in direction ``step`` whose kept units are not in ``keys``
        (head ratios that keep the same units are stepped over)."""
        position += step
        while (candidate := self.candidate(position)) is not None:
            if candidate.entrant.key not in keys:
                return candidate
            position += step
        return None

    def around(self, position: int) -> list[int]:
        """``position`` and the nearest distinct sub-network on each side of it (the window a grid point starts with)."""
        keys = {self.candidate(position).entrant.key}
        found = [position]
        for step in (-1, 1):
            beyond = self.beyond(position, step, keys)
            if beyond is not None:
                found.append(beyond.entrant.label)
        return sorted(found)

    def nearest(self, head_ratio: float) -> int:
        """The feasible window position whose head ratio is nearest ``head_ratio`` (-1: none is feasible); only the
        positions up to it are resolved."""
        by_distance = sorted(range(len(self.ratios)), key=lambda p: (abs(self.ratios[p] - head_ratio), p))
        return next((p for p in by_distance if self.candidate(p) is not None), -1)


def first_order_valid(scores: ElasticScores) -> bool:
    """Whether the scores estimate the drift itself: the per-unit output sensitivity (of the normalised embedding, not
    centred) with every coefficient 1. Then half the sum of the scores a sub-network removes is a first-order estimate
    of its drift ``1 - cos`` (docs/method.md)."""
    scorer = scores.settings.get("scorer") or {}
    coefficients = scores.coefficients
    return (scorer.get("name") == "sensitivity" and scorer.get("target", "normalized") == "normalized"
            and scorer.get("center") is None and (coefficients is None or bool((coefficients == 1).all())))


def first_order_drift(heads: Sequence[torch.Tensor], neurons: Sequence[torch.Tensor], subnet) -> float:
    """Half the scores of the units ``subnet`` removes: with drift-valued scores (:func:`first_order_valid`) the
    first-order (diagonal Gauss-Newton) estimate of its drift ``1 - cos``."""
    kept = subnet.heads + subnet.neurons
    return sum(float(s.sum() - s[k].sum()) for s, k in zip(list(heads) + list(neurons), kept)) / 2


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
    *,
    fitness: Optional[EmbeddingFitness] = None,
    rank: int = 0,
    world_size: int = 1,
    all_gather: Optional[AllGather] = None,
    grid_indifference: float = GRID_INDIFFERENCE,
    grid_images: Optional[int] = None,
) -> list[SplitChoice]:
    """Choose the head ratio of every cost budget in ``budgets`` (and of the grid ``export.split_grid``) by the
    embedding-drift fitness.

    Ratio-pair and latency budgets are skipped, and so are grid points the keep ratios make unreachable. The
    schedule's own split is a candidate of every budget asked for and wins ties. Under DDP every rank calls this with
    the same arguments: the evaluations are shared and every rank returns the same choices.

    Args:
        model: the dense base model (never modified).
        images: the fitness images ``[N, C, H, W]`` (the search's); unused when ``fitness`` is given.
        scores: the elastic scores (coefficients included); their recorded splits are ignored here.
        budgets: the budgets asked for.
        search: the fitness's ``pca_components`` and ``batch_size``.
        export: ``split_candidates`` head ratios spaced by ``split_step`` around the schedule's; ``split_grid``;
            ``split_images``; the extraction's ``mlp_multiple``.
        cost: the base model's :class:`CostModel`, if already built.
        progress: show progress (a :class:`snapvit_pl.progress.Progress` mode).
        on_choice: called with each finished choice.
        fitness: the run's fitness (dense embeddings and PCA of the fitness images), if already built.
        rank, world_size, all_gather: this process's place in a DDP run
            (:func:`snapvit_pl.search.population.evaluate_shared`).
        grid_indifference: the grid points' indifference zone (:data:`GRID_INDIFFERENCE`; 0: their near ties settled
            to the last image, as the budgets asked for).
        grid_images: a grid point's race ends once its candidates have seen this many fitness images, the least drift
            on them winning (default :data:`GRID_IMAGES`; the number of fitness images: every near tie settled).

    Returns:
        the choices, in the order of :func:`split_points`; ``SplitTable`` of them: :func:`split_table`.

    Raises:
        PruningSpecError: a budget asked for that no candidate split can meet.
    """
    cost = cost or CostModel(model)
    fitness = fitness or EmbeddingFitness(model, images, scores, search, pairs=[(0.0, 0.0)], rank=rank,
                                          world_size=world_size, all_gather=all_gather)
    heads, neurons = scores.unified()
    max_head = max_prune_ratio(heads, scores.min_head_keep)
    keep_args = (scores.min_mlp_keep, scores.min_head_keep, export.mlp_multiple)
    ranked = rank_units(heads, neurons, scores.min_mlp_keep, scores.min_head_keep)  # shared by every point's cuts
    points: list[_Point] = []
    deepest = deepest_keep(heads, neurons, cost, *keep_args)
    for index, (label, metric, keep, requested) in enumerate(split_points(budgets, cost, export.split_grid, deepest)):
        budget = Budget(params=keep) if metric == "params" else Budget(flops=keep)
        try:
            _, _, schedule_h = resolve(budget, heads, neurons, cost, *keep_args, ranked=ranked)
        except PruningSpecError:
            if requested:  # the refusal in the budget's own words ({sparsity: 0.8}, not the {params: 0.2} it reads as)
                asked = next(b for b in budgets if b.label() == label)
                resolve(asked, heads, neurons, cost, *keep_args, ranked=ranked)
                raise
            continue  # a grid point below what the keep ratios reach

        def resolve_at(h: float, budget: Budget = budget) -> Optional[tuple[float, float, object]]:
            try:
                return resolve(budget, heads, neurons, cost, *keep_args, head_ratio=h, ranked=ranked)[::-1]
            except PruningSpecError:
                return None  # this head ratio cannot meet the budget under the keep ratios

        ratios = split_candidates(schedule_h, export.split_candidates, export.split_step, max_head)
        points.append(_Point(index, label, metric, keep, requested, schedule_h, ratios, resolve_at, cost.flops))
    racer = Racer(fitness, export.split_images, rank=rank, world_size=world_size, all_gather=all_gather)
    choices: dict[int, SplitChoice] = {}
    with Progress("splits", len(points), progress, unit="budget") as bar:
        def decided(point: _Point, candidates: list[_Candidate], best: _Candidate, measured: list[int],
                    distances: list[float], criterion: str = "fitness") -> None:
            choice = SplitChoice(point.label, point.metric, point.keep, best.head_ratio, point.schedule,
                                 [(c.head_ratio, c.mlp_ratio, d) for c, d in zip(candidates, distances)],
                                 point.requested, measured, criterion)
            choices[point.index] = choice
            bar.update(best=round(min(distances), 5))
            if on_choice is not None:
                on_choice(choice)

        def raced(races: dict[_Point, Race], reopen: Optional[Callable[[Race], list[Entrant]]] = None) -> None:
            racer.run(list(races.values()), reopen)
            for point, race in races.items():
                judged = sorted((point.candidate(e.label) for e in race.entrants), key=lambda c: c.head_ratio)
                best = point.candidate(race.winner.label)
                confirmed = race.favourite is not None and race.rounds == 1 and race.winner.key == race.favourite.key
                decided(point, judged, best, [racer.seen(c.entrant) for c in judged],
                        [racer.drift(c.entrant) for c in judged], "first_order" if confirmed else "fitness")

        # 1. the budgets asked for: their whole windows
        asked = {p: Race([c.entrant for c in p.feasible(range(len(p.ratios)))]) for p in points if p.requested}
        for point, race in asked.items():
            if not race.entrants:
                raise PruningSpecError(f"no head ratio of {point.ratios} meets the budget {point.label}: raise the "
                                       "budget or lower the keep ratios")
        raced(asked)
        # 2. the grid, its races side by side: each point races the split nearest the offset from the
        #    schedule chosen nearest it (or, where the first-order estimate is valid, that estimate's minimum from
        #    there) and the nearest distinct split on each side; while the winner has an unraced neighbour, that
        #    neighbour enters (a descent of the drift across the window, raced)
        first_order = first_order_valid(scores)
        grid: dict[_Point, Race] = {}
        last_images = GRID_IMAGES if grid_images is None else grid_images
        by_index = {p.index: p for p in points}
        for point in sorted((p for p in points if not p.requested), key=lambda p: -p.keep):
            start = point.nearest(point.schedule + _offset(point, [by_index[i] for i in choices], choices))
            if start < 0:
                bar.update()
                continue  # no head ratio of the window meets this grid point
            favourite = None
            if first_order:
                start, estimates = _first_order_descent(point, start, heads, neurons)
                if estimates[start] < FIRST_ORDER_DRIFT:
                    favourite = point.candidate(start).entrant
            grid[point] = Race([point.candidate(p).entrant for p in point.around(start)], MIN_IMAGES, favourite,
                               grid_indifference, last_images)
        owner = {race: point for point, race in grid.items()}

        def next_downhill(race: Race) -> list[Entrant]:
            """The winner's nearest distinct neighbours not raced yet (none: the race stays decided)."""
            point, raced_keys = owner[race], {e.key for e in race.entrants}
            found = [point.beyond(race.winner.label, step, {race.winner.key}) for step in (-1, 1)]
            return [c.entrant for c in found if c is not None and c.entrant.key not in raced_keys]

        raced(grid, next_downhill)
    return [choices[p.index] for p in points if p.index in choices]


def exhaustive_splits(fitness: EmbeddingFitness, scores: ElasticScores, budgets: Sequence[Budget],
                      export: ExportSettings, cost: CostModel) -> dict[str, tuple[float, float, dict[float, float]]]:
    """The reference :func:`choose_splits` is measured against: every candidate of every window (asked and grid
    points alike) on every fitness image, the least drift winning (ties: nearest the schedule).

    Returns:
        ``{label: (chosen head ratio, its drift, {head ratio: (drift, first-order estimate, kept FLOPs fraction)} of
        every feasible candidate)}`` (the estimate: :func:`first_order_drift`).
    """
    heads, neurons = scores.unified()
    keep_args = (scores.min_mlp_keep, scores.min_head_keep, export.mlp_multiple)
    everything = torch.arange(fitness.images.shape[0])
    chosen = {}
    deepest = deepest_keep(heads, neurons, cost, *keep_args)
    for label, metric, keep, requested in split_points(budgets, cost, export.split_grid, deepest):
        budget = Budget(params=keep) if metric == "params" else Budget(flops=keep)
        try:
            schedule_h = resolve(budget, heads, neurons, cost, *keep_args)[2]
        except PruningSpecError:
            continue
        drifts: dict[float, tuple[float, float, float]] = {}
        for h in split_candidates(schedule_h, export.split_candidates, export.split_step,
                                  max_prune_ratio(heads, scores.min_head_keep)):
            try:
                subnet, _, h = resolve(budget, heads, neurons, cost, *keep_args, head_ratio=h)
            except PruningSpecError:
                continue
            drift = 1.0 - float(fitness.similarities(subnet, everything).double().mean())
            drifts[h] = (drift, first_order_drift(heads, neurons, subnet), cost.flops(subnet) / cost.dense_flops)
        best = min(drifts, key=lambda h: (drifts[h][0], abs(h - schedule_h)))
        chosen[label] = (best, drifts[best][0], drifts)
    return chosen


def _offset(point: _Point, chosen: Sequence[_Point], choices: dict[int, SplitChoice]) -> float:
    """The head ratio offset from the schedule chosen nearest ``point``: the other metric's at the same kept fraction,
    else the same metric's nearest kept fraction, else the other metric's nearest (0 when nothing is chosen yet)."""
    def offset(p: _Point) -> float:
        return choices[p.index].head_ratio - p.schedule

    twins = [p for p in chosen if p.metric != point.metric and abs(p.keep - point.keep) <= TOLERANCE]
    if twins:
        return offset(twins[0])
    for same in (True, False):
        near = [p for p in chosen if (p.metric == point.metric) == same]
        if near:
            return offset(min(near, key=lambda p: (abs(p.keep - point.keep), p.index)))
    return 0.0


def _first_order_descent(point: _Point, start: int, heads: list[torch.Tensor],
                         neurons: list[torch.Tensor]) -> tuple[int, dict[int, float]]:
    """From ``start``, step to the neighbouring distinct sub-network with the lower first-order drift estimate (half
    the removed units' scores) until none is lower: that position and the estimates computed."""
    estimates: dict[int, float] = {}

    def estimate(candidate: _Candidate) -> float:
        position = candidate.entrant.label
        if position not in estimates:
            estimates[position] = first_order_drift(heads, neurons, candidate.entrant.subnet)
        return estimates[position]

    here = point.candidate(start)
    estimate(here)
    while True:
        moves = [c for c in (point.beyond(here.entrant.label, step, {here.entrant.key}) for step in (-1, 1))
                 if c is not None and estimate(c) < estimate(here)]
        if not moves:
            return here.entrant.label, estimates
        here = min(moves, key=lambda c: (estimate(c), c.entrant.tie))


def split_table(choices: Sequence[SplitChoice]) -> SplitTable:
    """The choices as the elastic scores record them."""
    table = SplitTable()
    for choice in choices:
        table.add(choice.metric, choice.keep, choice.head_ratio)
    return table
