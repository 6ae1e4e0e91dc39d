"""Shared helpers of the scorer tests (importable by name: see conftest.py)."""
import copy

import torch

from families import FAMILIES
from snapvit_pl.models import BackboneSpec, embed, load_backbone
from snapvit_pl.scoring import self_distillation_loss

# The families the scorer tests cover: plain MLP + fused qkv, packed gated MLP, separate
# q/k/v projections (EVA), SwiGLU with fc1_g/fc1_x.
CORE = ["dino_vit", "dinov2_swiglu_packed", "eva02_separate_qkv", "vit_swiglu"]


def build(family: str, num_classes: int | None = None):
    """A tiny random model of ``family`` (seeded), optionally with a classifier head."""
    spec = FAMILIES[family]
    if num_classes is not None:
        spec = BackboneSpec(spec.model_name, False, None, dict(spec.model_kwargs, num_classes=num_classes))
    torch.manual_seed(0)
    return load_backbone(spec)


def views(batch: int = 8, n_views: int = 4, seed: int = 1) -> torch.Tensor:
    """Seeded multi-crop batch [B, V, 3, 32, 32]."""
    return torch.randn(batch, n_views, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def labels(batch: int = 8, num_classes: int = 5, seed: int = 2) -> torch.Tensor:
    return torch.randint(0, num_classes, (batch,), generator=torch.Generator().manual_seed(seed))


def full_backward_grads(model, x, n_global=2):
    """Gradients of every parameter from a plain loss.backward() on a copy of the model."""
    student, teacher = copy.deepcopy(model), copy.deepcopy(model)
    B, V = x.shape[:2]
    with torch.no_grad():
        target = embed(teacher, x[:, :n_global].flatten(0, 1)).view(B, n_global, -1)
    self_distillation_loss(embed(student, x.flatten(0, 1)).view(B, V, -1), target).backward()
    return student


def scores_of(scorer, model, batches, all_reduce_sum=lambda t: t, context=None):
    """One process's scores: bound, every batch, the reduction, compute."""
    scorer = scorer.bind(model, context)
    for batch in batches:
        scorer.update(batch)
    scorer.reduce(all_reduce_sum)
    return scorer.compute()


def two_process_scores(make, model, x, batch_size):
    """The scores two DDP ranks compute from DistributedSampler-style interleaved shards of ``x``, their
    accumulators summed as ``all_reduce`` sums them (rank 1's sent to rank 0)."""
    ranks = [make().bind(model), make().bind(model)]
    for rank, shard in zip(ranks, (x[0::2], x[1::2])):
        for batch in shard.split(batch_size):
            rank.update(batch)
    sent = []
    ranks[1].reduce(lambda t: sent.append(t.clone()) or t)
    ranks[0].reduce(lambda t: t + sent.pop(0))
    return ranks[0].compute()


def assert_scores(got, heads, neurons, rtol=1e-5, atol=1e-12):
    """``got`` (LocalScores) equals the given per-block head and neuron scores."""
    for a, b in zip(got.heads + got.neurons, heads + neurons):
        torch.testing.assert_close(a.double(), b.double(), rtol=rtol, atol=atol)
