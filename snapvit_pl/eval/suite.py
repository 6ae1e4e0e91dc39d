"""The evaluation of one (dense or pruned) model: frozen-feature accuracies, segmentation, size and speed.

:func:`evaluate_model` is the one evaluation path: ``prune.py`` (every extracted model),
``python -m snapvit_pl.evaluate``, the Python API and the benchmarks all call it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
from torch import nn

from ..device import autocast_context, resolve_device
from ..errors import ConfigError
from ..ranges import PositiveInt, check_fields
from ..models.cost import count_flops, count_params, input_shape, macs
from .features import extract_features
from .knn import knn_classify
from .linear_probe import linear_probe
from .seg_probe import seg_probe
from .throughput import REPEATS, measure_throughput

#: Every metric :func:`evaluate_model` knows, and those the ``evaluate`` command runs by default.
METRICS = ("knn", "linear", "head", "seg", "throughput")
DEFAULT_METRICS = ("knn", "linear", "head", "throughput")
CLASSIFICATION_METRICS = ("knn", "linear", "head")
#: Result key of the measured throughput (images per second).
THROUGHPUT_KEY = "throughput_images_per_s"
#: Result keys of the accuracies (fractions in [0, 1]), in reporting order.
ACCURACY_KEYS = ("knn_top1", "knn_top5", "linear_top1", "head_top1", "seg_miou", "seg_pixel_accuracy")


@dataclass
class EvaluationSettings:
    """How a (dense or pruned) model is evaluated: which metrics, on how many images.

    Args:
        metrics: any of ``knn``, ``linear``, ``head`` (own classifier, no retraining), ``seg`` (linear probe on
            patch tokens, on the segmentation data: ``seg_data``), ``throughput``; empty: no evaluation.
        train_samples: class-balanced subset of the train split used as k-NN memory / probe train set (None: all).
        val_samples: class-balanced subset of the val split scored (None: all).
        batch_size: feature-extraction batch size.
        knn_k: neighbours of the weighted k-NN (DINO: 20).
        seg_train_samples: segmentation probe train images (None: all).
        seg_val_samples: segmentation images scored (None: all).
        seg_epochs: segmentation probe training epochs.
        throughput_batch_size: batch size of the throughput measurement.
        throughput_repeats: timed forwards of the throughput measurement (their median is kept).
    """

    metrics: list[str] = field(default_factory=lambda: ["knn"])
    train_samples: Optional[PositiveInt] = 5000
    val_samples: Optional[PositiveInt] = 2000
    batch_size: PositiveInt = 256
    knn_k: PositiveInt = 20
    seg_train_samples: Optional[PositiveInt] = 500
    seg_val_samples: Optional[PositiveInt] = 200
    seg_epochs: PositiveInt = 20
    throughput_batch_size: PositiveInt = 64
    throughput_repeats: PositiveInt = REPEATS

    def __post_init__(self) -> None:
        self.metrics = parse_metrics(self.metrics) if self.metrics else []
        check_fields(self, "evaluation")  # (a null number of samples: the whole split)


def check_classes(num_classes: Optional[int], metrics: Sequence[str], source: str = "the data") -> None:
    """Refuse k-NN and linear-probe accuracy on fewer than two classes: every prediction would be right (and the
    probe cannot be built).

    Raises:
        ConfigError: naming the metrics and the data.
    """
    needs = [m for m in ("knn", "linear") if m in metrics]
    if needs and num_classes is not None and num_classes < 2:
        raise ConfigError(f"evaluation.metrics {needs}: {source} has {num_classes} class{'es' if num_classes != 1 else ''}"
                          f"; k-NN and linear-probe accuracy need labeled images of at least 2 classes; give such data, "
                          f"or leave {' and '.join(needs)} out of --evaluation.metrics")


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
        dataset: the classification data's name (``fashion_mnist``, ``folder``, ...), for the record.
    """

    train: Optional[Iterable] = None
    val: Optional[Iterable] = None
    seg_train: Optional[Iterable] = None
    seg_val: Optional[Iterable] = None
    seg_num_classes: int = 0
    seg_ignore_index: int = 255
    num_classes: Optional[int] = None
    dataset: Optional[str] = None

    @classmethod
    def from_datamodule(cls, datamodule: Any, settings: EvaluationSettings, seg_datamodule: Any = None,
                        cache: bool = False) -> "EvalData":
        """The data ``settings.metrics`` need from configured DataModules: seeded class-balanced subsets of the
        classification train split (k-NN memory, probe training set) and val split (scored), and of the
        segmentation splits; ``None`` sizes mean the whole split (not the DataModule's ``max_samples``, which
        sizes the pruning data). ``cache``: decode every batch once and keep it (for evaluating several models).

        Raises:
            ConfigError: ``seg`` without segmentation data.
        """
        keep = list if cache else (lambda loader: loader)
        data = cls(dataset=getattr(datamodule, "source", None))

        def loader(dm: Any, split: str, samples: Optional[int]):
            size = len(dm.base_dataset(split)) if samples is None else samples
            return keep(dm.labeled_dataloader(split, size, settings.batch_size))

        if set(CLASSIFICATION_METRICS) & set(settings.metrics):
            data.train = loader(datamodule, "train", settings.train_samples)
            data.val = loader(datamodule, "val", settings.val_samples)
            data.num_classes = getattr(datamodule, "num_classes", None)
            check_classes(data.num_classes, settings.metrics, f"{getattr(datamodule, 'root', 'the data')}")
        if "seg" in settings.metrics:
            if seg_datamodule is None:
                raise ConfigError("evaluation.metrics 'seg' needs segmentation data (seg_data: a SegmentationDataModule)")
            data.seg_train = loader(seg_datamodule, "train", settings.seg_train_samples)
            data.seg_val = loader(seg_datamodule, "val", settings.seg_val_samples)
            data.seg_num_classes, data.seg_ignore_index = seg_datamodule.num_classes, seg_datamodule.ignore_index
        return data


