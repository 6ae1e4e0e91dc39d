"""Parameter and FLOP counts of dense and pruned models."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .modes import eval_mode, frozen, manual_attention


#: How the project counts compute. ``flops``: floating-point operations per image as ``torch.utils.flop_counter``
#: counts them, 2 per multiply-accumulate; ``macs``: multiply-accumulates per image, what papers (SnapViT, DeiT,
#: timm's tables) call "FLOPs": DINO ViT-B/16 at 224 px is 35.1 G FLOPs = 17.6 G MACs.
COST_CONVENTION = {
    "flops": "floating-point operations per image, 2 per multiply-accumulate (torch.utils.flop_counter)",
    "macs": "multiply-accumulates per image (= flops / 2; what papers, SnapViT included, call FLOPs)",
}
FLOPS_PER_MAC = 2


def macs(flops: float) -> int:
    """Multiply-accumulates of a FLOP count (:data:`COST_CONVENTION`)."""
    return int(round(flops / FLOPS_PER_MAC))


def count_params(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (all, or only those with ``requires_grad``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def input_shape(model: nn.Module) -> tuple[int, int, int]:
    """(C, H, W) the model expects, from its timm pretrained config or patch embedding."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    in_chans = model.patch_embed.proj.in_channels if hasattr(model, "patch_embed") else 3
    img_size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if img_size is not None:
        return (in_chans, int(img_size[0]), int(img_size[1]))
    return tuple(cfg.get("input_size", (in_chans, 224, 224)))  # type: ignore[return-value]


def check_images(model: nn.Module, images: torch.Tensor, what: str = "the images") -> None:
    """Refuse images the model cannot take (``DataError`` naming both shapes): ``[..., C, H, W]`` with the model's
    channel count, and its input size unless its patch embedding takes any size.

    Args:
        model: a timm ViT.
        images: ``[B, C, H, W]`` or multi-crop ``[B, V, C, H, W]``.
        what: how the message names the images.
    """
    from ..errors import DataError

    want = input_shape(model)
    if not isinstance(images, torch.Tensor) or images.dim() not in (4, 5):
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise DataError(f"{what} must be a [B, C, H, W] (or multi-crop [B, V, C, H, W]) tensor, got {shape}")
    patch = getattr(model, "patch_embed", None)
    any_size = getattr(patch, "dynamic_img_size", False) or not getattr(patch, "strict_img_size", True)
    got = tuple(images.shape[-3:])
    if got[0] != want[0] or (not any_size and got[1:] != tuple(want[1:])):
        raise DataError(f"{what} are {'x'.join(map(str, got))} (channels x height x width) but the model takes "
                        f"{'x'.join(map(str, want))}; resize and normalise them with the model's data config "
                        "(timm.data.resolve_data_config(model=model) and timm.data.create_transform)")
    if not images.is_floating_point():
        raise DataError(f"{what} are {images.dtype}; the model takes float images normalised with its mean and std")
    weights = next((p.dtype for p in model.parameters() if p.is_floating_point()), images.dtype)
    if images.dtype != weights:
        raise DataError(f"{what} are {images.dtype} but the model's weights {weights}; give images of the model's "
                        f"dtype (images.to({weights})), or a model of theirs (model.to({images.dtype}))")


@torch.no_grad()
def flop_counts(model: nn.Module, shape: Sequence[int] | None = None) -> tuple[int, dict[str, int]]:
    """Total FLOPs of one forward pass on one image of ``shape`` (C, H, W), and FLOPs per module name.

    Counted by ``torch.utils.flop_counter`` with attention on the manual path (the CPU SDPA
    kernels are not registered with the counter); a multiply-add counts as 2 FLOPs. The model's
    train/eval mode and its parameters' ``requires_grad`` flags are left as they were.
    """
    shape = tuple(shape) if shape is not None else input_shape(model)
    param = next(model.parameters())
    x = torch.zeros(1, *shape, device=param.device, dtype=param.dtype)
    with eval_mode(model), frozen(model), manual_attention(model), FlopCounterMode(display=False) as counter:
        model(x)
    per_module = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    return int(counter.get_total_flops()), per_module


def count_flops(model: nn.Module, shape: Sequence[int] | None = None) -> int:
    """FLOPs of one forward pass on a single image (see :func:`flop_counts`)."""
    return flop_counts(model, shape)[0]
