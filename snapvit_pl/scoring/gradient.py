"""Gradient-based scorers: self-supervised Fisher (SnapViT's local term), label Fisher, SNIP-magnitude.

All three differentiate a loss with respect to two weights per block only, with
``torch.autograd.grad`` (no ``.grad`` accumulation, no DDP hooks, nothing else of the model
requires grad meanwhile):

- heads: the V rows of the attention input projection (fused ``qkv.weight``, or ``v_proj.weight``);
- neurons: the first MLP layer (``fc1.weight``; both halves of a packed gated ``fc1``;
  ``fc1_g.weight`` and ``fc1_x.weight`` of a ``SwiGLU``).

A unit's score is the mean, over that unit's rows and input columns, of a per-weight quantity.

Reductions of the Fisher scorers (``g_b`` = gradient of batch ``b``'s mean loss):

- ``"squared_sum"`` (default): ``(mean per-sample gradient)^2``, accumulated as the sum of
  ``n_b * g_b`` over batches (+ the sample count) and squared once at the end. This is what the
  reference implementation that produced the paper's numbers computes (it sums ``.grad`` over
  all batches, then squares; ours differs by a constant factor, so every ranking is identical).
  Because the losses here are sums of per-sample terms, the result does not depend on how the
  samples are grouped into batches, nor on how they are split over processes: 2-process DDP
  gives the same scores as one process, up to float rounding.
- ``"fisher"``: the paper's empirical-Fisher formula, the mean over batches of ``g_b^2``
  (mini-batch gradients, not per-sample ones: per-sample gradients would cost a backward per
  image). It depends on the batch composition: other batch sizes, or DDP sharding, change it.
"""
from __future__ import annotations

import copy
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..device import autocast_context
from ..errors import DataError, UnsupportedModelError
from ..models.embedding import embed
from ..models.modes import eval_mode
from ..models.units import UnitGroup
from ..ranges import check_arguments, one_of
from .base import (
    LocalScores, NonFiniteGradientError, Rows, ScoringContext, ScoringError, SummedStatistics, grad_only,
    head_rows, model_device_dtype, neuron_rows, unit_count, unit_mean, unit_sum,
)

REDUCTIONS = ("squared_sum", "fisher")
Reduction = one_of(*REDUCTIONS)


def _upcast(x: Tensor) -> Tensor:
    """float16/bfloat16 (autocast) activations to float32 for the loss; float32/float64 unchanged."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def self_distillation_loss(student: Tensor, teacher: Tensor) -> Tensor:
    """DINO-style loss without projection heads or temperature, averaged over the batch.

    Embeddings are L2-normalised, then softmax-ed; each teacher view's distribution is matched
    (cross-entropy) to every student view except the same view, and the pair terms are summed.

    Args:
        student: ``[B, V, D]`` embeddings of all views.
        teacher: ``[B, G, D]`` embeddings of the first ``G <= V`` (global) views.
    """
    p_teacher = F.softmax(F.normalize(_upcast(teacher), dim=-1), dim=-1)
    log_p_student = F.log_softmax(F.normalize(_upcast(student), dim=-1), dim=-1)
    cross = -torch.einsum("bgd,bvd->bgv", p_teacher, log_p_student)  # [B, G, V]
    G, V = cross.shape[1:]
    other = ~torch.eye(G, V, dtype=torch.bool, device=cross.device)
    return cross[:, other].sum(dim=1).mean()


@dataclass
class _Group:
    """The rows of one block's heads or neurons, and where their weights sit in the grad list."""

    key: str
    block: int
    units: UnitGroup
    rows: list[Rows]
    param_index: list[int]


