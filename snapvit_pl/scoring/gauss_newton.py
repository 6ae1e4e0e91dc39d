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
- ``auto`` (default): ``full`` where it fits (a share :data:`FULL_GRAM_DEVICE_SHARE` of the device's memory free
  when the pass starts, on a CPU at most :data:`FULL_GRAM_CPU_BYTES`), else ``lowrank``; :attr:`GaussNewtonGreedy.resolved`
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

from ..device import available_memory
from ..errors import DataError
from ..models.modes import eval_mode
from ..models.units import MIN_HEAD_KEEP, MIN_MLP_KEEP, iter_slots, min_kept
from ..ranges import ClosedUnitInterval, NonNegativeInt, PositiveInt, Seed, check_arguments
from .activation import output_layer
from .base import LocalScores, Scorer, ScoringError, grad_only, model_device_dtype, split_batch, to_model
from .sensitivity import DEFAULT_PROBES, OutputSensitivity

Gram = Literal["auto", "full", "block", "lowrank"]
GRAMS = ("auto", "full", "block", "lowrank")
#: ``gram="auto"`` keeps the full Gram on a CPU up to this size (bytes of the upper block triangle) ...
FULL_GRAM_CPU_BYTES = 4 * 2 ** 30
#: ... and on any device up to this share of the memory free at setup
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
    """``(form, why)``: the Gram form ``gram`` means on ``device`` (``auto``: ``full`` where it fits in the share
    :data:`FULL_GRAM_DEVICE_SHARE` of the device's memory free now, on a CPU at most :data:`FULL_GRAM_CPU_BYTES`;
    else ``lowrank``)."""
    if gram != "auto":
        return gram, "as configured"
    need = full_gram_bytes(block_sizes, dtype)
    free = available_memory(device)
    if device.type == "cpu":
        budget = FULL_GRAM_CPU_BYTES if free is None else min(FULL_GRAM_CPU_BYTES, FULL_GRAM_DEVICE_SHARE * free)
        where = (f"the {budget / 2 ** 30:.2f} GiB allowed on cpu (at most {FULL_GRAM_CPU_BYTES / 2 ** 30:.0f} GiB, "
                 f"at most {FULL_GRAM_DEVICE_SHARE:.0%} of the {(free or 0) / 2 ** 30:.1f} GiB available)")
    else:
        budget = FULL_GRAM_DEVICE_SHARE * (free or 0)
        where = f"{FULL_GRAM_DEVICE_SHARE:.0%} of the {(free or 0) / 2 ** 30:.1f} GiB free on {device}"
    form = "full" if need <= budget else "lowrank"
    return form, f"auto: the full Gram takes {need / 2 ** 30:.2f} GiB, {'within' if form == 'full' else 'over'} {where}"


class Segments:
    """Contiguous segments of a unit vector (blocks, or groups), each padded to the longest of its size class so
    that a per-segment operation is one fixed-shape tensor operation per class, with no host synchronisation.

    Args:
        sizes: units per segment, in order (segment ``s`` covers ``sum(sizes[:s]) .. sum(sizes[:s + 1])``).
        device: where the index maps live.
    """

    def __init__(self, sizes: list[int], device: torch.device):
        self.sizes = list(sizes)
        starts = [0]
        for n in sizes:
            starts.append(starts[-1] + n)
        self.starts = starts
        #: per size class: (segment ids, unit index ``[segments, size]``)
        self.classes: list[tuple[Tensor, Tensor]] = []
        for size in sorted(set(n for n in sizes if n > 0)):
            ids = torch.tensor([s for s, n in enumerate(sizes) if n == size], dtype=torch.long)
            index = torch.tensor(starts)[ids][:, None] + torch.arange(size)[None, :]
            self.classes.append((ids.to(device), index.to(device)))

    def ranks(self, values: Tensor) -> Tensor:
        """Each unit's rank within its segment by ``values`` (ties by position: a stable sort), ``[U]`` int64."""
        rank = torch.empty(values.shape, dtype=torch.long, device=values.device)
        for _, index in self.classes:
            order = torch.argsort(values[index], dim=1, stable=True)
            within = torch.empty_like(order)
            within.scatter_(1, order, torch.arange(order.shape[1], device=values.device).expand_as(order))
            rank[index] = within
        return rank


