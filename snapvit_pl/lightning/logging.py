"""The report's numbers in a Lightning logger (TensorBoard): metrics against model size, an hparams entry."""
from __future__ import annotations

from typing import Any

from ..pipeline.report import logged_metrics
from ..pipeline.state import RunState
from .tensorboard import merge_event_files


def log_report(logger: Any, report: dict[str, Any], state: RunState) -> None:
    """Every model's metrics against its parameter count, one hparams entry with the real metrics (no
    placeholder ``hp_metric``); a resumed run's event files are merged into one."""
    scalars, metrics = logged_metrics(report)
    for tag, value, step in scalars:
        logger.log_metrics({tag: value}, step=step)
    search = state.search_settings.to_dict() if state.search_settings else {}
    logger.log_hyperparams({"scorer": state.scorer.get("name"), **{f"search.{k}": str(v) for k, v in search.items()}},
                           metrics)
    logger.finalize("success")
    if state.elapsed_before and getattr(logger, "log_dir", None):
        merge_event_files(logger.log_dir)
