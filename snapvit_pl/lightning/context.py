"""A pipeline inside a Lightning run: its processes (DDP collectives) and its logger."""
from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch

from ..pipeline.driver import Distributed, Pipeline, RunEvents
from .logging import log_report


def distributed(trainer: pl.Trainer) -> Distributed:
    """This process's rank, the world size and the strategy's collectives (sum-reduce, gather, gather objects)."""
    world = trainer.world_size
    strategy = trainer.strategy

    def all_gather(tensor: torch.Tensor) -> torch.Tensor:
        return strategy.all_gather(tensor.to(strategy.root_device)).reshape(world, -1)

    def gather_objects(value: Any) -> list[Any]:
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, value)
        return gathered

    return Distributed(trainer.global_rank, world, lambda tensor: strategy.reduce(tensor, reduce_op="sum"),
                       all_gather if world > 1 else None, gather_objects if world > 1 else None)


def events(trainer: pl.Trainer, pipeline: Pipeline) -> RunEvents:
    """The trainer's logger hears the search's fitness, the report's figures and metrics (none without a logger)."""
    logger = trainer.logger
    if logger is None:
        return RunEvents()
    experiment: Any = getattr(logger, "experiment", None)
    on_figure = (lambda name, fig: experiment.add_figure(f"report/{name}", fig)) if hasattr(experiment, "add_figure") else None
    return RunEvents(log_metrics=lambda metrics, step: logger.log_metrics(metrics, step=step), on_figure=on_figure,
                     on_report=lambda report: log_report(logger, report))


def bind_trainer(pipeline: Pipeline, trainer: pl.Trainer) -> None:
    """Connect ``pipeline`` to ``trainer``'s processes and logger."""
    pipeline.dist = distributed(trainer)
    pipeline.events = events(trainer, pipeline)
