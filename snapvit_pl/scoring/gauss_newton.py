"""The Gauss-Newton greedy: a nested removal order from the Gram matrix of the per-sample mask gradients.

Removing a *set* S of units drifts the L2-normalised embedding by, to second order, ``1/2 * 1_S^T G 1_S`` with
``G = E_n[g_n g_n^T]`` the Gram matrix over all units (heads and MLP neurons of every block) of the per-sample
mask gradients ``g_n`` (:class:`snapvit_pl.scoring.OutputSensitivity`'s, one row per sample and probe). Units whose
contributions overlap cost more together than apart, units whose contributions cancel cost less: the cross-block
interactions that SnapViT searches for with an evolution strategy, computed instead. The greedy removes the unit
that adds least drift per parameter, ``(G_uu + 2 w sum_{v in S} G_uv) / params_u``, one step at a time; the
interaction terms are shrunk by ``w`` (:data:`DEFAULT_CROSS_WEIGHT`), since their estimate from N images x K probes
is noisy and the second-order model is least accurate at deep cuts.

How ``G`` is held (``gram``):

- ``full``: exactly, as the upper block triangle (block ``i``'s rows, the columns of blocks ``i..B-1``): half
  of the ``U^2`` entries (ViT-B/16, ``U = 37,008``: 2.9 GB in fp32);
- ``block``: each block's own heads-and-neurons Gram only (the cross-block terms dropped);
- ``lowrank``: each block's own Gram exactly, and the cross-block terms from a rank-``r`` Nystrom approximation
  ``G ~ Y (Omega^T Y)^+ Y^T`` of the whole Gram, ``Y = G Omega`` streamed with a fixed Gaussian ``Omega``
  ``[U, r]`` (Tropp et al. 2017, "Fixed-rank approximation of a positive-semidefinite matrix from streaming
  data"): ``U r`` entries, for models whose full Gram does not fit;
- ``auto`` (default): ``full`` where it fits (:data:`FULL_GRAM_CPU_BYTES` on a CPU, a share
  :data:`FULL_GRAM_DEVICE_SHARE` of an accelerator's memory), else ``lowrank``; :attr:`GaussNewtonGreedy.resolved`
  says which and why.

Every accumulator is a sum over samples, so DDP shards reduce to the single-process result (up to float
rounding). Above :data:`GREEDY_STEPS` removable units the greedy removes a few units per step (the lowest
``ceil(removable / steps)`` increments): the order of a ViT-B/16 costs seconds, not the 35,000 serial steps.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Literal, Optional

import torch
from torch import Tensor, nn

from ..errors import DataError
from ..models.modes import eval_mode
from ..models.units import MIN_HEAD_KEEP, MIN_MLP_KEEP, iter_slots, min_kept
from ..ranges import ClosedUnitInterval, NonNegativeInt, PositiveInt, Seed, check_arguments
from .activation import output_layer
from .base import LocalScores, Scorer, ScoringError, grad_only, model_device_dtype, split_batch, to_model
from .sensitivity import DEFAULT_PROBES, OutputSensitivity

Gram = Literal["auto", "full", "block", "lowrank"]
GRAMS = ("auto", "full", "block", "lowrank")
#: ``gram="auto"`` keeps the full Gram on a CPU up to this size (bytes of the upper block triangle)
FULL_GRAM_CPU_BYTES = 4 * 2 ** 30
#: ... and on an accelerator up to this share of its memory
FULL_GRAM_DEVICE_SHARE = 0.5
#: the greedy's steps at most: above it, several units are removed per step
GREEDY_STEPS = 4096
#: the Nystrom rank of ``gram="lowrank"``
DEFAULT_RANK = 512
#: the weight of the interaction terms in the greedy's increments: the Gram's off-diagonal part is estimated from
#: N images x K probes and the second-order model is least accurate at deep cuts, so the greedy shrinks it halfway
#: towards each unit's own drift (chosen on the development models: docs/method.md, "How the defaults were chosen")
DEFAULT_CROSS_WEIGHT = 0.5


def full_gram_bytes(block_sizes: list[int], dtype: torch.dtype = torch.float32) -> int:
    """Bytes of the full Gram's upper block triangle for blocks of ``block_sizes`` units."""
    total = sum(block_sizes)
    entries, done = 0, 0
    for size in block_sizes:
        entries += size * (total - done)
        done += size
    return entries * torch.tensor([], dtype=dtype).element_size()


