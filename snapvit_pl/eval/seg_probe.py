"""Linear segmentation probe (1x1 conv) on frozen patch features, scored by mIoU."""

from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex

from ..device import resolve_device


def tokens_to_feature_map(features: Tensor, grid_size: Optional[tuple[int, int]] = None) -> Tensor:
    """Return [N, C, h, w] feature maps from maps as-is or from tokens [N, h*w, C] + grid size."""
    if features.dim() == 4:
        return features
    if grid_size is None:
        raise ValueError("grid_size is required for token inputs [N, h*w, C]")
    n, num_tokens, channels = features.shape
    if num_tokens != grid_size[0] * grid_size[1]:
        raise ValueError(f"{num_tokens} tokens do not fill a {tuple(grid_size)} grid")
    return features.transpose(1, 2).reshape(n, channels, *grid_size)


class SegmentationHead(nn.Module):
    """Per-channel standardisation followed by a 1x1 conv, upsampled bilinearly to a size."""

    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        self.register_buffer("feature_mean", torch.zeros(1, in_channels, 1, 1))
        self.register_buffer("feature_std", torch.ones(1, in_channels, 1, 1))
        self.classifier = nn.Conv2d(in_channels, num_classes, kernel_size=1)

    @torch.no_grad()
    def set_feature_statistics(self, feature_maps: Tensor) -> None:
        """Standardise inputs with per-channel statistics of these (training) maps."""
        self.feature_mean.copy_(feature_maps.mean(dim=(0, 2, 3), keepdim=True))
        self.feature_std.copy_(feature_maps.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6))

    def forward(self, feature_maps: Tensor, output_size: tuple[int, int]) -> Tensor:
        logits = self.classifier((feature_maps - self.feature_mean) / self.feature_std)
        return F.interpolate(logits, size=output_size, mode="bilinear", align_corners=False)


@dataclass
class SegProbeResult:
    """Outcome of `seg_probe`: macro mIoU and pixel accuracy (fractions), and the head."""

    miou: float
    pixel_accuracy: float
    head: SegmentationHead


def seg_probe(
    train_features: Tensor,
    train_masks: Tensor,
    test_features: Tensor,
    test_masks: Tensor,
    num_classes: int,
    grid_size: Optional[tuple[int, int]] = None,
    ignore_index: int = 255,
    epochs: int = 20,
    lr: float = 1e-2,
    weight_decay: float = 0.0,
    batch_size: int = 16,
    seed: int = 0,
    device: Union[str, torch.device, None] = None,
) -> SegProbeResult:
    """Train a linear segmentation head on frozen features and score it on a test set.

    Logits are upsampled to the mask size and trained with cross-entropy ignoring
    ignore_index (AdamW, cosine schedule over all steps). mIoU is torchmetrics'
    MulticlassJaccardIndex(average="macro"); classes absent from both prediction and target
    are left out of the mean.

    Args:
        train_features, test_features: [N, C, h, w] maps or [N, h*w, C] tokens (+ grid_size).
        train_masks, test_masks: [N, H, W] integer masks.
        num_classes: number of classes (ignore_index excluded).
        grid_size: (h, w) patch grid, required for token inputs.
        ignore_index: mask value excluded from loss and metrics.
        epochs: passes over the training set.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        batch_size: images per step.
        seed: seed of the head initialisation and the shuffling.
        device: where to train (default: CUDA if available).
    """
    device = resolve_device(device)
    train_maps = tokens_to_feature_map(train_features, grid_size).float()
    test_maps = tokens_to_feature_map(test_features, grid_size).float()
    train_masks, test_masks = train_masks.long(), test_masks.long()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = SegmentationHead(train_maps.shape[1], num_classes)
    head.set_feature_statistics(train_maps)
    head.to(device).train()
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = -(-train_maps.shape[0] // batch_size)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * steps_per_epoch)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(train_maps.shape[0], generator=generator)
        for start in range(0, train_maps.shape[0], batch_size):
            batch = order[start : start + batch_size]
            masks = train_masks[batch].to(device)
            logits = head(train_maps[batch].to(device), masks.shape[-2:])
            loss = F.cross_entropy(logits, masks, ignore_index=ignore_index)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()

    head.eval()
    jaccard = MulticlassJaccardIndex(num_classes, average="macro", ignore_index=ignore_index).to(device)
    pixel_accuracy = MulticlassAccuracy(num_classes, average="micro", ignore_index=ignore_index).to(device)
    with torch.no_grad():
        for start in range(0, test_maps.shape[0], batch_size):
            masks = test_masks[start : start + batch_size].to(device)
            predictions = head(test_maps[start : start + batch_size].to(device), masks.shape[-2:]).argmax(1)
            jaccard.update(predictions, masks)
            pixel_accuracy.update(predictions, masks)
    return SegProbeResult(float(jaccard.compute()), float(pixel_accuracy.compute()), head.cpu())
