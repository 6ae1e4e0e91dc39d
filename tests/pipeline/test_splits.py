import pytest
import torch

from families import FAMILIES, random_elastic_scores
from snapvit_pl.elastic import Budget, CostModel, ElasticScores
from snapvit_pl.models import load_backbone
from snapvit_pl.pipeline import ExportSettings, RunState, choose_splits, export_stage
from snapvit_pl.pipeline.splits import split_candidates
from snapvit_pl.search.fitness import EmbeddingFitness
from snapvit_pl.scoring import LocalScores

BUDGETS = [Budget(sparsity=0.4), Budget(flops=0.5), Budget(mlp_ratio=0.35, head_ratio=0.2)]


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = load_backbone(FAMILIES["augreg_vit"])
    return model, torch.randn(16, 3, 32, 32), random_elastic_scores(model)


def test_candidates_surround_the_schedule_within_the_reachable_range():
    assert split_candidates(0.25, 5, 0.1, 0.8) == [0.05, 0.15, 0.25, 0.35, 0.45]
    assert split_candidates(0.05, 3, 0.1, 0.8) == [0.0, 0.05, 0.15]


def test_the_split_with_the_least_drift_wins_deterministically_and_meets_the_budget(setup):
    model, images, scores = setup
    kwargs = dict(candidates=5, pca_components=8, batch_size=8)
    first, again = (choose_splits(model, images, scores, BUDGETS, **kwargs) for _ in range(2))
    assert [c.label for c in first] == ["sparsity0.4", "flops0.5"]  # a ratio pair fixes its own split
    assert [(c.head_ratio, c.candidates) for c in first] == [(c.head_ratio, c.candidates) for c in again]
    fitness = EmbeddingFitness(model, images, scores, [(0.0, 0.0)], 8, 8)
    cost = CostModel(model)
    for choice, budget in zip(first, BUDGETS):
        assert choice.head_ratio == min(choice.candidates, key=lambda c: c[2])[0]
        assert any(h == pytest.approx(choice.schedule_head_ratio) for h, _, _ in choice.candidates)
        recorded = ElasticScores(**{**vars(scores), "splits": {choice.label: choice.head_ratio}})
        subnet, _, head_ratio = recorded.subnet(budget, cost)
        assert head_ratio == pytest.approx(choice.head_ratio)
        assert fitness.distance(subnet) == pytest.approx(min(d for _, _, d in choice.candidates), abs=1e-6)
    assert cost.params(recorded.subnet(BUDGETS[0], cost)[0]) <= 0.6 * cost.dense_params


def test_export_records_the_splits_in_the_elastic_scores(setup, tmp_path):
    model, images, scores = setup
    state = RunState(FAMILIES["augreg_vit"], scores.fingerprint)
    state.local = LocalScores(scores.head_scores, scores.neuron_scores)
    settings = ExportSettings(budgets=[b.to_dict() for b in BUDGETS[:2]], split_candidates=3, save_models=False)
    export_stage(state, model, settings, tmp_path, fitness_images=images)
    saved = ElasticScores.load(tmp_path / settings.scores_file)
    assert saved.splits == {c.label: c.head_ratio for c in state.splits} and len(saved.splits) == 2
    for item in state.extracted:
        assert item.head_ratio == pytest.approx(saved.splits[item.label])
    schedule = ExportSettings(budgets=settings.budgets, split="schedule", save_models=False)
    export_stage(state, model, schedule, tmp_path / "schedule", fitness_images=images)
    assert ElasticScores.load(tmp_path / "schedule" / settings.scores_file).splits == {}
