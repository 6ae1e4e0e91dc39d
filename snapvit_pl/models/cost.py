"""Parameter and FLOP counts of dense and pruned models."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def count_params(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (all, or only those with ``requires_grad``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


@contextmanager
def manual_attention(model: nn.Module) -> Iterator[nn.Module]:
    """Temporarily switch every timm attention module to its explicit (non-SDPA) path."""
    saved = [(m, m.fused_attn) for m in model.modules() if hasattr(m, "fused_attn")]
    try:
        for module, _ in saved:
            module.fused_attn = False
        yield model
    finally:
        for module, fused in saved:
            module.fused_attn = fused


def input_shape(model: nn.Module) -> tuple[int, int, int]:
    """(C, H, W) the model expects, from its timm pretrained config or patch embedding."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    in_chans = model.patch_embed.proj.in_channels if hasattr(model, "patch_embed") else 3
    img_size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if img_size is not None:
        return (in_chans, int(img_size[0]), int(img_size[1]))
    return tuple(cfg.get("input_size", (in_chans, 224, 224)))  # type: ignore[return-value]


@torch.no_grad()
def flop_counts(model: nn.Module, shape: Sequence[int] | None = None) -> tuple[int, dict[str, int]]:
    """Total FLOPs of one forward pass on one image of ``shape`` (C, H, W), and FLOPs per module name.

    Counted by ``torch.utils.flop_counter`` with attention on the manual path (the CPU SDPA
    kernels are not registered with the counter); a multiply-add counts as 2 FLOPs.
    """
    shape = tuple(shape) if shape is not None else input_shape(model)
    param = next(model.parameters())
    x = torch.zeros(1, *shape, device=param.device, dtype=param.dtype)
    was_training = model.training
    model.eval()
    try:
        with manual_attention(model), FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        model.train(was_training)
    per_module = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    return int(counter.get_total_flops()), per_module


def count_flops(model: nn.Module, shape: Sequence[int] | None = None) -> int:
    """FLOPs of one forward pass on a single image (see :func:`flop_counts`)."""
    return flop_counts(model, shape)[0]
