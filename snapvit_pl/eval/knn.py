"""Weighted k-NN classification on frozen features, as in DINO (Caron et al. 2021)."""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor


@torch.no_grad()
def knn_vote_scores(
    train_features: Tensor,
    train_labels: Tensor,
    queries: Tensor,
    num_classes: int,
    k: int = 20,
    temperature: float = 0.07,
) -> Tensor:
    """Class votes of the k nearest (cosine) training samples, weighted by exp(sim / T).

    Args:
        train_features: L2-normalised training features [N, C].
        train_labels: training labels [N].
        queries: L2-normalised query features [Q, C].
        num_classes: number of classes.
        k: neighbours per query (clamped to N).
        temperature: softmax-like temperature of the vote weights.

    Returns:
        Vote scores [Q, num_classes].
    """
    similarity = queries @ train_features.T
    top_similarity, top_index = similarity.topk(min(k, train_features.shape[0]), dim=1)
    weights = (top_similarity / temperature).exp()
    votes = torch.zeros(queries.shape[0], num_classes, dtype=weights.dtype, device=weights.device)
    return votes.scatter_add_(1, train_labels[top_index], weights)


@torch.no_grad()
def knn_classify(
    train_features: Tensor,
    train_labels: Tensor,
    test_features: Tensor,
    test_labels: Tensor,
    num_classes: Optional[int] = None,
    k: int = 20,
    temperature: float = 0.07,
    chunk_size: int = 1024,
) -> dict[str, float]:
    """Weighted k-NN accuracy of test features against a training set.

    Features are L2-normalised here; test queries are processed in chunks so that only a
    [chunk_size, N] similarity matrix is held at once. Computation runs on the device of
    train_features.

    Args:
        train_features: [N, C] training features.
        train_labels: [N] integer labels.
        test_features: [M, C] test features.
        test_labels: [M] integer labels.
        num_classes: number of classes (default: largest label + 1).
        k: neighbours per query (DINO: 20).
        temperature: vote temperature (DINO: 0.07).
        chunk_size: test queries per similarity block.

    Returns:
        {"top1": fraction correct} plus "top5" when num_classes >= 5.
    """
    device = train_features.device
    train_labels = train_labels.to(device).long()
    test_labels = test_labels.long()
    if num_classes is None:
        num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    train_features = F.normalize(train_features.float(), dim=1)
    top1 = top5 = 0
    for start in range(0, test_features.shape[0], chunk_size):
        queries = F.normalize(test_features[start : start + chunk_size].to(device).float(), dim=1)
        labels = test_labels[start : start + chunk_size].to(device)
        votes = knn_vote_scores(train_features, train_labels, queries, num_classes, k, temperature)
        ranked = votes.topk(min(5, num_classes), dim=1).indices
        top1 += int((ranked[:, 0] == labels).sum())
        top5 += int((ranked == labels[:, None]).any(dim=1).sum())
    total = test_features.shape[0]
    result = {"top1": top1 / total}
    if num_classes >= 5:
        result["top5"] = top5 / total
    return result
