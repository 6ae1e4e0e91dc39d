"""Budgets: prune-ratio pairs, an overall sparsity, or a parameter / FLOPs target.

Every budget is resolved to a (mlp_ratio, head_ratio) pair. Sparsity, parameter and FLOPs
targets move along one documented *schedule*, ``mlp_ratio = t``, ``head_ratio = t - 0.15``
(clipped to what the minimum keep ratios allow), on which the paper's evaluated pairs
(0.15, 0), (0.25, 0.1), ... (0.65, 0.5) lie; ``t`` is found by bisection so that the model
meets the target with the smallest possible cut.
"""
from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch
from torch import nn

from ..errors import PruningSpecError
from ..models.cost import count_params, flop_counts
from ..models.units import Subnet, UnitGroup, iter_slots, prunable_blocks

if TYPE_CHECKING:
    from .latency import LatencyTable
from .ranking import MIN_HEAD_KEEP, MIN_MLP_KEEP, UnitRanking, check_ratio, min_kept, select_ranked

HEAD_LAG = 0.15  # head_ratio = mlp_ratio - HEAD_LAG along the schedule
COST_KINDS = ("sparsity", "params", "flops", "latency")
BUDGET_KEYS = ("mlp_ratio", "head_ratio", *COST_KINDS)
_EXAMPLES = "e.g. {flops: 0.5}, {params: 2e7}, {sparsity: 0.4}, {latency: 12.5} or {mlp_ratio: 0.35, head_ratio: 0.2}"

#: The paper's evaluated (mlp_ratio, head_ratio) pairs: roughly 10-60% of the backbone's parameters removed.
PAPER_PAIRS: tuple[tuple[float, float], ...] = ((0.15, 0.0), (0.25, 0.1), (0.35, 0.2), (0.45, 0.3), (0.55, 0.4), (0.65, 0.5))


