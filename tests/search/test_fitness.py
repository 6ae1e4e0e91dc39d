import copy

import pytest
import torch

from families import FAMILIES, random_elastic_scores
from snapvit_pl.models import embed, load_backbone, prune_
from snapvit_pl.search import SearchSettings
from snapvit_pl.search.fitness import EmbeddingFitness, PCAProjection


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = load_backbone(FAMILIES["dinov2_reg"])
    images = torch.randn(24, 3, 32, 32)
    scores = random_elastic_scores(model)
    return model, images, scores, EmbeddingFitness(model, images, scores, SearchSettings(num_images=24, pca_components=16, batch_size=10))


def test_masked_fitness_equals_fitness_of_physically_pruned_copies(setup):
    model, images, scores, fitness = setup
    coefficients = scores.coefficients + 0.3 * torch.randn(scores.coefficients.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        teacher = embed(model, images)
        pca = PCAProjection(teacher, 16)
        target = torch.nn.functional.normalize(pca(teacher), dim=-1)
        expected = []
        for budget in fitness.pairs:
            pruned = prune_(copy.deepcopy(model), scores.subnet(budget, coefficients=coefficients)[0])
            projected = torch.nn.functional.normalize(pca(embed(pruned, images)), dim=-1)
            expected.append(1 - float((projected * target).sum(-1).mean()))
    assert fitness.distances(coefficients) == pytest.approx(expected, abs=1e-5)
    assert fitness(coefficients) == pytest.approx(sum(expected) / 4, abs=1e-5)


def test_fitness_is_zero_without_pruning_and_grows_with_sparsity(setup):
    model, images, scores, _ = setup
    none = EmbeddingFitness(model, images, scores, SearchSettings(sparsity_pairs=[(0.0, 0.0)], pca_components=16))
    assert none(scores.coefficients) == pytest.approx(0.0, abs=1e-6)
    light = EmbeddingFitness(model, images, scores, SearchSettings(sparsity_pairs=[(0.15, 0.0)], pca_components=16))
    heavy = EmbeddingFitness(model, images, scores, SearchSettings(sparsity_pairs=[(0.65, 0.5)], pca_components=16))
    assert 0 < light(scores.coefficients) < heavy(scores.coefficients)


def test_model_is_untouched_and_forward_time_is_tracked(setup):
    model, images, scores, fitness = setup
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fitness.forward_seconds = 0.0
    fitness(scores.coefficients)
    assert fitness.forward_seconds > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_pca_projection_preserves_variance_order():
    data = torch.randn(200, 8) * torch.tensor([10.0, 5, 1, 1, 1, 1, 1, 0.1])
    projected = PCAProjection(data, 3)(data)
    variances = projected.var(dim=0)
    assert projected.shape == (200, 3) and variances[0] > variances[1] > variances[2]
    assert variances[0] == pytest.approx(100, rel=0.3)


def test_empty_images_rejected(setup):
    model, _, scores, _ = setup
    with pytest.raises(ValueError, match="non-empty"):
        EmbeddingFitness(model, torch.empty(0, 3, 32, 32), scores, SearchSettings())


def test_the_dense_embeddings_are_shared_across_ranks_and_every_rank_gets_a_single_processs(setup, monkeypatch):
    import threading

    from threaded_ranks import as_ranks

    model, images, scores, single = setup  # batch_size 10: three batches of the 24 images
    settings = SearchSettings(num_images=24, pca_components=16, batch_size=10)
    batches_of = {}  # thread -> the batch sizes it embedded
    embed_batches = EmbeddingFitness.embed

    def counting(self, batch=None):
        if batch is not None and len(batch) > 1:  # (one image: the embedding width, on every rank)
            batches_of.setdefault(threading.get_ident(), []).append(len(batch))
        return embed_batches(self, batch)

    monkeypatch.setattr(EmbeddingFitness, "embed", counting)
    ranks = as_ranks(2, lambda rank, all_gather: EmbeddingFitness(model, images, scores, settings, rank=rank,
                                                                  world_size=2, all_gather=all_gather))
    assert sorted(sum(batches_of.values(), [])) == [4, 10, 10] and len(batches_of) == 2  # each batch on one rank
    for fitness in ranks:
        assert torch.equal(fitness.target, single.target) and torch.equal(fitness.pca.basis, single.pca.basis)


def test_a_candidate_waits_for_the_device_a_constant_number_of_times_whatever_the_depth(setup, monkeypatch):
    """Issue 51: a candidate's kept indices reach the device in one copy (not one per slot, about seven per block:
    on this CPU, where host and device are one, in none), its forward reads nothing back, and the pairs' distances
    come back in one read. (The candidates are resolved and their host-side indices validated before counting: host
    work on host tensors, which waits for no device.)"""
    from snapvit_pl.device import HostSyncs
    from snapvit_pl.models.units import Subnet

    model, _, scores, fitness = setup
    assert len(model.blocks) >= 2
    subnets = [scores.subnet(budget, coefficients=scores.coefficients * 1.1)[0].validate(model)
               for budget in fitness.pairs]
    monkeypatch.setattr(Subnet, "validate", lambda subnet, blocks: subnet)
    with HostSyncs(device="cpu") as syncs:
        torch.stack([fitness._distance(subnet) for subnet in subnets]).tolist()
    assert syncs.operators == {"Tensor.tolist": 1}, syncs.operators
