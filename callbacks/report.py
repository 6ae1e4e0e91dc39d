"""Report stage: ``report.json`` + ``report.md`` in the run directory and a summary table (``teardown``)."""
from __future__ import annotations

import pytorch_lightning as pl

from snapvit_pl.lightning.pruning_module import PruningModule, StageCallback


class ReportCallback(StageCallback):
    """Writes the run's report once its other stages are done (:meth:`Pipeline.report`, rank 0; also to the
    logger). A run that failed or was interrupted before its scores exist writes none."""

    stage = "report"

    def teardown(self, trainer: pl.Trainer, pl_module: PruningModule, stage: str) -> None:
        pipeline = pl_module.pipeline
        if stage == "fit" and pipeline.completed("splits") and all(
                pipeline.completed(s) for s in pipeline.stages if s not in ("report",)):
            self._run(pl_module)
