"""``FinetuneModule``: train a dense or pruned ViT with labels, distillation from the unpruned model, or both.

Distillation compares the logits (``distill: kl``, models with a classifier head) or the embeddings
(``cosine`` / ``mse``): the class token (pooled embedding), or every token with ``distill_tokens: all`` (the
class, register and patch tokens of ``forward_features``). Embedding distillation needs no labels and no head:
it is the fine-tuning of a pruned DINO / DINOv2 / DINOv3 backbone (``configs/train/distill_backbone.yaml``), and
it trains on image-only batches (``data.init_args.train_views: plain``).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from ..errors import CheckpointError, ConfigError
from ..models.checkpoint import load_pruned
from ..models.embedding import embed
from ..models.loading import BackboneSpec, fingerprint, load_backbone
from ..ranges import HalfOpenUnitInterval, NonNegativeFloat, PositiveFloat, one_of
from .training import (adamw, check_finite_weights, check_ranges, check_training_data, open_checkpoint,
                       record_training_data, reseed_for_epoch, run_seed, seal_checkpoint, stop_if_diverged,
                       warmup_cosine_schedule)


_TEACHER = "teacher."
#: The checkpoint key of the architecture a fine-tune trains (:func:`model_architecture`).
ARCHITECTURE_KEY = "snapvit_architecture"


def model_architecture(checkpoint: Optional[str] = None, model_name: Optional[str] = None,
                       model_kwargs: Optional[dict[str, Any]] = None, record: Optional[dict[str, Any]] = None
                       ) -> Optional[dict[str, Any]]:
    """What a fine-tune's checkpoint records of the model it trains, and a ``--ckpt_path`` to resume must match:
    ``sha256``, the digest of its architecture (the base model's name and arguments, regularisation rates and
    weight sources left out, and for a pruned checkpoint its widths and kept heads), ``model`` (the pruned
    checkpoint or the timm name), and its ``heads`` / ``mlp_hidden`` when pruned. ``record``: the pruned
    checkpoint's architecture record (read from ``checkpoint`` when not given). None when neither ``checkpoint``
    nor ``model_name`` is given."""
    if checkpoint is not None:
        if record is None:
            from ..models.checkpoint import read_record

            record = read_record(checkpoint)
        base = record["base"]
        widths = {"heads": record["heads"], "mlp_hidden": record["mlp_hidden"], "kept_heads": record.get("kept_heads")}
        model = str(checkpoint)
    elif model_name is not None:
        base = BackboneSpec(model_name, False, None, dict(model_kwargs or {})).to_dict()
        widths, model = {}, model_name
    else:
        return None
    kwargs = {k: v for k, v in (base.get("model_kwargs") or {}).items()
              if not (k.endswith("_rate") and "drop" in k) and k not in ("pretrained_cfg", "pretrained_cfg_overlay")}
    described = {"model_name": base["model_name"], "model_kwargs": kwargs, **widths}
    digest = hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()
    return {"sha256": digest, "model": model, **{k: v for k, v in widths.items() if k != "kept_heads"}}


def describe_architecture(architecture: dict[str, Any]) -> str:
    """``runs/prune/X/models/mlp0.50_head0.50 (heads [2, 2], mlp_hidden [64, 64])``, for errors."""
    widths = ", ".join(f"{k} {architecture[k]}" for k in ("heads", "mlp_hidden") if architecture.get(k) is not None)
    return f"{architecture.get('model')}{f' ({widths})' if widths else ''}"


def check_resumed_architecture(recorded: Optional[dict[str, Any]], expected: dict[str, Any], ckpt_path: Any) -> None:
    """Refuse to resume (or evaluate) from ``ckpt_path``, whose checkpoint records the architecture ``recorded``,
    a fine-tune of the model ``expected`` (:func:`model_architecture`) when they differ: its weights would be
    trained, and exported, as those of this model. A checkpoint that records none is refused too."""
    if isinstance(recorded, dict) and recorded.get("sha256") == expected["sha256"]:
        return
    model = describe_architecture(expected)
    if not isinstance(recorded, dict) or not recorded.get("sha256"):
        raise CheckpointError(f"--ckpt_path {ckpt_path} records no model architecture (it was not written by a "
                              f"snapvit-pl fine-tune, or by one older than this check), so it cannot be checked "
                              f"against the model {model}; give a checkpoint of this model's fine-tune, or start "
                              "again without --ckpt_path")
    other = describe_architecture(recorded)
    raise CheckpointError(f"--ckpt_path {ckpt_path} is the fine-tune of another model, {other}, not of {model}; "
                          "resuming would train and export its weights as this model's. Give the checkpoint of this "
                          "model's own run (--ckpt_path last in its run directory), or --model.checkpoint the model "
                          "it fine-tunes")


#: ``model.loss``: cross-entropy on labels, distillation from the teacher, or their sum
Loss = one_of("ce", "distill", "both")
#: ``model.distill``: how the student's output is compared with the teacher's
Distill = one_of("kl", "cosine", "mse")
#: ``model.distill_tokens``: the tokens a feature distillation compares
DistillTokens = one_of("class", "all")


class FinetuneModule(pl.LightningModule):
    """Fine-tunes a pruned checkpoint (or trains a dense timm model, e.g. the reference ViT).

    Args:
        checkpoint: a pruned-checkpoint directory (``model.safetensors`` + ``architecture.json``);
            if None, the dense model ``model_name``/``model_kwargs`` is built instead.
        model_name: timm model name of the dense model (when ``checkpoint`` is None).
        pretrained: load timm's weights for the dense model.
        checkpoint_path: local weights file of the dense model.
        model_kwargs: ``timm.create_model`` overrides of the dense model.
        loss: ``ce`` (labels), ``distill`` (teacher only) or ``both``.
        distill: ``kl`` on logits (needs classifier heads) or ``cosine`` / ``mse`` on embeddings.
        distill_tokens: with ``cosine`` / ``mse``: ``class`` (the pooled embedding) or ``all`` (every token of
            ``forward_features``: the class token and the patch tokens, each compared with the teacher's).
        distill_weight: weight of the distillation term when ``loss: both`` (added to the cross-entropy, >= 0).
        temperature: softening temperature of the KL term (> 0).
        teacher_model_name: timm name of the unpruned teacher. Default, for a checkpoint exported by
            ``prune.py``: the very base model it was cut from (its recorded spec and weights, checked
            against the recorded fingerprint); otherwise the checkpoint's base architecture.
        teacher_pretrained: load timm's weights for the teacher (default: as recorded, else true).
        teacher_checkpoint_path: local weights file of the teacher.
        lr: peak AdamW learning rate (> 0).
        weight_decay: AdamW weight decay (>= 0).
        warmup_epochs: linear warm-up length (fractions allowed, >= 0), then cosine decay to ``min_lr``.
        min_lr: final learning rate (>= 0).
        label_smoothing: cross-entropy label smoothing, in [0, 1).

    A training step whose loss is NaN or infinite stops the run with an error (nothing more is saved, nothing is
    exported); a checkpoint records the architecture of the model trained, and resuming from one of another
    model is refused.
    """

    def __init__(
        self,
        checkpoint: Optional[str] = None,
        model_name: Optional[str] = None,
        pretrained: bool = False,
        checkpoint_path: Optional[str] = None,
        model_kwargs: Optional[dict[str, Any]] = None,
        loss: Loss = "ce",
        distill: Distill = "kl",
        distill_tokens: DistillTokens = "class",
        distill_weight: NonNegativeFloat = 1.0,
        temperature: PositiveFloat = 1.0,
        teacher_model_name: Optional[str] = None,
        teacher_pretrained: Optional[bool] = None,
        teacher_checkpoint_path: Optional[str] = None,
        lr: PositiveFloat = 1e-3,
        weight_decay: NonNegativeFloat = 0.05,
        warmup_epochs: NonNegativeFloat = 1.0,
        min_lr: NonNegativeFloat = 1e-6,
        label_smoothing: HalfOpenUnitInterval = 0.0,
    ):
        super().__init__()
        check_ranges(FinetuneModule, locals())
        self.save_hyperparameters()
        if checkpoint is not None:
            self.model, record = load_pruned(checkpoint)
            self.model.train()  # load_pruned returns eval mode; Lightning keeps submodules' modes
            self.spec = BackboneSpec.from_dict(record["base"])
            self.record: Optional[dict[str, Any]] = record
        elif model_name is not None:
            self.spec = BackboneSpec(model_name, pretrained, checkpoint_path, dict(model_kwargs or {}), run_seed())
            self.model, self.record = load_backbone(self.spec).train(), None
        else:
            raise ConfigError("give model.checkpoint (a pruned checkpoint) or model.model_name (a dense timm model)")
        self.architecture = model_architecture(checkpoint, self.spec.model_name, self.spec.model_kwargs, self.record)
        if self.record is None:  # the widths of a dense model, for errors
            try:
                from ..models.surgery import architecture

                self.architecture.update(architecture(self.model))
            except Exception:  # not a model the surgery knows: its name says enough
                pass
        self.num_classes = getattr(self.model, "num_classes", 0)
        if loss != "distill" and not self.num_classes:
            raise ConfigError("loss 'ce' needs a classifier head: set model_kwargs.num_classes (or use loss: distill)")
        if loss != "ce" and distill == "kl" and not self.num_classes:
            raise ConfigError("distill 'kl' compares logits: the model has no classifier head; use distill: cosine or mse")
        self.teacher: Optional[nn.Module] = None
        if loss != "ce":
            self.teacher = self._teacher(teacher_model_name, teacher_pretrained, teacher_checkpoint_path)
        if self.num_classes:
            self.train_accuracy = MulticlassAccuracy(self.num_classes, average="micro")
            self.val_accuracy = MulticlassAccuracy(self.num_classes, average="micro")

    def _teacher(self, model_name: Optional[str], pretrained: Optional[bool], checkpoint_path: Optional[str]) -> nn.Module:
        extra = (self.record or {}).get("extra") or {}
        recorded = model_name is None and checkpoint_path is None and pretrained is None and extra.get("base_spec")
        if recorded:  # the base model prune.py cut this checkpoint from
            teacher = load_backbone(BackboneSpec.from_dict(extra["base_spec"]))
            if extra.get("base_fingerprint") and fingerprint(teacher) != extra["base_fingerprint"]:
                raise CheckpointError(
                    f"the base weights recorded for {self.hparams.checkpoint} ({extra['base_spec']}) have changed since it "
                    "was pruned; pass the unpruned model as model.teacher_checkpoint_path"
                )
        else:
            teacher = load_backbone(BackboneSpec(model_name or self.spec.model_name, True if pretrained is None else pretrained,
                                                 checkpoint_path, dict(self.spec.model_kwargs)))
        return teacher.eval().requires_grad_(False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse to save weights that are no longer finite (the last step diverged: the checkpoint saved before is
        kept); leave the frozen teacher out (it is rebuilt from its recorded base when the run resumes; for ViT-B
        that is 344 MB per checkpoint), record its fingerprint and the architecture trained, then seal the
        checkpoint (RNG states, checksum)."""
        check_finite_weights(self.model.state_dict(), "the checkpoint")
        checkpoint[ARCHITECTURE_KEY] = dict(self.architecture)
        if self.teacher is not None:
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items()
                                        if not k.startswith(_TEACHER)}
            checkpoint["teacher_fingerprint"] = self._teacher_fingerprint()
        record_training_data(self, checkpoint)
        seal_checkpoint(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Check the checkpoint (its checksum, the architecture it trained: this module's), and give it the teacher
        this module rebuilt (the one it was trained with)."""
        trainer = getattr(self, "_trainer", None)
        check_resumed_architecture(checkpoint.get(ARCHITECTURE_KEY), self.architecture,
                                   getattr(trainer, "ckpt_path", None) or "(the checkpoint)")
        open_checkpoint(checkpoint, {k: v for k, v in self.state_dict().items() if not k.startswith(_TEACHER)})
        check_training_data(self, checkpoint)
        if self.teacher is None:
            return
        recorded, rebuilt = checkpoint.get("teacher_fingerprint"), self._teacher_fingerprint()
        if recorded is not None and recorded != rebuilt:
            raise CheckpointError("the teacher rebuilt for this run is not the one the checkpoint was trained with "
                                  f"(fingerprint {recorded[:12]} != {rebuilt[:12]}); resume with the same "
                                  "model.teacher_* settings and base weights")
        checkpoint["state_dict"].update({_TEACHER + k: v for k, v in self.teacher.state_dict().items()})

    def _teacher_fingerprint(self) -> str:
        """The frozen teacher's weight fingerprint (computed once)."""
        if getattr(self, "_teacher_print", None) is None:
            self._teacher_print = fingerprint(self.teacher)
        return self._teacher_print

    def _features(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """What embedding distillation compares: ``[B, D]`` pooled embeddings or ``[B, N, D]`` tokens."""
        return embed(model, images) if self.hparams.distill_tokens == "class" else model.forward_features(images)

    def _distillation(self, images: torch.Tensor, logits: Optional[torch.Tensor]) -> torch.Tensor:
        kl = self.hparams.distill == "kl"
        with torch.no_grad():
            self.teacher.eval()
            target = self.teacher(images) if kl else self._features(self.teacher, images)
        if kl:
            t = self.hparams.temperature
            return F.kl_div(F.log_softmax(logits / t, -1), F.log_softmax(target / t, -1), log_target=True, reduction="batchmean") * t * t
        student = self._features(self.model, images)
        if self.hparams.distill == "cosine":
            return 1 - F.cosine_similarity(student, target, dim=-1).mean()
        return F.mse_loss(student, target)

    def _batch(self, batch: Any) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``(images, labels)``; image-only batches (``train_views: plain``) have no labels."""
        if isinstance(batch, torch.Tensor):
            return batch, None
        images, labels = batch[0], (batch[1] if len(batch) > 1 else None)
        return images, labels

    def _logits(self, images: torch.Tensor) -> Optional[torch.Tensor]:
        """The classifier's output when a term needs it (not for embedding distillation alone)."""
        needs = self.hparams.loss != "distill" or self.hparams.distill == "kl" or self.num_classes
        return self.model(images) if needs else None

    def on_train_epoch_start(self) -> None:
        reseed_for_epoch(self.current_epoch, self.global_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = self._batch(batch)
        logits = self._logits(images)
        terms = {}
        if self.hparams.loss in ("ce", "both"):
            if labels is None:
                raise ConfigError("loss 'ce' needs labeled batches: set data.init_args.train_views: labeled, or "
                                  "loss: distill")
            terms["ce"] = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)
        if self.hparams.loss in ("distill", "both"):
            weight = self.hparams.distill_weight if self.hparams.loss == "both" else 1.0
            terms["distill"] = weight * self._distillation(images, logits)
        loss = sum(terms.values())
        stop_if_diverged(self, loss, self._settings_to_lower())
        for name, value in terms.items():
            self.log(f"train/{name}", value, on_step=True, on_epoch=False)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False)
        if self.num_classes and labels is not None:
            self.train_accuracy(logits.detach(), labels)
            self.log("train/accuracy", self.train_accuracy, on_step=False, on_epoch=True)
        return loss

    def _settings_to_lower(self) -> str:
        """What a divergence's error tells to lower."""
        kl = self.hparams.loss != "ce" and self.hparams.distill == "kl"
        return f"--model.lr (now {self.hparams.lr:g})" + (
            f" or raise --model.temperature (now {self.hparams.temperature:g})" if kl else "")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        images, labels = self._batch(batch)
        logits = self._logits(images)
        fitting = getattr(getattr(self._trainer, "state", None), "fn", None) == "fit"
        if self.num_classes and labels is not None:
            loss = F.cross_entropy(logits, labels)
            if fitting:  # before the epoch's checkpoint is saved over the last finite one
                stop_if_diverged(self, loss, self._settings_to_lower(), "val/loss")
            self.log("val/loss", loss, sync_dist=True)
            self.val_accuracy(logits, labels)
            self.log("val/accuracy", self.val_accuracy, prog_bar=True)
        elif self.teacher is not None:
            loss = self._distillation(images, logits)
            if fitting:
                stop_if_diverged(self, loss, self._settings_to_lower(), "val/loss")
            self.log("val/loss", loss, sync_dist=True, prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def configure_optimizers(self):
        optimizer = adamw([self.model], self.hparams.lr, self.hparams.weight_decay)
        return warmup_cosine_schedule(optimizer, self.trainer, self.hparams.lr, self.hparams.min_lr,
                                      self.hparams.warmup_epochs)
