"""What every training module of the project shares: AdamW (no decay on biases and norms), linear warm-up then
cosine decay stepped every batch, RNGs reseeded per epoch (so a resumed run draws what an uninterrupted one
does), checkpoints that carry their RNG states and a checksum, the ranges of the modules' numeric arguments, and
the stop of a run whose loss or weights are no longer finite."""
from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import numpy as np
import pytorch_lightning as pl
import torch
from torch import nn

from ..data.sampling import epoch_seed
from ..errors import ConfigError
from ..ranges import check_arguments

def check_ranges(module_class: type, arguments: Mapping[str, Any]) -> None:
    """Check a training module's ``__init__`` ``arguments`` (its locals) against their annotated ranges (what the
    command line checks when it parses), for a module built from Python; one :class:`ConfigError`."""
    check_arguments(module_class.__init__, arguments, "model", skip={"self"})


def run_seed() -> Optional[int]:
    """The run's ``seed_everything`` (Lightning's ``PL_GLOBAL_SEED``), that random initial weights are drawn from
    (None: not seeded; :func:`snapvit_pl.models.load_backbone` then draws them from seed 0)."""
    seed = os.environ.get("PL_GLOBAL_SEED")
    return int(seed) if seed and seed.strip().lstrip("-").isdigit() else None


