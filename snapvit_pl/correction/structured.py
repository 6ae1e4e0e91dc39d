"""Structured pruning with SparseGPT-style correction, block by block.

For each block in order, the calibration hidden states entering it come from the blocks before it
*after* they were corrected and pruned, so every correction sees the inputs the final model sees:

1. run the dense-width block, collect the inputs of ``attn.proj``, correct ``proj`` to the kept
   heads' columns, prune the block's heads and write the corrected weight;
2. re-run the block (pruned attention), collect the inputs of ``mlp.fc2``, correct it to the kept
   neurons' columns, prune the neurons and write the corrected weight;
3. run the corrected block once more: its outputs are the next block's calibration inputs.
"""
from __future__ import annotations

from typing import Optional

import torch
from timm.models.eva import Eva
from torch import nn
from tqdm.auto import tqdm

from ..models.surgery import prune_
from ..models.units import Subnet, prunable_blocks
from .sparsegpt import ColumnCorrector, Damping

# (unit group, the Linear whose input columns it owns), in the order they are corrected.
_STAGES = (("heads", "proj"), ("neurons", "fc2"))


def embed_tokens(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The hidden states entering ``model.blocks[0]`` and Eva's rotary embedding (None otherwise).

    Reproduces the pre-block part of timm's ``forward_features`` (patch embedding, position
    embedding, prefix/register/distillation tokens, patch dropout, ``norm_pre``).
    """
    x = model.patch_embed(images)
    if isinstance(model, Eva):
        x, rope = model._pos_embed(x)  # also applies pos_drop and patch_drop
        return model.norm_pre(x), rope
    x = model.patch_drop(model._pos_embed(x))
    return model.norm_pre(x), None


def block_kwargs(model: nn.Module, rope: Optional[torch.Tensor], index: int) -> dict:
    """Keyword arguments of ``model.blocks[index]`` (Eva's rope; per-depth in ``rope_mixed`` mode)."""
    if not isinstance(model, Eva):
        return {}
    if rope is not None and getattr(model, "rope_mixed", False):
        return {"rope": rope[index]}
    return {"rope": rope}


@torch.no_grad()
def correct_and_prune(
    model: nn.Module,
    subnet: Subnet,
    images: torch.Tensor,
    batch_size: int = 64,
    damping: Damping = "mean",
    damp_fraction: float = 0.01,
    block_size: int = 128,
    progress: bool = False,
) -> nn.Module:
    """Prune ``model`` to ``subnet`` in place, correcting ``attn.proj``/``mlp.fc2`` on calibration images.

    Blocks that lose no unit are left bitwise unchanged; so is everything outside the blocks.

    Args:
        model: a dense supported timm ViT (pass a copy to keep the original).
        subnet: kept heads / neurons per block.
        images: calibration images ``[N, C, H, W]`` (moved to the model's device batch by batch).
        batch_size: images per forward pass.
        damping, damp_fraction, block_size: passed to :meth:`ColumnCorrector.correct`.
        progress: show a progress bar over blocks.

    Returns:
        ``model``, with the architecture of ``prune_(model, subnet)``.
    """
    subnet = subnet.validate(model)
    dense = Subnet.full(model)
    todo = [b for b in range(len(model.blocks))
            if any(len(getattr(subnet, g)[b]) < len(getattr(dense, g)[b]) for g, _ in _STAGES)]
    if not todo:
        return model
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    chunks = [embed_tokens(model, images[i:i + batch_size].to(device)) for i in range(0, len(images), batch_size)]
    cache, rope = torch.cat([x for x, _ in chunks]), chunks[0][1]
    del chunks
    options = dict(block_size=block_size, damping=damping, damp_fraction=damp_fraction)
    for b in tqdm(range(todo[-1] + 1), desc="correction", disable=not progress):
        kwargs = block_kwargs(model, rope, b)
        for group_name, layer_name in _STAGES:
            keep = getattr(subnet, group_name)[b]
            if len(keep) < len(getattr(dense, group_name)[b]):
                _correct_group(model, b, group_name, layer_name, keep, cache, kwargs, batch_size, options)
        if b < todo[-1]:
            _run(model.blocks[b], cache, kwargs, batch_size, write=True)
    model.train(was_training)
    return model


def _correct_group(
    model: nn.Module, b: int, group_name: str, layer_name: str, keep: torch.Tensor,
    cache: torch.Tensor, kwargs: dict, batch_size: int, options: dict,
) -> None:
    """Collects the layer's inputs on ``cache``, corrects it to the kept units' columns, prunes block ``b``'s group."""
    group = getattr(prunable_blocks(model)[b], group_name)
    layer = getattr(group.module, layer_name)
    slot = next(s for s in group.slots if s.path == f"{layer_name}.weight")
    corrector = ColumnCorrector(layer, name=f"blocks.{b}.{layer_name}")
    handle = corrector.attach()
    try:
        _run(model.blocks[b], cache, kwargs, batch_size, write=False)
    finally:
        handle.remove()
    # prune_ slices the columns in the same order as group.index (keep is sorted by validate).
    weight = corrector.correct(group.index(keep, slot), **options)
    del corrector  # frees the Hessian before the next layer's is allocated
    selection = Subnet.full(model)
    getattr(selection, group_name)[b] = keep
    prune_(model, selection)
    layer.weight.copy_(weight)


def _run(block: nn.Module, cache: torch.Tensor, kwargs: dict, batch_size: int, write: bool) -> None:
    """Runs ``block`` over ``cache`` in batches; with ``write`` its outputs replace ``cache`` in place."""
    for i in range(0, len(cache), batch_size):
        out = block(cache[i:i + batch_size], **kwargs)
        if write:
            cache[i:i + batch_size] = out
