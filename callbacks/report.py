"""Report stage: ``report.json`` + ``report.md`` in the run directory and a summary table (``teardown``)."""
from __future__ import annotations

import pytorch_lightning as pl

from snapvit_pl.lightning.pruning_module import PruningModule


class ReportCallback(pl.Callback):
    """Writes the run's report once the export is done (:meth:`Pipeline.report`, rank 0; also to the logger).
    A run that failed or was interrupted before its export writes none."""

    def teardown(self, trainer: pl.Trainer, pl_module: PruningModule, stage: str) -> None:
        if stage == "fit" and pl_module.pipeline is not None and pl_module.pipeline.completed("export"):
            pl_module.pipeline.report()