class GradientScorer(SummedStatistics):
    """Shared machinery of the gradient scorers; subclasses provide ``_loss``."""

    reduction: str = "squared_sum"

    def setup(self, model: nn.Module, context: Optional[ScoringContext] = None) -> None:
        super().setup(model, context)
        self._bind()
        self._acc_dtype = torch.promote_types(self._dtype, torch.float32)  # float64 models keep float64
        self._acc = self._init_accumulators()
        self._start_counting()

    def _bind(self) -> None:
        """Find the weights to differentiate (again after the model moved to another device)."""
        self._device, self._dtype = model_device_dtype(self.model)
        self._params: list[nn.Parameter] = []
        self._param_labels: list[str] = []
        self._groups: list[_Group] = []
        for block in self.blocks:
            for kind, units, rows in (("heads", block.heads, head_rows(block.heads, "v")),
                                      ("neurons", block.neurons, neuron_rows(block.neurons))):
                index = []
                for r in rows:
                    found = [i for i, p in enumerate(self._params) if p is r.weight]
                    if not found:
                        self._params.append(r.weight)
                        self._param_labels.append(f"block {block.index} {r.label}")
                    index.append(found[0] if found else len(self._params) - 1)
                self._groups.append(_Group(f"{block.index}.{kind}", block.index, units, rows, index))

    def _rebind(self) -> None:
        self._bind()

    # -- per batch -----------------------------------------------------------------------------
    def update(self, batch: Any) -> dict[str, float]:
        """Accumulate one batch (see the module docstring for the batch formats)."""
        images, labels = self._batch(batch)
        with eval_mode(self.model), grad_only(self.model, self._params):
            with autocast_context(self._device):  # bf16 on CUDA (fp32 weights and gradients); nothing on CPU
                loss, samples = self._loss(images, labels)
            grads = torch.autograd.grad(loss, self._params)
        loss_value = self._check_finite(loss, grads)
        self._batches += 1
        self._samples += samples
        with torch.no_grad():
            for group in self._groups:
                self._accumulate(group, [r.view(grads[i], group.units) for r, i in zip(group.rows, group.param_index)],
                                 samples)
        return {"loss": loss_value}

    @abstractmethod
    def _loss(self, images: Tensor, labels: Optional[Tensor]) -> tuple[Tensor, int]:
        """(mean loss over the batch's samples, number of samples)."""

    def _check_finite(self, loss: Tensor, grads: tuple[Tensor, ...]) -> float:
        """The loss as a float; one device sync for the loss and all the finiteness flags."""
        flags = torch.stack([g.isfinite().all() for g in grads] + [loss.detach().isfinite()])
        values = torch.cat([loss.detach().float().reshape(1), flags.float()]).tolist()
        loss_value, ok = values[0], values[1:]
        if all(ok):
            return loss_value
        where = next((self._param_labels[i] for i, flag in enumerate(ok[:-1]) if not flag), "the loss")
        raise NonFiniteGradientError(
            f"non-finite gradient in {where} (batch {self._batches + 1}, loss {loss_value:.4g}): check the input "
            "images for NaN/inf values and the model weights for non-finite entries; under float16, score in "
            "float32 or bfloat16"
        )

    # -- accumulators (additive, so that reduce = all-reduce-sum) ------------------------------
    @property
    def _sums_gradients(self) -> bool:
        """Accumulate the gradient itself (summed over samples), rather than a per-batch statistic of it."""
        return self.reduction in ("squared_sum", "snip")

    def _identity(self) -> dict[str, Any]:
        return {"scorer": self.name, "reduction": self.reduction}

    def _init_accumulators(self) -> dict[str, Tensor]:
        acc = {}
        for group in self._groups:
            if self._sums_gradients:
                for j, r in enumerate(group.rows):
                    acc[f"{group.key}.{j}"] = torch.zeros_like(r.view(r.weight, group.units), dtype=self._acc_dtype)
            else:
                acc[group.key] = torch.zeros(group.units.num_units, dtype=torch.float64, device=self._device)
        return acc

    def _accumulate(self, group: _Group, grads: list[Tensor], samples: int) -> None:
        if self._sums_gradients:
            for j, g in enumerate(grads):
                self._acc[f"{group.key}.{j}"].add_(g, alpha=samples)
        else:
            self._acc[group.key].add_(unit_sum([g.double().square() for g in grads]), alpha=1 / unit_count(grads))

    def _mean_gradients(self, group: _Group) -> list[Tensor]:
        """The mean per-sample gradient of each of the group's row views (``_sums_gradients`` reductions)."""
        return [self._acc[f"{group.key}.{j}"].double() / self._samples for j in range(len(group.rows))]

    def _finalize(self, group: _Group) -> Tensor:
        if self.reduction == "squared_sum":
            return unit_mean([g.square() for g in self._mean_gradients(group)])
        return self._acc[group.key] / self._batches

    def compute(self) -> LocalScores:
        self._require_bound()
        if self._batches == 0:
            raise DataError(f"{self.name} saw no batches: feed the scoring data through update() before compute()")
        with torch.no_grad():
            scores = {group.key: self._finalize(group).float().cpu() for group in self._groups}
        return LocalScores([scores[f"{b.index}.heads"] for b in self.blocks],
                           [scores[f"{b.index}.neurons"] for b in self.blocks])

    # -- resume --------------------------------------------------------------------------------
