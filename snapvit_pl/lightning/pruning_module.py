"""``PruningModule``: the pretrained ViT being pruned, its frozen dense teacher and the run's typed state.

The module itself trains nothing. ``trainer.fit`` makes one pass over the pruning data and the
callbacks in ``snapvit_pl.callbacks`` run the pipeline stages (:mod:`snapvit_pl.pipeline`) at fixed
points of that loop, so their order never depends on how they are listed:

========================  =====================================================
hook                      stage
========================  =====================================================
train batch / epoch end   importance (``ImportanceCallback``)
``on_train_end``          coefficient search (``SearchCallback``)
``on_fit_end``            export: scores file, then per budget cut -> correct ->
                          evaluate -> save (``ExportCallback``)
``teardown("fit")``       ``report.json`` / ``report.md`` (``ReportCallback``)
========================  =====================================================
"""
from __future__ import annotations

import copy
from typing import Any, Optional

import pytorch_lightning as pl
import torch
from torch import nn

from ..errors import CheckpointError
from ..models.loading import BackboneSpec, fingerprint, load_backbone
from ..pipeline.state import RunState


class PruningModule(pl.LightningModule):
    """A pretrained timm ViT to prune, with a frozen copy of its dense self as teacher.

    Args:
        model_name: timm model name with pretrained tag, e.g. ``vit_base_patch16_224.dino``.
        pretrained: load timm's weights for ``model_name`` (hub or local cache).
        checkpoint_path: local weights file used instead of the hub weights.
        model_kwargs: ``timm.create_model`` overrides (``img_size``, ``num_classes``, ...).
    """

    def __init__(
        self,
        model_name: str = "vit_small_patch16_224.dino",
        pretrained: bool = True,
        checkpoint_path: Optional[str] = None,
        model_kwargs: Optional[dict[str, Any]] = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.spec = BackboneSpec(model_name, pretrained, checkpoint_path, dict(model_kwargs or {}))
        self.backbone = load_backbone(self.spec)
        self.backbone.requires_grad_(False)
        # Not a registered submodule: it is not trained, not checkpointed, and not moved by DDP wrapping.
        self._teacher: Optional[nn.Module] = None
        self.state = RunState(self.spec, fingerprint(self.backbone))

    @property
    def teacher(self) -> nn.Module:
        """Frozen dense copy of the backbone (created on first use, on the backbone's device)."""
        if self._teacher is None:
            self._teacher = copy.deepcopy(self.backbone).eval().requires_grad_(False)
        return self._teacher

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Optional[int]:
        return -1 if self.state.local is not None else None  # resumed with its scores: -1 ends the epoch at once

    def training_step(self, batch: Any, batch_idx: int) -> None:
        """No-op: each batch is consumed by ``ImportanceCallback.on_train_batch_end``."""
        return None

    def configure_optimizers(self):
        return None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["state_dict"] = {}  # the backbone is never modified: resume rebuilds it from its spec
        checkpoint["base_fingerprint"] = self.state.fingerprint

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if checkpoint.get("base_fingerprint") not in (None, self.state.fingerprint):
            raise CheckpointError("the resume checkpoint was written for other base weights; resume with the same model")