class BlockRowGram:
    """The layout of a Gram held as one block row per block in one flat buffer (``state["gram"]``): block ``i``'s
    rows times the columns of blocks ``i..B-1`` (``cross_block``: the upper block triangle of the full Gram) or
    of block ``i`` only. The caller owns the ``state`` dict of tensors (reduced, saved and moved as it is); the
    index maps that read it are built once per device.

    Args:
        sizes: units per block.
        cross_block: keep the cross-block terms.
    """

    def __init__(self, sizes: list[int], cross_block: bool):
        self.sizes, self.cross_block = list(sizes), cross_block
        self.offsets = [0]
        for n in sizes:
            self.offsets.append(self.offsets[-1] + n)
        total = self.offsets[-1]
        self.widths = [total - lo if cross_block else n for lo, n in zip(self.offsets, sizes)]
        self.starts = [0]  # where each block row begins in the flat buffer
        for n, w in zip(sizes, self.widths):
            self.starts.append(self.starts[-1] + n * w)
        self._maps: dict[torch.device, dict[str, Tensor]] = {}

    @property
    def units(self) -> int:
        return self.offsets[-1]

    def zeros(self, dtype: torch.dtype, device: torch.device) -> dict[str, Tensor]:
        return {"gram": torch.zeros(self.starts[-1], dtype=dtype, device=device)}

    def block_row(self, state: dict[str, Tensor], i: int) -> Tensor:
        """Block ``i``'s rows ``[n_i, width_i]`` (a view of the flat buffer)."""
        return state["gram"][self.starts[i]:self.starts[i + 1]].view(self.sizes[i], self.widths[i])

    def accumulate(self, state: dict[str, Tensor], g: Tensor) -> None:
        """Add ``g^T g`` for gradient rows ``g`` ``[rows, U]``."""
        for i, (lo, hi) in enumerate(zip(self.offsets, self.offsets[1:])):
            acc = self.block_row(state, i)
            acc.addmm_(g[:, lo:hi].T.to(acc.dtype), g[:, lo:lo + acc.shape[1]].to(acc.dtype))

    def maps(self, device: torch.device) -> dict[str, Tensor]:
        """Index maps on ``device`` (built once): each unit's block, its block's first unit, where its row's
        diagonal entry lies, ``shift`` (the flat position of ``G[u, v]`` is ``shift[u] + v`` for ``v`` in the
        blocks ``>= u``'s, ``shift[v] + u`` for ``v`` in earlier blocks) and the blocks as :class:`Segments`."""
        if device not in self._maps:
            block = torch.repeat_interleave(torch.arange(len(self.sizes)), torch.tensor(self.sizes))
            lo = torch.tensor(self.offsets[:-1])[block]
            unit = torch.arange(self.units)
            row = torch.tensor(self.starts[:-1])[block] + (unit - lo) * torch.tensor(self.widths)[block]
            shift = row - lo  # G[u, v] for v in u's block row: row[u] + (v - lo[u])
            maps = {"block": block, "lo": lo, "shift": shift, "diagonal": shift + unit}
            self._maps[device] = {k: v.to(device) for k, v in maps.items()}
            self._maps[device]["segments"] = Segments(self.sizes, device)
        return self._maps[device]

    def diagonal(self, state: dict[str, Tensor]) -> Tensor:
        flat = state["gram"]
        return flat[self.maps(flat.device)["diagonal"]]

    def row_adder(self, state: dict[str, Tensor]) -> Callable[[Tensor, Tensor], None]:
        """``add(cross, units)``: ``cross += sum_{u in units} G[u]``, in fixed-shape operations (no host
        synchronisation)."""
        return lambda cross, units: self._add_rows(state["gram"], cross, units)

    def _add_rows(self, flat: Tensor, cross: Tensor, units: Tensor) -> None:
        maps = self.maps(flat.device)
        block = maps["block"][units]
        if self.cross_block:
            # a unit's row in its own block row covers the columns of its block onwards: read as a whole row of the
            # buffer seen with rows starting anywhere (``flat[shift[u] + v]``), the columns before its block masked
            v = torch.arange(self.units, device=flat.device)
            rows = flat.as_strided((flat.numel() - self.units + 1, self.units), (1, 1)).index_select(0, maps["shift"][units])
            cross += (rows * (v[None, :] >= maps["lo"][units][:, None]).to(flat.dtype)).sum(dim=0)
            # ... and its column in every earlier block row (``G[lo_i:hi_i, u]``)
            for i, (lo, hi) in enumerate(zip(self.offsets, self.offsets[1:])):
                columns = self.block_row({"gram": flat}, i).index_select(1, (units - lo).clamp(0, self.widths[i] - 1))
                cross[lo:hi] += columns @ (block > i).to(flat.dtype)
            return
        # the block-diagonal Gram: each unit's row within its block, summed per block (a one-hot product keeps the
        # sums deterministic on every device; the rows read for units of other blocks are multiplied by 0)
        start = maps["shift"][units] + maps["lo"][units]  # the row's first entry
        for ids, index in maps["segments"].classes:
            member = (block[None, :] == ids[:, None]).to(flat.dtype)  # [blocks of this size, k]
            rows = flat[(start[:, None] + torch.arange(index.shape[1], device=flat.device)).clamp_max(flat.numel() - 1)]
            cross[index] += member @ rows


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
        kept = values > values.max().clamp_min(0) * 1e-10  # a data-dependent width: once per order, not per step
        return (y @ (vectors[:, kept] / values[kept].sqrt())).to(sketch.dtype)

    def row_adder(self, state: dict[str, Tensor]) -> Callable[[Tensor, Tensor], None]:
        factor = self.factor(state)
        maps = self.maps(factor.device)
        blocks = torch.arange(len(self.sizes), device=factor.device)
        padded = [(ids, index, factor[index]) for ids, index in maps["segments"].classes]  # [blocks, size, r'] each

        def add(cross: Tensor, units: Tensor) -> None:
            self._add_rows(state["gram"], cross, units)
            added = factor[units]  # the chunk's rows of F
            # every unit's approximated G row-sum over the chunk, less the chunk's terms within its own block (the
            # exact block Grams hold those): F_v . (sum of the chunk's rows - the sum of those in v's block)
            per_block = (maps["block"][units][None, :] == blocks[:, None]).to(added.dtype) @ added  # [B, r']
            outside = added.sum(dim=0)[None, :] - per_block
            for ids, index, rows in padded:
                cross[index] += torch.bmm(rows, outside[ids][:, :, None])[:, :, 0].to(cross.dtype)
        return add


