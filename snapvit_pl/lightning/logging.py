"""The report's numbers in Lightning's loggers (TensorBoard, CSV, any): metrics against model size, hyperparameters.

A resumed run writes a second event file next to the first in the same directory; TensorBoard reads a
run directory's event files together, so the resumed run's curves continue where the first ones stopped.
"""
from __future__ import annotations

import inspect
from typing import Any

from ..pipeline.report import logged_metrics


def log_report(logger: Any, report: dict[str, Any]) -> None:
    """Every model's metrics against its parameter count, and the run's hyperparameters: in one hparams entry with
    the real metrics (no placeholder ``hp_metric``) where the logger takes metrics with them (TensorBoard's), else
    the hyperparameters, then the metrics (any logger of Lightning's interface: CSV, a user's own)."""
    scalars, metrics = logged_metrics(report)
    for tag, value, step in scalars:
        logger.log_metrics({tag: value}, step=step)
    method = report.get("method") or {}
    search = method.get("search") or {}
    params = {"scorer": (method.get("scorer") or {}).get("name"), **{f"search.{k}": str(v) for k, v in search.items()}}
    if _takes_metrics(logger):
        logger.log_hyperparams(params, metrics)
    else:
        logger.log_hyperparams(params)
        if metrics:
            logger.log_metrics(metrics)
    logger.finalize("success")


def _takes_metrics(logger: Any) -> bool:
    """Whether ``logger.log_hyperparams`` takes the metrics beside the hyperparameters (``metrics``, as
    TensorBoard's does; Lightning's interface only promises ``params``)."""
    try:
        return "metrics" in inspect.signature(logger.log_hyperparams).parameters
    except (TypeError, ValueError):
        return False
