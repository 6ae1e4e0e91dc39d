"""From per-unit scores to a sub-network: global ranking with per-block minimum keep ratios."""
from __future__ import annotations

import math
from typing import Sequence

import torch

from ..errors import PruningSpecError
from ..models.units import MIN_HEAD_KEEP, MIN_MLP_KEEP, Subnet, min_kept  # noqa: F401 (the keep ratios' defaults)


def check_ratio(value: float, name: str) -> float:
    """Validate a prune ratio: a fraction of units to remove, in [0, 1)."""
    value = float(value)
    if not (0.0 <= value < 1.0) or math.isnan(value):
        raise PruningSpecError(f"{name}={value} is outside [0, 1): it is the fraction of units to remove (0.4 = remove 40%)")
    return value


class UnitRanking:
    """One kind of unit (heads or neurons) ranked once, globally across blocks: a prune ratio removes a prefix of
    the ranking, so any number of ratios (a budget's bisection) costs one sort.

    The top ``min_keep_ratio`` of every block is protected (never pruned); the others are removed lowest score
    first, ties in block order.

    Args:
        scores: per block, one score per unit; higher is more important.
        min_keep_ratio: share of each block's units never pruned.
        kind: ``"head"`` or ``"MLP"`` (for error messages).
    """

    def __init__(self, scores: Sequence[torch.Tensor], min_keep_ratio: float, kind: str):
        self.scores = [s.detach().float().cpu() for s in scores]
        self.sizes = [len(s) for s in self.scores]
        self.min_keep_ratio, self.kind = min_keep_ratio, kind
        self.block_protected = protected = [min_kept(n, min_keep_ratio) for n in self.sizes]  # per block
        self.total, self.protected = sum(self.sizes), sum(protected)
        self.block_orders = [torch.argsort(s, descending=True, stable=True) for s in self.scores]
        ranked = []
        for s, order, keep in zip(self.scores, self.block_orders, protected):
            # Protected units get +inf so the global cut never reaches them.
            ranked.append(s.index_fill(0, order[:keep], math.inf))
        self.order = torch.argsort(torch.cat(ranked), stable=True)  # removal order
        self.owner = torch.cat([torch.full((n,), b) for b, n in enumerate(self.sizes)])
        self.local = torch.cat([torch.arange(n) for n in self.sizes])
        self._cuts: dict[int, list[torch.Tensor]] = {}  # units removed -> kept per block (a bisection revisits cuts)

    def removed(self, ratio: float) -> int:
        """How many units ``ratio`` removes."""
        return removed_count(ratio, self.total)

    def keep(self, ratio: float) -> list[torch.Tensor]:
        """Per block, the sorted indices of the units kept when ``ratio`` of all units are removed (not to be modified:
        the same cut returns the same tensors).

        Raises:
            PruningSpecError: the minimum keep ratio protects more units than ``ratio`` leaves.
        """
        to_prune = self.removed(ratio)
        prunable = self.total - self.protected
        if to_prune > prunable:
            raise PruningSpecError(
                f"{self.kind} prune ratio {ratio:.4f} removes {to_prune} of {self.total} units, but the minimum keep "
                f"ratio {self.min_keep_ratio} protects {self.protected}: at most {prunable / self.total:.4f} is "
                f"reachable; lower the ratio or the minimum keep ratio"
            )
        if to_prune not in self._cuts:
            mask = torch.ones(self.total, dtype=torch.bool)
            mask[self.order[:to_prune]] = False
            counts = torch.bincount(self.owner[mask], minlength=len(self.sizes)).tolist()
            self._cuts[to_prune] = [t.clone() for t in torch.split(self.local[mask], counts)]
        return list(self._cuts[to_prune])  # the same (read-only) tensors for the same cut

    def round_widths(self, keep: list[torch.Tensor], multiple: int) -> list[torch.Tensor]:
        """Round each block's kept count with :func:`rounded_width`: to the nearest multiple, never below the block's
        protected units (then the next multiple at or above them) nor above its width. The best pruned units are
        added back, or the worst kept ones dropped (never a protected one)."""
        rounded = []
        for kept, n, order, protected in zip(keep, self.sizes, self.block_orders, self.block_protected):
            target = rounded_width(len(kept), n, multiple, protected)
            if target >= len(kept):  # add the best pruned units back
                extra = order[~torch.isin(order, kept)][: target - len(kept)]
                rounded.append(torch.sort(torch.cat([kept, extra])).values)
            else:  # drop the worst kept units (the protected ones rank first in ``order``: target >= protected)
                ranked_kept = order[torch.isin(order, kept)]
                rounded.append(torch.sort(ranked_kept[:target]).values)
        return rounded


