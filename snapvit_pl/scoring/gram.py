"""The Gram matrix of the per-sample mask gradients and the greedy removal order it gives.

Removing a *set* S of units drifts the L2-normalised embedding by, to second order, ``1/2 * 1_S^T G 1_S`` with
``G = E_n[g_n g_n^T]`` the Gram matrix over all units (heads and MLP neurons of every block) of the per-sample mask
gradients ``g_n``. :func:`greedy_order` removes the unit that adds least drift per parameter, a few units per step,
with every step of a fixed size and the group caps applied by masking: the loop never waits for the device (one
check and one copy after it), so the order runs at an accelerator's pace (:class:`snapvit_pl.scoring.GaussNewtonGreedy`
is its scorer).

How ``G`` is held (``gram``):

- ``full``: exactly, as the upper block triangle (block ``i``'s rows, the columns of blocks ``i..B-1``) in one flat
  buffer: half of the ``U^2`` entries (ViT-B/16, ``U = 37,008``: 2.8 GB in fp32);
- ``block``: each block's own heads-and-neurons Gram only (the cross-block terms dropped);
- ``lowrank``: each block's own Gram exactly, and the cross-block terms from a rank-``r`` Nystrom approximation
  ``G ~ Y (Omega^T Y)^+ Y^T`` of the whole Gram, ``Y = G Omega`` streamed with a fixed Gaussian ``Omega``
  ``[U, r]`` (Tropp et al. 2017, "Fixed-rank approximation of a positive-semidefinite matrix from streaming
  data"): ``U r`` entries, for models whose full Gram does not fit;
- ``auto``: ``full`` where it fits (a share :data:`FULL_GRAM_DEVICE_SHARE` of the device's memory free when the pass
  starts, on a CPU at most :data:`FULL_GRAM_CPU_BYTES`), else ``lowrank`` (:func:`resolve_gram` says which and why).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import Tensor

from ..device import available_memory
from ..ranges import one_of
from .base import ScoringError

GRAMS = ("auto", "full", "block", "lowrank")
Gram = one_of(*GRAMS)
#: ``gram="auto"`` keeps the full Gram on a CPU up to this size (bytes of the upper block triangle) ...
FULL_GRAM_CPU_BYTES = 4 * 2 ** 30
#: ... and on any device up to this share of the memory free at setup
FULL_GRAM_DEVICE_SHARE = 0.5
#: the greedy's steps at most: above it, several units are removed per step
GREEDY_STEPS = 4096
#: the Nystrom rank of ``gram="lowrank"``
DEFAULT_RANK = 512


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
    share = FULL_GRAM_DEVICE_SHARE * (free or 0)
    if device.type == "cpu" and (free is None or FULL_GRAM_CPU_BYTES <= share):  # the cap binds: a fixed reason
        form = "full" if need <= FULL_GRAM_CPU_BYTES else "lowrank"
        where = f"the {FULL_GRAM_CPU_BYTES / 2 ** 30:.0f} GiB allowed on cpu"
    else:  # the free memory binds (its amount named only when it refuses: the record stays the same run to run)
        form = "full" if need <= share else "lowrank"
        where = f"{FULL_GRAM_DEVICE_SHARE:.0%} of the memory free on {device}" + (
            "" if form == "full" else f" ({(free or 0) / 2 ** 30:.1f} GiB free)")
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

    def scale_(self, state: dict[str, Tensor], scale: Tensor) -> None:
        """``G <- diag(scale) G diag(scale)``, in place (``scale`` ``[U]``)."""
        scale = scale.to(state["gram"])
        for i, (lo, hi) in enumerate(zip(self.offsets, self.offsets[1:])):
            self.block_row(state, i).mul_(scale[lo:hi, None] * scale[None, lo:lo + self.widths[i]])

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

    def dense(self, state: dict[str, Tensor]) -> Tensor:
        """The whole Gram ``[U, U]``, each row holding exactly what :meth:`row_adder` adds for its unit: its own block
        row's entries from its block on, and its column of every earlier block row (zeros outside its block without
        ``cross_block``)."""
        flat = state["gram"]
        dense = torch.zeros(self.units, self.units, dtype=flat.dtype, device=flat.device)
        for i, (lo, hi) in enumerate(zip(self.offsets, self.offsets[1:])):
            row = self.block_row(state, i)
            dense[lo:hi, lo:lo + row.shape[1]] = row
            if self.cross_block:
                dense[hi:, lo:hi] = row[:, hi - lo:].T
        return dense

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

    def scale_(self, state: dict[str, Tensor], scale: Tensor) -> None:
        """``G <- diag(scale) G diag(scale)``: the block Grams in place, the Nystrom factor's rows when it is made."""
        super().scale_(state, scale)
        state["row_scale"] = scale.to(state["sketch"]) * state.get("row_scale", 1.0)

    def factor(self, state: dict[str, Tensor]) -> Tensor:
        """``F`` ``[U, r']``, ``F F^T`` the Nystrom approximation (eigenvalues of ``C`` below ``1e-10`` of the
        largest dropped; rows scaled by :meth:`scale_`); computed in float64, kept in the accumulators' dtype."""
        sketch = state["sketch"]
        y, omega = sketch.double(), self.omega(sketch).double()
        core = omega.T @ y
        values, vectors = torch.linalg.eigh((core + core.T) / 2)
        kept = values > values.max().clamp_min(0) * 1e-10  # a data-dependent width: once per order, not per step
        factor = y @ (vectors[:, kept] / values[kept].sqrt())
        if "row_scale" in state:
            factor = factor * state["row_scale"].double()[:, None]
        return factor.to(sketch.dtype)

    def row_adder(self, state: dict[str, Tensor]) -> Callable[[Tensor, Tensor], None]:
        factor = self.factor(state)
        maps = self.maps(factor.device)
        blocks = torch.arange(len(self.sizes), device=factor.device)
        spans = list(zip(self.offsets, self.offsets[1:]))

        def add(cross: Tensor, units: Tensor) -> None:
            self._add_rows(state["gram"], cross, units)
            added = factor[units]  # the chunk's rows of F
            # every unit's approximated G row-sum over the chunk, less the chunk's terms within its own block (the
            # exact block Grams hold those): F_v . (sum of the chunk's rows - the sum of those in v's block); one
            # matrix-vector product per block (a batched product with one column is several times slower on a CPU)
            per_block = (maps["block"][units][None, :] == blocks[:, None]).to(added.dtype) @ added  # [B, r']
            outside = (added.sum(dim=0)[None, :] - per_block).to(factor.dtype)
            for b, (lo, hi) in enumerate(spans):
                cross[lo:hi] += torch.mv(factor[lo:hi], outside[b]).to(cross.dtype)
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