@dataclass
class Budget:
    """A compute budget; give exactly one of: both ratios, ``sparsity``, ``params``, ``flops`` or ``latency``.

    Args:
        mlp_ratio: fraction of all MLP neurons to remove, in [0, 1).
        head_ratio: fraction of all attention heads to remove, in [0, 1).
        sparsity: fraction of the model's parameters to remove, in [0, 1) (same as ``params=1-sparsity``).
        params: parameters to keep: a count (> 1) or a fraction of the dense model (<= 1).
        flops: FLOPs per image to keep: a count (> 1) or a fraction of the dense model (<= 1).
        latency: milliseconds per batch to stay within, on the device and batch size of the latency
            table (:mod:`snapvit_pl.elastic.latency`; ``export.latency_device`` / ``latency_batch_size``).
    """

    mlp_ratio: Optional[float] = None
    head_ratio: Optional[float] = None
    sparsity: Optional[float] = None
    params: Optional[float] = None
    flops: Optional[float] = None
    latency: Optional[float] = None

    def __post_init__(self) -> None:
        given = [k for k in COST_KINDS if getattr(self, k) is not None]
        pair = self.mlp_ratio is not None or self.head_ratio is not None
        if len(given) + int(pair) != 1:
            raise PruningSpecError(f"a budget takes exactly one of (mlp_ratio, head_ratio), sparsity, params, flops, "
                                   f"latency; got {self.describe()}: {_EXAMPLES}")
        if pair:
            check_ratio(self.mlp_ratio if self.mlp_ratio is not None else 0.0, "mlp_ratio")
            check_ratio(self.head_ratio if self.head_ratio is not None else 0.0, "head_ratio")
        if self.sparsity is not None:
            check_ratio(self.sparsity, "sparsity")
        for key in ("params", "flops"):
            value = getattr(self, key)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise PruningSpecError(f"{key}={value} must be a positive count or a fraction in (0, 1]")
        if self.latency is not None and not (self.latency > 0 and math.isfinite(self.latency)):
            raise PruningSpecError(f"latency={self.latency} must be a positive number of milliseconds per batch")

    @classmethod
    def parse(cls, value: "Budget | Mapping[str, Any] | str") -> "Budget":
        """A budget from a ``Budget``, a mapping of its fields (``{"flops": 0.5}``) or text (``"flops=0.5"``,
        ``"mlp_ratio=0.35,head_ratio=0.2"``).

        Raises:
            PruningSpecError: an unknown key (the known ones named, a likely-meant one suggested), a value that is not
                a number, or an invalid combination.
        """
        if isinstance(value, Budget):
            return value
        if isinstance(value, str):
            items = [item.strip() for item in value.split(",") if item.strip()]
            if not items or any("=" not in item for item in items):
                raise PruningSpecError(f"cannot read budget {value!r}; write key=value pairs, e.g. flops=0.5 or "
                                       "mlp_ratio=0.35,head_ratio=0.2")
            value = dict(item.split("=", 1) for item in items)
        if not isinstance(value, Mapping):
            raise PruningSpecError(f"a budget is a mapping of its fields, got {value!r}; {_EXAMPLES}")
        fields: dict[str, float] = {}
        for key, raw in value.items():
            key = str(key).strip()
            if key not in BUDGET_KEYS:
                if ":" in key and raw is None:  # YAML read {sparsity:0.3} as the key "sparsity:0.3"
                    name, _, number = key.partition(":")
                    raise PruningSpecError(f"budget {{{key}}} reads as one key: YAML needs a space after the colon, "
                                           f"write {{{name}: {number}}}")
                close = difflib.get_close_matches(key, BUDGET_KEYS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise PruningSpecError(f"unknown budget key {key!r}{hint}; a budget takes {', '.join(BUDGET_KEYS)}: "
                                       f"{_EXAMPLES}")
            try:
                if isinstance(raw, bool):  # YAML's true is not the number 1
                    raise TypeError
                fields[key] = float(raw)
            except (TypeError, ValueError):
                raise PruningSpecError(f"budget {key}={raw!r} is not a number; {_EXAMPLES}") from None
        return cls(**fields)

    def cost_point(self, cost: "CostModel") -> Optional[tuple[str, float]]:
        """``(metric, kept fraction of the dense model)`` of a sparsity, params or FLOPs budget (``("params", 0.6)``
        for ``sparsity=0.4``); None for a ratio pair or a latency budget."""
        if self.sparsity is not None:
            return "params", 1.0 - self.sparsity
        for metric, dense in (("params", cost.dense_params), ("flops", cost.dense_flops)):
            value = getattr(self, metric)
            if value is not None:
                return metric, value if value <= 1.0 else value / dense
        return None

    def to_dict(self) -> dict[str, float]:
        """The fields that are set, e.g. ``{"flops": 0.5}`` (inverse: ``Budget(**d)``)."""
        return {k: v for k, v in vars(self).items() if v is not None}

    def describe(self) -> str:
        """The budget as written in a config, e.g. ``{flops: 0.5}``."""
        return "{" + ", ".join(f"{k}: {v:.12g}" for k, v in self.to_dict().items()) + "}"

    def label(self) -> str:
        """A short name (the folder of its model), e.g. ``mlp0.35_head0.20``, ``flops0.5`` or ``params1.89M``."""
        if self.mlp_ratio is not None or self.head_ratio is not None:
            return f"mlp{self.mlp_ratio or 0:.2f}_head{self.head_ratio or 0:.2f}"
        # a fraction to 10 digits (0.9999999 stays itself: ``:g`` made it flops1, the dense model's name)
        return "_".join(f"{k}{_count(v) if k in ('params', 'flops') and v > 1 else _exact(v)}"
                        for k in COST_KINDS if (v := getattr(self, k)) is not None)

    @property
    def is_cost(self) -> bool:
        """A cost target (sparsity, params, FLOPs, latency) rather than a ratio pair."""
        return any(getattr(self, k) is not None for k in COST_KINDS)


def _exact(value: float) -> str:
    """``value`` to 10 significant digits (``0.5``, ``0.9999999``): a difference a budget can make to a model (one
    unit of a billion parameters) changes its label; closer values share one, and two budgets of one label are
    refused (:func:`check_unique_labels`)."""
    return f"{value:.10g}"


def _count(value: float) -> str:
    """A count in 3 significant digits with its unit: ``1.89M``, ``17.6G``, ``512``."""
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if value >= scale * 0.9995:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def check_unique_labels(budgets: Sequence[Budget]) -> None:
    """Refuse budgets whose labels (the folders of their models) coincide, before any work.

    Raises:
        PruningSpecError: naming both budgets and their label.
    """
    seen: dict[str, Budget] = {}
    for budget in budgets:
        first = seen.setdefault(budget.label(), budget)
        if first is budget:
            continue
        if first == budget:
            raise PruningSpecError(f"budget {first.describe()} is given twice; give each budget once")
        raise PruningSpecError(f"budgets {first.describe()} and {budget.describe()} would both be saved as "
                               f"{budget.label()}; give budgets whose labels differ (ratios in steps of 0.01, "
                               "fractions to 6 digits, counts to 3 significant digits)")


#: The default export: 10% ... 60% of the parameters removed (about what the paper's six pairs remove), each
#: split between heads and MLP neurons by the fitness (``export.split: fitness``).
DEFAULT_SPARSITIES: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)


