"""One call that evaluates a (dense or pruned) classifier backbone on frozen features."""
from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import nn

from .features import autocast_context, extract_features, resolve_device
from .knn import knn_classify
from .linear_probe import linear_probe

METRICS = ("knn", "linear", "head")


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
        metrics: any of ``knn``, ``linear``, ``head``.
        knn_k: neighbours of the weighted k-NN (DINO: 20).
        knn_temperature: temperature of its votes (DINO: 0.07).
        device: where to run (default: CUDA if available).
        progress: show progress bars.

    Returns:
        e.g. ``{"knn_top1": 0.81, "linear_top1": 0.84, "head_top1": 0.86}`` (fractions).
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
    return results
