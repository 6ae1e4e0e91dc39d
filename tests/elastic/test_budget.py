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
    with pytest.raises(PruningSpecError, match=r"too low, unreachable: the minimum keep ratios .* leave at least"):
        _elastic(model).subnet(Budget(flops=0.01), CostModel(model))


@pytest.mark.parametrize("kwargs", [dict(), dict(params=0.5, flops=0.5), dict(mlp_ratio=0.1, sparsity=0.2), dict(params=-1.0), dict(sparsity=1.0)])
def test_malformed_budgets(kwargs):
    with pytest.raises(PruningSpecError):
        Budget(**kwargs)


def test_no_pruning_when_budget_exceeds_dense():
    model = load_backbone(FAMILIES["dino_vit"])
    subnet, m, h = _elastic(model).subnet(Budget(params=1.0), CostModel(model))
    assert (m, h) == (0.0, 0.0) and subnet.neuron_counts == [256, 256]


def test_a_count_above_the_dense_model_is_too_high_and_a_small_one_reads_as_a_count():
    model = load_backbone(FAMILIES["dino_vit"])
    scores, cost = _elastic(model), CostModel(model)
    with pytest.raises(PruningSpecError, match=r"params budget 5e\+06 is too high: read as a count, it is more than "
                                               r"the dense model's"):
        scores.subnet(Budget(params=5e6), cost)
    with pytest.raises(PruningSpecError, match=r"flops budget \{flops: 1.5\} \(read as a count: a fraction of the "
                                               r"dense model is <= 1\) is no model: as a fraction it would keep 150% of "
                                               r"the dense model, as a count 1.5 FLOPs of its .*give a fraction <= 1"):
        scores.subnet(Budget(flops=1.5), cost)
    with pytest.raises(PruningSpecError, match=r"^params budget \{params: 512\} \(read as a count.*\) is too low"):
        scores.subnet(Budget(params=512), cost)  # a count, too small for this model: said so as before


@pytest.mark.parametrize("budget, label", [
    (Budget(params=1.89123e6), "params1.89M"), (Budget(flops=17.56e9), "flops17.6G"), (Budget(params=512), "params512"),
    (Budget(params=999_600), "params1M"), (Budget(flops=0.5), "flops0.5"), (Budget(sparsity=0.3), "sparsity0.3"),
    (Budget(mlp_ratio=0.35, head_ratio=0.2), "mlp0.35_head0.20"), (Budget(latency=12.5), "latency12.5"),
])
def test_labels_are_readable(budget, label):
    assert budget.label() == label


@pytest.mark.parametrize("budgets", [
    [{"mlp_ratio": 0.601, "head_ratio": 0.2}, {"mlp_ratio": 0.604, "head_ratio": 0.2}],
    [{"sparsity": 0.3}, {"sparsity": 0.30000000001}],
    [{"params": 1.891e6}, {"params": 1.894e6}],
    [{"flops": 0.5}, {"flops": 0.5}],
])
def test_budgets_sharing_a_label_are_refused_when_parsed(budgets):
    from snapvit_pl.pipeline import ExportSettings

    with pytest.raises(PruningSpecError, match="would both be saved as|is given twice"):
        ExportSettings(budgets=budgets)


def test_an_empty_budget_says_what_it_got():
    with pytest.raises(PruningSpecError, match=r"got \{\}: e.g. \{flops: 0.5\}"):
        Budget.parse({})


def _split_tables():
    """The head/MLP splits a run records: one budget's alone (a run asked for sparsity 0.5 only), and a grid."""
    from snapvit_pl.elastic.splits import SplitTable

    one = SplitTable({"params": [(0.5, 0.5)], "flops": [(0.5, 0.5)]})
    grid = [(k / 10, 0.85 - 0.6 * k / 10) for k in range(3, 10)]  # many: the deeper the cut, the more heads removed
    return {"one split": one, "many splits": SplitTable({"params": grid, "flops": grid})}


