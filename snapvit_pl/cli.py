"""Command-line entry points (LightningCLI) behind ``prune.py`` and ``train.py``.

Errors the user can fix (:class:`snapvit_pl.errors.SnapViTError`) are printed as one line and
exit with status 2 (:func:`snapvit_pl.errors.exit_with_error`); ``--verbose`` re-raises them with
their traceback.
"""
from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Optional

from .errors import ConfigError, SnapViTError, config_error, exit_with_error

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PRUNE_CONFIG = ROOT / "configs" / "prune" / "demo.yaml"
RESULT_FILES = ("report.json", "elastic_scores.safetensors", "models")


# Expected in a pruning run: no optimiser, no validation loop.
for _message in (
    ".*returned `None`, this fit will run with no optimizer", ".*but have no `validation_step`",
    ".*LightningCLI's args parameter", ".*module\\(s\\) in eval mode at the start of training", ".*isinstance.treespec, LeafSpec.*",
):
    warnings.filterwarnings("ignore", message=_message)


class _NoAdvertisements(logging.Filter):
    """Drops Lightning's "try installing litlogger" tip, printed on every run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


logging.getLogger("pytorch_lightning.utilities.rank_zero").addFilter(_NoAdvertisements())


def _pop_flag(argv: list[str], flag: str) -> bool:
    present = flag in argv
    while flag in argv:
        argv.remove(flag)
    return present


def check_run_dir(out_dir: Path, overwrite: bool) -> None:
    """Refuse to write into a run directory that already holds results, unless ``overwrite``."""
    existing = [name for name in RESULT_FILES if (out_dir / name).exists()]
    if existing and not overwrite:
        raise ConfigError(
            f"{out_dir} already holds results ({', '.join(existing)}); pass --overwrite true to replace them "
            "or choose another --out_dir"
        )


PRUNE_USAGE = "python prune.py [--config FILE] [--GROUP.KEY VALUE ...] [--out_dir DIR] [--resume RUN_DIR] [--verbose]"
PRUNE_EPILOG = """examples:
  python prune.py                                            # the offline demo (configs/prune/demo.yaml)
  python prune.py --config configs/prune/dino_vitb16.yaml --data.init_args.root /data/imagenet
  python prune.py --search.max_time 60 --export.budgets '[{sparsity: 0.5}, {flops: 0.4}]'
  python prune.py --resume runs/prune/20261201-101500      # continue an interrupted run
Every option can also be set in a YAML file (--config; --print_config shows the resolved one).
The Lightning Trainer's own options (--trainer.*) are listed last."""
_OWN_GROUPS = ("importance", "search", "export", "correction", "evaluation", "report", "model", "data")


def _help_formatter():
    """jsonargparse's help formatter, keeping the line breaks of the description and the examples."""
    import argparse

    from jsonargparse import DefaultHelpFormatter

    class HelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
        pass

    return HelpFormatter


