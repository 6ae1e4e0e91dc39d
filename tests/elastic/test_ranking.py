import math

import pytest
import torch

from snapvit_pl.elastic import select_subnet
from snapvit_pl.errors import PruningSpecError


def _scores(blocks=3, heads=5, neurons=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(heads, generator=g) for _ in range(blocks)], [torch.rand(neurons, generator=g) for _ in range(blocks)]


def test_global_ranking_prunes_lowest_scores_first():
    heads = [torch.tensor([0.9, 0.1, 0.8, 0.7, 0.6]), torch.tensor([0.5, 0.4, 0.3, 0.2, 0.95])]
    neurons = [torch.arange(10.0), torch.arange(10.0) + 100]
    sub = select_subnet(heads, neurons, mlp_ratio=0.4, head_ratio=0.3, min_mlp_keep=0.0, min_head_keep=0.0)
    assert sub.heads[0].tolist() == [0, 2, 3, 4] and sub.heads[1].tolist() == [0, 1, 4]  # 0.1, 0.2, 0.3 removed
    assert sub.neurons[0].tolist() == list(range(8, 10)) and sub.neurons[1].tolist() == list(range(10))


@pytest.mark.parametrize("mlp_ratio, head_ratio", [(0.0, 0.0), (0.35, 0.2), (0.65, 0.5), (0.9, 0.75)])
def test_prunes_the_requested_fraction_and_honours_minimum_keep(mlp_ratio, head_ratio):
    heads, neurons = _scores()
    sub = select_subnet(heads, neurons, mlp_ratio, head_ratio, min_mlp_keep=0.05, min_head_keep=0.2)
    assert sum(sub.neuron_counts) == 3 * 40 - math.floor(mlp_ratio * 120)
    assert sum(sub.head_counts) == 3 * 5 - math.floor(head_ratio * 15 + 1e-9)
    for b in range(3):
        top_neurons = torch.argsort(neurons[b], descending=True)[:2]  # ceil(0.05 * 40)
        top_head = torch.argsort(heads[b], descending=True)[:1]  # ceil(0.2 * 5)
        assert torch.isin(top_neurons, sub.neurons[b]).all() and torch.isin(top_head, sub.heads[b]).all()


def test_skewed_scores_still_keep_each_block_alive():
    heads = [torch.full((5,), 1e-6), torch.ones(5)]
    neurons = [torch.full((40,), 1e-6), torch.ones(40)]
    sub = select_subnet(heads, neurons, 0.5, 0.5, min_mlp_keep=0.05, min_head_keep=0.2)
    assert sub.head_counts[0] == 1 and sub.neuron_counts[0] == 2


@pytest.mark.parametrize("kwargs, message", [
    (dict(mlp_ratio=1.0, head_ratio=0.0), r"mlp_ratio=1.0 is outside \[0, 1\)"),
    (dict(mlp_ratio=0.2, head_ratio=-0.1), r"head_ratio=-0.1 is outside \[0, 1\)"),
    (dict(mlp_ratio=0.2, head_ratio=float("nan")), "outside"),
    (dict(mlp_ratio=0.2, head_ratio=0.9), "at most 0.8000 is reachable"),
])
def test_bad_ratios_are_rejected(kwargs, message):
    heads, neurons = _scores()
    with pytest.raises(PruningSpecError, match=message):
        select_subnet(heads, neurons, **kwargs)


@pytest.mark.parametrize("multiple", [8, 16])
def test_rounded_mlp_widths(multiple):
    heads, neurons = _scores(neurons=100)
    sub = select_subnet(heads, neurons, 0.37, 0.2, mlp_multiple=multiple)
    assert all(n % multiple == 0 or n == 100 for n in sub.neuron_counts)
    plain = select_subnet(heads, neurons, 0.37, 0.2)
    assert all(abs(a - b) <= multiple / 2 for a, b in zip(sub.neuron_counts, plain.neuron_counts))


@pytest.mark.parametrize("kept, width, protected, expected", [
    (20, 384, 20, 24),  # the nearest multiple (16, half to even) would cut into the protected 20
    (30, 384, 20, 32), (27, 384, 20, 24), (20, 384, 1, 16),  # the nearest multiple when it keeps the protected ones
    (5, 6, 1, 6), (20, 20, 20, 20),  # never above the width
])
def test_rounded_width_never_goes_below_the_protected_units(kept, width, protected, expected):
    from snapvit_pl.elastic.ranking import rounded_width

    assert rounded_width(kept, width, 8, protected) == expected


def test_rounding_keeps_every_protected_neuron_of_a_block_cut_to_its_floor():
    g = torch.Generator().manual_seed(0)
    heads = [torch.ones(6), torch.ones(6)]
    neurons = [torch.rand(384, generator=g) * 1e-3, 1 + torch.rand(384, generator=g)]  # block 0 goes first
    # 364 of 768 removed: block 0 down to its 20 protected neurons (ceil(0.05 * 384))
    plain = select_subnet(heads, neurons, 364 / 768, 0.0, min_mlp_keep=0.05, min_head_keep=0.2)
    assert plain.neuron_counts == [20, 384]
    sub = select_subnet(heads, neurons, 364 / 768, 0.0, min_mlp_keep=0.05, min_head_keep=0.2, mlp_multiple=8)
    assert sub.neuron_counts == [24, 384]
    protected = torch.argsort(neurons[0], descending=True)[:20]
    assert torch.isin(protected, sub.neurons[0]).all()
