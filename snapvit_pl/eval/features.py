"""One-pass feature extraction (pooled embeddings and/or patch tokens) from timm ViTs."""

from dataclasses import dataclass
from typing import Iterable, Optional, Union

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..device import autocast_context, resolve_device
from ..models.modes import eval_mode


def patch_grid_size(model: nn.Module, image_size: tuple[int, int]) -> tuple[int, int]:
    """Patch grid (h, w) of a timm ViT for an input size (handles dynamic size and padding)."""
    patch_embed = model.patch_embed
    if hasattr(patch_embed, "dynamic_feat_size"):
        return tuple(patch_embed.dynamic_feat_size(image_size))
    return tuple(patch_embed.grid_size)


@dataclass
class ExtractedFeatures:
    """Features of a whole dataloader, on CPU in float32.

    Attributes:
        embeddings: pooled pre-logits embeddings [N, C] (None if not requested).
        patch_tokens: patch tokens without prefix tokens [N, h*w, C] (None if not requested).
        targets: labels [N] or masks [N, H, W], as the dataloader yields them.
        grid_size: patch grid (h, w) of patch_tokens (None if not requested).
        logits: the model's own classifier outputs [N, num_classes] (None if not requested).
    """

    embeddings: Optional[Tensor]
    patch_tokens: Optional[Tensor]
    targets: Tensor
    grid_size: Optional[tuple[int, int]]
    logits: Optional[Tensor] = None


@torch.inference_mode()
def extract_features(
    model: nn.Module,
    dataloader: Iterable,
    embeddings: bool = True,
    patch_tokens: bool = False,
    logits: bool = False,
    device: Union[str, torch.device, None] = None,
    precision: str = "auto",
    progress: bool = False,
    description: str = "Extracting features",
) -> ExtractedFeatures:
    """Run a timm ViT once over a dataloader and collect its features.

    Pooled embeddings are model.forward_head(model.forward_features(x), pre_logits=True);
    patch tokens are forward_features' output without the model.num_prefix_tokens prefix
    (class/register/distillation) tokens; logits are model.forward_head(features), what the model's
    own forward returns, from the same pass. The model is moved to `device` and put in eval
    mode for the pass; its previous train/eval mode is restored afterwards.

    Args:
        model: timm VisionTransformer-like model.
        dataloader: yields (images, labels) or (images, masks).
        embeddings: collect pooled embeddings.
        patch_tokens: collect patch tokens.
        logits: collect the outputs of the model's own head.
        device: where to run (default: CUDA if available).
        precision: see `autocast_context`.
        progress: show a tqdm progress bar.
        description: progress bar label.
    """
    if not (embeddings or patch_tokens or logits):
        raise ValueError("request embeddings, patch_tokens or logits")
    device = resolve_device(device)
    model.to(device)
    pooled, tokens, outputs, targets, grid_size = [], [], [], [], None
    with eval_mode(model):
        for images, batch_targets in tqdm(dataloader, desc=description, disable=not progress):
            images = images.to(device, non_blocking=True)
            with autocast_context(device, precision):
                features = model.forward_features(images)
                if embeddings:
                    pooled.append(model.forward_head(features, pre_logits=True).float().cpu())
                if logits:
                    outputs.append(model.forward_head(features).float().cpu())
            if patch_tokens:
                grid_size = patch_grid_size(model, tuple(images.shape[-2:]))
                patches = features[:, model.num_prefix_tokens :]
                if patches.shape[1] != grid_size[0] * grid_size[1]:
                    raise ValueError(f"{patches.shape[1]} patch tokens do not fill a {grid_size} grid")
                tokens.append(patches.float().cpu())
            targets.append(torch.as_tensor(batch_targets).cpu())
    return ExtractedFeatures(
        embeddings=torch.cat(pooled) if embeddings else None,
        patch_tokens=torch.cat(tokens) if patch_tokens else None,
        targets=torch.cat(targets),
        grid_size=grid_size,
        logits=torch.cat(outputs) if logits else None,
    )
