import pytest

from families import FAMILIES
from snapvit_pl.callbacks import ExportCallback, ImportanceCallback, ReportCallback, SplitsCallback
from snapvit_pl.elastic import ElasticScores
from snapvit_pl.errors import PruningSpecError
from snapvit_pl.lightning.pruning_module import PruningModule
from snapvit_pl.models import load_pruned
from snapvit_pl.pipeline import (
    CorrectionSettings, EvaluationSettings, ExportSettings, ImportanceSettings, PipelineSettings, ReportSettings,
    SearchSettings,
)
from snapvit_pl.scoring import Magnitude


def test_budgets_are_checked_at_fit_start_with_the_configured_keep_ratios(tmp_path):
    """10 heads per block: the default keep ratio (20%) protects 2 per block, so removing 85% of the heads is
    unreachable; with ``importance.min_head_keep: 0.1`` (1 per block) it is reachable. Both decided before the
    importance pass, with the configured ratios."""
    spec = FAMILIES["augreg_vit"]
    module = PruningModule(spec.model_name, False, None, dict(spec.model_kwargs, embed_dim=80, num_heads=10))
    budget = ExportSettings(budgets=[{"mlp_ratio": 0.5, "head_ratio": 0.85}])
    callback = ExportCallback()
    module.configure_pipeline(PipelineSettings(export=budget), run_dir=tmp_path, progress="off")
    with pytest.raises(PruningSpecError, match="head prune ratio 0.8500 .* at most 0.8000 is reachable"):
        callback.on_fit_start(None, module)
    module.configure_pipeline(PipelineSettings(importance=ImportanceSettings(min_head_keep=0.1), export=budget),
                              run_dir=tmp_path, progress="off")
    callback.on_fit_start(None, module)  # reachable: nothing raised
    assert module.pipeline.state.completed == [] and not list(tmp_path.iterdir())  # before any stage or file


def test_fit_end_writes_scores_and_corrected_evaluated_models(scored, module, tmp_path):
    settings = module.pipeline.settings
    settings.search = SearchSettings(max_evaluations=0, num_images=16, pca_components=8, batch_size=8)
    settings.export = ExportSettings(budgets=[{"flops": 0.6}], split_candidates=3, split_grid=0)
    settings.correction = CorrectionSettings(enabled=True, num_samples=8)
    settings.evaluation = EvaluationSettings(metrics=["knn", "head"], train_samples=16, val_samples=8, knn_k=3)
    settings.report = ReportSettings(print_table=False)
    t = scored()
    module.pipeline.search()
    SplitsCallback().on_train_end(t, module)
    ExportCallback().on_fit_end(t, module)
    state = module.pipeline.state
    assert ElasticScores.load(tmp_path / "elastic_scores.safetensors").fingerprint == state.fingerprint
    assert {"knn_top1", "head_top1"} <= set(state.dense.metrics)
    (item,) = state.extracted
    assert item.checkpoint == "models/flops0.6" and item.correction["num_samples"] == 8 and "knn_top1" in item.metrics
    _, record = load_pruned(tmp_path / item.checkpoint)
    assert record["extra"]["label"] == "flops0.6" and record["extra"]["evaluated_on"]["dataset"] == "fake"

    ReportCallback().teardown(t, module, "fit")
    assert (tmp_path / "report.json").exists() and state.timings.total_s > 0


def test_no_report_for_a_run_that_did_not_export(trainer, module, tmp_path):
    module.pipeline.settings.importance = ImportanceSettings(Magnitude())
    ReportCallback().teardown(trainer([ImportanceCallback()]), module, "fit")
    assert not (tmp_path / "report.json").exists()
