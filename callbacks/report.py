"""Report stage: ``report.json`` + ``report.md`` in the run directory and a summary table (``teardown``)."""
from __future__ import annotations

from typing import Optional

import pytorch_lightning as pl

from snapvit_pl.lightning.logging import log_report
from snapvit_pl.lightning.pruning_module import PruningModule
from snapvit_pl.pipeline import ReportSettings, write_report


class ReportCallback(pl.Callback):
    """Writes the run's report once the export is done (rank 0 only).

    Args:
        settings: what to print.
    """

    def __init__(self, settings: Optional[ReportSettings] = None):
        self.settings = settings or ReportSettings()

    def teardown(self, trainer: pl.Trainer, pl_module: PruningModule, stage: str) -> None:
        state = pl_module.state
        if stage != "fit" or not trainer.is_global_zero or state.dense is None:
            return  # not the end of a finished fit (an interrupted or failed run writes no report)
        state.timings.total_s = state.elapsed()
        state.skipped_files = dict(getattr(trainer.datamodule, "skipped", {}) or {})
        experiment = getattr(trainer.logger, "experiment", None)
        on_figure = (lambda name, fig: experiment.add_figure(f"report/{name}", fig)) if hasattr(experiment, "add_figure") else None
        report = write_report(state, trainer.default_root_dir, self.settings.print_table, self.settings.plots, on_figure)
        if trainer.logger is not None:
            log_report(trainer.logger, report, state)