def default_budgets() -> list[Budget]:
    """What ``prune.py`` exports when no budgets are given: the sparsities of :data:`DEFAULT_SPARSITIES`."""
    return [Budget(sparsity=s) for s in DEFAULT_SPARSITIES]


class CostModel:
    """Exact parameter and FLOP counts of any sub-network, without building it.

    Both are affine in the kept units of each block: each head (or neuron) of block ``b`` owns
    a fixed number of parameters and FLOPs, measured once on the dense model.
    """

    def __init__(self, model: nn.Module, shape: Sequence[int] | None = None, latency: "LatencyTable | None" = None):
        self.latency = latency  # for latency budgets: a table measured on the target device
        blocks = prunable_blocks(model)
        self.dense_params = count_params(model)
        self.head_params = [_unit_params(b.heads) / b.heads.num_units for b in blocks]
        self.neuron_params = [_unit_params(b.neurons) / b.neurons.num_units for b in blocks]
        self.num_heads = [b.heads.num_units for b in blocks]
        self.num_neurons = [b.neurons.num_units for b in blocks]
        self.dense_flops, per_module = flop_counts(model, shape)
        attn = [_match(per_module, f"blocks.{b.index}.attn") for b in blocks]
        mlp = [_match(per_module, f"blocks.{b.index}.mlp") for b in blocks]
        self.head_flops = [a / h for a, h in zip(attn, self.num_heads)]
        self.neuron_flops = [m / n for m, n in zip(mlp, self.num_neurons)]

    def params(self, subnet: Subnet) -> int:
        return self._cost(subnet, self.dense_params, self.head_params, self.neuron_params)

    def flops(self, subnet: Subnet) -> int:
        return self._cost(subnet, self.dense_flops, self.head_flops, self.neuron_flops)

    def _cost(self, subnet: Subnet, dense: int, per_head: list[float], per_neuron: list[float]) -> int:
        """Dense cost minus what each removed head and neuron owned."""
        removed = sum(
            (H - h) * ph + (N - n) * pn
            for H, h, ph, N, n, pn in zip(
                self.num_heads, subnet.head_counts, per_head, self.num_neurons, subnet.neuron_counts, per_neuron
            )
        )
        return int(round(dense - removed))


def _unit_params(group: UnitGroup) -> int:
    """Parameters owned by the units of a group (buffers such as EVA's k_bias do not count)."""
    return sum(t.numel() for _, t in iter_slots(group) if isinstance(t, nn.Parameter))


def _match(per_module: dict[str, int], suffix: str) -> int:
    return next((v for k, v in per_module.items() if k.endswith("." + suffix)), 0)


