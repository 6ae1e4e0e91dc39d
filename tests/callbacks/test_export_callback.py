import pytest

from snapvit_pl.callbacks import ExportCallback, ReportCallback
from snapvit_pl.elastic import ElasticScores
from snapvit_pl.errors import PruningSpecError
from snapvit_pl.models import load_pruned
from snapvit_pl.pipeline import CorrectionSettings, EvaluationSettings, ExportSettings, ReportSettings


def test_unreachable_budget_fails_at_fit_start(trainer, module):
    callback = ExportCallback(ExportSettings(budgets=[{"params": 0.01}]))
    with pytest.raises(PruningSpecError, match="unreachable"):
        callback.on_fit_start(trainer([callback]), module)


def test_fit_end_writes_scores_and_corrected_evaluated_models(scored, module, tmp_path):
    callback = ExportCallback(ExportSettings(budgets=[{"flops": 0.6}]), CorrectionSettings(enabled=True, num_samples=8),
                              EvaluationSettings(metrics=["knn", "head"], train_samples=16, val_samples=8, knn_k=3))
    t = scored([callback])
    callback.on_fit_end(t, module)
    state = module.state
    assert ElasticScores.load(tmp_path / "elastic_scores.safetensors").fingerprint == state.fingerprint
    assert {"knn_top1", "head_top1"} <= set(state.dense.metrics)
    (item,) = state.extracted
    assert item.checkpoint == "models/flops0.6" and item.correction["num_samples"] == 8 and "knn_top1" in item.metrics
    _, record = load_pruned(tmp_path / item.checkpoint)
    assert record["extra"]["label"] == "flops0.6"

    report = ReportCallback(ReportSettings(print_table=False))
    report.teardown(t, module, "fit")
    assert (tmp_path / "report.json").exists() and state.timings.total_s > 0


def test_no_report_for_a_run_that_did_not_export(trainer, module, tmp_path):
    ReportCallback().teardown(trainer(), module, "fit")
    assert not (tmp_path / "report.json").exists()
