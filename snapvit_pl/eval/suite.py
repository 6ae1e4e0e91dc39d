"""The evaluation of one (dense or pruned) model: frozen-feature accuracies, segmentation, size and speed.

:func:`evaluate_model` is the one evaluation path: ``prune.py`` (every extracted model),
``python -m snapvit_pl.evaluate``, the Python API and the benchmarks all call it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
from torch import nn

from ..device import autocast_context, resolve_device
from ..errors import ConfigError
from ..models.cost import count_flops, count_params, input_shape
from .features import extract_features
from .knn import knn_classify
from .linear_probe import linear_probe
from .seg_probe import seg_probe
from .throughput import measure_throughput

#: Every metric :func:`evaluate_model` knows, and those the ``evaluate`` command runs by default.
METRICS = ("knn", "linear", "head", "seg", "throughput")
DEFAULT_METRICS = ("knn", "linear", "head", "throughput")
CLASSIFICATION_METRICS = ("knn", "linear", "head")
#: Result key of the measured throughput (images per second).
THROUGHPUT_KEY = "throughput_images_per_s"
#: Result keys of the accuracies (fractions in [0, 1]), in reporting order.
ACCURACY_KEYS = ("knn_top1", "knn_top5", "linear_top1", "head_top1", "seg_miou", "seg_pixel_accuracy")


def parse_metrics(text: str | Sequence[str]) -> list[str]:
    """``"knn,linear"`` (or a list) -> ``["knn", "linear"]``; ``ConfigError`` on an unknown or empty list."""
    items = text.split(",") if isinstance(text, str) else list(text)
    metrics = list(dict.fromkeys(m.strip().lower() for m in items if m.strip()))
    unknown = [m for m in metrics if m not in METRICS]
    if unknown or not metrics:
        raise ConfigError(f"unknown metric(s) {', '.join(unknown) or '(none given)'}; choose from {','.join(METRICS)}")
    return metrics


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
        e.g. ``{"knn_top1": 0.81, "knn_top5": 0.97, "linear_top1": 0.84, "head_top1": 0.86}``
        (accuracies as fractions).
    """
    unknown = set(metrics) - set(CLASSIFICATION_METRICS)
    if unknown:
        raise ConfigError(f"unknown classification metrics {sorted(unknown)}; choose from {list(CLASSIFICATION_METRICS)}")
    device = resolve_device(device)
    results: dict[str, float] = {}
    head = "head" in metrics and bool(getattr(model, "num_classes", 0))
    if {"knn", "linear"} & set(metrics):
        train = extract_features(model, train_loader, device=device, progress=progress, description="train features")
        # the own head's outputs come from the same pass over the val images (the model's forward, one pass less)
        val = extract_features(model, val_loader, logits=head, device=device, progress=progress, description="val features")
        if "knn" in metrics:
            results.update({f"knn_{k}": v for k, v in knn_classify(
                train.embeddings.to(device), train.targets, val.embeddings, val.targets, k=knn_k, temperature=knn_temperature
            ).items()})
        if "linear" in metrics:
            results["linear_top1"] = linear_probe(train.embeddings, train.targets, val.embeddings, val.targets).test_accuracy
        if head:
            results["head_top1"] = int((val.logits.argmax(dim=1) == val.targets).sum()) / max(len(val.targets), 1)
    elif head:
        results["head_top1"] = head_accuracy(model, val_loader, device)
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


@dataclass
class EvalData:
    """Labeled batches an evaluation runs on: any iterables (DataLoaders, or lists of cached batches).

    Attributes:
        train, val: classification ``(images, labels)``: k-NN memory / probe training set, and the scored set.
        seg_train, seg_val: segmentation ``(images, masks)`` for the patch-token probe.
        seg_num_classes: segmentation classes (ignore value excluded).
        seg_ignore_index: mask value left out of the loss and the metrics.
        num_classes: classes of the classification data (the own head is skipped when it has another number).
    """

    train: Optional[Iterable] = None
    val: Optional[Iterable] = None
    seg_train: Optional[Iterable] = None
    seg_val: Optional[Iterable] = None
    seg_num_classes: int = 0
    seg_ignore_index: int = 255
    num_classes: Optional[int] = None

    @classmethod
    def from_datamodule(cls, datamodule: Any, train_samples: Optional[int], val_samples: Optional[int],
                        batch_size: int) -> "EvalData":
        """Classification data from a configured ``ClassificationDataModule``: seeded class-balanced subsets
        of its train split (k-NN memory, probe training set) and its val split (scored); ``None``: the whole
        split (not the DataModule's ``max_samples``, which sizes the pruning data)."""
        def size(split: str, samples: Optional[int]) -> int:
            return len(datamodule.base_dataset(split)) if samples is None else samples

        return cls(train=datamodule.labeled_dataloader("train", size("train", train_samples), batch_size),
                   val=datamodule.labeled_dataloader("val", size("val", val_samples), batch_size),
                   num_classes=getattr(datamodule, "num_classes", None))


