"""From per-unit scores to a sub-network: global ranking with per-block minimum keep ratios."""
from __future__ import annotations

import math
from typing import Sequence

import torch

from ..errors import PruningSpecError
from ..models.units import Subnet, min_kept

#: Share of each block's MLP neurons / heads that is never pruned (the paper's): the defaults everywhere.
MIN_MLP_KEEP = 0.05
MIN_HEAD_KEEP = 0.2


def check_ratio(value: float, name: str) -> float:
    """Validate a prune ratio: a fraction of units to remove, in [0, 1)."""
    value = float(value)
    if not (0.0 <= value < 1.0) or math.isnan(value):
        raise PruningSpecError(f"{name}={value} is outside [0, 1): it is the fraction of units to remove (0.4 = remove 40%)")
    return value


def _global_keep(scores: Sequence[torch.Tensor], ratio: float, min_keep_ratio: float, kind: str) -> list[torch.Tensor]:
    sizes = [len(s) for s in scores]
    protected = [min_kept(n, min_keep_ratio) for n in sizes]
    to_prune = int(math.floor(ratio * sum(sizes) + 1e-9))
    prunable = sum(sizes) - sum(protected)
    if to_prune > prunable:
        raise PruningSpecError(
            f"{kind} prune ratio {ratio:.4f} removes {to_prune} of {sum(sizes)} units, but the minimum keep ratio "
            f"{min_keep_ratio} protects {sum(protected)}: at most {prunable / sum(sizes):.4f} is reachable; "
            f"lower the ratio or the minimum keep ratio"
        )
    ranked = []
    for block, (s, keep) in enumerate(zip(scores, protected)):
        s = s.detach().float().cpu()
        order = torch.argsort(s, descending=True, stable=True)
        # Protected units get +inf so the global cut never reaches them.
        ranked.append(torch.where(torch.isin(torch.arange(len(s)), order[:keep]), torch.full_like(s, math.inf), s))
    flat = torch.cat(ranked)
    owner = torch.cat([torch.full((n,), b) for b, n in enumerate(sizes)])
    local = torch.cat([torch.arange(n) for n in sizes])
    pruned = torch.argsort(flat, stable=True)[:to_prune]
    mask = torch.ones(len(flat), dtype=torch.bool)
    mask[pruned] = False
    return [local[(owner == b) & mask] for b in range(len(sizes))]


def _round_widths(keep: list[torch.Tensor], scores: Sequence[torch.Tensor], multiple: int) -> list[torch.Tensor]:
    """Round each block's kept count to the nearest multiple (at least one multiple, at most all units)."""
    rounded = []
    for kept, s in zip(keep, scores):
        n = len(s)
        target = min(n, max(multiple, multiple * round(len(kept) / multiple)))
        order = torch.argsort(s.detach().float().cpu(), descending=True, stable=True)
        if target >= len(kept):  # add the best pruned units back
            extra = order[~torch.isin(order, kept)][: target - len(kept)]
            rounded.append(torch.sort(torch.cat([kept, extra])).values)
        else:  # drop the worst kept units
            ranked_kept = order[torch.isin(order, kept)]
            rounded.append(torch.sort(ranked_kept[:target]).values)
    return rounded


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
            hardware-friendly shapes); 1 disables rounding.

    Raises:
        PruningSpecError: a ratio outside [0, 1), or one the keep ratios make unreachable.
    """
    mlp_ratio, head_ratio = check_ratio(mlp_ratio, "mlp_ratio"), check_ratio(head_ratio, "head_ratio")
    heads = _global_keep(head_scores, head_ratio, min_head_keep, "head")
    neurons = _global_keep(neuron_scores, mlp_ratio, min_mlp_keep, "MLP")
    if mlp_multiple > 1:
        neurons = _round_widths(neurons, neuron_scores, mlp_multiple)
    return Subnet(heads, neurons)
