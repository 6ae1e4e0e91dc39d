"""What a pruning run asks of its Trainer, whichever way the Trainer was made (``prune.py``'s ``--trainer`` options
or a ``pl.Trainer`` composed around a :class:`~snapvit_pl.lightning.PruningModule`): one list of the options it
honours, the settings it runs with, and one message for an option it cannot honour.

A pruning run uses the Trainer as a launcher (processes, devices, logging) around one pass over its data per
importance pass; it trains nothing, so the options that shape training (epochs, steps, batch limits, gradient
accumulation, checkpoints) have nothing to act on, and the ones that pick a subset of the data (``fast_dev_run``,
``limit_train_batches``, ``overfit_batches``) would score a fraction of the images and write a complete-looking run.
"""
from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from ..errors import ConfigError

#: The Trainer options a pruning run honours; every other one is refused unless it keeps its default.
LAUNCHER_OPTIONS = ("accelerator", "devices", "num_nodes", "strategy", "precision", "plugins", "logger",
                    "default_root_dir", "enable_progress_bar", "deterministic", "benchmark")

#: The settings ``prune.py``'s Trainer starts from (its ``--trainer`` defaults).
PRUNING_TRAINER_DEFAULTS = {
    "max_epochs": 1,  # one epoch per importance pass (the module sets the count itself)
    "enable_checkpointing": False,  # nothing trains; the run's progress file is its checkpoint
    "num_sanity_val_steps": 0, "limit_val_batches": 0,  # nothing to validate
    "devices": 1,
    "enable_model_summary": False,  # the frozen backbone, every parameter non-trainable: nothing to summarise
    "log_every_n_steps": 1,  # the importance loss of every batch
    "enable_progress_bar": False,  # every stage reports through snapvit_pl.progress
    "use_distributed_sampler": False,  # each process reads its own un-padded share of the images
}

_FEWER_IMAGES = "to score fewer images give the data fewer (max_samples: --data.init_args.max_samples)"
_A_SHARE = "scores a share of the images and would write a complete-looking run of other scores"
#: Why an option is refused, where more is to say than that a pruning run trains nothing.
WHY = {"fast_dev_run": _A_SHARE, "overfit_batches": _A_SHARE, "limit_train_batches": _A_SHARE, "max_steps": _A_SHARE}
_ONE_PASS = "each importance pass is one epoch over the data, and the module sets their count itself"
#: A refused option -> what to do instead.
INSTEAD = {
    "limit_train_batches": _FEWER_IMAGES, "overfit_batches": _FEWER_IMAGES, "max_steps": _FEWER_IMAGES,
    "fast_dev_run": "for a quick run use fewer images (max_samples) and a short search (prune.py: --config quick)",
    "max_epochs": _ONE_PASS, "min_epochs": _ONE_PASS, "min_steps": _ONE_PASS,
    "max_time": "to bound the search's time set its max_time (--search.max_time)",
    "accumulate_grad_batches": "nothing is optimised, so nothing accumulates",
    "use_distributed_sampler": "it pads the shards by repeating images; each process reads its own un-padded share",
}


def refusal(option: str, value: Any, *, cli: bool) -> ConfigError:
    """The one message for a Trainer option a pruning run cannot honour, spelled as the user gave it:
    ``--trainer.OPTION VALUE`` (``cli``) or ``Trainer(OPTION=VALUE)``."""
    shown = f"--trainer.{option} {value!r}" if cli else f"Trainer({option}={value!r})"
    top = option.split(".")[0]
    why = WHY.get(top, f"a pruning run trains nothing and honours only the Trainer's {', '.join(LAUNCHER_OPTIONS[:5])}, "
                       "...")
    return ConfigError(f"{shown}: {why}; {INSTEAD.get(top, 'leave it unset')}")


def check_options(given: Mapping[str, Any], defaults: Mapping[str, Any], *, cli: bool) -> None:
    """Refuse the first option of ``given`` (in its order) outside :data:`LAUNCHER_OPTIONS` whose value differs from
    ``defaults``' (:func:`refusal`)."""
    for key, value in given.items():
        if key.split(".")[0] not in LAUNCHER_OPTIONS and value != defaults.get(key):
            raise refusal(key, value, cli=cli)


#: A composed Trainer's readable options and Lightning's defaults for them (what :func:`composed_options` reads).
_COMPOSED_DEFAULTS = {"fast_dev_run": False, "overfit_batches": 0.0, "limit_train_batches": 1.0, "max_steps": -1,
                      "accumulate_grad_batches": 1, "use_distributed_sampler": False}


