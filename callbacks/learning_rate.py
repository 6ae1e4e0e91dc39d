"""Logs the learning rate, one curve per distinct value (Lightning's ``LearningRateMonitor`` logs every parameter
group, so the weight-decay split of one rate gave two identical curves)."""
from __future__ import annotations

import pytorch_lightning as pl

from snapvit_pl.lightning.training import learning_rates


class LearningRateCallback(pl.Callback):
    """At every logging step (``Trainer(log_every_n_steps=...)``), the rates :func:`learning_rates` gives, to every
    logger of the Trainer."""

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if step % max(1, trainer.log_every_n_steps) == 0 and trainer.is_global_zero:
            rates = learning_rates(trainer.optimizers)
            for logger in trainer.loggers:
                logger.log_metrics(rates, step=step)
