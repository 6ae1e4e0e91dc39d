"""Removing heads and MLP neurons: gathered forward passes and physical surgery.

Both paths slice the same tensors through the same layouts (:mod:`.units`):

- :func:`use_subnet` is a context manager: inside it the model computes with only the kept
  rows/columns, gathered from the original parameters (gradients flow back to them). Nothing is
  deep-copied or modified in place, and a forward costs what the pruned model costs, which is
  what a search that tries thousands of candidates needs.
- :func:`prune_` cuts the tensors for good and updates ``num_heads``/``attn_dim``/Linear and
  norm shapes, so fused (SDPA) and manual attention paths both stay correct.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
from torch import nn
from timm.models.eva import EvaAttention

from .pruned_eva import PrunedEvaAttention
from .units import BlockUnits, Subnet, UnitGroup, attention_units, mlp_units, prunable_blocks

# (object, attribute, value) triples; applied in order, undone in reverse.
_AttrEdit = tuple[object, str, object]


def _shape_edits(group: UnitGroup, kept: int, is_attention: bool) -> list[_AttrEdit]:
    """Attribute updates that make ``group.module`` consistent with ``kept`` units."""
    edits: list[_AttrEdit] = []
    for slot, (holder, _) in zip(group.slots, group.holders):
        size = kept * group.unit_size * slot.sections
        if isinstance(holder, nn.Linear):
            edits.append((holder, "out_features" if slot.dim == 0 else "in_features", size))
        elif hasattr(holder, "normalized_shape"):
            edits.append((holder, "normalized_shape", (size,)))
    if is_attention:
        attn = group.module
        edits.append((attn, "num_heads", kept))
        for attr, value in (("attn_dim", kept * attn.head_dim), ("num_kv_heads", kept), ("kv_dim", kept * attn.head_dim)):
            if hasattr(attn, attr):
                edits.append((attn, attr, value))
        if isinstance(attn, EvaAttention) and type(attn) is EvaAttention:
            edits.append((attn, "__class__", PrunedEvaAttention))
    return edits


def _plan(
    blocks: Sequence[BlockUnits], subnet: Subnet
) -> Iterator[tuple[UnitGroup, torch.Tensor, bool]]:
    """(group, kept indices, is_attention) for every group that actually loses units."""
    for block, heads, neurons in zip(blocks, subnet.heads, subnet.neurons):
        for group, keep, is_attention in ((block.heads, heads, True), (block.neurons, neurons, False)):
            if len(keep) < group.num_units:
                yield group, keep, is_attention


def _store(holder: nn.Module, name: str) -> dict:
    return holder._parameters if name in holder._parameters else holder._buffers


@contextmanager
def use_subnet(model: nn.Module, subnet: Subnet, blocks: Sequence[BlockUnits] | None = None):
    """Run ``model`` as if pruned to ``subnet``, without copying or reshaping its parameters.

    Args:
        model: a supported timm ViT.
        subnet: kept heads / neurons per block (validated here).
        blocks: ``prunable_blocks(model)`` if already computed (saves a walk over the model).

    Example:
        >>> with use_subnet(model, subnet):
        ...     features = model(images)
    """
    blocks = blocks if blocks is not None else prunable_blocks(model)
    subnet = subnet.validate(blocks)
    undo: list[Callable[[], None]] = []
    plan = list(_plan(blocks, subnet))
    try:
        for (group, keep, is_attention), indices in zip(plan, _slot_indices(plan)):
            for slot, (holder, name), index in zip(group.slots, group.holders, indices):
                store = _store(holder, name)
                undo.append(lambda s=store, n=name, t=store[name]: s.__setitem__(n, t))
                store[name] = store[name].index_select(slot.dim, index)
            for obj, attr, value in _shape_edits(group, len(keep), is_attention):
                # plain attributes (sizes, a class): object's setattr skips nn.Module's checks for tensors and modules
                undo.append(lambda o=obj, a=attr, v=getattr(obj, attr): object.__setattr__(o, a, v))
                object.__setattr__(obj, attr, value)
        yield model
    finally:
        for restore in reversed(undo):
            restore()


def _slot_indices(plan: list) -> list[list[torch.Tensor]]:
    """Per group of ``plan``, each slot's kept indices, built on the host and copied to the model's device at once:
    one blocking copy per sub-network (a copy per slot, about seven per block, would each wait for an accelerator).
    The slots of a group with the same number of sections share one index tensor."""
    devices = {getattr(holder, name).device for group, _, _ in plan for holder, name in group.holders}
    if len(devices) > 1:  # tensors on several devices: each slot's indices where its tensor is
        return [[group.index(keep, slot) for slot in group.slots] for group, keep, _ in plan]
    host: dict[tuple[int, int], torch.Tensor] = {}
    for i, (group, keep, _) in enumerate(plan):
        for slot in group.slots:
            if (i, slot.sections) not in host:
                host[(i, slot.sections)] = group.index(keep, slot, device=keep.device)
    shared = dict(host)
    if devices and any(index.device not in devices for index in host.values()):
        moved = torch.cat(list(host.values())).to(next(iter(devices))).split([len(i) for i in host.values()])
        shared = dict(zip(host, moved))
    return [[shared[(i, slot.sections)] for slot in group.slots] for i, (group, _, _) in enumerate(plan)]


def _cut_(group: UnitGroup, keep: torch.Tensor, is_attention: bool) -> None:
    """Slice every tensor of ``group`` to the kept units and update the module's shape attributes."""
    for slot, (holder, name) in zip(group.slots, group.holders):
        store = _store(holder, name)
        tensor = store[name]
        sliced = tensor.index_select(slot.dim, group.index(keep, slot)).clone()
        store[name] = nn.Parameter(sliced, requires_grad=tensor.requires_grad) if store is holder._parameters else sliced
    for obj, attr, value in _shape_edits(group, len(keep), is_attention):
        setattr(obj, attr, value)


@torch.no_grad()
def prune_(model: nn.Module, subnet: Subnet) -> nn.Module:
    """Physically remove every head and neuron not in ``subnet``, in place; returns ``model``.

    Do this before wrapping the model for DDP or ``torch.compile``.

    Raises:
        PruningSpecError: if ``subnet`` is invalid for ``model`` (nothing is modified then).
    """
    blocks = prunable_blocks(model)
    subnet = subnet.validate(blocks)
    for group, keep, is_attention in _plan(blocks, subnet):
        _cut_(group, keep, is_attention)
    return model


@torch.no_grad()
def prune_block_(block: nn.Module, heads: int, neurons: int) -> nn.Module:
    """Keep the first ``heads`` heads and ``neurons`` MLP neurons of one transformer block, in place (for timing
    a block at a width: which units are kept does not change its cost)."""
    for group, kept, is_attention in ((attention_units(block.attn), heads, True), (mlp_units(block.mlp), neurons, False)):
        if kept < group.num_units:
            _cut_(group, torch.arange(kept), is_attention)
    return block


def architecture(model: nn.Module) -> dict[str, list[int]]:
    """Heads and MLP hidden width per block, e.g. ``{"heads": [6, 4], "mlp_hidden": [1536, 800]}``."""
    blocks = prunable_blocks(model)
    return {"heads": [b.heads.num_units for b in blocks], "mlp_hidden": [b.neurons.num_units for b in blocks]}
