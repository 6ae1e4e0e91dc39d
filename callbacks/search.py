"""Search stage: the cross-block coefficients, after the importance pass (``on_train_end``)."""
from __future__ import annotations

import pytorch_lightning as pl

from snapvit_pl.lightning.pruning_module import PruningModule, StageCallback


class SearchCallback(StageCallback):
    """Runs :meth:`Pipeline.search` once the local scores are complete.

    Under DDP each rank evaluates its share of every generation (each candidate exactly once); the ranks
    share the seed, so they hold the same search state. The progress is saved after every round of
    evaluations, and a resumed run continues from there, in the middle of a generation too. Without this
    callback the block coefficients stay at their initial values (the report says so).
    """

    stage = "search"

    def on_train_end(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        self._run(pl_module)
