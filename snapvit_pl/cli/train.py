"""``train.py`` / ``snapvit-pl train``: LightningCLI (``fit``, ``validate``, ``test``) over a :class:`FinetuneModule`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .common import check_config_files, run_command, tensorboard_logger


def finetune_dir(checkpoint: str | Path) -> Path:
    """Where fine-tuning ``checkpoint`` writes when no directory is given: ``runs/finetune/<run>-<budget>`` for
    ``runs/prune/<run>/models/<budget>``, else ``runs/finetune/<checkpoint name>``."""
    path = Path(checkpoint).resolve()
    name = f"{path.parent.parent.name}-{path.name}" if path.parent.name == "models" else path.name
    return Path("runs") / "finetune" / name


def train_cli(argv: list[str], run: bool = True):
    """``train.py``'s LightningCLI (parsed, instantiated and, with ``run``, run)."""
    import torch
    from pytorch_lightning.cli import LightningCLI

    from ..data import VisionDataModule
    from ..lightning.finetune_module import FinetuneModule

    class TrainCLI(LightningCLI):
        def add_arguments_to_parser(self, parser) -> None:
            parser.link_arguments("model.model_name", "data.init_args.model_name")
            # bf16 mixed precision when a GPU exists; fp32 on CPU (bf16 autocast is slow there).
            parser.set_defaults({"trainer.max_epochs": 10,
                                 "trainer.precision": "bf16-mixed" if torch.cuda.is_available() else "32-true"})

        def before_instantiate_classes(self) -> None:
            config = self.config[self.subcommand] if self.subcommand else self.config
            if config.trainer.default_root_dir is None and config.model.checkpoint:
                config.trainer.default_root_dir = str(finetune_dir(config.model.checkpoint))
            if config.trainer.logger in (None, True):  # TensorBoard in the run directory, as prune.py
                config.trainer.logger = tensorboard_logger(config.trainer.default_root_dir or "runs/train")

        def instantiate_trainer(self, **kwargs):
            from .prune import build_trainer

            return build_trainer(super().instantiate_trainer, **kwargs)

    return TrainCLI(
        FinetuneModule, VisionDataModule, subclass_mode_data=True, args=argv, run=run, seed_everything_default=0,
        parser_kwargs={"description": "Fine-tune a pruned ViT (or train a dense one). --verbose true (anywhere on the "
                                      "command line): show the traceback of errors.", "exit_on_error": False},
        save_config_kwargs={"overwrite": True},
    )


def train_main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``train.py`` (LightningCLI subcommands ``fit``, ``validate``, ``test``)."""

    def body(argv: list[str]) -> int:
        check_config_files(argv)
        train_cli(argv)
        return 0

    return run_command(body, argv, "python train.py", keep_verbose=False, batch_options=("--data.init_args.batch_size",))
