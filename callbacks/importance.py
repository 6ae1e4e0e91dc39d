"""Importance stage: every training batch goes through the scorer; at epoch end the scores are complete."""
from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

from snapvit_pl.lightning.pruning_module import PruningModule, StageCallback
from snapvit_pl.pipeline.data_source import use_trainer_data


class ImportanceCallback(StageCallback):
    """Feeds every training batch to the pipeline's scorer; at epoch end its statistics are summed across ranks
    and, after the scorer's last pass (one epoch per pass: a re-linearised scorer makes several), the local scores
    recorded (:meth:`Pipeline.finish_importance`, which also saves the run's progress).

    A resumed run whose scores were complete skips the data pass (the module ends the epoch at once). Without
    this callback nothing is scored: the later stages refuse to run.
    """

    stage = "importance"

    def setup(self, trainer: pl.Trainer, pl_module: PruningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        use_trainer_data(pl_module.pipeline, trainer.datamodule, trainer.global_rank, trainer.world_size)

    def on_train_start(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        pl_module.pipeline.start_importance(trainer.num_training_batches)
        trainer.fit_loop.max_epochs = max(1, pl_module.pipeline.importance_passes)  # one epoch per pass

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: PruningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        for key, value in pl_module.pipeline.importance_step(batch).items():  # the scorer's loss, or what it measures
            pl_module.log(f"importance/{key}", value, on_step=True, on_epoch=False)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        pl_module.pipeline.finish_importance()