def adamw(modules: Iterable[nn.Module], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over the trainable parameters of ``modules``: weight decay on matrices only (not on biases,
    norms, tokens' 1-D parameters)."""
    params = [p for module in modules for p in module.parameters() if p.requires_grad]
    return torch.optim.AdamW([{"params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay},
                              {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}], lr=lr)


def learning_rates(optimizers: Iterable[torch.optim.Optimizer]) -> dict[str, float]:
    """The learning rates to log, one per distinct value: ``lr-<Optimizer>`` when all of an optimizer's parameter
    groups share one (the weight-decay split of :func:`adamw`), else ``lr-<Optimizer>/<group>`` for the first group of
    each value (its ``name``, or ``pg<i>`` as Lightning's monitor numbers them)."""
    rates: dict[str, float] = {}
    for optimizer in optimizers:
        prefix = f"lr-{type(optimizer).__name__}"
        groups = [(g.get("name", f"pg{i + 1}"), float(g["lr"])) for i, g in enumerate(optimizer.param_groups)]
        distinct = dict((lr, name) for name, lr in reversed(groups))  # value -> its first group's name
        if len(distinct) == 1:
            rates[prefix] = groups[0][1]
        else:
            rates.update({f"{prefix}/{name}": lr for lr, name in sorted(distinct.items(), key=lambda i: i[1])})
    return rates


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


_SEAL_KEY, _RNG_KEY, DATA_KEY = "snapvit_sha256", "snapvit_rng", "snapvit_data"
#: What a training checkpoint's checksum covers: the weights, the optimiser's and scheduler's state, the RNG
#: states and the fingerprint of the training data (the loop counters and the settings may be rewritten by
#: Lightning's migrations).
_SEALED = ("state_dict", "optimizer_states", "lr_schedulers", "epoch", "global_step", _RNG_KEY, DATA_KEY)


def _sealed(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """What the checksum covers (a checkpoint written before the data fingerprint existed: without it)."""
    return {k: checkpoint.get(k) for k in _SEALED if k != DATA_KEY or DATA_KEY in checkpoint}


def training_data(trainer: Any) -> Optional[dict[str, Any]]:
    """The fingerprint of the data a run trains on (:meth:`snapvit_pl.data.VisionDataModule.listing_fingerprint`);
    None when its DataModule has none."""
    listing = getattr(getattr(trainer, "datamodule", None), "listing_fingerprint", None)
    return listing() if listing is not None else None


def record_training_data(module: Any, checkpoint: dict[str, Any]) -> None:
    """``on_save_checkpoint`` of the project's training modules: record the training data's fingerprint (computed
    once per run) before the checkpoint is sealed."""
    if not hasattr(module, "_data_fingerprint"):
        module._data_fingerprint = training_data(getattr(module, "_trainer", None))
    if module._data_fingerprint is not None:
        checkpoint[DATA_KEY] = module._data_fingerprint


def check_training_data(module: Any, checkpoint: dict[str, Any]) -> None:
    """``on_load_checkpoint`` of the project's training modules: a ``fit`` resumed from ``checkpoint`` must train on
    the data it was trained on (``validate`` / ``test`` evaluate any checkpoint on any data)."""
    from ..errors import CheckpointError

    trainer = getattr(module, "_trainer", None)
    if getattr(getattr(trainer, "state", None), "fn", None) != "fit":
        return
    now = training_data(trainer)
    if now is None:
        return
    recorded = checkpoint.get(DATA_KEY)
    ckpt = getattr(trainer, "ckpt_path", None) or "the checkpoint"
    if not isinstance(recorded, dict):
        raise CheckpointError(f"--ckpt_path {ckpt} records no fingerprint of its training data (written by an older "
                              "snapvit-pl), so a resume on other data could not be told apart; start the fit again "
                              "without --ckpt_path")
    if recorded.get("sha256") != now["sha256"]:
        raise CheckpointError(f"--ckpt_path {ckpt} was trained on other data ({recorded.get('samples')} images of "
                              f"{recorded.get('data')}; now {now['samples']} of {now['data']}): a resumed fit must "
                              "read what it started on; give the run's own --data settings, or start a new fit "
                              "without --ckpt_path")


def seal_checkpoint(checkpoint: dict[str, Any]) -> None:
    """``on_save_checkpoint`` of the project's training modules: add the RNG states (a run resumed in the middle of
    an epoch then draws the same dropout masks) and a checksum of the weights and optimiser state."""
    from ..io import content_digest

    checkpoint[_RNG_KEY] = {
        "torch": torch.get_rng_state(), "python": random.getstate(),
        "numpy": [np.random.get_state()[0], torch.from_numpy(np.random.get_state()[1].astype(np.int64)),
                  *np.random.get_state()[2:]],
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    checkpoint[_SEAL_KEY] = content_digest(_sealed(checkpoint))


def open_checkpoint(checkpoint: dict[str, Any], expected: Optional[Mapping[str, torch.Tensor]] = None) -> None:
    """``on_load_checkpoint`` of the project's training modules: refuse a checkpoint whose weights, optimiser state
    or RNG states changed since it was written (a flipped bit, a truncated copy, an edit), or that carries no checksum
    (not written by this project's training, or its checksum removed: no checkpoint is resumed unverified), and
    restore its RNG states. ``expected``: the state dict the module holds (what Lightning loads the checkpoint's
    into): the checkpoint's weights must have its names, shapes and dtypes."""
    from ..errors import CheckpointError
    from ..io import content_digest

    fix = "resume from another checkpoint (--ckpt_path FILE) or start again without --ckpt_path"
    recorded = checkpoint.get(_SEAL_KEY)
    if recorded is None:
        raise CheckpointError("the checkpoint to resume from carries no snapvit-pl checksum (written by other code, by "
                              f"an older snapvit-pl, or its checksum removed); {fix}")
    if recorded != content_digest(_sealed(checkpoint)):
        raise CheckpointError("the checkpoint to resume from does not match its checksum (damaged or modified since it "
                              f"was written); {fix}")
    weights = checkpoint.get("state_dict")
    if expected is not None and (not isinstance(weights, Mapping) or set(weights) != set(expected) or any(
            not torch.is_tensor(weights[k]) or weights[k].shape != v.shape or weights[k].dtype != v.dtype
            for k, v in expected.items())):
        found = sorted(set(weights) ^ set(expected))[:3] if isinstance(weights, Mapping) else type(weights).__name__
        raise CheckpointError(f"the checkpoint to resume from holds other weights than this model's (names, shapes or "
                              f"dtypes differ: {found or 'a tensor of another shape'}); {fix}")
    rng = checkpoint.get(_RNG_KEY)
    try:
        torch.set_rng_state(rng["torch"])
        random.setstate(tuple(item if not isinstance(item, list) else tuple(item) for item in rng["python"]))
        kind, keys, *rest = rng["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
        if rng["cuda"] and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(rng["cuda"])
    except (TypeError, ValueError, KeyError, IndexError, RuntimeError, OverflowError) as err:  # sealed, not RNG states
        raise CheckpointError(f"the checkpoint to resume from holds unreadable RNG states ({type(err).__name__}: "
                              f"{' '.join(str(err).split())[:120]}); {fix}") from None


def stop_if_diverged(module: Any, loss: torch.Tensor, settings: str, name: str = "train/loss") -> None:
    """``training_step`` of the project's training modules: stop the run, before the step updates anything, when
    its loss is NaN or infinite (a learning rate too high, a temperature too low): every later step, checkpoint
    and exported model would be garbage. The run's checkpoints written before it are kept; nothing more is saved
    (no checkpoint callback saves on an error) and nothing is exported. All ranks stop together. ``settings``:
    the settings to lower, as the error names them (e.g. ``--model.lr (now 0.1)``); ``name``: the loss's (a
    ``validation_step`` of ``fit`` calls it with ``val/loss``: weights still finite may already compute NaN)."""
    diverged = not bool(torch.isfinite(loss.detach()).all())
    trainer = getattr(module, "_trainer", None)
    if getattr(trainer, "world_size", 1) > 1:
        diverged = trainer.strategy.reduce_boolean_decision(diverged, all=False)
    if not diverged:
        return
    where = (f" at epoch {trainer.current_epoch}, step {trainer.global_step}" if hasattr(trainer, "global_step")
             else "")
    value = loss.detach().float()
    raise ConfigError(f"training diverged: {name} is {value.item() if value.numel() == 1 else 'not finite'}"
                      f"{where}; the run stopped and exported no model. {_last_finite_state(trainer)}; lower "
                      f"{settings} and start the run again")


def _last_finite_state(trainer: Any) -> str:
    """Where the state saved before a divergence is, for its error."""
    paths = [getattr(c, attr, "") for c in getattr(trainer, "checkpoint_callbacks", [])
             for attr in ("last_model_path", "best_model_path")]
    paths.append(getattr(trainer, "ckpt_path", None) or "")  # the checkpoint this run resumed from
    path = next((p for p in paths if p and Path(p).is_file()), None)
    if path is None:
        return "No checkpoint was saved before it"
    return (f"The last checkpoint saved before it, {path}, is kept (--ckpt_path {path} continues from it, with the "
            "settings it was saved with)")


def check_finite_weights(state_dict: Mapping[str, torch.Tensor], what: str) -> None:
    """Refuse to save ``state_dict`` (a checkpoint's, a model's to export) when a weight is NaN or infinite (the last
    optimiser step diverged): one :class:`ConfigError` naming ``what`` was not written."""
    bad = [name for name, tensor in state_dict.items()
           if torch.is_tensor(tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
    if bad:
        raise ConfigError(f"training diverged: the weights hold NaN or infinite values ({', '.join(bad[:3])}"
                          f"{' ...' if len(bad) > 3 else ''}), so {what} was not written; lower the learning rate "
                          "(--model.lr) and start the run again")


class LogEveryEpoch(pl.Callback):
    """Log at least once per training epoch: Lightning logs every ``log_every_n_steps`` steps (50 by default), so a
    run of fewer batches than that would log no loss and no learning rate at all; the interval is lowered to the
    epoch's batch count when it is longer."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        batches = trainer.num_training_batches
        if isinstance(batches, int) and 0 < batches < trainer.log_every_n_steps:
            trainer.log_every_n_steps = batches