def removed_count(ratio: float, total: int) -> int:
    """How many of ``total`` units a prune ratio removes (rounded down: a ratio never removes more than it says)."""
    return int(math.floor(ratio * total + 1e-9))


def rounded_width(kept: int, width: int, multiple: int, protected: int = 1) -> int:
    """A block's kept count rounded to ``multiple``: the nearest multiple (half to even), raised to the first multiple
    at or above ``protected`` (the units the minimum keep ratio never prunes), capped at the full ``width``.

    Example: with ``multiple=8``, a block of 384 neurons cut to its 20 protected ones (``min_mlp_keep`` 0.05) keeps
    24, not the nearest multiple 16; cut to 30, it keeps 32; a block narrower than the multiple keeps its width.
    """
    if multiple <= 1:
        return min(width, max(kept, protected))
    floor = multiple * math.ceil(max(1, protected) / multiple)
    return min(width, max(floor, multiple * round(kept / multiple)))


def select_ranked(heads: UnitRanking, neurons: UnitRanking, mlp_ratio: float, head_ratio: float,
                  mlp_multiple: int = 1) -> Subnet:
    """:func:`select_subnet` from rankings made once (for many ratios over the same scores)."""
    mlp_ratio, head_ratio = check_ratio(mlp_ratio, "mlp_ratio"), check_ratio(head_ratio, "head_ratio")
    kept_heads, kept_neurons = heads.keep(head_ratio), neurons.keep(mlp_ratio)
    if mlp_multiple > 1:
        kept_neurons = neurons.round_widths(kept_neurons, mlp_multiple)
    return Subnet(kept_heads, kept_neurons)


def select_subnet(
    head_scores: Sequence[torch.Tensor],
    neuron_scores: Sequence[torch.Tensor],
    mlp_ratio: float,
    head_ratio: float,
    min_mlp_keep: float = MIN_MLP_KEEP,
    min_head_keep: float = MIN_HEAD_KEEP,
    mlp_multiple: int = 1,
) -> Subnet:
    """Keep the highest-scoring units: prune ``mlp_ratio`` of all neurons and ``head_ratio`` of all heads.

    Neurons and heads are ranked separately, each globally across blocks; the top
    ``min_mlp_keep`` / ``min_head_keep`` of every block are never pruned.

    Args:
        head_scores: per block, one (unified) score per head; higher is more important.
        neuron_scores: per block, one score per MLP hidden neuron.
        mlp_ratio: fraction of all MLP neurons to remove, in [0, 1).
        head_ratio: fraction of all heads to remove, in [0, 1).
        min_mlp_keep: fraction of each block's neurons always kept (:data:`MIN_MLP_KEEP`).
        min_head_keep: fraction of each block's heads always kept (:data:`MIN_HEAD_KEEP`).
        mlp_multiple: round each block's MLP width to a multiple of this (e.g. 8 or 16 for
            hardware-friendly shapes; never below the block's protected neurons, :func:`rounded_width`);
            1 disables rounding.

    Raises:
        PruningSpecError: a ratio outside [0, 1), or one the keep ratios make unreachable.
    """
    return select_ranked(UnitRanking(head_scores, min_head_keep, "head"), UnitRanking(neuron_scores, min_mlp_keep, "MLP"),
                         mlp_ratio, head_ratio, mlp_multiple)
