"""Splits stage: each cost budget's head/MLP split, then the finished elastic scores file (``on_train_end``,
after the search)."""
from __future__ import annotations

import pytorch_lightning as pl

from snapvit_pl.lightning.pruning_module import PruningModule


class SplitsCallback(pl.Callback):
    """Runs :meth:`Pipeline.choose_splits`: the fitness-chosen split of every budget asked for and of a grid of
    parameter and FLOPs budgets, recorded in ``elastic_scores.safetensors`` (under DDP the ranks share the
    candidates' evaluations; rank 0 writes the file)."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        pl_module.pipeline.choose_splits()
