import copy
import re

import pytest
import torch

from families import FAMILIES, random_elastic_scores
from snapvit_pl.correction import fit_to_dense_and_prune
from snapvit_pl.elastic import Budget, CostModel, select_subnet
from snapvit_pl.errors import ConfigError, PruningSpecError
from snapvit_pl.models import fingerprint, load_backbone, load_pruned, prunable_blocks, prune_
from snapvit_pl.pipeline import (
    Correction, CorrectionSettings, EvaluationSettings, ExportSettings, ImportanceSettings, Timings, check_budgets,
    extract_models,
)
from snapvit_pl.pipeline.state import DenseModel

BUDGETS = [Budget(mlp_ratio=0.35, head_ratio=0.25), Budget(flops=0.6)]


@pytest.fixture(scope="module")
def base():
    torch.manual_seed(0)
    model = load_backbone(FAMILIES["augreg_vit"])
    return model, random_elastic_scores(model)


def test_models_are_cut_then_corrected_then_evaluated_then_saved(base, tmp_path):
    model, scores = base
    before = fingerprint(model)
    images = torch.randn(12, 3, 32, 32)
    calls = []

    class Recording(Correction):
        def __call__(self, base_model, subnet, as_cut=None):
            calls.append("correct")
            return super().__call__(base_model, subnet, as_cut)

    def evaluation(pruned):
        calls.append("evaluate")
        return {"head_top1": 0.5, "n_params": sum(p.numel() for p in pruned.parameters())}

    timings = Timings()
    settings = CorrectionSettings(batch_size=5, held_out=0)  # nothing held out: every model corrected
    items = extract_models(model, scores, BUDGETS, correction=Recording(settings, images),
                           evaluation=evaluation, save_dir=tmp_path / "models", spec=FAMILIES["augreg_vit"], timings=timings)
    assert calls == ["evaluate", "correct", "evaluate"] * 2  # as cut (the report shows it beside), then corrected
    assert fingerprint(model) == before, "the base model is never modified"
    cost = CostModel(model)
    for item, budget in zip(items, BUDGETS):
        assert item.model is None and item.label == budget.label()
        assert item.params == cost.params(item.subnet) == item.metrics["n_params"]
        saved, record = load_pruned(item.checkpoint)
        expected = fit_to_dense_and_prune(copy.deepcopy(model), item.subnet, images, batch_size=5)  # the default
        assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), expected.state_dict().values()))
        assert record["extra"]["metrics"]["head_top1"] == 0.5 and record["extra"]["correction"]["num_samples"] == 12
        assert item.metrics_as_cut["n_params"] == item.metrics["n_params"] and record["extra"]["metrics_as_cut"]
        assert record["extra"]["base_fingerprint"] == scores.fingerprint
    assert items[1].flops <= 0.6 * cost.dense_flops
    assert timings.correction_s > 0 and timings.evaluation_s is not None


def test_without_steps_models_are_plain_surgery(base):
    model, scores = base
    (item,) = extract_models(model, scores, BUDGETS[:1], keep_models=True)
    expected = prune_(copy.deepcopy(model), item.subnet)
    assert all(torch.equal(a, b) for a, b in zip(item.model.state_dict().values(), expected.state_dict().values()))
    assert item.metrics is None and item.checkpoint is None and item.correction is None


def test_unreachable_budget_is_refused_up_front(base):
    model, scores = base
    keep = ImportanceSettings(min_mlp_keep=scores.min_mlp_keep, min_head_keep=scores.min_head_keep)
    with pytest.raises(PruningSpecError, match="unreachable"):
        check_budgets(model, [Budget(params=0.01)], keep, 1)
    check_budgets(model, BUDGETS, keep, 1)


def test_settings_are_checked_when_made():
    assert [b.label() for b in ExportSettings().budgets] == [f"sparsity0.{i}" for i in range(1, 7)]
    assert ExportSettings(budgets=[{"flops": 0.5}, "params=2e7"]).budgets == [Budget(flops=0.5), Budget(params=2e7)]
    with pytest.raises(PruningSpecError):
        ExportSettings(budgets=[{"mlp_ratio": 1.5, "head_ratio": 0.1}])
    with pytest.raises(PruningSpecError, match="did you mean 'flops'"):
        ExportSettings(budgets=[{"flop": 0.5}])
    with pytest.raises(ConfigError, match="unknown metric"):
        EvaluationSettings(metrics=["knn", "speed"])
    assert EvaluationSettings(metrics=[]).metrics == []


def _ordered_scores(model):
    """Every unit of block 0 below every unit of block 1 (no coefficients): a cut takes block 0 first."""
    from snapvit_pl.elastic import ElasticScores
    from snapvit_pl.models import prunable_blocks

    blocks = prunable_blocks(model)
    return ElasticScores([torch.arange(b.heads.num_units) + 100.0 * i for i, b in enumerate(blocks)],
                         [torch.arange(b.neurons.num_units) + 1000.0 * i for i, b in enumerate(blocks)],
                         fingerprint=fingerprint(model))


