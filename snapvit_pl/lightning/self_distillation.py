"""``SelfDistillationModule``: train a ViT without labels by DINO self-distillation (Caron et al. 2021).

A student (the backbone + a projection head) sees every multi-crop view of an image; a teacher, the exponential
moving average (EMA) of the student, sees the global views; the student learns to predict the teacher's
centred, sharpened distribution over ``out_dim`` prototypes for every other view. No labels and no classifier:
what is kept (and exported by :class:`~snapvit_pl.callbacks.SavePrunedCallback`) is the teacher's backbone, as
DINO ships it. ``snapvit-pl pretrain fit --config configs/train/dino_fmnist.yaml`` trains the project's
self-supervised development model with it.
"""
from __future__ import annotations

import copy
from itertools import chain
from typing import Any, Optional

import pytorch_lightning as pl
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from ..eval.features import extract_features
from ..eval.knn import knn_classify
from ..models.embedding import embed
from ..models.loading import BackboneSpec, load_backbone
from ..ranges import ClosedUnitInterval, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, one_of
from .training import (adamw, check_finite_weights, check_ranges, check_training_data, open_checkpoint,
                       record_training_data, reseed_for_epoch, run_seed, seal_checkpoint, stop_if_diverged, warmup_cosine,
                       warmup_cosine_schedule)


class ProjectionHead(nn.Module):
    """DINO's projection head: an MLP to a bottleneck, L2 normalisation, then a weight-normalised linear layer
    onto ``out_dim`` prototypes whose norms are fixed to 1 (the last layer's ``g`` is frozen).

    Args:
        in_dim: backbone embedding width.
        out_dim: number of prototypes.
        hidden_dim: width of the MLP's hidden layers.
        bottleneck_dim: width of the L2-normalised bottleneck.
    """

    def __init__(self, in_dim: int, out_dim: int = 1024, hidden_dim: int = 512, bottleneck_dim: int = 64):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, hidden_dim), nn.GELU(),
                                 nn.Linear(hidden_dim, bottleneck_dim))
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                nn.init.trunc_normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)
        self.last_layer = nn.utils.parametrizations.weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        magnitude = self.last_layer.parametrizations.weight.original0
        magnitude.data.fill_(1.0)
        magnitude.requires_grad_(False)

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.last_layer(F.normalize(self.mlp(embeddings), dim=-1))


def self_distillation_loss(student: torch.Tensor, teacher: torch.Tensor, center: torch.Tensor, n_views: int,
                           n_global: int, student_temp: float, teacher_temp: float) -> torch.Tensor:
    """DINO's loss: cross-entropy between the teacher's centred, sharpened distribution of each global view and
    the student's distribution of every *other* view, averaged over the pairs and the batch.

    Args:
        student: student logits ``[n_views * B, K]``, view-major (all images' view 0, then view 1, ...).
        teacher: teacher logits ``[n_global * B, K]`` of the global views, in the same order.
        center: running mean of the teacher logits ``[1, K]``.
        n_views: views per image (the first ``n_global`` are the global ones).
        n_global: global views per image.
        student_temp, teacher_temp: softmax temperatures.
    """
    return distillation_cross_entropy(student, F.softmax((teacher - center) / teacher_temp, dim=-1), n_views, n_global,
                                      student_temp)


def distillation_cross_entropy(student: torch.Tensor, target: torch.Tensor, n_views: int, n_global: int,
                               student_temp: float) -> torch.Tensor:
    """Cross-entropy between the teacher's target distribution of each global view ``target`` ``[n_global * B, K]``
    and the student's distribution of every *other* view (``student`` logits ``[n_views * B, K]``, view-major),
    averaged over the pairs and the batch."""
    log_student = F.log_softmax(student / student_temp, dim=-1).chunk(n_views)
    pairs = [(-t * log_student[v]).sum(-1).mean() for g, t in enumerate(target.chunk(n_global))
             for v in range(n_views) if v != g]
    return torch.stack(pairs).mean()


