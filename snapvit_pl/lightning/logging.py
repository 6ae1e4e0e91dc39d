"""The report's numbers in a Lightning logger (TensorBoard): metrics against model size, an hparams entry.

A resumed run writes a second event file next to the first in the same directory; TensorBoard reads a
run directory's event files together, so the resumed run's curves continue where the first ones stopped.
"""
from __future__ import annotations

from typing import Any

from ..pipeline.report import logged_metrics


def log_report(logger: Any, report: dict[str, Any]) -> None:
    """Every model's metrics against its parameter count, one hparams entry with the real metrics (no
    placeholder ``hp_metric``)."""
    scalars, metrics = logged_metrics(report)
    for tag, value, step in scalars:
        logger.log_metrics({tag: value}, step=step)
    method = report.get("method") or {}
    search = method.get("search") or {}
    logger.log_hyperparams({"scorer": (method.get("scorer") or {}).get("name"),
                            **{f"search.{k}": str(v) for k, v in search.items()}}, metrics)
    logger.finalize("success")