class GreedyError(ScoringError):
    """The greedy found no finite removal increment where units were still to be removed."""


_INDEX_BITS = 32
#: the largest key :func:`_sortable_keys` gives a finite value (+inf, and every NaN, key above it)
_FINITE_KEYS = 0x7F800000 << _INDEX_BITS


def _sortable_keys(values: Tensor) -> Tensor:
    """float32 ``values`` ``[U]`` as distinct int64 keys in the order of ``(value, index)``: the value's bits made
    monotone (negative floats flipped; -0 as +0, NaN as +inf) above the index. The lowest keys are a stable sort's first
    entries, found by ``topk`` without sorting."""
    values = torch.nan_to_num(values, nan=torch.inf, posinf=torch.inf, neginf=-torch.inf) + 0.0  # NaN as +inf, -0 as +0
    bits = values.view(torch.int32).to(torch.int64)
    bits = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return bits * (1 << _INDEX_BITS) + torch.arange(values.numel(), device=values.device)


def _lowest(delta: Tensor, size: int, groups: Segments, left: Tensor, group: Tensor) -> tuple[Tensor, Tensor]:
    """``(units, all finite)``: the ``size`` units with the lowest ``delta`` (ties: the lower index first, as a
    stable sort), in that order, taking at most ``left[g]`` of group ``g`` (the segments of ``groups``; ``group``:
    each unit's); fixed shapes, no host synchronisation."""
    if delta.dtype == torch.float32 and delta.numel() < 2 ** _INDEX_BITS:
        keys = _sortable_keys(delta)
        # a group gives at most ``size`` units to a step: its ``size`` lowest, of which its first ``left`` may go
        candidates = []
        for ids, index in groups.classes:
            low = torch.topk(keys[index], min(size, index.shape[1]), dim=1, largest=False).values
            allowed = torch.arange(low.shape[1], device=low.device)[None, :] < left[ids][:, None]
            candidates.append(torch.where(allowed, low, torch.iinfo(torch.int64).max).flatten())
        chosen = torch.topk(torch.cat(candidates), size, largest=False).values  # sorted: the removal order
        return chosen % (1 << _INDEX_BITS), (chosen < _FINITE_KEYS).all()
    # other dtypes: each unit's rank within its group, then a stable sort
    delta = torch.where(groups.ranks(delta) < left[group], delta, torch.inf)
    chunk = torch.argsort(delta, stable=True)[:size]
    return chunk, torch.isfinite(delta[chunk]).all()


