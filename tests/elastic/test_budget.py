import copy

import pytest

from families import FAMILIES, random_elastic_scores as _elastic
from snapvit_pl.elastic import Budget, CostModel
from snapvit_pl.errors import PruningSpecError
from snapvit_pl.models import count_flops, count_params, load_backbone, prune_


@pytest.mark.parametrize("family", ["dino_vit", "eva02_fused_qkv", "dinov3_swiglu"])
def test_cost_model_is_exact(family):
    model = load_backbone(FAMILIES[family])
    scores, cost = _elastic(model), CostModel(model)
    for budget in (Budget(mlp_ratio=0.35, head_ratio=0.2), Budget(mlp_ratio=0.65, head_ratio=0.5)):
        subnet = scores.subnet(budget, cost)[0]
        pruned = prune_(copy.deepcopy(model), subnet)
        assert cost.params(subnet) == count_params(pruned)
        assert cost.flops(subnet) == count_flops(pruned)


@pytest.mark.parametrize("budget", [Budget(params=0.6), Budget(flops=0.5), Budget(sparsity=0.3), Budget(params=70_000), Budget(flops=2e6)])
def test_cost_budgets_are_met_within_one_unit(budget):
    model = load_backbone(FAMILIES["eva02_fused_qkv"])
    scores, cost = _elastic(model), CostModel(model)
    subnet, mlp_ratio, head_ratio = scores.subnet(budget, cost)
    metric = "flops" if budget.flops is not None else "params"
    dense = cost.dense_flops if metric == "flops" else cost.dense_params
    value = 1 - budget.sparsity if budget.sparsity is not None else getattr(budget, metric)
    target = value * dense if value <= 1 else value
    achieved = count_flops(prune_(copy.deepcopy(model), subnet)) if metric == "flops" else count_params(prune_(copy.deepcopy(model), subnet))
    assert achieved <= target
    per_head, per_neuron = (cost.head_params, cost.neuron_params) if metric == "params" else (cost.head_flops, cost.neuron_flops)
    assert target - achieved <= max(max(per_head), max(per_neuron))  # within the cost of one unit
    assert head_ratio == pytest.approx(max(0.0, mlp_ratio - 0.15)) or head_ratio > 0.7


def test_unreachable_budget_names_the_minimum():
    model = load_backbone(FAMILIES["dino_vit"])
    with pytest.raises(PruningSpecError, match=r"unreachable: the minimum keep ratios .* leave at least"):
        _elastic(model).subnet(Budget(flops=0.01), CostModel(model))


@pytest.mark.parametrize("kwargs", [dict(), dict(params=0.5, flops=0.5), dict(mlp_ratio=0.1, sparsity=0.2), dict(params=-1.0), dict(sparsity=1.0)])
def test_malformed_budgets(kwargs):
    with pytest.raises(PruningSpecError):
        Budget(**kwargs)


def test_no_pruning_when_budget_exceeds_dense():
    model = load_backbone(FAMILIES["dino_vit"])
    subnet, m, h = _elastic(model).subnet(Budget(params=1.0), CostModel(model))
    assert (m, h) == (0.0, 0.0) and subnet.neuron_counts == [256, 256]
