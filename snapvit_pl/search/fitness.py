"""The search objective: how far pruned embeddings drift from the dense model's, in PCA space."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from ..device import ForwardTimer, autocast_context
from ..elastic.budget import Budget
from ..elastic.scores import ElasticScores
from ..models.embedding import embed
from ..models.surgery import use_subnet
from ..models.units import prunable_blocks
from .population import AllGather, evaluate_shared
from .settings import SearchSettings


class PCAProjection:
    """PCA fitted once (torch SVD) on reference embeddings; ``__call__`` centres and projects."""

    def __init__(self, reference: torch.Tensor, components: int):
        reference = reference.float()
        self.mean = reference.mean(dim=0)
        k = min(components, reference.shape[0], reference.shape[1])
        _, _, vh = torch.linalg.svd(reference - self.mean, full_matrices=False)
        self.basis = vh[:k].T.contiguous()  # [D, k]

    def __call__(self, embeddings: torch.Tensor) -> torch.Tensor:
        return (embeddings.float() - self.mean) @ self.basis


class EmbeddingFitness:
    """Mean over sparsity pairs of ``1 - cos(PCA(dense embedding), PCA(pruned embedding))``; minimise.

    Teacher (dense) embeddings and the PCA are computed once. Each candidate is evaluated with
    gathered forwards (:func:`use_subnet`): no model copies, and each forward costs what the
    pruned model costs.

    Args:
        model: the dense base model (eval mode; its weights are never modified).
        images: fixed evaluation images ``[N, C, H, W]`` (moved to the model's device once).
        scores: elastic scores holding the local scores and keep ratios; candidates supply coefficients.
        settings: the search settings: ``pca_components`` (clipped to the data), ``batch_size`` and the
            ``sparsity_pairs`` averaged by :meth:`__call__`.
        pairs: other (mlp_ratio, head_ratio) pairs than ``settings.sparsity_pairs``.
        rank, world_size, all_gather: this process's place in a DDP run: the dense embeddings' batches are shared
            across the ranks and gathered (each batch's forward is the one a single process makes, so every rank
            holds a single process's embeddings, bit for bit).
    """

    def __init__(
        self,
        model: nn.Module,
        images: torch.Tensor,
        scores: ElasticScores,
        settings: SearchSettings,
        pairs: Optional[Sequence[Sequence[float]]] = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        all_gather: Optional[AllGather] = None,
    ):
        if images.ndim != 4 or images.shape[0] == 0:
            raise ValueError(f"fitness images must be a non-empty [N, C, H, W] tensor, got shape {tuple(images.shape)}")
        self.model, self.scores, self.batch_size = model, scores, settings.batch_size
        pairs = settings.sparsity_pairs if pairs is None else pairs
        self.pairs = [Budget(mlp_ratio=float(m), head_ratio=float(h)) for m, h in pairs]
        self.device = next(model.parameters()).device
        self.images = images.to(self.device)
        self.blocks = prunable_blocks(model)
        self._timer = ForwardTimer(self.device)  # time inside the forward passes, to compare with the whole search
        teacher = self._dense_embeddings(rank, world_size, all_gather)
        self.pca = PCAProjection(teacher, settings.pca_components)
        self.target = torch.nn.functional.normalize(self.pca(teacher), dim=-1)
        self.forward_seconds = 0.0

    @property
    def forward_seconds(self) -> float:
        """Seconds spent in the forward passes since the last reset (on CUDA, read from events: one synchronisation
        here, none per forward)."""
        return self._timer.seconds()

    @forward_seconds.setter
    def forward_seconds(self, value: float) -> None:
        self._timer.reset(value)

    @torch.inference_mode()
    def embed(self, images: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Embeddings of ``images`` (default: all the fitness images) under the model's current (dense or gathered)
        weights, in batches of ``batch_size``."""
        images = self.images if images is None else images
        with self._timer, autocast_context(self.device):
            return torch.cat([embed(self.model, batch).float() for batch in images.split(self.batch_size)])

    def _dense_embeddings(self, rank: int, world_size: int, all_gather: Optional[AllGather]) -> torch.Tensor:
        """The dense model's embeddings of the fitness images: the batches of ``batch_size`` shared across ranks."""
        batches = list(self.images.split(self.batch_size))
        if world_size == 1 or len(batches) == 1:
            return self.embed()
        dim = self.embed(self.images[:1]).shape[1]  # the gather needs each batch's length before any is computed
        parts = evaluate_shared(batches, lambda batch: self.embed(batch), [len(b) * dim for b in batches],
                                [float(len(b)) for b in batches], rank, world_size, all_gather)
        return torch.cat([part.view(len(b), dim) for part, b in zip(parts, batches)]).to(self.device, torch.float32)

    def _distance(self, subnet) -> torch.Tensor:
        """``1 - mean cosine similarity`` as a 0-d tensor on the model's device (no host synchronisation)."""
        with use_subnet(self.model, subnet, self.blocks):
            projected = torch.nn.functional.normalize(self.pca(self.embed()), dim=-1)
        return 1.0 - (projected * self.target).sum(dim=-1).mean()

    @torch.inference_mode()
    def similarities(self, subnet, index: torch.Tensor) -> torch.Tensor:
        """Cosine similarity (PCA space) of one sub-network's embedding of each image ``index`` (positions in the
        fitness images) to the dense one: ``[len(index)]`` on the model's device; ``1 - mean`` over all images is
        :meth:`distance`."""
        index = index.to(self.device)
        with use_subnet(self.model, subnet, self.blocks):
            projected = torch.nn.functional.normalize(self.pca(self.embed(self.images[index])), dim=-1)
        return (projected * self.target[index]).sum(dim=-1)

    def distance(self, subnet) -> float:
        """``1 - mean cosine similarity`` of one sub-network's embeddings to the dense ones (PCA space)."""
        return float(self._distance(subnet))

    def distances(self, coefficients: torch.Tensor) -> list[float]:
        """``1 - mean cosine similarity`` for each sparsity pair (one device-to-host copy for all of them)."""
        return torch.stack([self._distance(self.scores.subnet(budget, coefficients=coefficients)[0])
                            for budget in self.pairs]).tolist()

    def __call__(self, coefficients: torch.Tensor) -> float:
        distances = self.distances(coefficients)
        return sum(distances) / len(distances)