#: On a CPU, where reading a value back costs nothing, each greedy step first takes the ``size`` lowest keys of all
#: units (one top-k) and keeps them when no group gives more than it may, the common case, in which they are exactly
#: what the capped pick below chooses; else it makes that pick. ``benchmarks/greedy_cost.py`` times both.
CPU_SHORTCUT = True


def _lowest(delta: Tensor, size: int, groups: Segments, left: Tensor, group: Tensor) -> tuple[Tensor, Tensor]:
    """``(units, all finite)``: the ``size`` units with the lowest ``delta`` (ties: the lower index first, as a
    stable sort), in that order, taking at most ``left[g]`` of group ``g`` (the segments of ``groups``; ``group``:
    each unit's); fixed shapes, no host synchronisation (but for :data:`CPU_SHORTCUT`'s check on a CPU)."""
    if delta.dtype == torch.float32 and delta.numel() < 2 ** _INDEX_BITS:
        keys = _sortable_keys(delta)
        if CPU_SHORTCUT and delta.device.type == "cpu":
            chosen = torch.topk(keys, size, largest=False).values  # sorted: the removal order
            units = chosen % (1 << _INDEX_BITS)
            if bool((torch.bincount(group[units], minlength=left.numel()) <= left).all()):
                return units, (chosen < _FINITE_KEYS).all()
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


def _no_finite(count: int) -> str:
    return (f"gn_greedy: fewer than {count} units have a finite removal increment (a non-finite Gram or a unit without "
            "parameters); check the scoring images and the model's weights")


#: Up to this many units (a Gram of 256 MiB in float32) a CPU's greedy of one unit per step reads whole rows of the
#: Gram laid out densely (:func:`_one_by_one`).
DENSE_UNITS = 8192


def _one_by_one(dense: Tensor, diag: Tensor, cost: Tensor, group: Tensor, removable: Tensor, count: int,
                cross_weight: float, alive: Optional[Tensor]) -> Tensor:
    """:func:`greedy_order` with one unit per step on a CPU (:data:`CPU_SHORTCUT`): the same increments, computed
    the same way, the lowest taken by ``argmin`` (its first index on ties, as the stable sort), the group caps kept
    in Python, a unit's interactions added as one row of the dense Gram; the same order, with a few operations per
    step instead of dozens."""
    total = diag.numel()
    groups = group.tolist()
    left = removable.tolist()
    first = {}
    for u, g in enumerate(groups):
        first.setdefault(g, u)
    ends = {g: first[g] + n for g, n in enumerate(torch.bincount(group, minlength=len(left)).tolist()) if g in first}
    allowed = torch.ones(total, dtype=torch.bool) if alive is None else alive.clone()
    for g, n in enumerate(left):
        if n <= 0 and g in first:
            allowed[first[g]:ends[g]] = False
    cross = torch.zeros(total, dtype=diag.dtype)
    order = []
    for _ in range(count):
        delta = torch.where(allowed, (diag + 2 * cross_weight * cross) / cost, torch.inf)
        u = int(torch.argmin(torch.nan_to_num(delta, nan=torch.inf)))
        if not math.isfinite(float(delta[u])):
            raise GreedyError(_no_finite(count))
        order.append(u)
        allowed[u] = False
        g = groups[u]
        left[g] -= 1
        if left[g] == 0:
            allowed[first[g]:ends[g]] = False
        cross += dense[u]
    return torch.tensor(order, dtype=torch.long)


def greedy_order(gram: BlockRowGram, state: dict[str, Tensor], cost: Tensor, group: Tensor, removable: Tensor,
                 count: int, per_step: int, cross_weight: float = 1.0, alive: Optional[Tensor] = None,
                 offset: Optional[Tensor] = None) -> Tensor:
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
        offset: added to each unit's own term ``G_uu`` (the first-order term of a re-linearised stage), ``[U]``.

    Raises:
        GreedyError: fewer finite increments than units to remove (a non-finite Gram, a unit without
            parameters).
    """
    diag, add_rows = gram.diagonal(state), gram.row_adder(state)
    device, dtype = diag.device, diag.dtype
    total = diag.numel()
    if offset is not None:
        diag = diag + offset.to(device=device, dtype=dtype)
    if (CPU_SHORTCUT and device.type == "cpu" and per_step == 1 and type(gram) is BlockRowGram
            and total <= DENSE_UNITS and dtype == torch.float32):
        dense = gram.dense(state)
        if bool(torch.isfinite(dense).all()):
            return _one_by_one(dense, diag, cost.to(dtype), group, removable, count, cross_weight, alive)
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
        raise GreedyError(_no_finite(count))
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