@pytest.mark.parametrize("splits", ["one split", "many splits"])
@pytest.mark.parametrize("metric", ["sparsity", "params", "flops"])
def test_a_cost_budget_never_removes_more_than_it_asks(metric, splits):
    """From nothing removed to the deepest cut the keep ratios allow, in steps of 1%: every budget is met, and within
    one unit step of its target (a head and a neuron): a split recorded for another budget never removes more (from a
    run whose only budget was sparsity 0.5, sparsity 0 removed 3.6% of the parameters, params 0.99 as much)."""
    model = load_backbone(FAMILIES["dino_vit"])
    scores, cost = _elastic(model), CostModel(model)
    scores.splits = _split_tables()[splits]
    kind = "params" if metric == "sparsity" else metric
    dense, measure = (cost.dense_params, cost.params) if kind == "params" else (cost.dense_flops, cost.flops)
    per_head, per_neuron = (cost.head_params, cost.neuron_params) if kind == "params" else (cost.head_flops,
                                                                                           cost.neuron_flops)
    step = max(per_head) + max(per_neuron)
    checked = 0
    for percent in range(0, 100):
        keep = 1 - percent / 100
        budget = Budget(sparsity=percent / 100) if metric == "sparsity" else Budget(**{metric: keep})
        try:
            subnet = scores.subnet(budget, cost)[0]
        except PruningSpecError:  # past the deepest cut: every deeper one is refused too
            break
        achieved, target = measure(subnet), keep * dense
        assert achieved <= target, f"{budget.describe()}: {achieved} above the target {target:.0f}"
        assert achieved == dense or target - achieved < step, \
            f"{budget.describe()}: {achieved} is {target - achieved:.0f} below the target, more than one step ({step:.0f})"
        checked += 1
    assert checked > 40  # the sweep reached deep cuts (the keep ratios allow about 60% here)
    assert measure(scores.subnet(Budget(**({"sparsity": 0.0} if metric == "sparsity" else {metric: 1.0})), cost)[0]) \
        == dense


def test_rankings_shared_across_budgets_resolve_what_each_budget_resolves_alone():
    """``resolve(..., ranked=rank_units(...))``, as the split choice calls it for every budget and head ratio, gives
    the sub-network and both ratios that a fresh ranking gives, refusals included; the shared ranking keeps its cuts."""
    from snapvit_pl.elastic.budget import rank_units, resolve

    model = load_backbone(FAMILIES["dino_vit"])
    scores, cost = _elastic(model), CostModel(model)
    heads, neurons = scores.unified()
    keep = (scores.min_mlp_keep, scores.min_head_keep)
    ranked = rank_units(heads, neurons, *keep)
    compared = 0
    for budget in (Budget(params=0.7), Budget(flops=0.45), Budget(sparsity=0.3), Budget(params=0.05)):
        for head_ratio in (None, 0.0, 0.2, 0.45, 0.8):
            outcomes = []
            for shared in (None, ranked):
                try:
                    subnet, m, h = resolve(budget, heads, neurons, cost, *keep, head_ratio=head_ratio, ranked=shared)
                    outcomes.append((subnet.to_dict(), m, h))
                except PruningSpecError as refused:
                    outcomes.append(str(refused))
            assert outcomes[0] == outcomes[1], (budget.describe(), head_ratio)
            compared += isinstance(outcomes[0], tuple)
    assert compared >= 12 and len(ranked[1]._cuts) > 20  # most resolved; the neurons' cuts kept across budgets
    other_keep = rank_units(heads, neurons, keep[0] / 2, keep[1])
    fewer_heads = rank_units(heads[:-1], neurons, *keep)
    for wrong in (other_keep, fewer_heads):  # rankings made otherwise are refused, not used
        with pytest.raises(ValueError, match="ranked.*other keep ratios or unit counts"):
            resolve(Budget(params=0.7), heads, neurons, cost, *keep, ranked=wrong)