def evaluate_model(
    model: nn.Module,
    data: EvalData,
    settings: Optional[EvaluationSettings] = None,
    device: str | torch.device | None = None,
    log: Optional[Callable[[str], None]] = None,
    count_cost: bool = True,
) -> dict[str, Any]:
    """Params, FLOPs and the requested metrics of one model (features extracted once per data set).

    Args:
        model: a timm ViT (dense or pruned).
        data: the labeled batches (see :class:`EvalData`).
        settings: the metrics and their parameters (default :class:`EvaluationSettings`).
        device: where to run (default: CUDA if available).
        log: receives one line per finished part.
        count_cost: include ``params``, ``flops`` and ``macs`` (one image; ``COST_CONVENTION``).

    Returns:
        a flat dict: ``params``, ``flops``, then e.g. ``knn_top1``, ``knn_top5``, ``linear_top1``,
        ``head_top1``, ``seg_miou``, ``seg_pixel_accuracy``, ``throughput_images_per_s`` (fractions,
        images/s), ``skipped`` (metric -> reason) and ``timings_s`` (stage -> seconds).
    """
    settings = settings or EvaluationSettings()
    metrics = settings.metrics
    device = resolve_device(device)
    log = log or (lambda message: None)
    model.eval()
    result: dict[str, Any] = {}
    if count_cost:
        flops = count_flops(model)
        result = {"params": count_params(model), "flops": flops, "macs": macs(flops)}
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
        result.update(evaluate_classification(model, data.train, data.val, classification, knn_k=settings.knn_k,
                                              device=device))
        timings["classification"] = time.perf_counter() - started
        log(f"{'+'.join(classification)}: {timings['classification']:.1f}s")
    if "seg" in metrics:
        started = time.perf_counter()
        result.update(evaluate_segmentation(model, data.seg_train, data.seg_val, data.seg_num_classes,
                                            data.seg_ignore_index, settings.seg_epochs, device))
        timings["seg"] = time.perf_counter() - started
        log(f"seg: {timings['seg']:.1f}s")
    if "throughput" in metrics:
        started = time.perf_counter()
        batch, repeats = settings.throughput_batch_size, settings.throughput_repeats
        measured = measure_throughput(model, input_shape(model), batch, warmup=max(1, repeats // 4), repeats=repeats,
                                      device=device)
        result.update({THROUGHPUT_KEY: measured.images_per_second, "throughput_batch_size": batch,
                       "throughput_device": measured.device})
        if measured.peak_memory_bytes is not None:
            result["peak_memory_mb"] = measured.peak_memory_bytes / 2**20
        timings["throughput"] = time.perf_counter() - started
        log(f"throughput: {measured.images_per_second:.0f} images/s ({timings['throughput']:.1f}s)")
    if skipped:
        result["skipped"] = skipped
    result["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
    return result
