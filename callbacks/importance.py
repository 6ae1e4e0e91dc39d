"""Importance estimation: local scores of every head and MLP neuron from one pass over the data."""
from __future__ import annotations

import time
from typing import Any, Optional

import pytorch_lightning as pl

from snapvit_pl.elastic import ElasticScores
from snapvit_pl.errors import ConfigError, DataError
from snapvit_pl.lightning.pruning_module import PruningModule
from snapvit_pl.lightning.resume import save_resume_state
from snapvit_pl.scoring import LocalScores, Scorer, SSLFisher


class ImportanceCallback(pl.Callback):
    """Feeds every training batch to a scorer; at epoch end sums its statistics across ranks.

    Resumable: once the scores are complete they are saved in the run's resume state, and a
    resumed run skips the data pass.

    Args:
        scorer: any :class:`snapvit_pl.scoring.Scorer` (default ``SSLFisher()``, label-free).
        min_mlp_keep: fraction of each block's MLP neurons never pruned (METHOD: 0.05).
        min_head_keep: fraction of each block's heads never pruned (METHOD: 0.2).
    """

    def __init__(self, scorer: Optional[Scorer] = None, min_mlp_keep: float = 0.05, min_head_keep: float = 0.2):
        self.scorer = scorer if scorer is not None else SSLFisher()
        self.min_mlp_keep, self.min_head_keep = min_mlp_keep, min_head_keep
        self._started = 0.0
        self._local: Optional[LocalScores] = None

    resumable = True

    def setup(self, trainer: pl.Trainer, pl_module: PruningModule, stage: str) -> None:
        pl_module.keep_ratios = (self.min_mlp_keep, self.min_head_keep)
        datamodule = trainer.datamodule
        if datamodule is not None:
            datamodule.configure_for_model(pl_module.backbone)
            images = len(datamodule.dataset("train"))
            if images == 0:
                raise DataError("the pruning data set is empty; check data.init_args.root and max_samples")
            if datamodule.batch_size > images:
                raise ConfigError(
                    f"data.batch_size {datamodule.batch_size} is larger than the {images} pruning images; "
                    "lower data.init_args.batch_size or raise data.init_args.max_samples"
                )
            if not self.scorer.requires_data:
                datamodule.train_views = "plain"
            else:
                datamodule.train_views = "labeled" if self.scorer.requires_labels else "multicrop"

    def on_train_start(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        self._started = time.perf_counter()
        if self._local is not None:
            pl_module.skip_training = True  # scores restored from an interrupted run
        else:
            self.scorer.setup(pl_module.backbone, pl_module.teacher)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: PruningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.scorer.requires_data:
            stats = self.scorer.update(batch)
            if "loss" in stats:
                pl_module.log("importance/loss", stats["loss"], prog_bar=True, on_step=True, on_epoch=False)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        if self._local is None:
            self.scorer.reduce(lambda t: trainer.strategy.reduce(t, reduce_op="sum"))
            self._local = self.scorer.compute()
            pl_module.summary["timings"]["scoring_s"] = time.perf_counter() - self._started
            save_resume_state(trainer)
        local = self._local
        pl_module.local_scores = ElasticScores(
            local.heads, local.neurons, None, pl_module.spec.to_dict(), pl_module.base_fingerprint,
            self.min_mlp_keep, self.min_head_keep, settings={"scorer": {"name": self.scorer.name, **self.scorer.config()}},
        )

    def state_dict(self) -> dict[str, Any]:
        return {"local_scores": self._local.to_dict() if self._local is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        local = state_dict.get("local_scores")
        self._local = LocalScores.from_dict(local) if local is not None else None
