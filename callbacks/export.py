"""Export stage: the pruned checkpoints asked for (``on_fit_end``); the budgets are checked at ``on_fit_start``."""
from __future__ import annotations

import pytorch_lightning as pl

from snapvit_pl.lightning.pruning_module import PruningModule


class ExportCallback(pl.Callback):
    """Cuts, corrects (when enabled), evaluates and saves one model per budget (:meth:`Pipeline.export`; under DDP
    each rank takes its share of the models). Before any work (``on_fit_start``) it refuses budgets the configured
    keep ratios cannot reach (:meth:`Pipeline.check`)."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        pl_module.pipeline.check()

    def on_fit_end(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        pl_module.pipeline.export()