def prune_cli(argv: list[str], help_defaults: Optional[Path] = None):
    """``prune.py``'s LightningCLI, parsed and instantiated but not run.

    ``cli.model`` (the :class:`PruningModule`), ``cli.datamodule``, ``cli.trainer`` and the stage settings
    (``cli.config_init.importance``, ``.search``, ``.export``, ``.correction``, ``.evaluation``, ``.report``)
    are what a ``python prune.py <argv>`` run uses; the benchmarks read their settings from here.
    """
    from pytorch_lightning.cli import LightningCLI

    from .callbacks import ExportCallback, ImportanceCallback, ReportCallback, SearchCallback
    from .data import VisionDataModule
    from .lightning.pruning_module import PruningModule
    from .pipeline import (
        CorrectionSettings, EvaluationSettings, ExportSettings, ImportanceSettings, ReportSettings, SearchSettings,
    )

    class PruneCLI(LightningCLI):
        def add_arguments_to_parser(self, parser) -> None:
            parser.add_argument("--out_dir", type=Optional[str], default=None,
                                help="run directory (default: runs/prune/<timestamp>)")
            parser.add_argument("--overwrite", type=bool, default=False,
                                help="replace the results of an earlier run in out_dir")
            # read by prune_main before parsing; listed here so that --help shows them
            parser.add_argument("--resume", type=Optional[str], default=None,
                                help="continue the interrupted run in this directory (its config.yaml, its progress)")
            parser.add_argument("--verbose", type=bool, default=False,
                                help="show the traceback of errors (or set SNAPVIT_VERBOSE=1)")
            # The pipeline's settings, one group per stage (snapvit_pl.pipeline); the stage callbacks get them.
            for key, settings in (("importance", ImportanceSettings), ("search", SearchSettings), ("export", ExportSettings),
                                  ("correction", CorrectionSettings), ("evaluation", EvaluationSettings),
                                  ("report", ReportSettings)):
                parser.add_class_arguments(settings, key)
            parser.link_arguments("model.model_name", "data.init_args.model_name")
            # --help: the project's options first, then its stage groups, the model and data; the trainer last
            own = [parser.groups[key] for key in _OWN_GROUPS if key in parser.groups]
            trainer = [parser.groups["trainer"]] if "trainer" in parser.groups else []
            rest = [g for g in parser._action_groups if g not in own and g not in trainer]  # argparse's print order
            parser._action_groups[:] = rest + own + trainer
            parser.set_defaults({
                "trainer.max_epochs": 1, "trainer.enable_checkpointing": False, "trainer.num_sanity_val_steps": 0,
                "trainer.limit_val_batches": 0, "trainer.devices": 1, "trainer.enable_model_summary": False,
                "trainer.log_every_n_steps": 1,  # the importance loss of every batch
                "trainer.enable_progress_bar": sys.stderr.isatty(),  # bars in a terminal, none in logs and pipes
            })

        def before_instantiate_classes(self) -> None:
            config = self.config
            out_dir = Path(config.out_dir or Path("runs") / "prune" / time.strftime("%Y%m%d-%H%M%S"))
            check_run_dir(out_dir, config.overwrite)
            config.out_dir = str(out_dir)
            config.trainer.default_root_dir = str(out_dir)
            if config.trainer.strategy in ("ddp", "ddp_spawn", "ddp_fork"):
                start_method = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork"}[config.trainer.strategy]
                config.trainer.strategy = {
                    "class_path": "snapvit_pl.lightning.strategy.PruningDDPStrategy",
                    "init_args": {"start_method": start_method},
                }
            if config.trainer.logger in (None, True):
                config.trainer.logger = {
                    "class_path": "pytorch_lightning.loggers.TensorBoardLogger",
                    "init_args": {"save_dir": str(out_dir), "name": "tensorboard", "version": "", "default_hp_metric": False},
                }

        def instantiate_trainer(self, **kwargs):
            trainer = super().instantiate_trainer(**kwargs)
            c = self.config_init
            trainer.callbacks[:0] = [  # the stages; they run at fixed hooks, so their order here does not matter
                ImportanceCallback(c.importance), SearchCallback(c.search),
                ExportCallback(c.export, c.correction, c.evaluation, c.search), ReportCallback(c.report),
            ]
            return trainer

    return PruneCLI(
        PruningModule, VisionDataModule, subclass_mode_data=True, run=False, args=argv, seed_everything_default=0,
        save_config_callback=None,
        parser_kwargs={"description": "Prune a pretrained ViT into an elastic family of sub-networks (SnapViT):\n"
                                      "local importance, coefficient search, pruned models at budgets, report.",
                       "usage": PRUNE_USAGE, "epilog": PRUNE_EPILOG, "formatter_class": _help_formatter(),
                       "exit_on_error": False,
                       **({"default_config_files": [str(help_defaults)]} if help_defaults else {})},
        trainer_defaults={}, auto_configure_optimizers=False,
    )


def _resume_args(argv: list[str]) -> tuple[list[str], Optional[Path]]:
    """``--resume RUN_DIR`` -> the run's saved config and out_dir, then any other overrides (refused when they
    change what the run computes)."""
    from .lightning.resume import check_resume

    resume = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--resume"), None)
    resume = resume or next((a.split("=", 1)[1] for a in argv if a.startswith("--resume=")), None)
    if resume is None:
        return argv, None
    rest = [a for i, a in enumerate(argv) if a != "--resume" and not a.startswith("--resume=") and (i == 0 or argv[i - 1] != "--resume")]
    run_dir = Path(resume)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} has no config.yaml: --resume takes the directory of an interrupted prune.py run")
    if (run_dir / "report.json").exists():
        raise ConfigError(f"{run_dir} already finished (report.json exists); nothing to resume")
    check_resume((run_dir / "config.yaml").read_text(), rest)
    return ["--config", str(run_dir / "config.yaml"), *rest, "--out_dir", str(run_dir), "--overwrite", "true"], run_dir


class _Interrupted(KeyboardInterrupt):
    """Raised by the SIGTERM handler so Lightning shuts down as for Ctrl+C."""


def _raise_interrupted(signum: int, frame: object) -> None:
    raise _Interrupted()


