"""The Gauss-Newton greedy: a nested removal order from the Gram matrix of the per-sample mask gradients.

Removing a *set* S of units drifts the L2-normalised embedding by, to second order, ``1/2 * 1_S^T G 1_S`` with
``G = E_n[g_n g_n^T]`` the Gram matrix over all units (heads and MLP neurons of every block) of the per-sample
mask gradients ``g_n`` (:class:`snapvit_pl.scoring.OutputSensitivity`'s, one row per sample and probe). Units whose
contributions overlap cost more together than apart, units whose contributions cancel cost less: the cross-block
interactions that SnapViT searches for with an evolution strategy, computed instead. The greedy
(:func:`snapvit_pl.scoring.gram.greedy_order`) removes the units that add least drift per parameter,
``(G_uu + 2 w sum_{v in S} G_uv) / params_u``; the interaction terms are shrunk by ``w`` (:data:`DEFAULT_CROSS_WEIGHT`),
since their estimate from N images x K probes is noisy and the second-order model is least accurate at deep cuts.

**Stages** (re-linearisation). The model above is taken at the dense network and grows wrong as the cut deepens.
With ``stages`` S > 1 the order is built in S passes over the pruning images: each pass takes the Gram (and the
gradient) at the sub-network the order has reached so far, and the greedy continues from there among the units still
present, for the next ``1/S`` of the removable units. The order stays one nested order (every budget is still one
cut of it); each stage costs one more importance pass. At a sub-network the drift's first-order term no longer
vanishes: the increment of unit ``u`` is ``(-2 b_u + G_uu + 2 w sum_S G_uv) / params_u`` with ``b_u = E_n[g_nu .
(f_n - t_n)]`` (``f_n`` the sub-network's normalised embedding, ``t_n`` the dense one's).

**Correction-aware** (``correction_aware``). When the SparseGPT-style correction follows the cut, the layer that
consumes a removed unit (``mlp.fc2`` for a neuron, ``attn.proj`` for a head) is refitted by least squares on the units
it keeps; what of the unit's contribution it cannot rebuild is, by the OBS algebra, the share ``rho_u = 1 / (H_uu
[H^-1]_uu)`` of the uncorrected error for a neuron (``H`` the layer's input second moments over the units present,
damped as the correction damps it) and ``tr(W_h ([H^-1]_hh)^-1 W_h^T) / tr(W_h H_hh W_h^T)`` for a head. The greedy
then orders the Gram scaled by ``sqrt(rho)`` on both sides (and the first-order term by ``sqrt(rho)``), so that the
units the correction can compensate go first. ``rho`` is taken at each stage's sub-network.

Every accumulator is a sum over samples, so DDP shards reduce to the single-process result (up to float rounding).
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..device import autocast_context
from ..errors import ConfigError, DataError
from ..models.embedding import embed
from ..models.modes import eval_mode
from ..models.units import iter_slots, min_kept
from ..ranges import ClosedUnitInterval, NonNegativeInt, PositiveInt, Seed, check_arguments, one_of
from ..seeding import resolve_seed
from .activation import output_layer
from .base import LocalScores, ScoringContext, ScoringError, SummedStatistics, grad_only, model_device_dtype
from .gram import (
    DEFAULT_RANK, GREEDY_STEPS, BlockRowGram, Gram, LowRankGram, greedy_order, resolve_gram,
)
from .sensitivity import DEFAULT_PROBES, gaussian_probes, probe_seeds, probe_vjps, unit_masks

#: the weight of the interaction terms in the greedy's increments: the Gram's off-diagonal part is estimated from
#: N images x K probes and the second-order model is least accurate at deep cuts, so the greedy shrinks it halfway
#: towards each unit's own drift (chosen on the development models: docs/method.md, "How the defaults were chosen")
DEFAULT_CROSS_WEIGHT = 0.5
#: the damping of the layer input second moments of ``correction_aware`` (a share of their mean diagonal): the
#: correction's own (:data:`snapvit_pl.correction.sparsegpt.DAMP_FRACTION`)
CORRECTION_DAMPING = 0.01
PRECISIONS = ("auto", "bf16", "32")
ScorerPrecision = one_of(*PRECISIONS)


class GaussNewtonGreedy(SummedStatistics):
    """A nested removal order from the Gauss-Newton model of the embedding drift over all units (label-free).

    :class:`OutputSensitivity` scores each unit by its own drift, as if units were removed one at a time; this
    scorer accumulates the Gram of the per-sample mask gradients over all units (random probes as
    :class:`OutputSensitivity`) and removes units greedily, each time those that add least drift per parameter,
    heads and neurons competing, never more of a block than its minimum keep ratios allow (see the module
    docstring). The scores are the removal order, scaled to (0, 1] (the first removed scores lowest; the units no
    block may lose come last): every budget is one cut of one ranking per kind, with no block coefficients.

    The share of each block the greedy never removes is the run's (``importance.min_mlp_keep`` / ``min_head_keep``,
    in the :class:`~snapvit_pl.scoring.base.ScoringContext` it is bound with); a scorer bound without one protects
    :data:`snapvit_pl.models.units.MIN_MLP_KEEP` / ``MIN_HEAD_KEEP``, as the ranking does by default.

    Args:
        probes: random Gaussian probes per sample (0: exact, one backward pass per embedding dimension).
        gram: ``"auto"``, ``"full"``, ``"block"`` or ``"lowrank"`` (:mod:`snapvit_pl.scoring.gram`).
        rank: the Nystrom rank of ``"lowrank"``.
        cross_weight: the weight of the interaction terms in the greedy's increments (1: the Gauss-Newton model as
            estimated; 0: each unit's own drift per parameter, no interactions; default :data:`DEFAULT_CROSS_WEIGHT`).
        max_steps: the greedy's steps at most over the whole order (above it, several units per step).
        stages: passes over the pruning images, each re-linearising at the sub-network reached (module docstring).
        correction_aware: order for the SparseGPT-style correction that follows the cut (module docstring).
        precision: of the pass's forward and backward passes: ``auto`` (bf16 autocast on CUDA, fp32 elsewhere;
            :func:`snapvit_pl.device.autocast_context`), ``bf16`` or ``32``; the Gram is summed in fp32 or wider.
        seed: seed of the probes and of the Nystrom test matrix; None: prune.py's ``seed_everything`` (0 from
            Python).
    """

    name = "gn_greedy"
    requires_labels = False
    views = "plain"

    def __init__(self, probes: NonNegativeInt = DEFAULT_PROBES, gram: Gram = "auto", rank: PositiveInt = DEFAULT_RANK,
                 cross_weight: ClosedUnitInterval = DEFAULT_CROSS_WEIGHT, max_steps: PositiveInt = GREEDY_STEPS,
                 stages: PositiveInt = 1, correction_aware: bool = False, precision: ScorerPrecision = "auto",
                 seed: Optional[Seed] = None):
        check_arguments(GaussNewtonGreedy.__init__, locals(), "importance.scorer.init_args", skip={"self"})
        self.probes, self.seed = int(probes), resolve_seed(seed)
        self.gram, self.rank, self.max_steps = gram, int(rank), int(max_steps)
        self.cross_weight = float(cross_weight)
        self.stages, self.correction_aware = int(stages), bool(correction_aware)
        self.precision = precision
        #: ``(form, why)`` after :meth:`setup`: the Gram form used (``auto`` resolved on the model's device)
        self.resolved: Optional[tuple[str, str]] = None

    def _probe_scale(self) -> int:
        return 1 if self.probes == 0 else self.probes

    @property
    def passes(self) -> int:
        """Passes over the pruning images: one per stage."""
        return self.stages

    def choices(self) -> dict[str, Any]:
        """``{"gram_used": form, "gram_why": why}`` after :meth:`setup`."""
        return {} if self.resolved is None else {"gram_used": self.resolved[0], "gram_why": self.resolved[1]}

    # -- the pass ----------------------------------------------------------------------------------------------
    def setup(self, model: nn.Module, context: Optional[ScoringContext] = None) -> None:
        super().setup(model, context)
        self._device, self._dtype = model_device_dtype(model)
        self._groups = [(f"{b.index}.{kind}", kind, getattr(b, kind)) for b in self.blocks for kind in ("heads", "neurons")]
        for key, kind, group in self._groups:
            output_layer(group, kind)
        sizes = [b.heads.num_units + b.neurons.num_units for b in self.blocks]
        self._acc_dtype = torch.promote_types(self._dtype, torch.float32)
        self.resolved = resolve_gram(self.gram, sizes, self._device, self._acc_dtype)
        form = self.resolved[0]
        if form == "lowrank" and self.rank > sum(sizes):
            # the sketch holds units x rank numbers: a rank above the units costs that memory and adds nothing (the
            # full Gram is rank sum(sizes) at most)
            raise ConfigError(f"{self.name}(rank={self.rank}): this model has {sum(sizes)} units, so a Nystrom rank "
                              f"above {sum(sizes)} adds nothing but memory ({sum(sizes) * self.rank * 4 / 2**30:.1f} "
                              "GiB for its sketch); lower rank, or use gram: full")
        self._gram = LowRankGram(sizes, self.rank, self.seed) if form == "lowrank" else BlockRowGram(sizes, form == "full")
        self._gram.maps(self._device)  # the index maps the order and the per-batch log read, built once
        # the units in the Gram's order (block by block: heads, then neurons): group, parameters, what each may lose
        counts = [g.num_units for _, _, g in self._groups]
        self._unit_group = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
        keep = [min_kept(g.num_units, self.context.min_head_keep if kind == "heads" else self.context.min_mlp_keep)
                for _, kind, g in self._groups]
        self._removable = torch.tensor([n - k for n, k in zip(counts, keep)])
        self._count = int(self._removable.sum())
        if self.stages > max(self._count, 1):  # each stage re-linearises after a share of the removable units
            raise ConfigError(f"{self.name}(stages={self.stages}): this model has {self._count} units the keep ratios let "
                              f"it remove, so at most {max(self._count, 1)} stages (each one pass over the pruning "
                              "images; 1 to 3 is what was measured, docs/method.md); lower stages")
        self._per_step = max(1, math.ceil(self._count / self.max_steps))
        self._left = self._removable.clone()
        self._alive = torch.ones(sum(counts), dtype=torch.bool)
        self._alive_mask: Optional[Tensor] = None  # _alive on the device, as the masks read it (made once per stage)
        self._order: list[Tensor] = []  # the units removed by the stages done, in order
        self._stage = 0
        self._acc = self._new_accumulators()
        self._start_counting()

    def _new_accumulators(self) -> dict[str, Tensor]:
        acc = self._gram.zeros(self._acc_dtype, self._device)
        if self._stage > 0:  # the first-order term, zero at the dense network
            acc["linear"] = torch.zeros(self._gram.units, dtype=torch.float64, device=self._device)
        if self.correction_aware:  # the second moments of each output layer's input
            for key, kind, group in self._groups:
                width = output_layer(group, kind).in_features
                acc[f"inputs.{key}"] = torch.zeros(width, width, dtype=self._acc_dtype, device=self._device)
        return acc

    def _masks(self, samples: int) -> dict[str, Tensor]:
        """Per group ``[samples, units]``: 1 for the units present, 0 for those the stages done removed."""
        if self._alive_mask is None:  # once per stage: the units present, on the device
            self._alive_mask = self._alive.to(self._device, torch.float32)
        alive = self._alive_mask.split([g.num_units for _, _, g in self._groups])
        return {key: a.expand(samples, -1).clone().requires_grad_(True) for (key, _, _), a in zip(self._groups, alive)}

    def update(self, batch: Any) -> dict[str, float]:
        images, _ = self._batch(batch)
        if images.dim() == 5:
            images = images.flatten(0, 1)
        with eval_mode(self.model), grad_only(self.model, []):
            rows, linear = self._gradients(images)
            finite = torch.isfinite(rows).all() & (True if linear is None else torch.isfinite(linear).all())
            self._gram.accumulate(self._acc, rows)
            if linear is not None:
                self._acc["linear"] += linear
        self._batches += 1
        self._samples += images.shape[0]
        self._note_finite(finite)
        head, neuron = self._drift_so_far()  # 0-d tensors on the device: read when shown (no sync per batch)
        return {"drift_per_head": head, "drift_per_neuron": neuron}

    def _gradients(self, images: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        """The probes' mask-gradient rows ``[K n, U]`` at this stage's sub-network and, after the first stage, the
        first-order term ``sum_n g_n^T (f_n - t_n)`` ``[U]`` (``t_n``: the dense model's normalised embedding)."""
        n = images.shape[0]
        target = None
        if self._stage > 0:
            with torch.no_grad(), autocast_context(self._device, self.precision):
                target = F.normalize(embed(self.model, images).float(), dim=-1)
        masks = self._masks(n)
        observe = self._observe if self.correction_aware else None
        with torch.inference_mode(False), torch.enable_grad(), unit_masks(self._groups, masks, observe=observe), \
                autocast_context(self._device, self.precision):
            out = F.normalize(embed(self.model, images).float(), dim=-1)
            leaves = [masks[key] for key, _, _ in self._groups]
            linear = None
            if target is not None:
                grads = torch.autograd.grad(out, leaves, grad_outputs=(out - target).detach(), retain_graph=True)
                linear = torch.cat([g.double().sum(dim=0) for g in grads])
            if self.probes == 0:
                probes = torch.eye(out.shape[1], device=out.device)[:, None, :].expand(-1, n, -1)
            else:
                probes = gaussian_probes(probe_seeds(images, self.seed), self.probes, out.shape[1])
            rows = torch.cat([torch.cat(g, dim=1) for g in probe_vjps(out, leaves, probes, out.device.type != "cpu")])
        return rows, linear

    def _observe(self, key: str, inputs: Tensor) -> None:
        """Accumulate an output layer's input second moments (``correction_aware``), over every token."""
        x = inputs.detach().reshape(-1, inputs.shape[-1]).to(self._acc_dtype)
        self._acc[f"inputs.{key}"].addmm_(x.T, x)

    def _drift_so_far(self) -> Tensor:
        """What the Gram's diagonal estimates so far, to log per batch (as :class:`OutputSensitivity` logs it): the
        mean second-order drift of the embedding when one head (``drift_per_head``) or one MLP neuron
        (``drift_per_neuron``) is removed alone, averaged over each block's units, then over the blocks
        (``[2]`` float64, on the device)."""
        per_group = self._gram.diagonal(self._acc).split([g.num_units for _, _, g in self._groups])
        means = torch.stack([d.mean() for d in per_group]).view(-1, 2).mean(dim=0)  # (heads, neurons)
        return (means / (2 * self._samples * self._probe_scale())).to(torch.float64)

    # -- the order ---------------------------------------------------------------------------------------------
    def _unit_params(self) -> Tensor:
        costs = []
        for _, _, group in self._groups:
            owned = sum(t.numel() for _, t in iter_slots(group) if isinstance(t, nn.Parameter))
            costs.append(torch.full((group.num_units,), owned / group.num_units, dtype=torch.float64))
        return torch.cat(costs)

    def next_pass(self) -> None:
        """End a stage (after :meth:`reduce`): the greedy on this stage's Gram removes its share of the units; the
        accumulators start again for the next pass, at the sub-network reached."""
        self._require_bound()
        if self._stage + 1 >= self.stages:
            raise ScoringError(f"{self.name}: all {self.stages} stages are done; compute() gives the scores")
        target = round(self._stage_end(self._stage) * self._count)
        self._remove(target - sum(len(o) for o in self._order))
        self._stage += 1
        self._acc = self._new_accumulators()
        self._batches, self._samples = 0, 0

    def _stage_end(self, stage: int) -> float:
        """The share of the removable units removed when stage ``stage`` (0-based, not the last) ends: equal shares."""
        return (stage + 1) / self.stages

    def _remove(self, count: int) -> None:
        """The greedy on the accumulated statistics removes ``count`` units among those present."""
        self._check_finite_batches()
        if self._samples == 0:
            raise DataError(f"{self.name} saw no batches: feed the scoring data through update() before compute()")
        offset = None
        if "linear" in self._acc:  # in the Gram's units (a sum over samples and probes): -2 K b
            offset = -2 * self._probe_scale() * self._acc["linear"]
        if self.correction_aware:
            scale = self._compensation().sqrt()
            self._gram.scale_(self._acc, scale)
            offset = None if offset is None else offset * scale
        cost = self._unit_params()
        order = greedy_order(self._gram, self._acc, cost, self._unit_group, self._left, count, self._per_step,
                             self.cross_weight, alive=self._alive, offset=offset).cpu()
        self._order.append(order)
        self._alive[order] = False
        self._alive_mask = None
        self._left -= torch.bincount(self._unit_group[order], minlength=len(self._left))

    @torch.no_grad()
    def compute(self) -> LocalScores:
        self._require_bound()
        if self._stage + 1 < self.stages:
            raise ScoringError(f"{self.name}: stage {self._stage + 1} of {self.stages} is running; next_pass() "
                               "first (one pass over the pruning images per stage)")
        self._remove(self._count - sum(len(o) for o in self._order))
        removed = torch.cat(self._order)
        # the units no group may lose come last, by their last stage's diagonal
        diag = self._gram.diagonal(self._acc).double().cpu()
        rest = torch.argsort(torch.where(self._alive, diag, torch.inf), stable=True)[:int(self._alive.sum())]
        position = torch.empty(len(diag), dtype=torch.float64)
        position[torch.cat([removed, rest])] = torch.arange(1, len(diag) + 1, dtype=torch.float64)
        scores = (position / position.numel()).float()
        parts = scores.split([g.num_units for _, _, g in self._groups])
        return LocalScores(list(parts[0::2]), list(parts[1::2]))

    # -- correction awareness ----------------------------------------------------------------------------------
    def _compensation(self) -> Tensor:
        """Per unit ``[U]``, the share of its removal's error in its output layer that the least-squares correction
        cannot rebuild from the units present (1 for the units already removed); see the module docstring."""
        shares = []
        alive = self._alive.split([g.num_units for _, _, g in self._groups])
        for (key, kind, group), present in zip(self._groups, alive):
            inputs = self._acc[f"inputs.{key}"].double()
            shares.append(_unrebuilt_share(inputs, output_layer(group, kind).weight.detach().double(),
                                           present.to(inputs.device), group.unit_size).cpu())
        return torch.cat(shares).to(self._device)


def _unrebuilt_share(inputs: Tensor, weight: Tensor, present: Tensor, unit_size: int) -> Tensor:
    """OBS: removing unit ``u`` (``unit_size`` input columns ``Q`` of ``weight``) with the optimal update of the
    other present columns leaves ``tr(W_Q ([H^-1]_QQ)^-1 W_Q^T)`` of the error ``tr(W_Q H_QQ W_Q^T)`` it leaves
    uncorrected (``H``: the damped input second moments over the present units' columns). Returns that ratio per
    unit (1 for the absent ones)."""
    units = present.numel()
    columns = present.repeat_interleave(unit_size)
    index = columns.nonzero().flatten()  # once per stage, not per step
    share = torch.ones(units, dtype=torch.float64, device=inputs.device)
    if index.numel() == 0:
        return share
    h = inputs[index][:, index]
    h = h + CORRECTION_DAMPING * h.diagonal().mean().clamp_min(1e-12) * torch.eye(len(index), dtype=h.dtype,
                                                                                device=h.device)
    inverse = torch.cholesky_inverse(torch.linalg.cholesky(h))
    kept = present.nonzero().flatten()
    k = len(kept)
    blocks = torch.arange(k * unit_size, device=h.device).view(k, unit_size)
    inv_blocks = inverse[blocks[:, :, None], blocks[:, None, :]]  # [k, s, s]
    h_blocks = h[blocks[:, :, None], blocks[:, None, :]]
    w = weight[:, index].T.reshape(k, unit_size, -1)  # [k, s, out]: each unit's columns
    outer = w @ w.transpose(1, 2)  # [k, s, s]: tr(W_Q M W_Q^T) = sum(M * W_Q^T W_Q)
    corrected = (torch.linalg.inv(inv_blocks) * outer).sum(dim=(1, 2))
    uncorrected = (h_blocks * outer).sum(dim=(1, 2))
    share[kept] = (corrected / uncorrected.clamp_min(1e-30)).clamp(0.0, 1.0)
    return share
