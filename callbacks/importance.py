"""Importance stage: every training batch goes through the scorer; at epoch end the scores are complete."""
from __future__ import annotations

import time
from typing import Any, Optional

import pytorch_lightning as pl

from snapvit_pl.lightning.pruning_module import PruningModule
from snapvit_pl.lightning.resume import save_resume_state
from snapvit_pl.pipeline import (
    ImportanceSettings, finish_importance_stage, prepare_pruning_data, record_importance, start_importance,
)
from snapvit_pl.scoring import LocalScores


class ImportanceCallback(pl.Callback):
    """Feeds every training batch to the scorer; at epoch end sums its statistics across ranks.

    Resumable: once the scores are complete they are saved in the run's resume state, and a
    resumed run skips the data pass.

    Args:
        settings: the scorer and the keep ratios.
    """

    resumable = True

    def __init__(self, settings: Optional[ImportanceSettings] = None):
        self.settings = settings or ImportanceSettings()
        self._local: Optional[LocalScores] = None  # complete scores: computed, or restored for a resumed run
        self._started = 0.0

    def setup(self, trainer: pl.Trainer, pl_module: PruningModule, stage: str) -> None:
        if trainer.datamodule is not None:
            prepare_pruning_data(trainer.datamodule, pl_module.backbone, self.settings.scorer)

    def on_train_start(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        self._started = time.perf_counter()
        if self._local is not None:
            record_importance(pl_module.state, self.settings, self._local)  # the data pass is skipped
            if trainer.progress_bar_callback is not None:
                trainer.progress_bar_callback.disable()  # no empty "epoch 0, 0 batches" bar for the skipped pass
        else:
            start_importance(self.settings.scorer, pl_module.backbone, pl_module.teacher)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: PruningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._local is None and self.settings.scorer.requires_data:
            loss = self.settings.scorer.update(batch).get("loss")
            if loss is not None:
                pl_module.log("importance/loss", loss, prog_bar=True, on_step=True, on_epoch=False)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        if self._local is not None:
            return
        finish_importance_stage(pl_module.state, self.settings, lambda t: trainer.strategy.reduce(t, reduce_op="sum"))
        pl_module.state.timings.add("scoring", time.perf_counter() - self._started)
        self._local = pl_module.state.local
        save_resume_state(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {"local_scores": self._local.to_dict() if self._local is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        local = state_dict.get("local_scores")
        self._local = LocalScores.from_dict(local) if local is not None else None
