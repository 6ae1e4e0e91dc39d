"""Search stage: the cross-block coefficients, after the importance pass (``on_train_end``)."""
from __future__ import annotations

import sys
from typing import Any, Optional

import pytorch_lightning as pl
import torch

from snapvit_pl.lightning.pruning_module import PruningModule
from snapvit_pl.lightning.resume import save_resume_state
from snapvit_pl.pipeline import SearchProgress, SearchSettings, search_stage
from snapvit_pl.search import EvolutionStrategy


class SearchCallback(pl.Callback):
    """Runs :func:`snapvit_pl.pipeline.run_search` once the local scores are complete.

    Under DDP each rank evaluates its share of every generation (each candidate exactly once);
    the ranks share the seed, so they hold the same search state. Resumable: the progress is
    saved after every round of evaluations (one candidate per rank), and a resumed run continues
    from there, in the middle of a generation too.

    Args:
        settings: the search settings.
    """

    resumable = True

    def __init__(self, settings: Optional[SearchSettings] = None):
        self.settings = settings or SearchSettings()
        self._progress: Optional[SearchProgress] = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        world = trainer.world_size
        gather = (lambda t: trainer.strategy.all_gather(t.to(pl_module.device)).reshape(world, -1)) if world > 1 else None
        images = trainer.datamodule.unlabeled_images(self.settings.num_images, self.settings.batch_size).to(pl_module.device)
        search_stage(pl_module.state, pl_module.backbone, images, self.settings, rank=trainer.global_rank,
                     world_size=world, all_gather=gather, resume=self._progress,
                     on_progress=lambda progress: self._save(trainer, progress),
                     on_generation=lambda es, candidates, values: self._log(trainer, es, values),
                     progress=trainer.is_global_zero and trainer.progress_bar_callback is not None and sys.stderr.isatty())

    def _save(self, trainer: pl.Trainer, progress: SearchProgress) -> None:
        """After every round of evaluations: what a resumed run continues from."""
        self._progress = progress
        save_resume_state(trainer)

    @staticmethod
    def _log(trainer: pl.Trainer, es: EvolutionStrategy, values: torch.Tensor) -> None:
        if trainer.logger is not None:
            first = es.evaluations - len(values)
            for offset, value in enumerate(values.tolist()):
                trainer.logger.log_metrics({"search/fitness": value}, step=first + offset)
            trainer.logger.log_metrics({"search/best_fitness": es.best_fitness, "search/sigma": es.sigma}, step=es.evaluations)

    def state_dict(self) -> dict[str, Any]:
        return self._progress.to_dict() if self._progress is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._progress = SearchProgress.from_dict(state_dict) if state_dict else None
