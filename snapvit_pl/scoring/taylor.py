"""First-order Taylor importance of coupled groups, with the label-free self-distillation loss.

Torch-Pruning's ``GroupTaylorImportance`` (Fang et al., "DepGraph: Towards Any Structural
Pruning", CVPR 2023; Molchanov et al., "Importance Estimation for Neural Network Pruning",
CVPR 2019): a unit's importance is ``sum |w * dL/dw|`` over every weight that is removed with it.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

from ..device import autocast_context
from ..errors import DataError
from ..models.modes import eval_mode
from ..models.units import Slot, UnitGroup, iter_slots
from ..ranges import check_arguments, one_of
from .base import (
    LocalScores, NonFiniteGradientError, ScoringContext, SummedStatistics, grad_only,
    model_device_dtype,
)
from .gradient import _SelfDistillation


def unit_slices(tensor: Tensor, group: UnitGroup, slot: Slot) -> Tensor:
    """``tensor`` (shaped like the slot's tensor) as ``[units, entries per unit]``: each unit's slice of it.

    A slot holds ``sections`` equal parts along ``slot.dim``, each ``units * unit_size`` long
    (e.g. q, k and v of a fused ``qkv``: head ``h`` owns rows ``s * H * d + h * d ... + d - 1`` of each).
    """
    moved = tensor.movedim(slot.dim, 0)
    parts = moved.reshape(slot.sections, group.num_units, group.unit_size, -1)
    return parts.permute(1, 0, 2, 3).reshape(group.num_units, -1)


Normalizer = one_of("none", "mean")


class Taylor(_SelfDistillation, SummedStatistics):
    """First-order Taylor importance ``sum |w * dL/dw|`` over each unit's coupled weights, label-free.

    The coupled weights are every parameter that holds a slice per unit
    (:mod:`snapvit_pl.models.units`): for a head its q, k and v rows of ``qkv`` (or of
    ``q_proj``/``k_proj``/``v_proj``), their biases (EVA's ``q_bias``/``v_bias``), the head's channels
    of an inner attention norm, and its columns of ``proj``; for an MLP neuron its ``fc1`` row(s)
    and bias (both halves of a gated MLP, ``fc1_g`` and ``fc1_x`` of a ``SwiGLU``), its channel of
    an MLP norm, and its ``fc2`` column. Torch-Pruning's ``GroupTaylorImportance`` sums the same
    products over the same dependency group (its group reduction averages the layers' sums: the same
    order).

    The loss is :class:`SSLFisher`'s self-distillation loss (multi-crop views, frozen teacher, no
    labels). ``dL/dw`` is the gradient of the loss summed over all the data (accumulated over batches
    as ``sum n_b g_b``, then divided by the number of samples, as :class:`SNIPMagnitude` does up to a
    constant factor), so the scores do not depend on the batch order, on the batching, nor on DDP
    sharding (float rounding aside).

    Args:
        n_global: as for :class:`snapvit_pl.scoring.SSLFisher` (None, default: the DataModule's ``n_global_views``).
        normalizer: ``"none"`` (default) or ``"mean"`` (Torch-Pruning's default normaliser: each
            block's heads, and each block's neurons, divided by their mean).
    """

    name = "taylor"

    def __init__(self, n_global: Optional[int] = None, normalizer: Normalizer = "none"):
        self.n_global = n_global
        check_arguments(Taylor.__init__, locals(), "importance.scorer.init_args", skip={"self"})
        self.normalizer = normalizer
        self._check_n_global()

    def setup(self, model: nn.Module, context: Optional[ScoringContext] = None) -> None:
        super().setup(model, context)
        self._bind()
        self._acc = {name: torch.zeros_like(p, dtype=self._acc_dtype) for name, p in zip(self._names, self._params)}
        self._start_counting()

    def _bind(self) -> None:
        self._device, self._dtype = model_device_dtype(self.model)
        self._acc_dtype = torch.promote_types(self._dtype, torch.float32)
        self._params: list[nn.Parameter] = []
        self._names: list[str] = []
        self._slots: list[tuple[str, UnitGroup, list[tuple[Slot, int]]]] = []
        for block in self.blocks:
            for kind in ("heads", "neurons"):
                group = getattr(block, kind)
                used = []
                for slot, tensor in iter_slots(group):
                    if not isinstance(tensor, nn.Parameter):
                        continue  # buffers (EVA's constant k_bias) are not weights
                    found = [i for i, p in enumerate(self._params) if p is tensor]
                    if not found:
                        self._params.append(tensor)
                        self._names.append(f"{block.index}.{kind}.{slot.path}")
                    used.append((slot, found[0] if found else len(self._params) - 1))
                self._slots.append((f"{block.index}.{kind}", group, used))

    def _rebind(self) -> None:
        self._bind()

    def update(self, batch: Any) -> dict[str, float]:
        images, labels = self._batch(batch)
        with eval_mode(self.model), grad_only(self.model, self._params):
            with autocast_context(self._device):
                loss, samples = self._loss(images, labels)
            grads = torch.autograd.grad(loss, self._params)
        if not bool(torch.isfinite(loss.detach())) or not all(bool(g.isfinite().all()) for g in grads):
            raise NonFiniteGradientError(f"taylor: non-finite loss or gradient (batch {self._batches + 1}); check the "
                                         "input images and the model weights for NaN/inf values")
        with torch.no_grad():
            for name, g in zip(self._names, grads):
                self._acc[name].add_(g, alpha=samples)
        self._batches += 1
        self._samples += samples
        return {"loss": float(loss.detach())}

    def compute(self) -> LocalScores:
        self._require_bound()
        if self._samples == 0:
            raise DataError(f"{self.name} saw no batches: feed the scoring data through update() before compute()")
        scores = {}
        with torch.no_grad():
            for key, group, used in self._slots:
                total = torch.zeros(group.num_units, dtype=torch.float64, device=self._device)
                for slot, i in used:
                    g = self._acc[self._names[i]].double() / self._samples
                    w = self._params[i].detach().double()
                    total += unit_slices((w * g).abs(), group, slot).sum(dim=1)
                if self.normalizer == "mean":
                    total = total / total.mean().clamp_min(torch.finfo(torch.float64).tiny)
                scores[key] = total.float().cpu()
        return LocalScores([scores[f"{b.index}.heads"] for b in self.blocks],
                           [scores[f"{b.index}.neurons"] for b in self.blocks])
