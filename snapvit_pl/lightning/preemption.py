"""A fine-tune stopped by SIGTERM (what SLURM and other schedulers send before they stop or preempt a job) leaves a
checkpoint to continue from, and says so.

Lightning finishes the batch in progress when SIGTERM arrives and stops with ``SIGTERMException``; on that exception
:class:`PreemptionCheckpoint` writes ``last.ckpt`` where the run's ``ModelCheckpoint`` keeps it (what
``--ckpt_path last`` reads), atomically. The checkpoint holds the position in the epoch (the training data loader's
state), the RNG states and the optimiser state, so the resumed run sees the batches and draws the masks an
uninterrupted one would.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities.exceptions import SIGTERMException


class PreemptionCheckpoint(pl.Callback):
    """On SIGTERM, save a checkpoint to resume from (``path`` afterwards; None until then)."""

    def __init__(self) -> None:
        self.path: Optional[Path] = None
        self.found_by_last = False  # whether --ckpt_path last finds it (a ModelCheckpoint watches its folder)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning (2.6) hands the saved data-loader state to the loaders in FitLoop.setup_data, which does nothing when
        # the loaders were set up earlier (trainer.estimated_stepping_batches in configure_optimizers does): a run
        # resumed mid-epoch would start the epoch's data from its first batch. Hand it over here (once; a no-op when
        # not restarting or when Lightning did it).
        trainer.fit_loop._load_combined_loader_states()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return
        path = self.checkpoint_path(trainer)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        trainer.save_checkpoint(tmp)  # every rank takes part; the main process writes
        if trainer.is_global_zero:
            os.replace(tmp, path)  # a kill while writing leaves the previous checkpoint intact
        self.path = path
        self.found_by_last = any(isinstance(c, ModelCheckpoint) and c.dirpath and Path(c.dirpath) == path.parent
                                 for c in trainer.checkpoint_callbacks)

    @staticmethod
    def checkpoint_path(trainer: pl.Trainer) -> Path:
        """``last.ckpt`` in the first ``ModelCheckpoint``'s folder, else ``<default_root_dir>/checkpoints/``."""
        callback = next((c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint) and c.dirpath), None)
        folder = Path(callback.dirpath) if callback is not None else Path(trainer.default_root_dir) / "checkpoints"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"
