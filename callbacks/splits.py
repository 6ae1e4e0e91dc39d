"""Splits stage: each cost budget's head/MLP split, then the finished elastic scores file (``on_train_end``,
after the search)."""
from __future__ import annotations

import pytorch_lightning as pl

from snapvit_pl.lightning.pruning_module import PruningModule, StageCallback


class SplitsCallback(StageCallback):
    """Runs :meth:`Pipeline.choose_splits` (after the search, when the run makes one, whatever the callbacks'
    order): the fitness-chosen split of every budget asked for and of a grid of parameter and FLOPs budgets,
    recorded in ``elastic_scores.safetensors`` (under DDP the ranks share the candidates' evaluations; rank 0 writes
    the file). The splits always run (they make the scores): without this callback the export asks for them."""

    stage = "splits"

    def on_train_end(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        self._run(pl_module)
