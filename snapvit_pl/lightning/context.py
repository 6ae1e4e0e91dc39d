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
        # torch's own collective: the gathered statistics need no autograd, and the strategy's all_gather (through
        # torch.distributed.nn) warns of its deprecation on every process from torch 2.14
        tensor = tensor.detach().to(strategy.root_device).contiguous()
        gathered = [torch.empty_like(tensor) for _ in range(world)]
        torch.distributed.all_gather(gathered, tensor)
        return torch.stack(gathered).reshape(world, -1)

    def gather_objects(value: Any) -> list[Any]:
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, value)
        return gathered

    return Distributed(trainer.global_rank, world, lambda tensor: strategy.reduce(tensor, reduce_op="sum"),
                       all_gather if world > 1 else None, gather_objects if world > 1 else None)


def events(trainer: pl.Trainer, pipeline: Pipeline) -> RunEvents:
    """The trainer's loggers hear the search's fitness, the report's figures (those that draw them: TensorBoard's)
    and metrics (none without a logger)."""
    loggers = list(trainer.loggers)
    if not loggers:
        return RunEvents()
    drawing = [e for e in (getattr(logger, "experiment", None) for logger in loggers) if hasattr(e, "add_figure")]

    def log_metrics(metrics: dict[str, float], step: int) -> None:
        for logger in loggers:
            logger.log_metrics(metrics, step=step)

    def on_figure(name: str, figure: Any) -> None:
        for experiment in drawing:
            experiment.add_figure(f"report/{name}", figure)

    def on_report(report: dict[str, Any]) -> None:
        for logger in loggers:
            log_report(logger, report)

    return RunEvents(log_metrics=log_metrics, on_figure=on_figure if drawing else None, on_report=on_report)


def bind_trainer(pipeline: Pipeline, trainer: pl.Trainer) -> None:
    """Connect ``pipeline`` to ``trainer``'s processes and logger."""
    pipeline.dist = distributed(trainer)
    pipeline.events = events(trainer, pipeline)