def prune_main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``prune.py``; returns the exit status."""
    import signal

    from .io import write_text_atomic
    from .lightning.resume import has_progress, load_resume_state, restore_run, start_resume_state

    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = _pop_flag(argv, "--verbose")
    out_dir: Optional[Path] = None
    created = False
    try:
        argv, resume_dir = _resume_args(argv)
        has_config = any(a in ("--config", "-c") or a.startswith("--config=") for a in argv)
        if {"-h", "--help"} & set(argv):  # the help shows the values this command would run with
            given = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--config", "-c")), None)
            prune_cli([a for a in argv if a not in ("--config", "-c", given)], Path(given or DEFAULT_PRUNE_CONFIG))
        if not has_config:
            argv = ["--config", str(DEFAULT_PRUNE_CONFIG)] + argv
        cli = prune_cli(argv)
        out_dir = Path(cli.config.out_dir)
        created = not out_dir.exists()
        out_dir.mkdir(parents=True, exist_ok=True)
        if resume_dir is not None:
            restore_run(cli.trainer, cli.model, load_resume_state(resume_dir))
        else:
            write_text_atomic(out_dir / "config.yaml", cli.parser.dump(cli.config, skip_none=False))
            start_resume_state(out_dir, cli.model)
        signal.signal(signal.SIGTERM, _raise_interrupted)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    except (SnapViTError, argparse.ArgumentError) as err:
        if created and out_dir is not None and not has_progress(out_dir):
            shutil.rmtree(out_dir, ignore_errors=True)  # a run that failed on bad input leaves nothing behind
        return exit_with_error(err if isinstance(err, SnapViTError) else config_error(err, "python prune.py"), verbose)
    except (KeyboardInterrupt, SystemExit) as err:
        if isinstance(err, SystemExit) and err.code in (0, None):
            raise
        if out_dir is None:
            raise
        from .lightning.resume import RESUME_FILE

        if (out_dir / RESUME_FILE).exists():
            print(f"interrupted: progress is saved in {out_dir}; continue with: python prune.py --resume {out_dir}",
                  file=sys.stderr)
        else:
            print("interrupted before anything was saved; start the run again", file=sys.stderr)
        return 130
    return 0


def finetune_dir(checkpoint: str | Path) -> Path:
    """Where fine-tuning ``checkpoint`` writes when no directory is given: ``runs/finetune/<run>-<budget>`` for
    ``runs/prune/<run>/models/<budget>``, else ``runs/finetune/<checkpoint name>``."""
    path = Path(checkpoint).resolve()
    name = f"{path.parent.parent.name}-{path.name}" if path.parent.name == "models" else path.name
    return Path("runs") / "finetune" / name


def _train_cli(argv: list[str]):
    from pytorch_lightning.cli import LightningCLI

    from .data import VisionDataModule
    from .lightning.finetune_module import FinetuneModule

    class TrainCLI(LightningCLI):
        def add_arguments_to_parser(self, parser) -> None:
            import torch

            parser.link_arguments("model.model_name", "data.init_args.model_name")
            # bf16 mixed precision when a GPU exists; fp32 on CPU (bf16 autocast is slow there).
            parser.set_defaults({"trainer.max_epochs": 10, "trainer.precision": "bf16-mixed" if torch.cuda.is_available() else "32-true"})

        def before_instantiate_classes(self) -> None:
            config = self.config[self.subcommand] if self.subcommand else self.config
            if config.trainer.default_root_dir is None and config.model.checkpoint:
                config.trainer.default_root_dir = str(finetune_dir(config.model.checkpoint))
            if config.trainer.logger in (None, True):  # TensorBoard in the run directory, as prune.py
                config.trainer.logger = {
                    "class_path": "pytorch_lightning.loggers.TensorBoardLogger",
                    "init_args": {"save_dir": config.trainer.default_root_dir or "runs/train", "name": "tensorboard",
                                  "version": ""},
                }

    return TrainCLI(
        FinetuneModule, VisionDataModule, subclass_mode_data=True, args=argv, seed_everything_default=0,
        parser_kwargs={"description": "Fine-tune a pruned ViT (or train a dense one).", "exit_on_error": False},
        save_config_kwargs={"overwrite": True},
    )


def train_main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``train.py`` (LightningCLI subcommands ``fit``, ``validate``, ``test``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = _pop_flag(argv, "--verbose")
    try:
        _train_cli(argv)
    except (SnapViTError, argparse.ArgumentError) as err:
        return exit_with_error(err if isinstance(err, SnapViTError) else config_error(err, "python train.py"), verbose)
    return 0