def test_the_ratios_recorded_are_those_of_the_saved_model_and_the_request_is_kept_apart(base, tmp_path):
    from snapvit_pl.pipeline import RunState, build_report
    from snapvit_pl.pipeline.tables import rows

    model, _ = base
    scores = _ordered_scores(model)
    budget = Budget(mlp_ratio=0.3, head_ratio=0.2)  # 8 heads: 0.2 asks for 1.6, one is removed; 153.6 of 512 neurons
    (item,) = extract_models(model, scores, [budget], save_dir=tmp_path, spec=FAMILIES["augreg_vit"])
    saved, record = load_pruned(item.checkpoint)
    widths = [b.neurons.num_units for b in prunable_blocks(saved)], [b.heads.num_units for b in prunable_blocks(saved)]
    assert widths == ([256 - 153, 256], [3, 4])
    assert item.mlp_ratio == pytest.approx(153 / 512) and item.head_ratio == pytest.approx(1 / 8)
    assert (item.requested_mlp_ratio, item.requested_head_ratio) == (0.3, 0.2)
    extra = record["extra"]
    assert extra["head_ratio"] == pytest.approx(1 / 8) and extra["requested_head_ratio"] == 0.2
    assert "rounding" not in extra  # no mlp_multiple
    state = RunState(FAMILIES["augreg_vit"], scores.fingerprint)
    state.dense, state.extracted = DenseModel(CostModel(model).dense_params, CostModel(model).dense_flops), [item]
    report = build_report(state)
    assert report["pruned"][0]["head_ratio"] == 0.125 and report["pruned"][0]["requested_head_ratio"] == 0.2
    assert rows(report)[1][1] == f"{153 / 512:.2f}/{1 / 8:.2f}"


def test_a_multiple_that_keeps_more_than_a_ratio_budget_asks_says_so(base, caplog):
    model, _ = base
    scores = _ordered_scores(model)
    budget = Budget(mlp_ratio=0.3, head_ratio=0.0)  # block 0 keeps 103 neurons: 104 with mlp_multiple 8
    with caplog.at_level("WARNING", logger="snapvit_pl.pipeline.extraction"):
        (item,) = extract_models(model, scores, [budget], mlp_multiple=8)
    assert item.subnet.neuron_counts == [104, 256] and item.rounding == {"mlp_multiple": 8, "extra_neurons": 1}
    assert item.mlp_ratio == pytest.approx(152 / 512) and item.requested_mlp_ratio == 0.3
    assert item.record()["rounding"] == {"mlp_multiple": 8, "extra_neurons": 1}
    assert "export.mlp_multiple 8 keeps 1 MLP neuron(s) more than mlp_ratio 0.3 asks" in caplog.text


@pytest.mark.parametrize("multiple", [1, 8, 16])
def test_rounded_models_still_meet_every_cost_budget(base, multiple):
    model, scores = base
    scores = copy.copy(scores)
    scores.min_mlp_keep = 0.078  # 20 protected neurons of 256: the nearest multiple of 8 or 16 (16) is below them
    keep = ImportanceSettings(min_mlp_keep=0.078, min_head_keep=scores.min_head_keep)
    budgets = [Budget(sparsity=s) for s in (0.1, 0.3, 0.5, 0.6)] + [Budget(flops=0.5), Budget(params=0.7)]
    check_budgets(model, budgets, keep, multiple)
    cost = CostModel(model)
    for item in extract_models(model, scores, budgets, mlp_multiple=multiple):
        point = item.budget.cost_point(cost)
        dense = cost.dense_params if point[0] == "params" else cost.dense_flops
        assert (item.params if point[0] == "params" else item.flops) <= point[1] * dense, item.label
        assert all(n % multiple == 0 or n == 256 for n in item.subnet.neuron_counts)
        assert all(n >= 20 for n in item.subnet.neuron_counts)
        assert item.mlp_ratio == pytest.approx(1 - sum(item.subnet.neuron_counts) / 512)


def test_a_budget_the_rounded_floor_cannot_reach_is_refused_up_front(base):
    from snapvit_pl.elastic.budget import max_prune_ratio

    model, scores = base
    keep = ImportanceSettings(min_mlp_keep=0.078, min_head_keep=scores.min_head_keep)
    ratios = max_prune_ratio(scores.neuron_scores, 0.078), max_prune_ratio(scores.head_scores, scores.min_head_keep)
    floor = select_subnet(scores.head_scores, scores.neuron_scores, *ratios, 0.078, scores.min_head_keep)
    assert max(floor.neuron_counts) <= 21  # (the protected 20 a block; the schedule stops one unit short of them)
    smallest = CostModel(model).params(floor)
    budget = Budget(params=smallest + 1)
    check_budgets(model, [budget], keep, 1)  # reachable at 20 neurons a block...
    for multiple in (8, 16):  # ...not at 24 or 32 (rounding to the nearest multiple cut them to 16)
        with pytest.raises(PruningSpecError, match=rf"rounded up to multiples of {multiple} \(export.mlp_multiple\)"):
            check_budgets(model, [budget], keep, multiple)


@pytest.mark.parametrize("budget", [Budget(sparsity=0.0), Budget(params=1.0), Budget(mlp_ratio=0.0, head_ratio=0.0)])
def test_a_budget_that_removes_nothing_is_said_plainly_before_any_work(budget):
    """Issue 77: {sparsity: 0} spent a full export on an unpruned copy without a word."""
    from snapvit_pl.errors import PruningSpecError

    model = load_backbone(FAMILIES["dino_vit"])
    with pytest.raises(PruningSpecError, match=rf"^budget {re.escape(budget.describe())} removes nothing: its model "
                                               "would be a copy of the dense one"):
        check_budgets(model, [budget], ImportanceSettings(), 1)
