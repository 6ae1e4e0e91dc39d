"""Smoke runs of the benchmarks (their --tiny / --quick modes): they run and write what they promise. A smoke test
never checks a measured time or anything that depends on one (a timing is a number the file holds, nothing more:
docs/development.md, "Numbers")."""
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
needs_data = pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="dataset-fashion-mnist")


def timed(*values) -> bool:
    """Each value a finite number (a time or a memory size was recorded; what it is, is not a test's business)."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)


def test_gpu_pipeline_tiny_runs_every_phase_on_cpu(tmp_path):
    from benchmarks.gpu_pipeline import main

    assert main(["--tiny", "--out", str(tmp_path / "gpu")]) == 0
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert [p["phase"] for p in report["phases"]] == ["tiny core", "tiny extras"]
    assert all(p["status"] == "done" for p in report["phases"])
    core, extras = report["core"]["tiny"], report["extras"]["tiny"]
    assert core["scorer"]["name"] == "gn_greedy" and core["scorer"]["gram_used"] == "full"  # the default scorer
    assert set(core["stages"]) == {"importance", "splits", "export"} and core["models"] == 6  # the default budgets
    assert all(timed(r["floor_s"], r["ratio"]) for r in core["stages"].values())
    assert {"importance", "splits", "export"} <= set(core["peak_memory_mb"])
    assert timed(extras["search"]["floor"]["ratio"]) and len(extras["throughput"]) == 2  # dense, flops0.5
    assert {"bf16_b1_images_per_s", "32_b8_images_per_s"} <= set(extras["throughput"][0])
    markdown = (tmp_path / "gpu.md").read_text()
    assert markdown.startswith("# The pipeline on full-size models") and "| tiny core | done |" in markdown


def test_gpu_pipeline_stops_cleanly_at_its_budget(tmp_path):
    """A budget shorter than the run: the phase running is cut short, the rest recorded as not run, the file
    written (what a lease that ends keeps)."""
    from benchmarks.gpu_pipeline import main

    assert main(["--tiny", "--budget-s", "0.02", "--out", str(tmp_path / "gpu")]) == 0
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert [p["status"] for p in report["phases"]] == ["stopped at the budget (0.02 s)", "not run: the budget was spent"]
    assert report["core"] == {} and "| tiny extras | not run: the budget was spent |" in (tmp_path / "gpu.md").read_text()


@pytest.mark.slow
@needs_data
def test_latency_budget_quick(tmp_path):
    from benchmarks.latency_budget import main

    assert main(["--quick", "--out", str(tmp_path / "latency")]) == 0
    report = json.loads((tmp_path / "latency.json").read_text())
    assert set(report["batches"]) == {"1", "8"} and (tmp_path / "latency.md").is_file()
    for entry in report["batches"].values():
        # six budgets asked; on a noisy table two can resolve to one model, so the count of rows is the table's business
        assert 1 <= len(entry["rows"]) <= 6
        assert all(timed(r["measured_ms"], r["predicted_ms"], r["relative_error"]) for r in entry["rows"])


@pytest.mark.slow
@needs_data
def test_compare_methods_quick_gives_every_method_the_split_and_the_correction(tmp_path):
    from benchmarks.compare_methods import main

    main(["--quick", "--threads", "1", "--out", str(tmp_path / "compare")])
    report = json.loads((tmp_path / "compare.json").read_text())
    entry = report["models"]["reference"]
    methods = ("ours", "snapvit", "label_fisher")  # one pass each: its models as cut and corrected
    assert [(r["method"], r["corrected"]) for r in entry["runs"]] == [(m, True) for m in methods]
    assert {(r["method"], r["corrected"]) for r in entry["rows"]} == {(m, c) for m in methods for c in (False, True)}
    assert all(r["correction"]["kept"] in ("corrected", "as cut") for r in entry["rows"] if r["corrected"])
    assert all("splits" in r for r in entry["runs"])  # every method cut at the fitness-chosen split
    assert {"ours", "ours+correction"} == set(report["goal"])  # the goal is checked against label Fisher
    assert all(check["rival"] == "label_fisher" for check in report["goal"]["ours"]["checks"])
    assert (tmp_path / "compare_flops.png").stat().st_size > 0


@pytest.mark.slow
def test_quick_cpu_tiny_runs_the_quick_overlay_on_the_vit_b_config(tmp_path):
    from benchmarks.quick_cpu import main

    assert main(["--tiny", "--out", str(tmp_path / "quick")]) == 0
    record = json.loads((tmp_path / "quick.json").read_text())
    run = record["run"]
    assert "--config dino_vitb16.yaml --config quick.yaml" in run["command"] and record["machine"]["torch_threads"] == 1
    assert len(run["models"]) == 3 and timed(run["wall_s"], run["timings"]["total_s"])
    assert len(run["load_before"]) == 3 and "[snapvit] importance" in run["progress"][0]
    assert (tmp_path / "quick.md").read_text().startswith("# configs/prune/quick.yaml on a tiny model")


@needs_data
def test_split_choice_tiny_compares_the_raced_choice_with_the_exhaustive_one(tmp_path):
    from benchmarks.split_choice import main

    assert main(["--tiny", "--out", str(tmp_path / "splits")]) == 0
    report = json.loads((tmp_path / "splits.json").read_text())
    entry = report["models"]["reference"][0]
    assert len(entry["points"]) > 6 and all(p["relative_drift_difference"] >= 0 for p in entry["points"])
    assert set(entry["raced"]) == {"asked", "grid"} and timed(entry["exhaustive"]["grid_s"])
    assert 0 < report["summary"]["raced_flops_fraction_at_1000_images"] <= 1
    images = entry["images"]
    assert 0 < images["grid"] <= images["grid_settled"] and 0 <= images["grid_to_the_end"] <= images["grid"]
    assert entry["grid_images_over_asked"] == pytest.approx(images["grid"] / images["asked"], abs=1e-3)
    assert 0 <= report["summary"]["grid_images_to_the_end"] <= 1
    assert 1 < entry["grid_over_asked_flops"] == report["summary"]["grid_over_asked_flops"]["max"]
    summary = report["summary"]  # the budgets asked for and the grid points counted apart
    assert summary["asked_points"] + summary["grid_points"] == summary["points"] == len(entry["points"])
    assert summary["asked_same"] + summary["grid_same"] == summary["same"]
    assert 0 < summary["grid_local"] <= summary["grid_points"] and all(
        isinstance(p["local_minimum"], bool) for p in entry["points"])
    assert (tmp_path / "splits.md").read_text().startswith("# Split choice")


@needs_data
def test_pixel_baselines_tiny_measures_both_tasks(tmp_path):
    from benchmarks.pixel_baselines import main

    main(["--tiny", "--out", str(tmp_path / "pixels")])
    report = json.loads((tmp_path / "pixels.json").read_text())
    assert set(report["tasks"]) == {"fashion_mnist", "fashion_mnist_clutter"}
    for task in report["tasks"].values():
        assert 0 < task["knn_top1"] <= 1 and 0 < task["linear_top1"] <= 1 and task["val_samples"] == 200
    assert report["tasks"]["fashion_mnist"]["knn_top1"] > 0.3  # pixels classify plain Fashion-MNIST well
    assert "| fashion_mnist_clutter |" in (tmp_path / "pixels.md").read_text()


@needs_data
def test_stage_floors_tiny_times_every_stage_against_its_floor(tmp_path):
    from benchmarks.stage_floors import main

    assert main(["--tiny", "--out", str(tmp_path / "floors")]) == 0
    report = json.loads((tmp_path / "floors.json").read_text())
    for entry in report["models"].values():
        assert set(entry["stages"]) == {"importance", "splits", "export"}
        assert all(timed(r["floor_s"], r["seconds"]) for r in entry["stages"].values())
    dino = report["models"]["tiny"]["dino_config"]
    assert timed(dino["splits_raced_s"], dino["splits_exhaustive_s"])
    assert "two_processes" not in report  # not in the smoke run


def test_greedy_cost_tiny_times_the_order_and_counts_its_syncs(capsys):
    """The order is timed and its host synchronisations counted: a few per order, not one per step."""
    from benchmarks.greedy_cost import main

    assert main(["--tiny", "--no-before"]) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny-")]
    assert [r[1].strip() for r in rows] == ["tiny-4", "tiny-8"]
    steps = [int(r[4].replace(",", "")) for r in rows]
    syncs = [int(r[10]) for r in rows]
    assert steps[1] > 3 * steps[0] and syncs[0] == syncs[1] <= 10, rows
    assert all(timed(float(r[7]), float(r[8])) for r in rows)  # timed without and with the CPU shortcut
    assert all(r[9].strip() == r[11].strip() == "n/a" for r in rows)  # --no-before: no earlier greedy to compare


def test_correction_cost_tiny_times_every_method_in_a_process_of_its_own(tmp_path):
    from benchmarks.correction_cost import METHODS, main

    assert main(["--tiny", "--out", str(tmp_path / "cost")]) == 0
    rows = json.loads((tmp_path / "cost.json").read_text())["rows"]
    assert [r["method"] for r in rows] == list(METHODS)
    assert all(timed(r["seconds"], r["peak_mb"], r["held_before_mb"]) for r in rows)
    assert "| tiny | 54% | dense_fit | 2 |" in (tmp_path / "cost.md").read_text()


@needs_data
def test_demo_prune_report_keeps_the_runs_report_with_its_provenance(tmp_path, tiny_prune_args):
    from benchmarks import demo_prune_report

    shrink = [a for a in tiny_prune_args if not a.startswith("--out_dir") and a != str(tmp_path / "run")]
    assert demo_prune_report.main(["--out", str(tmp_path / "demo"), "--", *shrink]) == 0
    report = json.loads((tmp_path / "demo.json").read_text())
    assert report["provenance"]["recorded"] == "run" and "snapvit_pl/cli/prune.py" in report["provenance"]["files"]
    assert [e["label"] for e in report["pruned"]] == ["mlp0.35_head0.25", "flops0.6"]
    text = (tmp_path / "demo.md").read_text()
    assert "](demo_plots/accuracy_vs_params.png)" in text and (tmp_path / "demo_plots" / "kept_units.png").is_file()


@needs_data
def test_finetune_recipe_quick_trains_and_evaluates_a_pruned_model(tmp_path, tiny_prune_args):
    """The script had stopped running (an evaluation API it called had changed): its quick mode, in CI."""
    from benchmarks import finetune_recipe
    from snapvit_pl.cli import prune_main

    assert prune_main([*tiny_prune_args, "--search.max_evaluations=0", "--evaluation.metrics=[]"]) == 0
    checkpoint = tmp_path / "run" / "models" / "flops0.6"
    assert finetune_recipe.main(["--checkpoint", str(checkpoint), "--quick", "--threads", "1",
                                 "--out", str(tmp_path / "recipe")]) == 0
    report = json.loads((tmp_path / "recipe.json").read_text())
    assert set(report["before"]) >= {"knn_top1", "linear_top1", "head_top1"} and timed(report["finetune_s"])


@needs_data
def test_correction_finetune_quick_corrects_fine_tunes_and_evaluates(tmp_path):
    """Its evaluation had stopped running with the evaluation API's change, as finetune_recipe's had: in CI now."""
    from benchmarks import correction_finetune

    assert correction_finetune.main(["--quick", "--out", str(tmp_path / "cf")]) == 0
    report = json.loads((tmp_path / "cf.json").read_text())
    assert report["quick"] and report["models"]


def test_later_budgets_quick_cuts_each_budget_both_ways_and_measures_their_drift(tmp_path):
    """A later cut and an up-front cut of one budget: both within it, their drifts measured on the same images (the
    same heads kept: the same sub-network, the same drift)."""
    from benchmarks.later_budgets import main

    assert main(["--quick", "--later", "0.32,0.23", "--out", str(tmp_path / "later")]) == 0
    report = json.loads((tmp_path / "later.json").read_text())
    assert [row["keep"] for row in report["rows"]] == [0.32, 0.23]
    for row in report["rows"]:
        later, up_front = row["later"], row["up_front"]
        assert 0 < later["drift"] < 2 and 0 < up_front["drift"] < 2
        if later["heads"] == up_front["heads"]:
            assert later["drift"] == pytest.approx(up_front["drift"], abs=1e-4)
    markdown = (tmp_path / "later.md").read_text()
    assert "| clutter | 23% |" in markdown and f"Of {len(report['rows'])} later cuts" in markdown
    (cost,) = report["split_costs"]  # the grid's cost: the races' forwards with it over those of the asked alone
    assert cost["with_grid_flops"] > cost["asked_alone_flops"] > 0 and timed(cost["with_grid_cpu_s"])
    assert report["grid_cost"]["forwards"]["min"] == pytest.approx(cost["with_grid_flops"] / cost["asked_alone_flops"],
                                                                   abs=1e-3)


@needs_data
def test_throughput_times_a_runs_models_against_the_dense_one(tmp_path, tiny_prune_args, monkeypatch):
    """One round of one timed forward per model, one thread, on the demo's reference model pruned to two budgets: the
    efficiency range the docs quote is over the pruned models."""
    from benchmarks import throughput
    from snapvit_pl.cli import prune_main

    shrink = [a for a in tiny_prune_args if not a.startswith(("--out_dir", "--model.")) and a != str(tmp_path / "run")]
    assert prune_main(["--out_dir", str(tmp_path / "run"), *shrink, "--search.max_evaluations=0",
                       "--evaluation.metrics=[]"]) == 0
    monkeypatch.setattr(sys, "argv", ["throughput.py", "--run", str(tmp_path / "run"), "--threads", "1",
                                      "--rounds", "1", "--repeats", "1", "--batch-size", "4",
                                      "--out", str(tmp_path / "throughput")])
    throughput.main()
    report = json.loads((tmp_path / "throughput.json").read_text())
    rows = report["threads"]["1"]
    assert set(rows) == {"dense", "mlp0.35_head0.25", "flops0.6"} and rows["dense"]["speedup"] == 1.0
    efficiency = [v["speedup"] / v["flops_reduction"] for name, v in rows.items() if name != "dense"]
    assert report["efficiency"]["1"] == {"min": min(efficiency), "max": max(efficiency)}
    assert "over the pruned models" in (tmp_path / "throughput.md").read_text()


@needs_data
def test_search_speed_times_the_search_and_its_bare_forwards_as_a_pair_in_rounds(tmp_path):
    from benchmarks.search_speed import main

    main(["--evaluations", "2", "--images", "64", "--batch-size", "32", "--rounds", "3", "--out", str(tmp_path / "s")])
    report = json.loads((tmp_path / "s.json").read_text())
    assert len(report["rounds"]) == 3 and all(timed(r["search_s"], r["bare_s"], r["ratio"]) for r in report["rounds"])
    assert set(report["ratio"]) == {"median", "min", "max"} and report["provenance"]["machine"]["torch_threads"] == 1
    assert "| median |" in (tmp_path / "s.md").read_text()


def test_correction_default_pairs_each_seed_and_flags_a_loss_beyond_the_spread(tmp_path):
    """Issue 75's table from a compare_methods report: corrected minus as cut per seed, a cell failing only where the
    mean difference is below minus the seed spread."""
    from benchmarks.correction_default import main

    def row(seed, corrected, knn, head):
        return {"method": "ours", "seed": seed, "corrected": corrected, "pair": [0.65, 0.5], "params": 41,
                "knn_top1": knn, "head_top1": head, "linear_top1": None,
                **({"correction": {"kept": "corrected", "seconds": 2.0, "blocks_kept": {"fitted": 2},
                                   "output_check": {"as_cut": {"drift": 0.04}, "corrected": {"drift": 0.01}}}}
                   if corrected else {})}

    rows = [row(s, c, knn, head) for s, (cut_knn, fit_knn) in enumerate([(0.70, 0.68), (0.71, 0.69), (0.70, 0.69)])
            for c, knn, head in ((False, cut_knn, 0.80), (True, fit_knn, 0.82 + 0.001 * s))]
    run = {"settings": {"overrides": ["--correction.held_out=0.2"]},
           "models": {"m": {"dense": {"params": 100, "knn_top1": 0.72, "head_top1": 0.85}, "rows": rows}}}
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert main(["--runs", f"fit={tmp_path / 'run.json'}", "--out", str(tmp_path / "default")]) == 0
    report = json.loads((tmp_path / "default.json").read_text())
    cells = {r["metric"]: r for r in report["variants"]["fit"]["rows"]}
    assert cells["knn_top1"]["difference"] == pytest.approx(-1.67, abs=0.01) and not cells["knn_top1"]["passes"]
    assert cells["head_top1"]["passes"] and cells["head_top1"]["checks"]["corrected"] == 3
    text = (tmp_path / "default.md").read_text()
    assert "| m | k-NN top-1 | -1.67 (0.58) **no** |" in text and "0.0400 -> 0.0100" in text
