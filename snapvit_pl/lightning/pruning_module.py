"""``PruningModule``: the pretrained ViT being pruned and its frozen dense teacher.

The module itself trains nothing. ``trainer.fit`` makes one pass over the pruning data and the
callbacks in ``callbacks/`` do the work at fixed points of the loop, so their order never
depends on how they are listed:

========================  =====================================================
hook                      stage
========================  =====================================================
train batch / epoch end   importance estimation (``ImportanceCallback``)
``on_train_end``          xNES search of block coefficients (``SearchCallback``)
``on_fit_end``            extraction, correction, evaluation, export (``ExportCallback``
                          + hooks registered by ``CorrectionCallback``/``EvaluationCallback``)
``teardown("fit")``       ``report.json`` / ``report.md`` (``ReportCallback``)
========================  =====================================================
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pytorch_lightning as pl
import torch
from torch import nn

from ..elastic.scores import ElasticScores
from ..models.loading import BackboneSpec, fingerprint, load_backbone
from ..models.units import Subnet


@dataclass
class ExtractedModel:
    """One pruned model produced by the export stage."""

    label: str
    budget: dict[str, Any]
    subnet: Subnet
    model: nn.Module
    mlp_ratio: float
    head_ratio: float
    info: dict[str, Any] = field(default_factory=dict)  # params, flops, metrics, checkpoint, ...


# Hook run on each extracted model, in priority order (correction before evaluation).
ExtractHook = Callable[["PruningModule", ExtractedModel], None]


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
        self.base_fingerprint = fingerprint(self.backbone)
        self.local_scores: Optional[ElasticScores] = None
        self.coefficients: Optional[torch.Tensor] = None
        self.extracted: list[ExtractedModel] = []
        self.extract_hooks: list[tuple[int, ExtractHook]] = []
        self.summary: dict[str, Any] = {"timings": {}}
        self.strict_loading = False
        self.keep_ratios = (0.05, 0.2)  # (min_mlp_keep, min_head_keep), set by ImportanceCallback
        self.skip_training = False  # set when a resumed run already has its importance scores

    @property
    def teacher(self) -> nn.Module:
        """Frozen dense copy of the backbone (created on first use, on the backbone's device)."""
        if self._teacher is None:
            self._teacher = copy.deepcopy(self.backbone).eval().requires_grad_(False)
        return self._teacher

    @property
    def run_dir(self) -> Path:
        """Where artifacts are written (``trainer.default_root_dir``)."""
        return Path(self.trainer.default_root_dir)

    def register_extract_hook(self, hook: ExtractHook, priority: int) -> None:
        """Run ``hook`` on every extracted model; lower priority runs first."""
        self.extract_hooks.append((priority, hook))
        self.extract_hooks.sort(key=lambda item: item[0])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Optional[int]:
        return -1 if self.skip_training else None  # -1 ends the epoch at once

    def training_step(self, batch: Any, batch_idx: int) -> None:
        """No-op: each batch is consumed by ``ImportanceCallback.on_train_batch_end``."""
        return None

    def configure_optimizers(self):
        return None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["state_dict"] = {}  # the backbone is never modified: resume rebuilds it from its spec
        checkpoint["base_fingerprint"] = self.base_fingerprint

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if checkpoint.get("base_fingerprint") not in (None, self.base_fingerprint):
            from ..errors import CheckpointError

            raise CheckpointError("the resume checkpoint was written for other base weights; resume with the same model")
