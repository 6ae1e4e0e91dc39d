"""What every training module of the project shares: AdamW (no decay on biases and norms), linear warm-up then
cosine decay stepped every batch, and RNGs reseeded per epoch (so a resumed run draws what an uninterrupted one
does)."""
from __future__ import annotations

import math
import os
from typing import Any, Iterable

import torch
from torch import nn

from ..data.base import epoch_seed


def adamw(modules: Iterable[nn.Module], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over the trainable parameters of ``modules``: weight decay on matrices only (not on biases,
    norms, tokens' 1-D parameters)."""
    params = [p for module in modules for p in module.parameters() if p.requires_grad]
    return torch.optim.AdamW([{"params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay},
                              {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}], lr=lr)


def warmup_cosine(step: int, total: int, warmup: int, floor: float) -> float:
    """Multiplier of the peak value at ``step``: linear warm-up over ``warmup`` steps, then cosine from 1 to
    ``floor`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def warmup_cosine_schedule(optimizer: torch.optim.Optimizer, trainer: Any, lr: float, min_lr: float,
                           warmup_epochs: float) -> dict[str, Any]:
    """Lightning's ``configure_optimizers`` answer: ``optimizer`` with a per-step warm-up + cosine schedule
    over the trainer's estimated steps."""
    total = max(1, int(trainer.estimated_stepping_batches))
    warmup = int(warmup_epochs * total / max(1, trainer.max_epochs or 1))
    floor = min_lr / lr
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_cosine(step, total, warmup, floor))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def reseed_for_epoch(epoch: int, rank: int) -> None:
    """With ``seed_everything`` (``PL_GLOBAL_SEED``), reseed torch's RNGs from (seed, epoch, rank): dropout and
    drop-path of an epoch then do not depend on what ran before it, so a run resumed from an end-of-epoch
    checkpoint draws the same masks as an uninterrupted one (Lightning checkpoints do not hold the RNG states)."""
    seed = os.environ.get("PL_GLOBAL_SEED")
    if seed is not None:
        torch.manual_seed((epoch_seed(int(seed), epoch) + 1_000_003 * rank) % 2**64)
