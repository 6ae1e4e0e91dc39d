"""One call that evaluates a (dense or pruned) classifier backbone on frozen features."""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import nn

from .features import autocast_context, extract_features, resolve_device
from .knn import knn_classify
from .linear_probe import linear_probe
from .seg_probe import seg_probe
from .throughput import measure_throughput

METRICS = ("knn", "linear", "head", "throughput")


@torch.inference_mode()
def head_accuracy(model: nn.Module, loader: Iterable, device: torch.device, precision: str = "auto") -> float:
    """Top-1 of the model's own classifier head, without retraining (pruned or not)."""
    correct = total = 0
    model.to(device).eval()
    for images, labels in loader:
        with autocast_context(device, precision):
            logits = model(images.to(device))
        correct += int((logits.argmax(dim=1).cpu() == labels).sum())
        total += len(labels)
    return correct / max(total, 1)


def evaluate_classification(
    model: nn.Module,
    train_loader: Iterable,
    val_loader: Iterable,
    metrics: Sequence[str] = ("knn",),
    knn_k: int = 20,
    throughput_batch_size: int = 64,
    knn_temperature: float = 0.07,
    device: str | torch.device | None = None,
    progress: bool = False,
) -> dict[str, float]:
    """Frozen-feature metrics of ``model``: weighted k-NN, linear probe, and its own head.

    Features are extracted once and shared by k-NN and the linear probe. ``head`` is skipped
    for models without a classifier (``num_classes == 0``).

    Args:
        model: a timm ViT (dense or pruned).
        train_loader: labeled (images, labels) batches used as the k-NN memory / probe train set.
        val_loader: labeled batches to score.
        metrics: any of ``knn``, ``linear``, ``head``, ``throughput``.
        knn_k: neighbours of the weighted k-NN (DINO: 20).
        knn_temperature: temperature of its votes (DINO: 0.07).
        throughput_batch_size: batch of the measured throughput (images/s, median of 20 forwards).
        device: where to run (default: CUDA if available).
        progress: show progress bars.

    Returns:
        e.g. ``{"knn_top1": 0.81, "linear_top1": 0.84, "head_top1": 0.86, "images_per_s": 950.0}``
        (accuracies as fractions).
    """
    unknown = set(metrics) - set(METRICS)
    if unknown:
        raise ValueError(f"unknown metrics {sorted(unknown)}; choose from {list(METRICS)}")
    device = resolve_device(device)
    results: dict[str, float] = {}
    if {"knn", "linear"} & set(metrics):
        train = extract_features(model, train_loader, device=device, progress=progress, description="train features")
        val = extract_features(model, val_loader, device=device, progress=progress, description="val features")
        if "knn" in metrics:
            results.update({f"knn_{k}": v for k, v in knn_classify(
                train.embeddings.to(device), train.targets, val.embeddings, val.targets, k=knn_k, temperature=knn_temperature
            ).items()})
        if "linear" in metrics:
            results["linear_top1"] = linear_probe(train.embeddings, train.targets, val.embeddings, val.targets).test_accuracy
    if "head" in metrics and getattr(model, "num_classes", 0):
        results["head_top1"] = head_accuracy(model, val_loader, device)
    if "throughput" in metrics:
        from ..models.cost import input_shape

        measured = measure_throughput(model, input_shape(model), throughput_batch_size, device=device)
        results["images_per_s"] = measured.images_per_second
        if measured.peak_memory_bytes is not None:
            results["peak_memory_mb"] = measured.peak_memory_bytes / 2**20
    return results


def evaluate_segmentation(
    model: nn.Module,
    train_loader: Iterable,
    val_loader: Iterable,
    num_classes: int,
    ignore_index: int = 255,
    epochs: int = 20,
    device: str | torch.device | None = None,
    progress: bool = False,
) -> dict[str, float]:
    """Linear segmentation probe (1x1 conv) on the model's frozen patch tokens.

    Patch tokens of both splits are extracted once (prefix tokens dropped), then a probe is
    trained on train and scored on val (:func:`snapvit_pl.eval.seg_probe`).

    Args:
        model: a timm ViT (dense or pruned).
        train_loader, val_loader: ``(images, masks [B, H, W])`` batches.
        num_classes: number of classes (``ignore_index`` excluded).
        ignore_index: mask value left out of the loss and the metrics.
        epochs: probe training epochs.
        device: where to run (default: CUDA if available).
        progress: show progress bars.

    Returns:
        ``{"seg_miou": ..., "seg_pixel_accuracy": ...}`` (fractions).
    """
    device = resolve_device(device)
    train = extract_features(model, train_loader, embeddings=False, patch_tokens=True, device=device,
                             progress=progress, description="train patch tokens")
    val = extract_features(model, val_loader, embeddings=False, patch_tokens=True, device=device,
                           progress=progress, description="val patch tokens")
    result = seg_probe(train.patch_tokens, train.targets, val.patch_tokens, val.targets, num_classes, train.grid_size,
                       ignore_index=ignore_index, epochs=epochs, device=device)
    return {"seg_miou": result.miou, "seg_pixel_accuracy": result.pixel_accuracy}
