"""``torch.export`` of (pruned) timm ViTs: an ExportedProgram with a dynamic batch dimension."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.export import Dim, ExportedProgram

from ..models import input_shape as model_input_shape
from ..models import eval_mode


def example_input(model: nn.Module, shape: Sequence[int], batch_size: int) -> torch.Tensor:
    """A random batch on the model's device, in its dtype."""
    param = next(model.parameters())
    return torch.randn(batch_size, *shape, device=param.device, dtype=param.dtype)


def export_program(model: nn.Module, input_shape: Sequence[int] | None = None) -> ExportedProgram:
    """Export ``model`` (in eval mode) with ``torch.export.export``; the batch size is dynamic.

    Attention keeps the path timm built (fused SDPA by default), which ``torch.export`` supports.
    Save the result with ``torch.export.save`` and run it with ``program.module()(images)``.

    Args:
        model: a (pruned) timm ViT; its train/eval mode is restored.
        input_shape: (C, H, W) of one image; default: what the model expects.
    """
    shape = tuple(input_shape) if input_shape is not None else model_input_shape(model)
    with eval_mode(model):
        return torch.export.export(model, (example_input(model, shape, 2),), dynamic_shapes=({0: Dim("batch", min=1)},))
