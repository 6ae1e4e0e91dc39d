import json
from dataclasses import replace

import pytest
import torch
from PIL import Image
from rich.console import Console

from snapvit_pl.elastic import Budget
from snapvit_pl.models import BackboneSpec, Subnet
from snapvit_pl.pipeline import ExtractedModel, RunState, SearchResult, SearchSettings, build_report, write_report
from snapvit_pl.pipeline.tables import rows, summary_table
from snapvit_pl.pipeline.state import DenseModel
from snapvit_pl.scoring import LocalScores

METRICS = {"knn_top1": 0.9, "knn_top5": 0.99, "linear_top1": 0.89, "head_top1": 0.88, "throughput_images_per_s": 1500.0}


def _finished_state(models: int = 6) -> RunState:
    state = RunState(BackboneSpec("vit_tiny_patch16_224", False), "f" * 64)
    state.local = LocalScores([torch.ones(6)] * 6, [torch.ones(384)] * 6)
    state.method = {"scorer": {"name": "ssl_fisher"}, "search": SearchSettings(max_evaluations=16).to_dict()}
    history = [{"generation": g, "evaluations": 8 * g, "generation_best": 0.05 - g * 0.002, "generation_median": 0.06,
                "best_fitness": 0.05 - g * 0.002, "sigma": 1.0} for g in (1, 2)]
    state.search = SearchResult(torch.ones(42), evaluations=16, initial_fitness=0.0554044246673584,
                                best_fitness=0.045711055397987366, resumed_at=8, history=history)
    state.dense = DenseModel(678730, 72267648, {**METRICS, "timings_s": {}})
    for i in range(models):
        ratio = 0.15 + 0.1 * i
        subnet = Subnet.from_counts([6 - i // 2] * 6, [int(384 * (1 - ratio))] * 6)
        state.extracted.append(ExtractedModel(
            f"sparsity0.{i + 1}", Budget(sparsity=0.1 * (i + 1)), subnet, ratio, max(0.0, ratio - 0.15),
            int(678730 * (0.9 - 0.1 * i)), int(72267648 * (0.9 - 0.1 * i)),
            metrics={k: v * (1 - 0.01 * i) for k, v in METRICS.items()}, checkpoint=f"models/sparsity0.{i + 1}"))
    state.timings.add("search", 1.5)
    return state


def test_report_holds_every_stage():
    report = build_report(_finished_state(1))
    assert report["search"]["resumed_at"] == 8 and report["search"]["improved_on_initial"]
    assert len(report["search"]["history"]) == 2 and report["splits"] == []
    assert report["dense"]["params"] == 678730 and report["dense"]["metrics"]["knn_top1"] == 0.9
    assert report["pruned"][0]["checkpoint"] == "models/sparsity0.1" and report["timings"] == {"search_s": 1.5}


def test_written_report_plots_are_png_and_markdown_is_rounded(tmp_path, capsys):
    report = write_report(_finished_state(), tmp_path, print_table=True)
    assert json.loads((tmp_path / "report.json").read_text()) == report
    for name in ("accuracy_vs_params", "accuracy_vs_flops", "kept_units", "search_fitness"):
        path = tmp_path / "plots" / f"{name}.png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(path) as image:
            assert image.size[0] > 300 and image.size[1] > 200
    markdown = (tmp_path / "report.md").read_text()
    assert "![kept_units](plots/kept_units.png)" in markdown
    assert "fitness 0.0554 -> 0.0457" in markdown and "0.045711" not in markdown
    assert "| dense | - | 679k 100% | 72.3M 100% | 36.1M | 90.00 | 89.00 | 88.00 | 1500 |" in markdown
    assert "MACs: multiply-accumulates per image" in markdown and report["dense"]["macs"] * 2 == report["dense"]["flops"]
    assert "Run directory" in capsys.readouterr().out


@pytest.mark.parametrize("width", [80, 100])
def test_summary_table_fits_the_terminal_without_cut_cells(width):
    report = build_report(_finished_state())
    console = Console(width=width, record=True, force_terminal=False)
    console.print(summary_table(report))
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
    if width == 100:  # nothing folded either: every cell is on one line
        for row in rows(report):
            assert all(cell in text for cell in row), row


def test_a_run_without_correction_says_how_to_turn_it_on_in_the_report_and_on_the_console(tmp_path, capsys):
    from snapvit_pl.correction import CorrectionSettings
    from snapvit_pl.pipeline.extraction import correction_record

    state = _finished_state(1)
    auto = CorrectionSettings(enabled="auto")
    state.correction = correction_record(auto, auto.active("cpu"), "cpu")
    report = write_report(state, tmp_path, print_table=True, plots=False)
    assert report["correction"]["applied"] is False and "--correction.enabled true" in report["correction"]["hint"]
    assert "- weight correction: off (the pruned models are not corrected" in (tmp_path / "report.md").read_text()
    assert "note: the pruned models are not corrected" in capsys.readouterr().out
    state.correction = correction_record(CorrectionSettings(num_samples=64), True, "cuda")
    report = write_report(state, tmp_path, print_table=True, plots=False)
    assert "hint" not in report["correction"] and "note:" not in capsys.readouterr().out
    from snapvit_pl.correction.settings import RECONSTRUCT_STEPS

    assert f"- weight correction: `dense_fit`, 64 calibration images, {RECONSTRUCT_STEPS} reconstruction steps per " \
        "pruned block" in (tmp_path / "report.md").read_text()  # reconstruct_steps: auto on an accelerator
    state.correction = correction_record(CorrectionSettings(num_samples=64), True, "cpu")
    write_report(state, tmp_path, print_table=False, plots=False)
    assert "- weight correction: `dense_fit`, 64 calibration images\n" in (tmp_path / "report.md").read_text()
    # scores ranked for corrected models (GaussNewtonGreedy(correction_aware=True)), models not corrected: said so
    state.correction = correction_record(CorrectionSettings(), False, "cpu", ranked_for_correction=True)
    write_report(state, tmp_path, print_table=True, plots=False)
    assert "note: the scores were ranked for corrected models" in capsys.readouterr().out


def test_the_report_shows_what_each_model_removes_and_keeps_the_request_apart():
    from snapvit_pl.pipeline.report import report_markdown
    from snapvit_pl.pipeline.splits import SplitChoice

    state = _finished_state(1)
    item = state.extracted[0]
    item.mlp_ratio, item.head_ratio = 1 - 326 / 384, 0.0  # what the widths remove (all 36 heads kept)...
    item.requested_mlp_ratio, item.requested_head_ratio = 0.15, 0.011111  # ...and what the split asked for
    item.subnet = Subnet.from_counts([6] * 6, [326] * 6)
    state.splits = [SplitChoice("sparsity0.1", "params", 0.9, 0.011111, 0.11, requested=True)]
    report = build_report(state)
    entry = report["pruned"][0]
    assert (entry["head_ratio"], entry["requested_head_ratio"]) == (0.0, 0.011111)
    assert rows(report)[1][1] == "0.15/0.00"
    assert "sparsity0.1 head ratio 0.01 (schedule 0.11) -> 0.00 removed" in report_markdown(report)


def test_the_accuracy_plots_name_what_was_measured_and_their_titles_fit():
    """The axis named mIoU with no mIoU measured, and a long title was cut off at the right (reported twice)."""
    import matplotlib.pyplot as plt

    from snapvit_pl.pipeline.plots import accuracy_figure

    report = build_report(_finished_state(2))
    report["model"]["model_name"] = "hf-hub:some-organisation/a-rather-long-name-of-a-vit-base-patch16-224-model"
    for size in ("params", "flops"):
        fig = accuracy_figure(report, size)
        ax = fig.axes[0]
        assert ax.get_ylabel() == "top-1 (%)"
        box = ax.title.get_window_extent(renderer=fig.canvas.get_renderer())
        assert 0 <= box.x0 and box.x1 <= fig.bbox.x1, (box, fig.bbox)
        plt.close(fig)
    for entry in [report["dense"], *report["pruned"]]:
        entry["metrics"]["seg_miou"] = 0.5
    fig = accuracy_figure(report, "params")
    assert fig.axes[0].get_ylabel() == "top-1 / mIoU (%)"
    plt.close(fig)


@pytest.mark.parametrize("steep", [False, True])
def test_no_line_crosses_a_budget_label_in_the_accuracy_plots(steep):
    """Issue 51: the labels sat centred above each point, and a line rising to the next model crossed them. Steep
    curves (the deep cuts losing much) and gentle ones, several metrics: every label lies where no line passes."""
    import matplotlib.pyplot as plt

    from snapvit_pl.pipeline.plots import accuracy_figure, label_boxes_crossed

    state = _finished_state(6)
    for i, item in enumerate(state.extracted):
        drop = (0.12 if steep else 0.01) * i ** 1.5
        item.metrics = {k: max(0.05, v - drop - 0.03 * j) for j, (k, v) in enumerate(METRICS.items())}
    report = build_report(state)
    for size in ("params", "flops"):
        fig = accuracy_figure(report, size)
        ax = fig.axes[0]
        assert sorted(t.get_text() for t in ax.texts) == sorted(e["label"] for e in report["pruned"])
        assert label_boxes_crossed(fig, ax) == [], size
        plt.close(fig)


def test_corrected_models_are_shown_beside_the_models_as_cut(tmp_path):
    """Issue 75: per model, each accuracy as cut and corrected side by side (table, report.json, TensorBoard), what
    the output check kept and what the correction cost."""
    from snapvit_pl.pipeline.report import logged_metrics
    from snapvit_pl.pipeline.tables import columns

    state = _finished_state(2)
    for item, kept in zip(state.extracted, ("corrected", "as cut")):
        item.metrics_as_cut = {k: v - 0.02 for k, v in item.metrics.items() if k != "throughput_images_per_s"}
        item.correction = {"method": "dense_fit", "num_samples": 100, "held_out_images": 20, "kept": kept,
                           "output_check": {"held_out_images": 20, "kept": kept}, "seconds": 3.25}
    state.correction = {"enabled": True, "applied": True, "method": "dense_fit", "device": "cpu", "num_samples": 100}
    report = write_report(state, tmp_path, print_table=False, plots=False)
    assert columns(report) == ["model", "mlp/head", "params", "FLOPs", "MACs", "k-NN % cut", "k-NN %",
                               "linear % cut", "linear %", "head % cut", "head %", "img/s", "corr."]
    table = rows(report)
    first, second = table[1], table[2]
    assert first[5:7] == [f"{100 * (0.9 - 0.02):.2f}", f"{100 * 0.9:.2f}"] and first[-1] == "3.2s"
    assert second[-1] == "cut 3.2s" and table[0][-1] == "-"
    assert report["pruned"][0]["metrics_as_cut"]["knn_top1"] == pytest.approx(0.88)
    markdown = (tmp_path / "report.md").read_text()
    assert "20 of them held out to judge each model: 1 of 2 models kept corrected, the others as cut" in markdown
    assert "| k-NN % cut | k-NN % |" in markdown
    scalars, hparams = logged_metrics(report)
    assert ("models/knn_top1_as_cut_vs_params", pytest.approx(0.88), state.extracted[0].params) in scalars
    assert hparams["sparsity0.1/knn_top1_as_cut"] == pytest.approx(0.88)
    # uncorrected runs keep one column per metric
    plain = _finished_state(1)
    assert "k-NN %" in columns(build_report(plain)) and "corr." not in columns(build_report(plain))


def test_the_end_of_run_note_comes_only_where_a_model_loses_accuracy():
    """Correction off: the note saying how to turn it on only where some model is more than half a point below the
    dense model (or nothing was measured)."""
    from snapvit_pl.pipeline.extraction import pruning_costs_accuracy

    state = _finished_state(2)
    dense = state.dense.metrics
    assert pruning_costs_accuracy(dense, state.extracted)  # the second model is 1% below on every metric
    close = [replace(item, metrics={**dense}) for item in state.extracted]
    assert not pruning_costs_accuracy(dense, close)
    close[1].metrics["head_top1"] -= 0.006
    assert pruning_costs_accuracy(dense, close)
    assert pruning_costs_accuracy(None, close) and pruning_costs_accuracy(dense, [replace(close[0], metrics=None)])