def resolve_gram(gram: str, block_sizes: list[int], device: torch.device, dtype: torch.dtype) -> tuple[str, str]:
    """``(form, why)``: the Gram form ``gram`` means on ``device`` (``auto``: ``full`` where it fits, else
    ``lowrank``)."""
    if gram != "auto":
        return gram, "as configured"
    need = full_gram_bytes(block_sizes, dtype)
    if device.type == "cuda":
        budget = FULL_GRAM_DEVICE_SHARE * torch.cuda.get_device_properties(device).total_memory
        where = f"{FULL_GRAM_DEVICE_SHARE:.0%} of the {device} memory"
    else:
        budget, where = FULL_GRAM_CPU_BYTES, f"the {FULL_GRAM_CPU_BYTES / 2 ** 30:.0f} GiB allowed on {device.type}"
    form = "full" if need <= budget else "lowrank"
    return form, f"auto: the full Gram takes {need / 2 ** 30:.2f} GiB, {'within' if form == 'full' else 'over'} {where}"


class BlockRowGram:
    """The layout of a Gram held as one block row per block: block ``i``'s rows, the columns of blocks ``i..B-1``
    (``cross_block``: the upper block triangle of the full Gram) or of block ``i`` only. The accumulators live in
    a ``state`` dict of tensors that the caller owns (reduced, saved and moved as it is).

    Args:
        sizes: units per block.
        cross_block: keep the cross-block terms.
    """

    def __init__(self, sizes: list[int], cross_block: bool):
        self.sizes, self.cross_block = list(sizes), cross_block
        self.offsets = [0]
        for n in sizes:
            self.offsets.append(self.offsets[-1] + n)

    def zeros(self, dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
        total = self.offsets[-1]
        return {f"gram.{i}": torch.zeros(n, total - self.offsets[i] if self.cross_block else n, dtype=dtype,
                                         device=device) for i, n in enumerate(self.sizes)}

    def accumulate(self, state: dict[str, Tensor], g: Tensor) -> None:
        """Add ``g^T g`` for gradient rows ``g`` ``[rows, U]``."""
        for i, (lo, hi) in enumerate(zip(self.offsets, self.offsets[1:])):
            acc = state[f"gram.{i}"]
            acc.addmm_(g[:, lo:hi].T.to(acc.dtype), g[:, lo:lo + acc.shape[1]].to(acc.dtype))

    def diagonal(self, state: dict[str, Tensor]) -> Tensor:
        return torch.cat([state[f"gram.{i}"].diagonal() for i in range(len(self.sizes))])

    def row_adder(self, state: dict[str, Tensor]) -> Callable[[Tensor, Tensor, Tensor], None]:
        """``add(cross, units, block)``: ``cross += sum_{u in units} G[u]`` (``block``: each unit's block)."""
        return lambda cross, units, block: self._add_rows(state, cross, units, block)

    def _add_rows(self, state: dict[str, Tensor], cross: Tensor, units: Tensor, block: Tensor) -> None:
        for i, (lo, hi) in enumerate(zip(self.offsets, self.offsets[1:])):
            acc = state[f"gram.{i}"]
            own = units[block == i] - lo
            if len(own):  # the units' rows of block row i: columns lo .. lo + width
                cross[lo:lo + acc.shape[1]] += acc.index_select(0, own).sum(dim=0)
            if self.cross_block:  # units of later blocks: their columns in block row i are G[block i, u]
                later = units[block > i] - lo
                if len(later):
                    cross[lo:hi] += acc.index_select(1, later).sum(dim=1)


class LowRankGram(BlockRowGram):
    """Each block's own Gram exactly (a :class:`BlockRowGram` without cross-block terms) and the cross-block terms
    of a rank-``rank`` Nystrom approximation of the whole Gram: ``F F^T`` with ``F = Y C^{+1/2}``, ``Y = G Omega``
    (the ``sketch`` accumulator), ``C = Omega^T Y``.

    Args:
        sizes: units per block.
        rank: columns of the Gaussian test matrix ``Omega`` (seeded by ``seed`` and drawn on the CPU: the same on
            every process and device).
    """

    def __init__(self, sizes: list[int], rank: int, seed: int):
        super().__init__(sizes, cross_block=False)
        self.rank, self.seed = rank, seed
        self._omega: Optional[Tensor] = None

    def zeros(self, dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
        return {**super().zeros(dtype, device), "sketch": torch.zeros(self.offsets[-1], self.rank, dtype=dtype,
                                                                      device=device)}

    def omega(self, like: Tensor) -> Tensor:
        if self._omega is None:
            generator = torch.Generator().manual_seed(self.seed)
            self._omega = torch.randn(self.offsets[-1], self.rank, generator=generator, dtype=torch.float64)
        if self._omega.device != like.device or self._omega.dtype != like.dtype:
            self._omega = self._omega.to(device=like.device, dtype=like.dtype)
        return self._omega

    def accumulate(self, state: dict[str, Tensor], g: Tensor) -> None:
        super().accumulate(state, g)
        sketch = state["sketch"]
        g = g.to(sketch.dtype)
        sketch.addmm_(g.T, g @ self.omega(sketch))

    def factor(self, state: dict[str, Tensor]) -> Tensor:
        """``F`` ``[U, r']``, ``F F^T`` the Nystrom approximation (eigenvalues of ``C`` below ``1e-10`` of the
        largest dropped); computed in float64, kept in the accumulators' dtype."""
        sketch = state["sketch"]
        y, omega = sketch.double(), self.omega(sketch).double()
        core = omega.T @ y
        values, vectors = torch.linalg.eigh((core + core.T) / 2)
        kept = values > values.max().clamp_min(0) * 1e-10
        return (y @ (vectors[:, kept] / values[kept].sqrt())).to(sketch.dtype)

    def row_adder(self, state: dict[str, Tensor]) -> Callable[[Tensor, Tensor, Tensor], None]:
        factor = self.factor(state)

        def add(cross: Tensor, units: Tensor, block: Tensor) -> None:
            self._add_rows(state, cross, units, block)
            self._add_low_rank(factor, cross, units, block)
        return add

    def _add_low_rank(self, factor: Tensor, cross: Tensor, units: Tensor, block: Tensor) -> None:
        added = factor.index_select(0, units)  # the chunk's rows of F
        off = factor @ added.sum(dim=0)  # every unit's approximated G row-sum over the chunk ...
        for i, (lo, hi) in enumerate(zip(self.offsets, self.offsets[1:])):
            own = added[block == i]
            if len(own):  # ... less the terms within a block, which the exact block Grams hold
                off[lo:hi] -= factor[lo:hi] @ own.sum(dim=0)
        cross += off.to(cross.dtype)


def greedy_positions(gram: BlockRowGram, state: dict[str, Tensor], cost: Tensor, group: Tensor, removable: Tensor,
                     max_steps: int = GREEDY_STEPS, cross_weight: float = 1.0) -> Tensor:
    """Removal position (1-based, float64, CPU) of every unit: the greedy order under ``gram``.

    Each step removes the units with the lowest drift increment per parameter ``(G_uu + 2 sum_{v in S} G_uv) /
    cost_u`` (``ceil(removable / max_steps)`` of them, at most ``removable[group]`` of any unit group); the units
    no group may lose come last, by their diagonal ``G_uu``.

    Args:
        gram: the Gram's layout (:class:`BlockRowGram` or :class:`LowRankGram`).
        state: its accumulators.
        cost: parameters per unit ``[U]``.
        group: each unit's group (head or neuron group of a block, ``2 * block + kind``) ``[U]``.
        removable: units each group may lose ``[groups]``.
        max_steps: steps at most.
        cross_weight: the weight of the interaction terms ``sum_{v in S} G_uv`` (1: the Gauss-Newton model; 0: each
            unit's own drift per parameter).
    """
    diag, add_rows = gram.diagonal(state), gram.row_adder(state)
    device, dtype = diag.device, diag.dtype
    total = diag.numel()
    group, removable, cost = group.to(device), removable.clone().to(device), cost.to(device=device, dtype=dtype)
    block = group // 2
    per_step = max(1, math.ceil(int(removable.sum()) / max_steps))
    cross = torch.zeros(total, dtype=dtype, device=device)
    alive = torch.ones(total, dtype=torch.bool, device=device)
    position = torch.zeros(total, dtype=torch.float64)
    inf = torch.tensor(float("inf"), dtype=dtype, device=device)
    done = 0
    while int(removable.sum()) > 0:
        delta = torch.where(alive & (removable[group] > 0), (diag + 2 * cross_weight * cross) / cost, inf)
        if per_step == 1:
            chunk = torch.argmin(delta).view(1)
        else:
            order = torch.argsort(delta, stable=True)
            order = order[torch.isfinite(delta[order])]
            groups = group[order]
            # each candidate's rank within its group (in increment order): a stable sort by group keeps that order
            by_group = torch.argsort(groups, stable=True)
            counts = torch.bincount(groups, minlength=len(removable))
            rank = torch.empty_like(order)
            rank[by_group] = torch.arange(len(order), device=device) - (counts.cumsum(0) - counts)[groups[by_group]]
            chunk = order[rank < removable[groups]][:per_step]
        position[chunk.cpu()] = torch.arange(done + 1, done + len(chunk) + 1, dtype=torch.float64)
        done += len(chunk)
        alive[chunk] = False
        removable -= torch.bincount(group[chunk], minlength=len(removable))
        add_rows(cross, chunk, block[chunk])
    rest = alive.nonzero().flatten().cpu()
    rest = rest[torch.argsort(diag.double().cpu()[rest], stable=True)]
    position[rest] = torch.arange(len(rest), dtype=torch.float64) + done + 1
    return position


class GaussNewtonGreedy(OutputSensitivity):
    """A nested removal order from the Gauss-Newton model of the embedding drift over all units (label-free).

    :class:`OutputSensitivity` scores each unit by its own drift, as if units were removed one at a time; this
    scorer accumulates the Gram of the per-sample mask gradients over all units (random probes as
    :class:`OutputSensitivity`) and removes units greedily, each time the one that adds least drift per parameter,
    heads and neurons competing, never more of a block than its minimum keep ratios allow (see the module
    docstring). The scores are the removal order, scaled to (0, 1] (the first removed scores lowest; the units no
    block may lose come last): every budget is one cut of one ranking per kind, with no block coefficients.

    The share of each block the greedy never removes is the importance settings' (``importance.min_mlp_keep`` /
    ``min_head_keep``, handed over through :meth:`use_keep_ratios`); a scorer used alone protects
    :data:`snapvit_pl.models.units.MIN_MLP_KEEP` / ``MIN_HEAD_KEEP``, as the ranking does by default.

    Args:
        probes: random Gaussian probes per sample (0: exact, one backward pass per embedding dimension).
        gram: ``"auto"``, ``"full"``, ``"block"`` or ``"lowrank"`` (module docstring).
        rank: the Nystrom rank of ``"lowrank"``.
        cross_weight: the weight of the interaction terms in the greedy's increments (1: the Gauss-Newton model as
            estimated; 0: each unit's own drift per parameter, no interactions; default :data:`DEFAULT_CROSS_WEIGHT`).
        max_steps: the greedy's steps at most (above it, several units per step).
        seed: seed of the probes and of the Nystrom test matrix; None: prune.py's ``seed_everything`` (0 from
            Python).
    """

    name = "gn_greedy"
    min_mlp_keep: float = MIN_MLP_KEEP
    min_head_keep: float = MIN_HEAD_KEEP
    _handed_over = ("min_mlp_keep", "min_head_keep")

    def __init__(self, probes: NonNegativeInt = DEFAULT_PROBES, gram: Gram = "auto", rank: PositiveInt = DEFAULT_RANK,
                 cross_weight: ClosedUnitInterval = DEFAULT_CROSS_WEIGHT, max_steps: PositiveInt = GREEDY_STEPS,
                 seed: Optional[Seed] = None):
        super().__init__(probes=probes, seed=seed)
        check_arguments(GaussNewtonGreedy.__init__, locals(), "importance.scorer.init_args", skip={"self", "__class__"})
        if gram not in GRAMS:
            raise ScoringError(f"gn_greedy: gram must be one of {', '.join(GRAMS)}, got {gram!r}")
        self.gram, self.rank, self.max_steps = gram, int(rank), int(max_steps)
        self.cross_weight = float(cross_weight)
        #: ``(form, why)`` after :meth:`setup`: the Gram form used (``auto`` resolved on the model's device)
        self.resolved: Optional[tuple[str, str]] = None

    def choices(self) -> dict[str, Any]:
        """``{"gram_used": form, "gram_why": why}`` after :meth:`setup`."""
        return {} if self.resolved is None else {"gram_used": self.resolved[0], "gram_why": self.resolved[1]}

    def use_keep_ratios(self, min_mlp_keep: float, min_head_keep: float) -> None:
        """Never remove more of a block than these minimum keep ratios allow (the importance settings')."""
        for name, value in (("min_mlp_keep", min_mlp_keep), ("min_head_keep", min_head_keep)):
            if not 0.0 <= value <= 1.0:
                raise ScoringError(f"gn_greedy: {name} must lie in [0, 1], got {value}")
        self.min_mlp_keep, self.min_head_keep = float(min_mlp_keep), float(min_head_keep)

    def setup(self, model: nn.Module, teacher: Optional[nn.Module] = None) -> None:
        Scorer.setup(self, model, teacher)
        self._device, self._dtype = model_device_dtype(model)
        self._groups = [(f"{b.index}.{kind}", kind, getattr(b, kind)) for b in self.blocks for kind in ("heads", "neurons")]
        for key, kind, group in self._groups:
            output_layer(group, kind)
        sizes = [b.heads.num_units + b.neurons.num_units for b in self.blocks]
        acc_dtype = torch.promote_types(self._dtype, torch.float32)
        self.resolved = resolve_gram(self.gram, sizes, self._device, acc_dtype)
        form = self.resolved[0]
        self._gram = LowRankGram(sizes, self.rank, self.seed) if form == "lowrank" else BlockRowGram(sizes, form == "full")
        self._acc = self._gram.zeros(acc_dtype, self._device)
        self._start_counting()

    def update(self, batch: Any) -> dict[str, float]:
        self._require_setup()
        self._follow_device()
        images, _ = split_batch(batch)
        if images.dim() == 5:
            images = images.flatten(0, 1)
        with eval_mode(self.model), grad_only(self.model, []):
            images = to_model(images, self._device, self._dtype)
            rows = torch.cat([torch.cat(grads, dim=1) for grads in self._probe_gradients(images)])  # [K n, U]
            if not bool(torch.isfinite(rows).all()):  # one check per batch
                raise DataError(f"{self.name}: non-finite mask gradients (batch {self._batches + 1}); check the images")
            self._gram.accumulate(self._acc, rows)
        self._batches += 1
        self._samples += images.shape[0]
        return self._drift_so_far()

    def _drift_so_far(self) -> dict[str, float]:
        """What the Gram's diagonal estimates so far, to log per batch (as :meth:`OutputSensitivity.update`): the
        mean second-order drift of the embedding when one head (``drift_per_head``) or one MLP neuron
        (``drift_per_neuron``) is removed alone, averaged over each block's units, then over the blocks."""
        per_group = self._gram.diagonal(self._acc).split([g.num_units for _, _, g in self._groups])
        means = torch.stack([d.mean() for d in per_group]).view(-1, 2).mean(dim=0)  # (heads, neurons)
        head, neuron = (means / (2 * self._samples * self._probe_scale())).tolist()  # one host sync per batch
        return {"drift_per_head": head, "drift_per_neuron": neuron}

    def _unit_params(self) -> Tensor:
        costs = []
        for _, _, group in self._groups:
            owned = sum(t.numel() for _, t in iter_slots(group) if isinstance(t, nn.Parameter))
            costs.append(torch.full((group.num_units,), owned / group.num_units, dtype=torch.float64))
        return torch.cat(costs)

    def _positions(self, cost: Tensor, group: Tensor, removable: Tensor) -> Tensor:
        """The greedy's removal positions (:func:`greedy_positions` over the accumulated Gram)."""
        return greedy_positions(self._gram, self._acc, cost, group, removable, self.max_steps, self.cross_weight)

    @torch.no_grad()
    def compute(self) -> LocalScores:
        self._require_setup()
        if self._samples == 0:
            raise DataError(f"{self.name} saw no batches: feed the scoring data through update() before compute()")
        # the greedy walks the units block by block: heads, then neurons (the Gram's order)
        sizes = [g.num_units for _, _, g in self._groups]
        group = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
        keep = [min_kept(g.num_units, self.min_head_keep if kind == "heads" else self.min_mlp_keep)
                for _, kind, g in self._groups]
        removable = torch.tensor([n - k for n, k in zip(sizes, keep)])
        # no 1 / (samples * probes): a positive scale leaves the order as it is
        position = self._positions(self._unit_params(), group, removable)
        scores = (position / position.numel()).float()
        parts = scores.split(sizes)
        return LocalScores(list(parts[0::2]), list(parts[1::2]))