def build_data(
    model: nn.Module,
    metrics: Sequence[str],
    source: str = "fashion_mnist",
    root: str = "data",
    train_samples: Optional[int] = 5000,
    val_samples: Optional[int] = 2000,
    batch_size: int = 256,
    seg_source: str = "fashion_mnist",
    seg_root: Optional[str] = None,
    seg_train_samples: Optional[int] = 500,
    seg_val_samples: Optional[int] = 200,
    seed: int = 0,
    num_workers: int = 0,
    cache: bool = False,
) -> EvalData:
    """Seeded, class-balanced evaluation subsets in the model's input format (only those ``metrics`` need).

    Args:
        model: any model of the family evaluated (sets input size, channels, mean/std).
        metrics: subset of :data:`METRICS`.
        source, root: the ``ClassificationDataModule`` source and root.
        train_samples, val_samples: classification subset sizes (None: the whole split).
        batch_size: images per forward.
        seg_source, seg_root: the ``SegmentationDataModule`` source and root (default ``root``).
        seg_train_samples, seg_val_samples: segmentation subset sizes (None: the whole split).
        seed: subset seed.
        num_workers: DataLoader workers.
        cache: decode every batch once and keep it in memory (for evaluating several models).
    """
    from ..data import ClassificationDataModule, SegmentationDataModule

    keep = list if cache else (lambda loader: loader)
    data = EvalData()
    if set(CLASSIFICATION_METRICS) & set(metrics):
        dm = ClassificationDataModule(source=source, root=root, seed=seed, batch_size=batch_size, num_workers=num_workers)
        dm.configure_for_model(model)
        data.train = keep(dm.labeled_dataloader("train", train_samples, batch_size))
        data.val = keep(dm.labeled_dataloader("val", val_samples, batch_size))
        data.num_classes = dm.num_classes
    if "seg" in metrics:
        seg = SegmentationDataModule(source=seg_source, root=seg_root or root, seed=seed, batch_size=batch_size,
                                     num_workers=num_workers)
        seg.configure_for_model(model)
        data.seg_train = keep(seg.labeled_dataloader("train", seg_train_samples, batch_size))
        data.seg_val = keep(seg.labeled_dataloader("val", seg_val_samples, batch_size))
        data.seg_num_classes, data.seg_ignore_index = seg.num_classes, seg.ignore_index
    return data


def evaluate_model(
    model: nn.Module,
    data: EvalData,
    metrics: Sequence[str] = DEFAULT_METRICS,
    knn_k: int = 20,
    seg_epochs: int = 20,
    throughput_batch: int = 64,
    throughput_repeats: int = 20,
    device: str | torch.device | None = None,
    log: Optional[Callable[[str], None]] = None,
    count_cost: bool = True,
) -> dict[str, Any]:
    """Params, FLOPs and the requested metrics of one model (features extracted once per data set).

    Args:
        model: a timm ViT (dense or pruned).
        data: the labeled batches (see :class:`EvalData` and :func:`build_data`).
        metrics: subset of :data:`METRICS`.
        knn_k: neighbours of the weighted k-NN.
        seg_epochs: training epochs of the segmentation probe.
        throughput_batch, throughput_repeats: batch size and timed forwards of the throughput measurement.
        device: where to run (default: CUDA if available).
        log: receives one line per finished part.
        count_cost: include ``params`` and ``flops`` (one image).

    Returns:
        a flat dict: ``params``, ``flops``, then e.g. ``knn_top1``, ``knn_top5``, ``linear_top1``,
        ``head_top1``, ``seg_miou``, ``seg_pixel_accuracy``, ``throughput_images_per_s`` (fractions,
        images/s), ``skipped`` (metric -> reason) and ``timings_s`` (stage -> seconds).
    """
    metrics = parse_metrics(metrics)
    device = resolve_device(device)
    log = log or (lambda message: None)
    model.eval()
    result: dict[str, Any] = {"params": count_params(model), "flops": count_flops(model)} if count_cost else {}
    skipped: dict[str, str] = {}
    timings: dict[str, float] = {}
    classification = [m for m in CLASSIFICATION_METRICS if m in metrics]
    model_classes = getattr(model, "num_classes", 0)
    if "head" in classification and not model_classes:
        classification.remove("head")
        skipped["head"] = "the model has no classifier head (num_classes=0)"
    elif "head" in classification and data.num_classes is not None and model_classes != data.num_classes:
        classification.remove("head")
        skipped["head"] = f"the head has {model_classes} classes but the data set {data.num_classes}"
    if classification:
        started = time.perf_counter()
        result.update(evaluate_classification(model, data.train, data.val, classification, knn_k=knn_k, device=device))
        timings["classification"] = time.perf_counter() - started
        log(f"{'+'.join(classification)}: {timings['classification']:.1f}s")
    if "seg" in metrics:
        started = time.perf_counter()
        result.update(evaluate_segmentation(model, data.seg_train, data.seg_val, data.seg_num_classes,
                                            data.seg_ignore_index, seg_epochs, device))
        timings["seg"] = time.perf_counter() - started
        log(f"seg: {timings['seg']:.1f}s")
    if "throughput" in metrics:
        started = time.perf_counter()
        measured = measure_throughput(model, input_shape(model), throughput_batch, warmup=max(1, throughput_repeats // 4),
                                      repeats=throughput_repeats, device=device)
        result.update({THROUGHPUT_KEY: measured.images_per_second, "throughput_batch_size": throughput_batch,
                       "throughput_device": measured.device})
        if measured.peak_memory_bytes is not None:
            result["peak_memory_mb"] = measured.peak_memory_bytes / 2**20
        timings["throughput"] = time.perf_counter() - started
        log(f"throughput: {measured.images_per_second:.0f} images/s ({timings['throughput']:.1f}s)")
    if skipped:
        result["skipped"] = skipped
    result["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    return result
