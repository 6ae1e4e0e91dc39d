"""timm's forward up to the first block, and each block's extra arguments: for code that runs blocks one by one
(the block-by-block weight correction, the per-block latency table)."""
from __future__ import annotations

from typing import Optional

import torch
from timm.models.eva import Eva
from torch import nn


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