def multicrop_contrastive_loss(embeddings: torch.Tensor, n_views: int, temperature: float) -> torch.Tensor:
    """InfoNCE over multi-crop views (SimCLR's NT-Xent with every other view of the same image as a positive, as
    supervised contrastive learning does with a class): ``embeddings`` ``[n_views * B, D]`` view-major; each view is
    pulled towards the other views of its image and pushed from every view of the other images of the batch."""
    z = F.normalize(embeddings.float(), dim=-1)
    logits = z @ z.T / temperature
    own = torch.eye(len(z), dtype=torch.bool, device=z.device)
    logits = logits.masked_fill(own, float("-inf"))
    image = torch.arange(len(z) // n_views, device=z.device).repeat(n_views)
    positive = (image[:, None] == image[None, :]) & ~own
    log_p = F.log_softmax(logits, dim=1).masked_fill(~positive, 0.0)
    return -(log_p.sum(dim=1) / positive.sum(dim=1)).mean()


@torch.no_grad()
def sinkhorn_targets(teacher: torch.Tensor, teacher_temp: float, iterations: int = 3) -> torch.Tensor:
    """Teacher targets ``[N, K]`` by Sinkhorn-Knopp (SwAV; DINOv2's centring): ``exp(teacher / temp)`` scaled so
    that every prototype takes an equal share of the batch and every sample's row sums to 1. Under DDP the sums run
    over every process's batch."""
    distributed = dist.is_available() and dist.is_initialized()
    shift = teacher.max().float()
    if distributed:  # one shift for all processes: the largest logit of any
        dist.all_reduce(shift, op=dist.ReduceOp.MAX)
    q = torch.exp((teacher.float() - shift) / teacher_temp).T  # [K, N]
    samples = torch.tensor(float(q.shape[1]), device=q.device)
    if distributed:
        dist.all_reduce(samples)

    def summed(x: torch.Tensor) -> torch.Tensor:
        if distributed:
            dist.all_reduce(x)
        return x

    tiny = torch.finfo(q.dtype).tiny  # a prototype (or sample) whose every weight underflowed stays at zero
    q /= summed(q.sum()).clamp_min(tiny)
    for _ in range(iterations):
        q /= summed(q.sum(dim=1, keepdim=True)).clamp_min(tiny)  # every prototype the same mass ...
        q /= q.shape[0]
        q /= q.sum(dim=0, keepdim=True).clamp_min(tiny)  # ... every sample a distribution
        q /= samples
    return (q * samples).T


#: ``model.objective``: DINO's cross-entropy between teacher and student prototypes, or a contrastive loss
Objective = one_of("dino", "contrastive")
#: ``model.centering``: how the teacher's outputs are centred (a running mean, or Sinkhorn-Knopp)
Centering = one_of("mean", "sinkhorn")


class SelfDistillationModule(pl.LightningModule):
    """DINO self-distillation of a timm ViT from scratch (or from given weights), on multi-crop batches
    ``[B, V, C, H, W]`` (``data.init_args.train_views: multicrop``; the first ``n_global_views`` are the global
    crops).

    Args:
        model_name: timm model name of the backbone.
        model_kwargs: ``timm.create_model`` arguments (``num_classes: 0``: no classifier).
        pretrained: start from timm's weights.
        checkpoint_path: start from a local weights file.
        n_global_views: global views per image (the teacher's inputs).
        local_size: side the local views are resized to (smaller than the input: fewer tokens, as DINO's
            96 px local crops of a 224 px model); None keeps the input size.
        out_dim: prototypes of the projection head.
        hidden_dim: hidden width of the projection head.
        bottleneck_dim: bottleneck width of the projection head.
        student_temp: student softmax temperature.
        teacher_temp: teacher softmax temperature after the warm-up.
        warmup_teacher_temp: teacher temperature at the start, raised linearly to ``teacher_temp``.
        warmup_teacher_temp_epochs: length of that warm-up (epochs, fractions allowed).
        center_momentum: momentum of the teacher-output centre.
        objective: ``dino`` (the default: self-distillation from the teacher's prototype distribution) or
            ``contrastive`` (:func:`multicrop_contrastive_loss` on the student's projection-head bottleneck, at
            temperature ``student_temp``; the teacher is still the student's EMA, and it is what is exported, as
            MoCo's momentum encoder); faster to reach useful features on a small budget.
        centering: how the teacher's outputs are centred: ``mean`` (DINO: a running mean subtracted) or ``sinkhorn``
            (DINOv2: three Sinkhorn-Knopp iterations over the batch, :func:`sinkhorn_targets`).
        teacher_momentum: EMA momentum at the start, raised to 1 by a cosine over the run.
        lr: peak AdamW learning rate (linear warm-up, then cosine to ``min_lr``).
        min_lr: final learning rate.
        weight_decay: AdamW weight decay (matrices only).
        warmup_epochs: learning-rate warm-up (epochs).
        freeze_last_layer_epochs: the prototypes are not updated for this long (DINO's stabiliser).
        knn_train_samples: after every epoch, the teacher's weighted k-NN top-1 is logged (``knn/top1``) with this
            many labelled train images as memory (0: off; needs a labelled DataModule). A monitor only: the
            exported weights are the last epoch's, whatever it shows.
        knn_val_samples: images of the DataModule's val split the k-NN monitor scores.

    The numbers' ranges are their types' (``PositiveFloat``: > 0, ``ClosedUnitInterval``: in [0, 1], ...), checked
    by the command line when it parses and by the constructor. A training step whose loss is NaN or infinite stops
    the run with an error (nothing more is saved, nothing is exported).
    """

    def __init__(
        self,
        model_name: str = "vit_tiny_patch16_224",
        model_kwargs: Optional[dict[str, Any]] = None,
        pretrained: bool = False,
        checkpoint_path: Optional[str] = None,
        n_global_views: PositiveInt = 2,
        local_size: Optional[PositiveInt] = None,
        out_dim: PositiveInt = 1024,
        hidden_dim: PositiveInt = 512,
        bottleneck_dim: PositiveInt = 64,
        student_temp: PositiveFloat = 0.1,
        teacher_temp: PositiveFloat = 0.07,
        warmup_teacher_temp: PositiveFloat = 0.04,
        warmup_teacher_temp_epochs: NonNegativeFloat = 3.0,
        center_momentum: ClosedUnitInterval = 0.9,
        objective: Objective = "dino",
        centering: Centering = "mean",
        teacher_momentum: ClosedUnitInterval = 0.99,
        lr: PositiveFloat = 5e-4,
        min_lr: NonNegativeFloat = 1e-6,
        weight_decay: NonNegativeFloat = 0.04,
        warmup_epochs: NonNegativeFloat = 1.0,
        freeze_last_layer_epochs: NonNegativeFloat = 1.0,
        knn_train_samples: NonNegativeInt = 5000,
        knn_val_samples: NonNegativeInt = 2000,
    ):
        super().__init__()
        check_ranges(SelfDistillationModule, locals())
        self.save_hyperparameters()
        self.spec = BackboneSpec(model_name, pretrained, checkpoint_path, dict(model_kwargs or {}), run_seed())
        # dynamic_img_size: the same weights take the smaller local views (position embeddings resampled); the
        # exported record keeps the spec's own arguments, so the shipped model is a plain fixed-size ViT.
        build = BackboneSpec(model_name, pretrained, checkpoint_path, {**self.spec.model_kwargs, "dynamic_img_size": True},
                             self.spec.seed)
        self.student = load_backbone(build if local_size else self.spec).train()
        if getattr(self.student, "num_classes", 0):
            raise ConfigError("self-distillation trains a backbone without classifier: set model_kwargs.num_classes: 0")
        self.student_head = ProjectionHead(self.student.num_features, out_dim, hidden_dim, bottleneck_dim)
        #: the EMA teacher's backbone: what is evaluated and exported (``model``, as FinetuneModule's)
        self.model = copy.deepcopy(self.student).requires_grad_(False)
        self.teacher_head = copy.deepcopy(self.student_head).requires_grad_(False)
        self.register_buffer("center", torch.zeros(1, out_dim))
        if objective == "contrastive":  # the prototypes take no part (and DDP wants no parameter left without gradient)
            self.student_head.last_layer.requires_grad_(False)

    # -- schedules ------------------------------------------------------------------------------
    def _epochs_done(self) -> float:
        """Training progress in epochs (fractional), from the global step."""
        return self.global_step / max(1, self.trainer.num_training_batches)

    def _teacher_temp(self) -> float:
        hp = self.hparams
        progress = min(1.0, self._epochs_done() / hp.warmup_teacher_temp_epochs) if hp.warmup_teacher_temp_epochs > 0 else 1.0
        return hp.warmup_teacher_temp + (hp.teacher_temp - hp.warmup_teacher_temp) * progress

    def _teacher_momentum(self) -> float:
        """Cosine from ``teacher_momentum`` to 1 over the run."""
        total = max(1, int(self.trainer.estimated_stepping_batches))
        return 1.0 - (1.0 - self.hparams.teacher_momentum) * warmup_cosine(self.global_step, total, 0, 0.0)

    # -- training -------------------------------------------------------------------------------
    def on_train_epoch_start(self) -> None:
        reseed_for_epoch(self.current_epoch, self.global_rank)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        check_finite_weights(checkpoint["state_dict"], "the checkpoint")
        record_training_data(self, checkpoint)
        seal_checkpoint(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        open_checkpoint(checkpoint, self.state_dict())
        check_training_data(self, checkpoint)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        views = batch[0] if isinstance(batch, (list, tuple)) else batch
        if views.dim() != 5 or views.shape[1] <= self.hparams.n_global_views:
            raise ConfigError(f"self-distillation takes multi-crop batches [B, V, C, H, W] with more than "
                              f"{self.hparams.n_global_views} views, got shape {tuple(views.shape)}; set "
                              "data.init_args.train_views: multicrop (and n_local_views >= 1)")
        n_views, n_global = views.shape[1], self.hparams.n_global_views
        global_views = views[:, :n_global].transpose(0, 1).flatten(0, 1)  # view-major: [n_global * B, C, H, W]
        local_views = views[:, n_global:].transpose(0, 1).flatten(0, 1)
        if self.hparams.local_size:
            local_views = F.interpolate(local_views, size=self.hparams.local_size, mode="bilinear", antialias=True,
                                        align_corners=False)
        if self.hparams.objective == "contrastive":
            student = torch.cat([self.student_head.mlp(embed(self.student, global_views)),
                                 self.student_head.mlp(embed(self.student, local_views))])
            loss = multicrop_contrastive_loss(student, n_views, self.hparams.student_temp)
            stop_if_diverged(self, loss, f"--model.lr (now {self.hparams.lr:g})")
            self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False)
            return loss
        with torch.no_grad():
            self.model.eval()
            teacher = self.teacher_head(embed(self.model, global_views))
        student = torch.cat([self.student_head(embed(self.student, global_views)),
                             self.student_head(embed(self.student, local_views))])
        teacher_temp = self._teacher_temp()
        if self.hparams.centering == "sinkhorn":
            loss = distillation_cross_entropy(student, sinkhorn_targets(teacher, teacher_temp), n_views, n_global,
                                              self.hparams.student_temp)
        else:
            loss = self_distillation_loss(student, teacher, self.center, n_views, n_global, self.hparams.student_temp,
                                          teacher_temp)
            self._update_center(teacher)
        stop_if_diverged(self, loss, f"--model.lr (now {self.hparams.lr:g})")
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False)
        self.log("train/teacher_temp", teacher_temp, on_step=True, on_epoch=False)
        return loss

    @torch.no_grad()
    def _update_center(self, teacher: torch.Tensor) -> None:
        batch_center = teacher.mean(0, keepdim=True)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(batch_center)
            batch_center /= dist.get_world_size()
        momentum = self.hparams.center_momentum
        self.center.mul_(momentum).add_(batch_center, alpha=1 - momentum)

    def on_after_backward(self) -> None:
        if self._epochs_done() < self.hparams.freeze_last_layer_epochs:
            for param in self.student_head.last_layer.parameters():
                param.grad = None

    @torch.no_grad()
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        momentum = self._teacher_momentum()
        self.log("train/teacher_momentum", momentum, on_step=True, on_epoch=False)
        students = chain(self.student.parameters(), self.student_head.parameters())
        teachers = chain(self.model.parameters(), self.teacher_head.parameters())
        for teacher, student in zip(teachers, students):
            teacher.mul_(momentum).add_(student.detach(), alpha=1 - momentum)

    def on_train_epoch_end(self) -> None:
        """The k-NN monitor of the teacher (see ``knn_train_samples``)."""
        datamodule = getattr(self.trainer, "datamodule", None)
        if not self.hparams.knn_train_samples or datamodule is None or not getattr(datamodule, "labeled", False):
            return
        memory = extract_features(self.model, datamodule.labeled_dataloader("train", self.hparams.knn_train_samples),
                                  device=self.device)
        scored = extract_features(self.model, datamodule.labeled_dataloader("val", self.hparams.knn_val_samples),
                                  device=self.device)
        result = knn_classify(memory.embeddings, memory.targets, scored.embeddings, scored.targets)
        self.log("knn/top1", result["top1"], prog_bar=True, on_epoch=True)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        """No validation loop (set ``trainer.limit_val_batches: 0``); the k-NN monitor runs after each epoch."""

    def configure_optimizers(self):
        optimizer = adamw([self.student, self.student_head], self.hparams.lr, self.hparams.weight_decay)
        return warmup_cosine_schedule(optimizer, self.trainer, self.hparams.lr, self.hparams.min_lr,
                                      self.hparams.warmup_epochs)
