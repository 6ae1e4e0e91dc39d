"""The backbone's output embedding: what SnapViT's self-distillation loss and its fitness compare."""
from __future__ import annotations

import torch
from torch import nn

from ..errors import UnsupportedModelError


def embed(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Pooled pre-logits embedding ``[B, D]`` of a timm ViT, with its heads disabled.

    ``model.forward_head(model.forward_features(images), pre_logits=True)``: the class token,
    average or attention pool (SigLIP ``attn_pool``) after the final norm, before the classifier.
    A distilled DeiT returns the mean of its class and distillation tokens, as timm does.

    Args:
        model: a timm ``VisionTransformer``, ``VisionTransformerDistilled`` or ``Eva``.
        images: ``[B, C, H, W]``.

    Raises:
        UnsupportedModelError: the model lacks timm's ``forward_features``/``forward_head``.
    """
    if not (hasattr(model, "forward_features") and hasattr(model, "forward_head")):
        raise UnsupportedModelError(
            f"{type(model).__name__} has no forward_features/forward_head; pass the bare timm model "
            "(not a DDP or Lightning wrapper)"
        )
    return model.forward_head(model.forward_features(images), pre_logits=True)