def greedy_order(gram: BlockRowGram, state: dict[str, Tensor], cost: Tensor, group: Tensor, removable: Tensor,
                 count: int, per_step: int, cross_weight: float = 1.0, alive: Optional[Tensor] = None) -> Tensor:
    """The next ``count`` units the greedy removes, in order (int64, on the Gram's device).

    Each step removes the ``per_step`` units (the last step: what is left of ``count``) with the lowest drift
    increment per parameter ``(G_uu + 2 w sum_{v in S} G_uv) / cost_u`` (``S``: the units this call removed
    before), never more of a group than ``removable[group]``. The step sizes are fixed up front and the group
    caps applied by masking, so the loop has no host synchronisation: one check after it.

    Args:
        gram: the Gram's layout (:class:`BlockRowGram` or :class:`LowRankGram`).
        state: its accumulators.
        cost: parameters per unit ``[U]``.
        group: each unit's group (head or neuron group of a block, ``2 * block + kind``) ``[U]``, contiguous.
        removable: units each group may still lose ``[groups]`` (its sum at least ``count``).
        count: units to remove.
        per_step: units removed per step.
        cross_weight: the weight of the interaction terms (1: the Gauss-Newton model; 0: each unit's own drift).
        alive: units present (default all); the others are never chosen.

    Raises:
        GreedyError: fewer finite increments than units to remove (a non-finite Gram, a unit without
            parameters).
    """
    diag, add_rows = gram.diagonal(state), gram.row_adder(state)
    device, dtype = diag.device, diag.dtype
    total = diag.numel()
    group = group.to(device)
    left = removable.to(device=device, dtype=torch.long).clone()
    cost = cost.to(device=device, dtype=dtype)
    groups = Segments(torch.bincount(group.cpu(), minlength=len(removable)).tolist(), device)
    cross = torch.zeros(total, dtype=dtype, device=device)
    alive = torch.ones(total, dtype=torch.bool, device=device) if alive is None else alive.to(device).clone()
    order = torch.empty(count, dtype=torch.long, device=device)
    failed = torch.zeros((), dtype=torch.bool, device=device)
    done = 0
    while done < count:
        size = min(per_step, count - done)
        delta = torch.where(alive & (left[group] > 0), (diag + 2 * cross_weight * cross) / cost, torch.inf)
        chunk, finite = _lowest(delta, size, groups, left, group)
        failed |= ~finite
        order[done:done + size] = chunk
        alive[chunk] = False
        left.index_add_(0, group[chunk], torch.full((size,), -1, dtype=torch.long, device=device))
        add_rows(cross, chunk)
        done += size
    if bool(failed):  # the one host synchronisation of the order
        raise GreedyError(f"gn_greedy: fewer than {count} units have a finite removal increment (a non-finite Gram or "
                          "a unit without parameters); check the scoring images and the model's weights")
    return order


def greedy_positions(gram: BlockRowGram, state: dict[str, Tensor], cost: Tensor, group: Tensor, removable: Tensor,
                     max_steps: int = GREEDY_STEPS, cross_weight: float = 1.0) -> Tensor:
    """Removal position (1-based, float64, CPU) of every unit: the greedy order under ``gram``
    (:func:`greedy_order` over all ``removable`` units, ``ceil(removable / max_steps)`` per step); the units no
    group may lose come last, by their diagonal ``G_uu``."""
    count = int(removable.sum())
    order = greedy_order(gram, state, cost, group, removable, count, max(1, math.ceil(count / max_steps)),
                         cross_weight)
    diag = gram.diagonal(state).double()
    removed = torch.zeros(diag.numel(), dtype=torch.bool, device=diag.device)
    removed[order] = True
    rest = torch.argsort(torch.where(removed, torch.inf, diag), stable=True)[:diag.numel() - count]
    everything = torch.cat([order, rest])
    position = torch.empty(diag.numel(), dtype=torch.float64, device=diag.device)
    position[everything] = torch.arange(1, diag.numel() + 1, dtype=torch.float64, device=diag.device)
    return position.cpu()


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
        self._gram.maps(self._device)  # the index maps the order and the per-batch log read, built once
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
            finite = torch.isfinite(rows).all()
            self._gram.accumulate(self._acc, rows)
        self._batches += 1
        self._samples += images.shape[0]
        ok, head, neuron = torch.cat([finite.view(1).to(torch.float64), self._drift_so_far()]).tolist()  # one sync
        if not ok:
            raise DataError(f"{self.name}: non-finite mask gradients (batch {self._batches}); check the images")
        return {"drift_per_head": head, "drift_per_neuron": neuron}

    def _drift_so_far(self) -> Tensor:
        """What the Gram's diagonal estimates so far, to log per batch (as :meth:`OutputSensitivity.update`): the
        mean second-order drift of the embedding when one head (``drift_per_head``) or one MLP neuron
        (``drift_per_neuron``) is removed alone, averaged over each block's units, then over the blocks
        (``[2]`` float64, on the device)."""
        per_group = self._gram.diagonal(self._acc).split([g.num_units for _, _, g in self._groups])
        means = torch.stack([d.mean() for d in per_group]).view(-1, 2).mean(dim=0)  # (heads, neurons)
        return (means / (2 * self._samples * self._probe_scale())).to(torch.float64)

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
