import json

import torch

from snapvit_pl.elastic import Budget
from snapvit_pl.models import BackboneSpec, Subnet
from snapvit_pl.pipeline import ExtractedModel, RunState, SearchResult, build_report, write_report
from snapvit_pl.pipeline.state import DenseModel
from snapvit_pl.scoring import LocalScores


def _finished_state() -> RunState:
    state = RunState(BackboneSpec("vit_tiny_patch16_224", False), "f" * 64)
    state.local = LocalScores([torch.ones(2)], [torch.ones(4)])
    state.scorer = {"name": "ssl_fisher"}
    state.search = SearchResult(torch.ones(3), evaluations=4, initial_fitness=0.5, best_fitness=0.25, resumed_at=2)
    state.dense = DenseModel(1000, 20000, {"knn_top1": 0.9, "throughput_images_per_s": 100.0, "timings_s": {}})
    state.extracted = [ExtractedModel("flops0.5", Budget(flops=0.5), Subnet.from_counts([1], [2]), 0.5, 0.5, 600, 10000,
                                      metrics={"knn_top1": 0.8}, checkpoint="models/flops0.5")]
    state.timings.add("search", 1.5)
    return state


def test_report_holds_every_stage():
    report = build_report(_finished_state())
    assert report["search"]["resumed_at"] == 2 and report["search"]["improved_on_initial"]
    assert report["dense"] == {"params": 1000, "flops": 20000, "metrics": {"knn_top1": 0.9, "throughput_images_per_s": 100.0,
                                                                              "timings_s": {}}}
    assert report["pruned"][0]["checkpoint"] == "models/flops0.5" and report["timings"] == {"search_s": 1.5}


def test_written_report_and_table(tmp_path, capsys):
    report = write_report(_finished_state(), tmp_path, print_table=True)
    assert json.loads((tmp_path / "report.json").read_text()) == report
    markdown = (tmp_path / "report.md").read_text()
    assert "| flops0.5 |" in markdown and "knn_top1 (%)" in markdown and "timings_s" not in markdown
    assert "Run directory" in capsys.readouterr().out
