"""``PruningModule``: the pretrained ViT being pruned and the pipeline that prunes it.

The module itself trains nothing. ``trainer.fit`` makes one pass over the pruning data; the
callbacks in ``snapvit_pl.callbacks`` (one per stage, installed in the order of
:data:`snapvit_pl.pipeline.STAGES`) each call one method of the module's :class:`~snapvit_pl.pipeline.Pipeline`,
which refuses a stage before the ones it follows:

========================  =====================================================
hook                      stage
========================  =====================================================
train batch / epoch end   importance (``ImportanceCallback``)
``on_train_end``          coefficient search (``SearchCallback``), then the
                          head/MLP splits and the scores file (``SplitsCallback``)
``on_fit_end``            export: per budget cut -> correct -> evaluate -> save
                          (``ExportCallback``)
``teardown("fit")``       ``report.json`` / ``report.md`` (``ReportCallback``)
========================  =====================================================
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl
import torch

from ..models.loading import BackboneSpec, load_backbone
from ..pipeline.driver import Pipeline
from ..pipeline.settings import PipelineSettings
from ..progress import ProgressMode
from ..ranges import Seed
from .context import bind_trainer


class PruningModule(pl.LightningModule):
    """A pretrained timm ViT to prune (its weights are never changed).

    Args:
        model_name: timm model name with pretrained tag, e.g. ``vit_base_patch16_224.dino``.
        pretrained: load timm's weights for ``model_name`` (hub or local cache).
        checkpoint_path: local weights file used instead of the hub weights.
        model_kwargs: ``timm.create_model`` overrides (``img_size``, ``num_classes``, ...).
        seed: the seed of random weights (``pretrained: false`` without ``checkpoint_path``), recorded with the
            base model so that ``extract``, ``evaluate`` and ``train`` rebuild the same weights; ``prune.py``
            derives it from the run's ``seed_everything`` unless given. Logged as the hyperparameter
            ``weights_seed`` (the DataModule's ``seed`` is another seed).
    """

    def __init__(
        self,
        model_name: str = "vit_small_patch16_224.dino",
        pretrained: bool = True,
        checkpoint_path: Optional[str] = None,
        model_kwargs: Optional[dict[str, Any]] = None,
        seed: Optional[Seed] = None,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["seed"])
        self.hparams["weights_seed"] = seed  # its own name: Lightning merges these hparams with the DataModule's
        self.automatic_optimization = False
        self.spec = BackboneSpec(model_name, pretrained, checkpoint_path, dict(model_kwargs or {}),
                                 seed if pretrained is False and checkpoint_path is None else None)
        self.backbone = load_backbone(self.spec)
        self.backbone.requires_grad_(False)
        self.pipeline: Optional[Pipeline] = None

    def configure_pipeline(self, settings: Optional[PipelineSettings] = None, run_dir: Optional[str | Path] = None,
                           progress: ProgressMode | bool = "auto", seg_data: Any = None) -> Pipeline:
        """The pipeline the stage callbacks drive (over this module's backbone; ``seg_data``: the segmentation
        DataModule of the ``seg`` metric); returns it."""
        self.pipeline = Pipeline(self.backbone, settings, spec=self.spec, seg_datamodule=seg_data, run_dir=run_dir,
                                 progress=progress)
        return self.pipeline

    def setup(self, stage: str) -> None:
        if self.pipeline is None:
            self.configure_pipeline()
        bind_trainer(self.pipeline, self.trainer)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Optional[int]:
        # resumed with complete scores: -1 ends the epoch at once
        return -1 if self.pipeline is not None and self.pipeline.completed("importance") else None

    def training_step(self, batch: Any, batch_idx: int) -> None:
        """No-op: each batch is consumed by ``ImportanceCallback.on_train_batch_end``."""
        return None

    def configure_optimizers(self):
        return None
