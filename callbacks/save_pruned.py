"""Saves the trained model in the pruned-checkpoint format (safetensors + architecture record)."""
from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl

from snapvit_pl.errors import ConfigError
from snapvit_pl.lightning.finetune_module import FinetuneModule
from snapvit_pl.lightning.training import check_finite_weights
from snapvit_pl.models import save_pruned


class SavePrunedCallback(pl.Callback):
    """At the end of ``fit``, writes ``<default_root_dir>/<dirname>`` loadable by ``load_pruned``
    (and therefore by ``prune.py`` and evaluation). Rank 0 only; written atomically.

    Weights that are no longer finite (a diverged training) are not exported: the run ends with an error.
    A run never replaces the model an earlier run exported there: it stops at the start instead
    (before any training), unless ``overwrite``. A run resumed with ``--ckpt_path`` has exported nothing
    yet, so it is not affected.

    Args:
        dirname: output directory name inside the run directory.
        use_best: reload the best ``ModelCheckpoint`` weights first (when one was saved).
        overwrite: replace a model already exported there.
    """

    def __init__(self, dirname: str = "model", use_best: bool = True, overwrite: bool = False):
        self.dirname, self.use_best, self.overwrite = dirname, use_best, overwrite

    def _target(self, trainer: pl.Trainer) -> Path:
        return Path(trainer.default_root_dir) / self.dirname

    def on_fit_start(self, trainer: pl.Trainer, pl_module: FinetuneModule) -> None:
        target = self._target(trainer)
        if target.exists() and not self.overwrite:
            raise ConfigError(
                f"{target} already holds a model exported by an earlier run; choose another "
                "--trainer.default_root_dir (and the logger's save_dir), or set overwrite: true in the "
                "SavePrunedCallback's init_args to replace it"
            )

    def on_fit_end(self, trainer: pl.Trainer, pl_module: FinetuneModule) -> None:
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") if self.use_best else ""
        if best:
            import torch

            state = torch.load(best, map_location="cpu", weights_only=True)["state_dict"]
            pl_module.load_state_dict(state, strict=False)
        check_finite_weights(pl_module.model.state_dict(), f"the model {self._target(trainer)}")
        if trainer.is_global_zero:
            extra = {"trained_from": pl_module.hparams.get("checkpoint"), "best_checkpoint": best or None,
                     "epochs": trainer.current_epoch, "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()}}
            save_pruned(pl_module.model, self._target(trainer), pl_module.spec, extra=extra, overwrite=True)
