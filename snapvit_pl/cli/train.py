"""``train.py`` / ``snapvit-pl train``: LightningCLI (``fit``, ``validate``, ``test``) over a :class:`FinetuneModule`;
``snapvit-pl pretrain``: the same over a :class:`SelfDistillationModule` (DINO training without labels)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Optional

from ..config_files import check_config_files, layered_parser
from ..errors import ConfigError
from ..run.launch import check_device_counts
from .common import program, remember_parser, run_command, show_declared, tensorboard_logger, writing_to


#: --config's help line (:func:`snapvit_pl.config_files.resolve_config`).
CONFIG_HELP = ("a YAML file of these options (repeatable, the last wins), or the name of a shipped preset: "
               "configs/train/NAME.yaml, found from any directory (e.g. --config finetune_pruned)")


def finetune_dir(checkpoint: str | Path) -> Path:
    """Where fine-tuning ``checkpoint`` writes when no directory is given: ``runs/finetune/<run>-<budget>`` for
    ``runs/prune/<run>/models/<budget>``, else ``runs/finetune/<checkpoint name>``."""
    path = Path(checkpoint).resolve()
    name = f"{path.parent.parent.name}-{path.name}" if path.parent.name == "models" else path.name
    return Path("runs") / "finetune" / name


def train_cli(argv: list[str], run: bool = True, pretrain: bool = False, preemption: Any = None):
    """``train.py``'s LightningCLI (parsed, instantiated and, with ``run``, run); with ``pretrain``, the
    self-supervised (DINO) training of ``snapvit-pl pretrain``. ``preemption``: the
    :class:`~snapvit_pl.lightning.preemption.PreemptionCheckpoint` to install (default: a new one)."""
    import torch
    from pytorch_lightning.cli import LightningCLI

    from ..data import VisionDataModule
    if pretrain:
        from ..lightning.self_distillation import SelfDistillationModule as module_class
        description = "Train a ViT without labels by DINO self-distillation."
    else:
        from ..lightning.finetune_module import FinetuneModule as module_class
        description = "Fine-tune a pruned ViT (or train a dense one)."

    class TrainCLI(LightningCLI):
        def init_parser(self, **kwargs: Any) -> Any:
            return remember_parser(layered_parser(self.parser_class, CONFIG_HELP, **kwargs))  # a config's base: files first

        def parse_arguments(self, parser, args) -> None:
            from ..seeding import check_seed

            super().parse_arguments(parser, args)
            # before LightningCLI reads the checkpoint's settings into the model's (it would build that model)
            subcommand = self.config.get("subcommand")
            config = self.config[subcommand] if subcommand else self.config
            check_seed(config.get("seed_everything"))  # (Lightning seeds before before_instantiate_classes)
            check_device_counts(config.trainer)
            ckpt_path = config.get("ckpt_path")
            check_ckpt_name(ckpt_path, subcommand)
            check_ckpt_file(ckpt_path)  # the command line's --ckpt_path and a config's ckpt_path: alike
            check_ckpt_kind(ckpt_path, module_class, program("pretrain" if pretrain else "train"))
            if not pretrain:
                check_ckpt_model(ckpt_path, config.model)

        def _parse_ckpt_path(self) -> None:
            try:  # the checkpoint's hyper-parameters become the model's settings
                super()._parse_ckpt_path()
            except (argparse.ArgumentError, TypeError, ValueError) as err:
                from ..errors import CheckpointError

                subcommand = self.config.get("subcommand")
                ckpt_path = (self.config[subcommand] if subcommand else self.config).get("ckpt_path")
                raise CheckpointError(f"--ckpt_path {ckpt_path}: its saved settings do not fit {module_class.__name__} "
                                      f"({' '.join(str(err).split())[:160]}); give a checkpoint written by this "
                                      "command") from err

        def add_arguments_to_parser(self, parser) -> None:
            from ..ranges import declared_hints

            parser.link_arguments("model.model_name", "data.init_args.model_name")
            show_declared(parser, declared_hints(module_class, "model"))  # each argument's range in --help
            # bf16 mixed precision when a GPU exists; fp32 on CPU (bf16 autocast is slow there).
            parser.set_defaults({"trainer.max_epochs": 10,
                                 "trainer.precision": "bf16-mixed" if torch.cuda.is_available() else "32-true"})

        def before_instantiate_classes(self) -> None:
            config = self.config[self.subcommand] if self.subcommand else self.config
            if self.subcommand == "fit":
                refuse_no_training(config.trainer)
            if pretrain:
                check_global_views(config.model, config.data)
            if config.trainer.default_root_dir is None and config.model.get("checkpoint"):
                config.trainer.default_root_dir = str(finetune_dir(config.model.checkpoint))
            if config.trainer.logger in (None, True):  # TensorBoard in the run directory, as prune.py
                # no placeholder hp_metric (Lightning's constant -1): the run's metrics are logged under their names
                config.trainer.logger = tensorboard_logger(config.trainer.default_root_dir or "runs/train",
                                                           default_hp_metric=False)
            writing_to(config.trainer.default_root_dir or os.getcwd())  # (Lightning's default: the working directory)

        def instantiate_trainer(self, **kwargs):
            from ..lightning.preemption import PreemptionCheckpoint
            from ..lightning.training import LogEveryEpoch
            from .prune import build_trainer

            trainer = build_trainer(super().instantiate_trainer, **kwargs)
            trainer.callbacks.append(preemption or PreemptionCheckpoint())  # SIGTERM: a checkpoint to continue from
            trainer.callbacks.append(LogEveryEpoch())  # a short run's log has its loss and learning rate too
            return trainer

    return TrainCLI(
        module_class, VisionDataModule, subclass_mode_data=True, args=argv, run=run, seed_everything_default=0,
        parser_kwargs={"description": f"{description} --verbose true (anywhere on the command line): show the "
                                      "traceback of errors.", "exit_on_error": False,
                       "prog": program("pretrain" if pretrain else "train")},
        save_config_kwargs={"overwrite": True},
    )


_LIGHTNING_NAMES = (None, "", "null", "last", "best", "hpc")  # ckpt_path values Lightning resolves itself


def check_ckpt_name(value: Optional[str], subcommand: Optional[str]) -> None:
    """Refuse ``--ckpt_path best`` outside ``fit``: it names the best checkpoint of a fit in the same process, which
    ``validate`` / ``test`` never ran (Lightning's refusal is a traceback)."""
    if value == "best" and subcommand not in (None, "fit"):
        raise ConfigError(f"--ckpt_path best names the best checkpoint of a fit run in the same process, and {subcommand} "
                          "runs none; give the checkpoint file (e.g. <run>/checkpoints/last.ckpt), or leave --ckpt_path "
                          "out to use the model's weights as given")


def check_ckpt_kind(value: Optional[str], module_class: type, command: str) -> None:
    """Refuse a ``--ckpt_path`` file written by another kind of training (a fine-tune's checkpoint given to
    ``pretrain``, or the reverse): its saved settings are not ``module_class``'s, and LightningCLI would build the
    model from them (its refusal names a model setting, not the checkpoint)."""
    import inspect

    import torch

    from ..errors import CheckpointError

    if value in _LIGHTNING_NAMES:
        return
    try:
        checkpoint = torch.load(value, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - unreadable: check_ckpt_model / Lightning say why, naming the file
        return
    hparams = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    if not isinstance(hparams, dict):
        return
    accepted = set(inspect.signature(module_class.__init__).parameters) - {"self"}
    foreign = sorted(str(key) for key in hparams if key not in accepted and not str(key).startswith("_"))
    if foreign:
        raise CheckpointError(f"--ckpt_path {value} was written by another kind of training (its settings "
                              f"{', '.join(foreign[:3])} are not {module_class.__name__}'s); give a checkpoint of a "
                              f"{command} run")


def check_ckpt_path(argv: list[str]) -> None:
    """Refuse a ``--ckpt_path`` file that is missing, not a file, or not a complete checkpoint (a truncated copy),
    before LightningCLI reads it (``last``, ``best`` and ``hpc`` are Lightning's names, resolved by it)."""
    value = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--ckpt_path"), None)
    check_ckpt_file(value or next((a.split("=", 1)[1] for a in argv if a.startswith("--ckpt_path=")), None))


def check_ckpt_file(value: Optional[str]) -> None:
    """:func:`check_ckpt_path` of one value (the command line's or a config's ``ckpt_path``)."""
    import zipfile

    from ..errors import CheckpointError

    if value in _LIGHTNING_NAMES:
        return
    from ..io import special_file

    path = Path(value)
    if not path.is_file():
        what = "is a directory, not a checkpoint file" if path.is_dir() else (
            f"is {special_file(path)}, not a checkpoint file" if special_file(path) else "does not exist")
        raise CheckpointError(f"--ckpt_path {value} {what}; give a .ckpt file, or last (the run's last checkpoint)")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"--ckpt_path {value} is not a complete checkpoint (truncated or not a Lightning "
                              "checkpoint); give another .ckpt file, or last")
    try:  # every member against its CRC (torch's zip format records them): a flipped byte anywhere is found here
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as err:
        damaged = f"{type(err).__name__}: {' '.join(str(err).split())[:100]}"
    if damaged is not None:
        raise CheckpointError(f"--ckpt_path {value} is damaged ({damaged} fails its check); give another .ckpt "
                              "file, or last")


def check_ckpt_model(value: Optional[str], model: Any) -> None:
    """Refuse a ``ckpt_path`` file that is the fine-tune of another model than ``model`` (the parsed ``model``
    settings: another budget's widths, another base), or that records no architecture, before anything is built:
    the run would train and export that model's weights as this one's. ``last`` / ``hpc`` are checked by
    :meth:`FinetuneModule.on_load_checkpoint` when Lightning has found them."""
    import torch

    from ..errors import CheckpointError
    from ..lightning.finetune_module import ARCHITECTURE_KEY, check_resumed_architecture, model_architecture

    if value in _LIGHTNING_NAMES:
        return
    expected = model_architecture(*(_setting(model, key) for key in ("checkpoint", "model_name", "model_kwargs")))
    if expected is None:  # no model given: FinetuneModule says so
        return
    try:
        checkpoint = torch.load(value, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # what a foreign or damaged file raises varies (pickle, zip, torch errors)
        raise CheckpointError(f"--ckpt_path {value} cannot be read as a checkpoint ({' '.join(str(err).split())[:160]}"
                              "); give another .ckpt file, or last") from err
    recorded = checkpoint.get(ARCHITECTURE_KEY) if isinstance(checkpoint, dict) else None
    check_resumed_architecture(recorded, expected, value)


def _setting(section: Any, key: str) -> Any:
    """``section[key]`` of a parsed config section (a Namespace or a dict); None when absent."""
    if section is None:
        return None
    return section.get(key) if hasattr(section, "get") else getattr(section, key, None)


def check_global_views(model: Any, data: Any) -> None:
    """Refuse self-distillation whose model and data count the global crops differently: the teacher's inputs are
    the first ``model.n_global_views`` views of each image, so with the data's count apart a local crop would
    become a teacher input (or a global crop a student-only view)."""
    wanted, given = _setting(model, "n_global_views"), _setting(_setting(data, "init_args"), "n_global_views")
    if wanted is not None and given is not None and wanted != given:
        raise ConfigError(f"model.n_global_views {wanted} and data.init_args.n_global_views {given} differ: the "
                          "teacher reads the first model.n_global_views crops of each image; give both the same value")


def refuse_no_training(trainer: Any) -> None:
    """Refuse a ``fit`` that would train nothing: its exported model would be an untrained copy reported as trained."""
    for key in ("max_steps", "max_epochs", "limit_train_batches"):
        value = trainer.get(key) if hasattr(trainer, "get") else getattr(trainer, key, None)
        if value is not None and not isinstance(value, bool) and value == 0:
            raise ConfigError(f"--trainer.{key} 0 trains nothing: the exported model would be an untrained copy of the "
                              f"input; give --trainer.{key} > 0 ({program('train')} validate evaluates without training)")


def train_main(argv: Optional[list[str]] = None, pretrain: bool = False) -> int:
    """Entry point of ``train.py`` (LightningCLI subcommands ``fit``, ``validate``, ``test``); with ``pretrain``,
    of ``snapvit-pl pretrain``. A run stopped by SIGTERM saves a checkpoint and exits with status 130."""
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    def body(argv: list[str]) -> int:
        from ..lightning.preemption import PreemptionCheckpoint
        from ..lightning.strategy import close_process_group

        check_config_files(argv, "train")
        check_ckpt_path(argv)
        preemption = PreemptionCheckpoint()
        try:
            cli = train_cli(argv, pretrain=pretrain, preemption=preemption)
            close_process_group()  # the ranks finish together
        except SIGTERMException:
            if preemption.path is None:
                print("interrupted (SIGTERM) before training began; nothing was saved, start the run again",
                      file=sys.stderr)
            else:
                how = "--ckpt_path last" if preemption.found_by_last else f"--ckpt_path {preemption.path}"
                print(f"interrupted (SIGTERM): the training state is saved in {preemption.path}; continue with the "
                      f"same command and {how}", file=sys.stderr)
            return 130
        exported = [Path(cli.trainer.default_root_dir) / getattr(c, "dirname", "model") for c in cli.trainer.callbacks
                    if type(c).__name__ == "SavePrunedCallback"]
        if cli.subcommand == "fit" and cli.trainer.is_global_zero and exported and exported[0].is_dir():
            print(f"the trained model is in {exported[0]} (--checkpoint / --model.checkpoint of the other commands; "
                  f"load_pruned in Python); TensorBoard logs in {cli.trainer.log_dir or cli.trainer.default_root_dir}")
        return 0

    return run_command(body, argv, program("pretrain" if pretrain else "train"), keep_verbose=False,
                       batch_options=("--data.init_args.batch_size",), presets="train")


def pretrain_main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``snapvit-pl pretrain``: self-supervised (DINO) training, ``fit`` / ``validate``."""
    return train_main(argv, pretrain=True)
