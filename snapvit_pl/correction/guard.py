"""What keeps a correction from making a model worse: calibration images held out before anything is fitted, and
a last check of the corrected model's output against the model as cut on them (docs/method.md, section 4).

The check reads what the model's users read, label-free: the pooled output embedding (class token or pooled
features, :func:`snapvit_pl.models.embedding.embed`) and how far it drifts from the dense model's (``1 - mean
cosine``, as the search measures drift); for a headless model, whose users search neighbours, also how many of each
held-out image's nearest neighbours under the dense model stay its neighbours. A fit can bring features closer to
the dense ones and still move neighbourhoods: the model as cut is kept unless the corrected one is at least as good
on both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from ..models.embedding import embed
from .calibration import BATCH_SIZE

#: Nearest neighbours per held-out image that the neighbourhood check compares (fewer when fewer images are held out).
NEIGHBOURS = 10


def split_calibration(images: torch.Tensor, share: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fit images, held-out images)``: the last ``share`` of ``images`` (at least one image where there are two or
    more and ``share`` > 0) held out, before anything is fitted on the rest."""
    n = len(images)
    aside = min(n - 1, max(1, round(n * share))) if share > 0 and n > 1 else 0
    return images[:n - aside], images[n - aside:]


def is_headless(model: nn.Module) -> bool:
    """Whether ``model`` has no classifier (its users read the embedding itself: k-NN, retrieval, a new probe)."""
    return getattr(model, "num_classes", 0) == 0


@torch.no_grad()
def embeddings(model: nn.Module, images: torch.Tensor, batch_size: int = BATCH_SIZE) -> torch.Tensor:
    """Pooled output embeddings ``[N, D]`` (float32) of ``images``, batch by batch on the model's device."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        return torch.cat([embed(model, images[i:i + batch_size].to(device)).float()
                          for i in range(0, len(images), batch_size)])
    finally:
        model.train(was_training)


def neighbour_sets(features: torch.Tensor, k: int) -> torch.Tensor:
    """``[N, k]`` indices of each row's ``k`` nearest other rows by cosine similarity."""
    normed = torch.nn.functional.normalize(features, dim=-1)
    similarity = normed @ normed.T
    similarity.fill_diagonal_(-float("inf"))
    return similarity.topk(k, dim=1).indices


@dataclass
class OutputCheck:
    """How close a model's output is to the dense model's on the held-out images.

    Attributes:
        drift: ``1 - mean cosine`` of its embeddings to the dense ones (0: the same directions).
        neighbours: mean share of each image's ``k`` nearest held-out neighbours under the dense model that stay
            among its ``k`` nearest (1: every neighbourhood kept; None: not checked, a model with a classifier).
    """

    drift: float
    neighbours: Optional[float] = None

    def at_least_as_good_as(self, other: "OutputCheck") -> bool:
        """No more drift than ``other``, and (where checked) no fewer neighbours kept."""
        return self.drift <= other.drift and (self.neighbours is None or self.neighbours >= other.neighbours)

    def record(self) -> dict[str, float]:
        return {"drift": round(self.drift, 6),
                **({"neighbours": round(self.neighbours, 6)} if self.neighbours is not None else {})}


class OutputGuard:
    """The dense model's output on the held-out images, computed once, and the check of a model against it."""

    def __init__(self, base: nn.Module, held_out: torch.Tensor, batch_size: int = BATCH_SIZE,
                 neighbourhoods: Optional[bool] = None):
        self.held_out, self.batch_size = held_out, batch_size
        self.dense = embeddings(base, held_out, batch_size)
        self.k = min(NEIGHBOURS, len(held_out) - 1)
        wanted = is_headless(base) if neighbourhoods is None else neighbourhoods
        self.dense_neighbours = neighbour_sets(self.dense, self.k) if wanted and self.k >= 1 else None

    def check(self, model: nn.Module) -> OutputCheck:
        """How close ``model``'s output is to the dense model's on the held-out images."""
        features = embeddings(model, self.held_out, self.batch_size)
        drift = 1.0 - float(torch.nn.functional.cosine_similarity(features, self.dense.to(features.device)).mean())
        if self.dense_neighbours is None:
            return OutputCheck(drift)
        mine = neighbour_sets(features.cpu(), self.k)
        dense = self.dense_neighbours.cpu()
        kept = (mine.unsqueeze(2) == dense.unsqueeze(1)).any(dim=2).float().mean()
        return OutputCheck(drift, float(kept))

    def choose(self, as_cut: nn.Module, corrected: nn.Module) -> tuple[bool, dict[str, Any]]:
        """``(keep the corrected model, the record)``: the corrected model only when its output is at least as close
        to the dense model's as the model as cut, on every measure checked."""
        cut, fixed = self.check(as_cut), self.check(corrected)
        keep = fixed.at_least_as_good_as(cut) and fixed != cut
        return keep, {"held_out_images": len(self.held_out), "as_cut": cut.record(), "corrected": fixed.record(),
                      "kept": "corrected" if keep else "as cut"}