class _SelfDistillation:
    """DINO-style loss between the model (student, all views) and a frozen teacher (global views).

    The teacher's inputs are the first :attr:`global_views` views of each sample: ``n_global`` when given, else the
    data's global crops (``data.init_args.n_global_views``, the run's :class:`ScoringContext`:
    :func:`snapvit_pl.pipeline.prepare_pruning_data` reads them and refuses an ``n_global`` that differs), else
    :data:`snapvit_pl.data.transforms.N_GLOBAL_VIEWS`.
    """

    n_global: Optional[int]

    def _check_n_global(self) -> None:
        if self.n_global is not None and int(self.n_global) < 1:
            raise ScoringError(f"n_global must be >= 1, got {self.n_global}")

    @property
    def global_views(self) -> int:
        """The leading views of each multi-crop sample the teacher sees (see the class docstring)."""
        if self.n_global is not None:
            return int(self.n_global)
        given = getattr(getattr(self, "context", None), "global_views", None)
        if given is not None:
            return int(given)
        from ..data.transforms import N_GLOBAL_VIEWS  # (below this layer; imported when first needed)

        return N_GLOBAL_VIEWS

    def setup(self, model: nn.Module, context: Optional[ScoringContext] = None) -> None:
        super().setup(model, context)
        teacher = self.context.teacher
        self._own_teacher = teacher is None
        self.teacher = copy.deepcopy(model).requires_grad_(False).eval() if teacher is None else teacher

    def _loss(self, images: Tensor, labels: Optional[Tensor]) -> tuple[Tensor, int]:
        if images.dim() != 5 or images.shape[1] < 2:
            raise DataError(
                f"{self.name} needs multi-crop batches [B, V, C, H, W] with V >= 2 views, got {tuple(images.shape)}; "
                "use the multi-crop view transform (unlabeled_dataloader(views='multicrop'))"
            )
        B, V = images.shape[:2]
        G = self.global_views
        if V < G:
            raise DataError(f"{self.name}: batch has {V} views but n_global={G} global views are expected")
        teacher_device = next(self.teacher.parameters()).device
        with torch.no_grad(), eval_mode(self.teacher):
            target = embed(self.teacher, images[:, :G].flatten(0, 1).to(teacher_device))
        student = embed(self.model, images.flatten(0, 1)).view(B, V, -1)
        return self_distillation_loss(student, target.to(student.device).view(B, G, -1)), B


class SSLFisher(_SelfDistillation, GradientScorer):
    """SnapViT's local term: Fisher of the label-free self-distillation loss (SnapViT's scorer; the project's default is
    :class:`snapvit_pl.scoring.OutputSensitivity`).

    Args:
        n_global: leading views of each multi-crop sample that are global crops (teacher inputs); None (default):
            the DataModule's ``n_global_views``, handed over by the pipeline (2, the data's default, when used alone).
        reduction: ``"squared_sum"`` (default, reference implementation, batching- and
            DDP-invariant) or ``"fisher"`` (paper formula); see the module docstring.
    """

    name = "ssl_fisher"

    def __init__(self, n_global: Optional[int] = None, reduction: Reduction = "squared_sum"):
        check_arguments(SSLFisher.__init__, locals(), "importance.scorer.init_args", skip={"self"})
        self.n_global = n_global
        self.reduction = reduction
        self._check_n_global()


