"""Export stage: the pruned checkpoints asked for (``on_fit_end``); the budgets are checked at ``on_fit_start``."""
from __future__ import annotations

import pytorch_lightning as pl

from snapvit_pl.lightning.pruning_module import PruningModule, StageCallback


class ExportCallback(StageCallback):
    """Cuts, corrects (when enabled), evaluates and saves one model per budget (:meth:`Pipeline.export`; under DDP
    each rank takes its share of the models). Before any work (``on_fit_start``) it refuses budgets the configured
    keep ratios cannot reach (:meth:`Pipeline.check`). Without this callback the run makes the elastic scores
    only."""

    stage = "export"

    def on_fit_start(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        pl_module.pipeline.check()

    def on_fit_end(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        self._run(pl_module)
