"""Evaluation of the dense model and every extracted model on the labeled data."""
from __future__ import annotations

import time
from typing import Optional, Sequence

import pytorch_lightning as pl

from snapvit_pl.eval.suite import evaluate_classification
from snapvit_pl.lightning.pruning_module import ExtractedModel, PruningModule


class EvaluationCallback(pl.Callback):
    """Frozen-feature metrics (weighted k-NN, linear probe, own head) and throughput, dense and pruned.

    Uses the DataModule's labeled ``train`` split as k-NN memory / probe training set and its
    ``val`` split for scoring. Runs on rank 0 only; the other ranks skip it.

    Args:
        metrics: any of ``knn``, ``linear``, ``head``, ``throughput`` (images/s at batch 64).
        train_samples: class-balanced subset of train used as memory (None: all).
        val_samples: class-balanced subset of val scored (None: all).
        batch_size: feature-extraction batch size.
        knn_k: neighbours of the weighted k-NN (DINO: 20).
    """

    def __init__(self, metrics: Sequence[str] = ("knn",), train_samples: Optional[int] = 5000, val_samples: Optional[int] = 2000,
                 batch_size: int = 256, knn_k: int = 20):
        self.metrics, self.train_samples, self.val_samples = list(metrics), train_samples, val_samples
        self.batch_size, self.knn_k = batch_size, knn_k

    def on_fit_start(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        pl_module.register_extract_hook(self._evaluate_extracted, priority=100)

    def _evaluate(self, trainer: pl.Trainer, model) -> dict[str, float]:
        datamodule = trainer.datamodule
        train = datamodule.labeled_dataloader("train", self.train_samples, self.batch_size)
        val = datamodule.labeled_dataloader("val", self.val_samples, self.batch_size)
        return evaluate_classification(model, train, val, self.metrics, knn_k=self.knn_k, device=trainer.strategy.root_device)

    def _evaluate_dense(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        if "metrics" not in pl_module.summary.setdefault("dense", {}):
            started = time.perf_counter()
            pl_module.summary["dense"]["metrics"] = self._evaluate(trainer, pl_module.backbone)
            pl_module.summary["timings"]["evaluation_s"] = pl_module.summary["timings"].get("evaluation_s", 0.0) + time.perf_counter() - started

    def _evaluate_extracted(self, pl_module: PruningModule, extracted: ExtractedModel) -> None:
        trainer = pl_module.trainer
        if not trainer.is_global_zero:
            return
        self._evaluate_dense(trainer, pl_module)
        started = time.perf_counter()
        extracted.info["metrics"] = self._evaluate(trainer, extracted.model)
        pl_module.summary["timings"]["evaluation_s"] += time.perf_counter() - started

    def on_fit_end(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        if trainer.is_global_zero:
            self._evaluate_dense(trainer, pl_module)