class LabelFisher(GradientScorer):
    """Fisher of the classification cross-entropy; needs labels and a classifier head.

    Multi-crop batches use every view, each with its sample's label.

    Args:
        reduction: as for :class:`SSLFisher`.
    """

    name = "label_fisher"
    requires_labels = True

    def __init__(self, reduction: Reduction = "squared_sum"):
        check_arguments(LabelFisher.__init__, locals(), "importance.scorer.init_args", skip={"self"})
        self.reduction = reduction

    def setup(self, model: nn.Module, context: Optional[ScoringContext] = None) -> None:
        if not getattr(model, "num_classes", 0):
            raise UnsupportedModelError(
                f"label_fisher needs a classifier head but {type(model).__name__} has num_classes=0; "
                "use a model with a head or a label-free scorer (ssl_fisher)"
            )
        super().setup(model, context)

    def _loss(self, images: Tensor, labels: Optional[Tensor]) -> tuple[Tensor, int]:
        if labels is None:
            raise DataError("label_fisher needs (images, labels) batches but got images only; "
                            "use a labeled dataloader or a label-free scorer (ssl_fisher)")
        B = images.shape[0]
        labels = labels.to(self._device).long().flatten()
        if labels.numel() != B:
            raise DataError(f"label_fisher needs one class label per image, got labels of shape {tuple(labels.shape)}")
        if images.dim() == 5:
            labels = labels.repeat_interleave(images.shape[1])
            images = images.flatten(0, 1)
        num_classes = self.model.num_classes
        if bool(((labels < 0) | (labels >= num_classes)).any()):
            raise DataError(f"label_fisher: labels must lie in [0, {num_classes}) for this classifier head")
        return F.cross_entropy(_upcast(self.model(images)), labels), B


class SNIPMagnitude(_SelfDistillation, GradientScorer):
    """SNIP-magnitude baseline on the self-distillation gradients: ``|g * w| + alpha * w^2``.

    As in the reference code, the saliency is evaluated once, from the gradient accumulated over
    all batches: ``g`` is the sum of the batch gradients, computed as the mean per-sample gradient
    times the number of batches one process makes of all the images, ``ceil(N / B)`` (so that
    ``alpha`` weighs the magnitude term as there). ``B`` is the data's batch size, handed over by
    the run (:class:`ScoringContext` ``batch_size``), else the largest batch seen. Each weight's saliency is
    averaged over the unit's rows (the same rows as :class:`SSLFisher`). The result depends
    neither on the order of the batches nor on how DDP processes share them.

    Args:
        n_global: as for :class:`SSLFisher`.
        alpha: weight of the magnitude term.
    """

    name = "snip_magnitude"
    reduction = "snip"

    def __init__(self, n_global: Optional[int] = None, alpha: float = 0.001):
        self.n_global = n_global
        self.alpha = alpha
        self._check_n_global()

    def _start_counting(self) -> None:
        self._largest_batch = 0
        super()._start_counting()

    def update(self, batch: Any) -> dict[str, float]:
        before = self._samples
        result = super().update(batch)
        self._largest_batch = max(self._largest_batch, self._samples - before)
        return result

    def _finalize(self, group: _Group) -> Tensor:
        weights = [r.view(r.weight.detach(), group.units).double() for r in group.rows]
        size = self.context.batch_size or self._largest_batch
        batches = -(-self._samples // size) if size else self._batches  # ceil(N / B): one process's batch count
        grads = [g * batches for g in self._mean_gradients(group)]
        return unit_mean([(g * w).abs() + self.alpha * w.square() for g, w in zip(grads, weights)])

