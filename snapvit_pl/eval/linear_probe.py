"""Linear probe on frozen, pre-extracted features with a small learning-rate sweep."""

from dataclasses import dataclass, field
from typing import Optional, Sequence

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Accuracy


class LinearProbe(pl.LightningModule):
    """nn.Linear on standardised features, trained with cross-entropy.

    Standardisation statistics are buffers (set them with `set_feature_statistics`), so a
    saved probe carries them. Batches are (features [B, C], labels [B]).

    Args:
        in_features: feature dimension.
        num_classes: number of classes.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        max_epochs: length of the cosine learning-rate schedule, in epochs.
    """

    def __init__(self, in_features: int, num_classes: int, lr: float = 1e-3, weight_decay: float = 0.0, max_epochs: int = 100):
        super().__init__()
        self.save_hyperparameters()
        self.register_buffer("feature_mean", torch.zeros(in_features))
        self.register_buffer("feature_std", torch.ones(in_features))
        self.linear = nn.Linear(in_features, num_classes)
        self.train_accuracy = Accuracy(task="multiclass", num_classes=num_classes)
        self.val_accuracy = Accuracy(task="multiclass", num_classes=num_classes)
        self.test_accuracy = Accuracy(task="multiclass", num_classes=num_classes)

    @torch.no_grad()
    def set_feature_statistics(self, features: Tensor) -> None:
        """Standardise inputs with the per-dimension mean/std of these (training) features."""
        self.feature_mean.copy_(features.mean(0))
        self.feature_std.copy_(features.std(0).clamp_min(1e-6))

    def forward(self, features: Tensor) -> Tensor:
        return self.linear((features - self.feature_mean) / self.feature_std)

    def loss(self, features: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-entropy loss and logits of a batch."""
        logits = self(features)
        return F.cross_entropy(logits, labels), logits

    def training_step(self, batch, batch_idx):
        loss, logits = self.loss(*batch)
        self.train_accuracy(logits, batch[1])
        self.log("train/loss", loss)
        self.log("train/acc", self.train_accuracy, on_epoch=True, on_step=False)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, logits = self.loss(*batch)
        self.val_accuracy(logits, batch[1])
        self.log("val/loss", loss)
        self.log("val/acc", self.val_accuracy)

    def test_step(self, batch, batch_idx):
        _, logits = self.loss(*batch)
        self.test_accuracy(logits, batch[1])
        self.log("test/acc", self.test_accuracy)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.hparams.max_epochs)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


@dataclass
class LinearProbeResult:
    """Outcome of `linear_probe`; accuracies are fractions in [0, 1]."""

    test_accuracy: float
    best_lr: float
    val_accuracy: dict[float, float] = field(default_factory=dict)
    probe: Optional[LinearProbe] = None


def fit_linear_probe(probe: LinearProbe, features: Tensor, labels: Tensor, batch_size: int = 4096, seed: int = 0) -> LinearProbe:
    """Train a probe with a plain loop over in-memory features (no Trainer overhead).

    Uses the probe's own loss and configure_optimizers; the LR schedule steps once per epoch.

    Args:
        probe: the module to train (its statistics are set from `features` here).
        features: [N, C] training features.
        labels: [N] labels.
        batch_size: mini-batch size (>= N means full-batch training).
        seed: seed of the shuffling order.
    """
    probe.set_feature_statistics(features)
    config = probe.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    generator = torch.Generator().manual_seed(seed)
    probe.train()
    for _ in range(probe.hparams.max_epochs):
        order = torch.randperm(features.shape[0], generator=generator)
        for start in range(0, features.shape[0], batch_size):
            batch = order[start : start + batch_size]
            loss, _ = probe.loss(features[batch], labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        scheduler.step()
    return probe.eval()


@torch.no_grad()
def probe_accuracy(probe: LinearProbe, features: Tensor, labels: Tensor, batch_size: int = 8192) -> float:
    """Top-1 accuracy (fraction) of a probe on features."""
    correct = sum(
        int((probe(features[i : i + batch_size]).argmax(1) == labels[i : i + batch_size]).sum())
        for i in range(0, features.shape[0], batch_size)
    )
    return correct / features.shape[0]


def linear_probe(
    train_features: Tensor,
    train_labels: Tensor,
    test_features: Tensor,
    test_labels: Tensor,
    num_classes: Optional[int] = None,
    lrs: Sequence[float] = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1),
    weight_decay: float = 0.0,
    epochs: int = 100,
    batch_size: int = 4096,
    val_fraction: float = 0.1,
    seed: int = 0,
    refit: bool = True,
) -> LinearProbeResult:
    """Sweep learning rates on a seeded validation split of train, then report test accuracy.

    Training runs on the device of train_features.

    Args:
        train_features, train_labels: [N, C] features and [N] labels.
        test_features, test_labels: [M, C] features and [M] labels.
        num_classes: number of classes (default: largest label + 1).
        lrs: learning rates to sweep.
        weight_decay: AdamW weight decay.
        epochs: training epochs per fit.
        batch_size: mini-batch size (>= N: full batch).
        val_fraction: share of train held out for selecting the learning rate.
        seed: seed of the split, the probe initialisation and the shuffling.
        refit: retrain on all of train with the best lr before testing (else test the probe
            fitted on the reduced split).
    """
    train_features, test_features = train_features.float(), test_features.float()
    train_labels, test_labels = train_labels.long(), test_labels.long()
    if num_classes is None:
        num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    if num_classes < 2:
        from ..errors import ConfigError

        raise ConfigError(f"a linear probe needs at least 2 classes, got {num_classes}; give labeled features of "
                          "several classes")
    permutation = torch.randperm(train_features.shape[0], generator=torch.Generator().manual_seed(seed))
    val_size = max(1, round(val_fraction * train_features.shape[0]))
    val_index, fit_index = permutation[:val_size], permutation[val_size:]

    def fit(lr: float, index: Tensor) -> LinearProbe:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            probe = LinearProbe(train_features.shape[1], num_classes, lr, weight_decay, epochs).to(train_features.device)
        return fit_linear_probe(probe, train_features[index], train_labels[index], batch_size, seed)

    val_accuracy, probes = {}, {}
    for lr in lrs:
        probes[lr] = fit(lr, fit_index)
        val_accuracy[lr] = probe_accuracy(probes[lr], train_features[val_index], train_labels[val_index])
    best_lr = max(lrs, key=lambda lr: val_accuracy[lr])
    probe = fit(best_lr, permutation) if refit else probes[best_lr]
    return LinearProbeResult(probe_accuracy(probe, test_features, test_labels), best_lr, val_accuracy, probe)
