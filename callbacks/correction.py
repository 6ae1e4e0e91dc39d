"""SparseGPT-style correction of every extracted model (runs inside the export stage)."""
from __future__ import annotations

import copy
import time
from typing import Optional

import pytorch_lightning as pl
import torch

from snapvit_pl.correction import correct_and_prune
from snapvit_pl.correction.sparsegpt import Damping
from snapvit_pl.lightning.pruning_module import ExtractedModel, PruningModule


class CorrectionCallback(pl.Callback):
    """Replaces each extracted model by the dense backbone corrected and pruned to the same subnet.

    Registers an extract hook (priority 10: before evaluation and export). Calibration images are
    the DataModule's plain unlabeled views, loaded once. Runs on every rank (deterministic), so all
    ranks hold the same model. Holds no state to resume: the hook reruns from the dense weights.

    Args:
        num_samples: calibration images (seeded class-balanced subset of the train split).
        batch_size: images per forward pass.
        damping, damp_fraction, block_size: see :meth:`ColumnCorrector.correct`.
    """

    def __init__(self, num_samples: int = 256, batch_size: int = 64, damping: Damping = "mean",
                 damp_fraction: float = 0.01, block_size: int = 128):
        self.num_samples, self.batch_size = num_samples, batch_size
        self.options = dict(damping=damping, damp_fraction=damp_fraction, block_size=block_size)
        self._images: Optional[torch.Tensor] = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        pl_module.register_extract_hook(self._correct, priority=10)

    def _calibration_images(self, pl_module: PruningModule) -> torch.Tensor:
        if self._images is None:
            self._images = pl_module.trainer.datamodule.unlabeled_images(self.num_samples, self.batch_size)
        self._images = self._images.to(next(pl_module.backbone.parameters()).device)
        return self._images

    def _correct(self, pl_module: PruningModule, extracted: ExtractedModel) -> None:
        started = time.perf_counter()
        images = self._calibration_images(pl_module)
        extracted.model = None  # free the uncorrected copy before building the corrected one
        extracted.model = correct_and_prune(
            copy.deepcopy(pl_module.backbone), extracted.subnet, images, batch_size=self.batch_size, **self.options)
        seconds = time.perf_counter() - started
        extracted.info["correction"] = {"num_samples": len(images), "damping": self.options["damping"], "seconds": seconds}
        timings = pl_module.summary["timings"]
        timings["correction_s"] = timings.get("correction_s", 0.0) + seconds
