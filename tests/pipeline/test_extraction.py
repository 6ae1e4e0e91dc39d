import copy

import pytest
import torch

from families import FAMILIES, random_elastic_scores
from snapvit_pl.correction import correct_and_prune
from snapvit_pl.elastic import Budget, CostModel
from snapvit_pl.errors import ConfigError, PruningSpecError
from snapvit_pl.models import fingerprint, load_backbone, load_pruned, prune_
from snapvit_pl.pipeline import (
    Correction, CorrectionSettings, EvaluationSettings, ExportSettings, ImportanceSettings, Timings, check_budgets,
    extract_models,
)

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
        def __call__(self, base_model, subnet):
            calls.append("correct")
            return super().__call__(base_model, subnet)

    def evaluation(pruned):
        calls.append("evaluate")
        return {"head_top1": 0.5, "n_params": sum(p.numel() for p in pruned.parameters())}

    timings = Timings()
    items = extract_models(model, scores, BUDGETS, correction=Recording(CorrectionSettings(batch_size=5), images),
                           evaluation=evaluation, save_dir=tmp_path / "models", spec=FAMILIES["augreg_vit"], timings=timings)
    assert calls == ["correct", "evaluate"] * 2
    assert fingerprint(model) == before, "the base model is never modified"
    cost = CostModel(model)
    for item, budget in zip(items, BUDGETS):
        assert item.model is None and item.label == budget.label()
        assert item.params == cost.params(item.subnet) == item.metrics["n_params"]
        saved, record = load_pruned(item.checkpoint)
        expected = correct_and_prune(copy.deepcopy(model), item.subnet, images, CorrectionSettings(batch_size=5))
        assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), expected.state_dict().values()))
        assert record["extra"]["metrics"]["head_top1"] == 0.5 and record["extra"]["correction"]["num_samples"] == 12
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