def schedule(t: float) -> tuple[float, float]:
    """The (mlp_ratio, head_ratio) pair at position ``t`` of the sparsity schedule (before clipping)."""
    return t, max(0.0, t - HEAD_LAG)


def rank_units(head_scores: Sequence[torch.Tensor], neuron_scores: Sequence[torch.Tensor],
               min_mlp_keep: float = MIN_MLP_KEEP, min_head_keep: float = MIN_HEAD_KEEP) -> tuple[UnitRanking, UnitRanking]:
    """Heads and neurons each ranked once (:class:`UnitRanking`), for :func:`resolve`."""
    return UnitRanking(head_scores, min_head_keep, "head"), UnitRanking(neuron_scores, min_mlp_keep, "MLP")


def resolve(
    budget: Budget,
    head_scores: Sequence[torch.Tensor],
    neuron_scores: Sequence[torch.Tensor],
    cost: CostModel | None = None,
    min_mlp_keep: float = MIN_MLP_KEEP,
    min_head_keep: float = MIN_HEAD_KEEP,
    mlp_multiple: int = 1,
    head_ratio: float | None = None,
    ranked: tuple[UnitRanking, UnitRanking] | None = None,
) -> tuple[Subnet, float, float]:
    """Turn a budget into ``(subnet, mlp_ratio, head_ratio)`` for the given unit scores.

    A cost budget (sparsity, params, FLOPs) is met with the smallest cut along a path of ratio
    pairs: the schedule ``head_ratio = mlp_ratio - 0.15`` by default, or, with ``head_ratio``
    given (a split chosen for this budget, see :func:`snapvit_pl.pipeline.splits.choose_splits`),
    that head ratio with the MLP ratio found by bisection.

    ``ranked``: the same scores already ranked (:func:`rank_units`, with the same keep ratios), to share their sort
    and their cuts across the many budgets and head ratios of a split choice.

    Raises:
        PruningSpecError: a target below what the minimum keep ratios allow (the message gives
            the smallest reachable value), or a cost budget without a ``CostModel``.
        ValueError: ``ranked`` made with other keep ratios or unit counts.
    """
    if ranked is None:
        ranked = rank_units(head_scores, neuron_scores, min_mlp_keep, min_head_keep)
    elif ((ranked[0].min_keep_ratio, ranked[1].min_keep_ratio) != (min_head_keep, min_mlp_keep)
          or ranked[0].sizes != [len(s) for s in head_scores] or ranked[1].sizes != [len(s) for s in neuron_scores]):
        raise ValueError("resolve: `ranked` was made with other keep ratios or unit counts than the arguments; make "
                         "it with rank_units(head_scores, neuron_scores, min_mlp_keep, min_head_keep)")
    select = lambda m, h: select_ranked(*ranked, m, h, mlp_multiple)  # noqa: E731
    if not budget.is_cost:
        m, h = budget.mlp_ratio or 0.0, budget.head_ratio or 0.0
        return select(m, h), m, h
    if cost is None:
        raise PruningSpecError("sparsity / params / flops / latency budgets need a CostModel of the dense model")
    if budget.latency is not None:
        if cost.latency is None:
            raise PruningSpecError("latency budgets need a latency table of the target device "
                                   "(snapvit_pl.elastic.latency; prune.py measures one when a budget asks for latency)")
        metric, dense, target, measure = "latency", cost.latency.dense_ms, budget.latency, cost.latency.predict
    else:
        metric = "flops" if budget.flops is not None else "params"
        dense = cost.dense_flops if metric == "flops" else cost.dense_params
        value = {"flops": budget.flops, "params": budget.params}.get(metric)
        if budget.sparsity is not None:
            value = 1.0 - budget.sparsity
        target = value * dense if value <= 1.0 else value
        measure: Callable[[Subnet], float] = cost.flops if metric == "flops" else cost.params
        if target > dense:
            raise PruningSpecError(
                f"{metric} budget {value:g} is too high: read as a count, it is more than the dense model's {dense:.4g} "
                f"{'FLOPs' if metric == 'flops' else 'parameters'}, so nothing would be pruned; give a smaller count, or "
                "a fraction of the dense model (<= 1)")

    max_mlp = max_prune_ratio(neuron_scores, min_mlp_keep)
    max_head = max_prune_ratio(head_scores, min_head_keep)
    if head_ratio is None:  # along the schedule, both ratios clipped to what the keep ratios allow
        t_end = max(max_mlp, max_head + HEAD_LAG)
        path = lambda t: (min(schedule(t)[0], max_mlp), min(schedule(t)[1], max_head))  # noqa: E731
    else:  # a fixed head ratio, the MLP ratio free
        fixed = min(check_ratio(head_ratio, "head_ratio"), max_head)
        t_end, path = max_mlp, (lambda t: (min(t, max_mlp), fixed))
    costs: dict[tuple[int, int], float] = {}

    def cost_at(t: float) -> float:
        """The cost along the path at ``t`` (measured once per cut: the bisection revisits cuts)."""
        m, h = path(t)
        cut = (ranked[1].removed(m), ranked[0].removed(h))
        if cut not in costs:
            costs[cut] = measure(select(m, h))
        return costs[cut]

    if cost_at(0.0) <= target:
        if head_ratio is not None and path(0.0)[1] > 0 and cost_at(0.0) < dense:
            # the split's heads alone already meet the budget: they would remove more than it asks (a sparsity 0.02
            # cut at a split chosen for 0.5): the smallest cut along the schedule, from nothing removed, meets it
            return resolve(budget, head_scores, neuron_scores, cost, min_mlp_keep, min_head_keep, mlp_multiple,
                           ranked=ranked)
        return select(*path(0.0)), *path(0.0)
    smallest = cost_at(t_end)
    if smallest > target and metric in ("params", "flops") and target == value and value < MISREAD_FRACTION:
        unit = "FLOPs" if metric == "flops" else "parameters"
        raise PruningSpecError(
            f"{metric} budget {budget.describe()} (read as a count: a fraction of the dense model is <= 1) is no "
            f"model: as a fraction it would keep {value:.0%} of the dense model, as a count {value:g} {unit} of its "
            f"{dense:.4g}; give a fraction <= 1 (e.g. {{{metric}: 0.5}}) or a count of {unit}")
    if smallest > target:
        split = "" if head_ratio is None else f" with head_ratio {head_ratio:.3f}"
        asked = budget.describe() + (" (read as a count: a fraction of the dense model is <= 1)"
                                     if metric in ("params", "flops") and target == value else f" ({target:.4g})")
        rounding = (f" with MLP widths rounded up to multiples of {mlp_multiple} (export.mlp_multiple)"
                    if mlp_multiple > 1 else "")
        kind = "sparsity" if budget.sparsity is not None else metric
        raise PruningSpecError(
            f"{kind} budget {asked} is too low, unreachable{split}: the minimum keep ratios (MLP {min_mlp_keep}, heads "
            f"{min_head_keep}){rounding} leave at least {smallest:.4g} ({smallest / dense:.1%} of dense); raise the "
            f"budget or lower the keep ratios (importance.min_mlp_keep, importance.min_head_keep)"
            + (" or export.mlp_multiple" if mlp_multiple > 1 else "")
        )
    lo, hi = 0.0, t_end  # invariant: cost(lo) > target >= cost(hi)
    for _ in range(50):
        mid = (lo + hi) / 2
        if cost_at(mid) <= target:
            hi = mid
        else:
            lo = mid
    m, h = path(hi)
    return select(m, h), m, h


#: A params or FLOPs budget above 1 (a count) but below this is no model's count: a fraction written above 1.
MISREAD_FRACTION = 100.0


def max_prune_ratio(scores: Sequence[torch.Tensor], min_keep_ratio: float) -> float:
    """Largest prune ratio the minimum keep ratio allows."""
    sizes = [len(s) for s in scores]
    prunable = sum(sizes) - sum(min_kept(n, min_keep_ratio) for n in sizes)
    return max(0.0, prunable / sum(sizes) - 1e-9)
