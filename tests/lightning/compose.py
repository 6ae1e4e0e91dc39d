"""A pruning run composed as a Lightning user composes one: a ``PruningModule``, a DataModule and the stage callbacks
in a plain ``pl.Trainer``, no ``prune.py`` wiring. Imported by test_composition.py; run as a program (the two-process
case: Lightning starts the second process by running this file again):

    python tests/lightning/compose.py OUT_DIR DEVICES [--without CALLBACK] [--reader] [--plain] [--wait]

``--plain``: a Trainer with Lightning's defaults (its checkpoint callback, model summary, progress bar, logger);
``--wait``: print ``ready`` once set up and start on a line read from stdin (two runs started in the same instant).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl

from snapvit_pl.callbacks import STAGE_CALLBACKS
from snapvit_pl.data import ClassificationDataModule
from snapvit_pl.eval import EvaluationSettings
from snapvit_pl.lightning.pruning_module import PruningModule
from snapvit_pl.lightning.strategy import PruningDDPStrategy
from snapvit_pl.pipeline import ExportSettings, PipelineSettings, ReportSettings, SearchSettings

IMAGES = 49
#: the same run through prune.py (after configs/prune/demo.yaml)
PRUNE_ARGS = ["--model.checkpoint_path=null", "--model.model_kwargs.embed_dim=32", "--model.model_kwargs.depth=2",
              "--model.model_kwargs.num_heads=4", f"--data.init_args.max_samples={IMAGES}",
              "--data.init_args.batch_size=16", "--search.max_evaluations=0", f"--search.num_images={IMAGES}",
              "--search.batch_size=32", "--search.pca_components=8", "--export.budgets=[{flops: 0.6}]",
              "--export.split_grid=0", "--export.split_candidates=3", "--evaluation.metrics=[]",
              "--report.print_table=false", "--report.plots=false", "--progress=off", "--trainer.accelerator=cpu"]
MODEL_KWARGS = {"img_size": 28, "patch_size": 4, "in_chans": 1, "embed_dim": 32, "depth": 2, "num_heads": 4,
                "num_classes": 10, "pretrained_cfg_overlay": {"mean": [0.2860], "std": [0.3530], "input_size": [1, 28, 28],
                                                              "interpolation": "bilinear", "crop_pct": 1.0}}


class ScoresReader(pl.Callback):
    """A user's own callback: reads the elastic scores once the run made them and cuts a model from them."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir

    def on_fit_end(self, trainer: pl.Trainer, pl_module: PruningModule) -> None:
        scores = pl_module.scores
        small = scores.extract(pl_module.backbone, params=0.5)
        if trainer.is_global_zero:
            (self.out_dir / "reader.json").write_text(json.dumps({
                "blocks": len(scores.head_scores), "heads": [len(h) for h in scores.head_scores],
                "params": sum(p.numel() for p in small.parameters())}))


def compose(out_dir: Path, devices: int = 1, without: Optional[str] = None, reader: bool = False,
            overwrite: bool = False, plain: bool = False, wait: bool = False, logger: Any = None,
            metrics: Optional[list[str]] = None, data_as: str = "datamodule") -> PruningModule:
    """Build and fit the composed run; returns the module (its pipeline holds what each stage made)."""
    pl.seed_everything(0)
    module = PruningModule("vit_tiny_patch16_224", pretrained=False, model_kwargs=MODEL_KWARGS, seed=0)
    module.configure_pipeline(PipelineSettings(
        search=SearchSettings(max_evaluations=0, num_images=IMAGES, batch_size=32, pca_components=8),
        export=ExportSettings(budgets=[{"flops": 0.6}], split_grid=0, split_candidates=3),
        evaluation=EvaluationSettings(metrics=metrics or [], train_samples=20, val_samples=20, knn_k=3),
        report=ReportSettings(print_table=False, plots=False)),
        run_dir=out_dir, progress="off", overwrite=overwrite)
    data = ClassificationDataModule(source="fashion_mnist", max_samples=IMAGES, batch_size=16, seed=0)
    callbacks: list[Any] = [c() for c in STAGE_CALLBACKS if c.__name__ != without]
    if reader:
        callbacks.append(ScoresReader(out_dir))
    strategy: Any = PruningDDPStrategy() if devices > 1 else "auto"
    quiet = {} if plain else {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                              "enable_model_summary": False, "max_epochs": 1}
    if logger is not None:
        quiet["logger"] = logger
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy=strategy, callbacks=callbacks,
                         use_distributed_sampler=False, **quiet)
    if wait:
        print("ready", flush=True)
        sys.stdin.readline()
    if data_as == "datamodule":
        trainer.fit(module, datamodule=data)
    else:  # the same images as a plain DataLoader of (images, labels), or a LightningDataModule of the user's
        data.configure_for_model(module.backbone)
        loader = data.labeled_dataloader("train", IMAGES, 16)
        if data_as == "loader":
            trainer.fit(module, train_dataloaders=loader)
        else:
            trainer.fit(module, datamodule=pl.LightningDataModule.from_datasets(train_dataset=loader.dataset,
                                                                                 batch_size=16))
    return module


if __name__ == "__main__":
    args = sys.argv[1:]
    without = args[args.index("--without") + 1] if "--without" in args else None
    compose(Path(args[0]), int(args[1]), without, "--reader" in args, plain="--plain" in args, wait="--wait" in args)