def composed_options(trainer: Any) -> dict[str, Any]:
    """The options of a built Trainer that :func:`check_options` judges (those a Trainer still shows once built), the
    debug modes first: they set the batch limits too."""
    options = {name: getattr(trainer, name, default) for name, default in _COMPOSED_DEFAULTS.items()}
    if options["limit_train_batches"] is None:
        options["limit_train_batches"] = 1.0
    # one process reads the whole data set whatever the sampler; several would read padded shards
    connector = getattr(trainer, "_accelerator_connector", None)
    options["use_distributed_sampler"] = getattr(trainer, "world_size", 1) > 1 and bool(
        getattr(connector, "use_distributed_sampler", False))
    return options


def check_composed(trainer: Any) -> None:
    """Refuse, in :func:`refusal`'s words, an option of a composed Trainer the run cannot honour."""
    check_options(composed_options(trainer), _COMPOSED_DEFAULTS, cli=False)


#: Lightning's messages a pruning run expects and has nothing to act on: no optimiser, no validation loop, a frozen
#: module in eval mode, fewer batches than a logging interval, a deprecation inside Lightning itself.
EXPECTED_WARNINGS = (
    ".*returned `None`, this fit will run with no optimizer", ".*but have no `validation_step`",
    ".*defined a `validation_step` but have no `val_dataloader`",
    ".*module\\(s\\) in eval mode at the start of training", ".*isinstance.treespec, LeafSpec.*",
    ".*is smaller than the logging interval",
)
_LOGGERS = ("pytorch_lightning", "lightning_fabric", "lightning")


class _NoAdvertisements(logging.Filter):
    """Drops Lightning's tips to install its cloud packages (litlogger, litmodels), printed on every run."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "litlogger" not in message and "litmodels" not in message


logging.getLogger("pytorch_lightning.utilities.rank_zero").addFilter(_NoAdvertisements())


def ignore_expected_warnings() -> None:
    """For a program that runs pruning (the commands): :data:`EXPECTED_WARNINGS` never shown."""
    for message in EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


def lightning_information(level: int) -> dict[str, int]:
    """Set Lightning's loggers to ``level`` (``logging.WARNING``: no information lines); returns their levels before."""
    before = {name: logging.getLogger(name).level for name in _LOGGERS}
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(level)
    return before


@contextmanager
def quiet_lightning(information: bool = True) -> Iterator[None]:
    """Within the block, Lightning's :data:`EXPECTED_WARNINGS` are not shown, nor (``information``) its information
    lines (the devices found, "`Trainer.fit` stopped"); its other warnings and errors still show."""
    with warnings.catch_warnings():
        ignore_expected_warnings()
        levels = lightning_information(logging.WARNING) if information else {}
        try:
            yield
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)


def quiet_composed_trainer(trainer: Any) -> list[Any]:
    """Take out of a composed Trainer what speaks for a training loop the run does not have: Lightning's default
    checkpoint callback (nothing to checkpoint), its model summary (the frozen backbone) and its progress bar (each
    stage reports its own progress); returns the callbacks taken out. A checkpoint callback the user configured is
    refused instead.

    Raises:
        ConfigError: a ``ModelCheckpoint`` with settings of the user's.
    """
    from pytorch_lightning.callbacks import ModelCheckpoint, ModelSummary, ProgressBar

    removed = []
    for callback in list(trainer.callbacks):
        if isinstance(callback, ModelCheckpoint):
            if not _is_default_checkpoint(callback):
                raise ConfigError("ModelCheckpoint on a PruningModule: a pruning run has nothing to checkpoint (it "
                                  "trains nothing; its scores, models and progress are written to its run folder, "
                                  "configure_pipeline(run_dir=...)); remove it, or pass enable_checkpointing=False")
        elif not isinstance(callback, (ModelSummary, ProgressBar)):
            continue
        trainer.callbacks.remove(callback)
        removed.append(callback)
    return removed


def _is_default_checkpoint(callback: Any) -> bool:
    """``callback`` is a ``ModelCheckpoint()`` with Lightning's defaults (what ``enable_checkpointing=True`` adds)."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    if type(callback) is not ModelCheckpoint:
        return False
    default = ModelCheckpoint()
    # (its folder is not compared: Lightning fills it in before the module's setup)
    names = ("filename", "monitor", "save_last", "save_top_k", "save_weights_only", "_every_n_train_steps",
             "_every_n_epochs", "_train_time_interval", "_save_on_train_epoch_end")
    return all(getattr(callback, name, None) == getattr(default, name, None) for name in names)
