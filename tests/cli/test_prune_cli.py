import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from snapvit_pl.cli import prune_cli, prune_main
from snapvit_pl.config_files import merged_config
from snapvit_pl.elastic import Budget, ElasticScores, ElasticViT
from snapvit_pl.models import BackboneSpec, count_params, fingerprint, load_backbone, load_pruned

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").exists() and not (ROOT / "data").exists(),
    reason="needs Fashion-MNIST: apt-get install dataset-fashion-mnist",
)


def test_prune_end_to_end_writes_a_complete_run(tiny_prune_args, tmp_path):
    assert prune_main(tiny_prune_args) == 0
    run = tmp_path / "run"
    report = json.loads((run / "report.json").read_text())
    assert {"model", "method", "timings", "search", "dense", "pruned"} <= set(report)
    assert report["method"]["scorer"]["name"] == "gn_greedy"  # the default, with the Gram form it chose on the CPU
    assert report["method"]["scorer"]["gram"] == "auto" and report["method"]["scorer"]["gram_used"] == "full"
    assert set(report["timings"]) >= {"scoring_s", "search_s", "total_s"}
    assert report["search"]["evaluations"] == 4 and report["search"]["best_fitness"] > 0
    assert 0 <= report["dense"]["metrics"]["knn_top1"] <= 1
    assert [p["label"] for p in report["pruned"]] == ["mlp0.35_head0.25", "flops0.6"]
    for entry in report["pruned"]:
        model, record = load_pruned(run / entry["checkpoint"])
        assert count_params(model) == entry["params"] and "knn_top1" in entry["metrics"]
    assert report["pruned"][1]["flops"] <= 0.6 * report["dense"]["flops"]
    assert (run / "report.md").read_text().startswith("# Pruning report")
    assert (run / "config.yaml").exists() and len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 1
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    drift = events.Scalars("importance/drift_per_head")  # what the default score measures, per batch
    assert len(drift) == 3 and all(e.value > 0 for e in drift) and "search/best_fitness" in events.Tags()["scalars"]
    for name in ("accuracy_vs_params", "accuracy_vs_flops", "kept_units", "search_fitness"):
        assert (run / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG", name
    umask = os.umask(0)
    os.umask(umask)
    for artifact in [run / "elastic_scores.safetensors", run / "report.json", *run.glob("models/*/model.safetensors")]:
        assert artifact.stat().st_mode & 0o777 == 0o666 & ~umask, artifact  # not the 0600 of temporary files
    assert not [p for p in run.rglob(".*") if p.is_dir() or p.suffix == ".tmp"]  # no temp leftovers

    # The elastic artifact reproduces the exported models from the base weights.
    scores = ElasticScores.load(run / "elastic_scores.safetensors")
    torch.manual_seed(1)  # the recorded spec rebuilds the random base weights whatever the global RNG holds
    base = load_backbone(BackboneSpec.from_dict(scores.base))
    elastic = ElasticViT(base, scores).set_budget(Budget(mlp_ratio=0.35, head_ratio=0.25))
    assert elastic.subnet.head_counts == report["pruned"][0]["heads"]


def test_existing_results_are_not_overwritten(tiny_prune_args, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.json").write_text("{}")
    assert prune_main(tiny_prune_args) == 2
    assert "already holds results" in capsys.readouterr().err
    assert (tmp_path / "run" / "report.json").read_text() == "{}"


def test_the_command_line_exits_2_without_a_traceback(tiny_prune_args, tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "prune.py"), *tiny_prune_args, "--search.max_evaluations=-5"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: search.max_evaluations must be an integer >= 0, got -5"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, key", [
    ("--search.max_evaluationz=3", "search.max_evaluationz"),
    ("--search.max_evaluations=abc", "search.max_evaluations"),
    ("--config={bad_yaml}", "max_evaluationz"),
])
def test_invalid_configuration_names_the_key(tmp_path, override, key):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("search:\n  max_evaluationz: 3\n")
    result = subprocess.run([sys.executable, str(ROOT / "prune.py"), "--out_dir", str(tmp_path / "run"),
                             override.format(bad_yaml=bad_yaml)], capture_output=True, text=True)
    assert result.returncode == 2 and key in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("config", sorted((ROOT / "configs" / "prune").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_prune_config_instantiates(config, tmp_path):
    import yaml

    values = merged_config(config)
    overlay = "model" not in values  # quick.yaml, snapvit.yaml: composed after a model's config
    configs = ["--config", str(ROOT / "configs" / "prune" / "dino_vitb16.yaml")] if overlay else []
    cli = prune_cli([
        *configs, "--config", str(config), "--out_dir", str(tmp_path / "run"), "--model.pretrained=false", "--model.checkpoint_path=null",
        "--model.model_kwargs.depth=1", "--trainer.logger=false",
    ])
    assert cli.model.backbone is not None and cli.datamodule is not None
    if "base" in yaml.safe_load(config.read_text()):  # a full-size preset: its base's data and stages, its model
        assert cli.datamodule.source == "folder" and cli.datamodule.max_samples == 1000
        assert cli.model.spec.model_name == values["model"]["model_name"]
        assert cli.model.pipeline.settings.evaluation.metrics == values["evaluation"]["metrics"]
    if overlay:  # the model's config with the overlay's values
        assert cli.datamodule.source == "folder" and cli.model.spec.model_name.endswith(".dino")
        assert cli.datamodule.max_samples == values["data"]["init_args"]["max_samples"]
        assert cli.model.pipeline.settings.search.num_images == values["search"]["num_images"]
    assert {type(c).__name__ for c in cli.trainer.callbacks} >= {"ImportanceCallback", "SearchCallback", "ExportCallback", "ReportCallback"}


def test_default_config_prunes_the_shipped_reference_model(tmp_path):
    cli = prune_cli(["--config", str(ROOT / "configs" / "prune" / "demo.yaml"), "--out_dir", str(tmp_path / "run"),
                         "--trainer.logger=false"])
    reference, record = load_pruned(ROOT / "assets" / "reference_vit_fmnist")
    assert cli.model.pipeline.state.fingerprint == fingerprint(reference)
    assert record["heads"] == [6] * 6 and record["extra"]["metrics"]["val/accuracy"] > 0.85


def test_out_of_memory_is_one_line_naming_the_batch_sizes_to_lower(tiny_prune_args, tmp_path, capsys, monkeypatch):
    from snapvit_pl.scoring import DEFAULT_SCORER

    def out_of_memory(self, batch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.11 GiB total capacity)")

    monkeypatch.setattr(DEFAULT_SCORER, "update", out_of_memory)
    assert prune_main(tiny_prune_args) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith("error: out of memory (CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "lower --data.init_args.batch_size, --search.batch_size, --evaluation.batch_size" in line
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_extract_at_a_grid_budget_gives_the_model_prune_py_cuts_when_asked_for_it(tiny_prune_args, tmp_path):
    """Run 1 asks for sparsity 0.4; its scores record the fitness-chosen split of a grid of budgets, FLOPs 0.7
    among them. Extracting FLOPs 0.7 from run 1's scores gives the very model run 2 cuts when asked for it."""
    from safetensors.torch import load_file

    from snapvit_pl.cli.extract import main as extract_main

    common = [a for a in tiny_prune_args if not a.startswith(("--export.budgets", "--out_dir"))
              and a != str(tmp_path / "run")] + ["--evaluation.metrics=[]", "--export.split_grid=0.1"]
    assert prune_main([*common, "--out_dir", str(tmp_path / "one"), "--export.budgets=[{sparsity: 0.4}]"]) == 0
    assert prune_main([*common, "--out_dir", str(tmp_path / "two"), "--export.budgets=[{flops: 0.7}]"]) == 0
    torch.manual_seed(1)  # extract rebuilds the random base weights from the seed recorded in the scores
    assert extract_main(["--scores", str(tmp_path / "one" / "elastic_scores.safetensors"), "--progress=off",
                         "--out_dir", str(tmp_path / "cut"), "--export.budgets=[{flops: 0.7}]"]) == 0
    extracted = load_file(tmp_path / "cut" / "flops0.7" / "model.safetensors")
    asked = load_file(tmp_path / "two" / "models" / "flops0.7" / "model.safetensors")
    assert extracted.keys() == asked.keys() and all(torch.equal(extracted[k], asked[k]) for k in asked)
    record = json.loads((tmp_path / "two" / "report.json").read_text())
    assert [c["label"] for c in record["splits"] if c["requested"]] == ["flops0.7"]


def test_a_pruning_run_prints_its_own_progress_only(tiny_prune_args, tmp_path):
    """No Lightning banner (devices found, "Seed set to", "`Trainer.fit` stopped") among the run's progress lines."""
    result = subprocess.run([sys.executable, str(ROOT / "prune.py"), *tiny_prune_args, "--progress=lines",
                             "--search.max_evaluations=2", "--search.popsize=2", "--evaluation.metrics=[knn]"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert lines and all(line.startswith("[snapvit] ") for line in lines), result.stderr
    assert {line.split(":")[0] for line in lines} >= {"[snapvit] importance", "[snapvit] search", "[snapvit] export"}


def test_a_segmentation_datamodule_gives_the_miou_of_every_budget(tiny_prune_args, tmp_path, capsys):
    """evaluation.metrics seg with the offline Fashion-MNIST canvases: mIoU per model in report.json, the tables
    (console, report.md) and TensorBoard; without segmentation data, one error line before any work."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = [*tiny_prune_args, "--search.max_evaluations=0", "--evaluation.metrics=[knn, seg]", "--report.print_table=true",
            "--evaluation.seg_train_samples=64", "--evaluation.seg_val_samples=32", "--evaluation.seg_epochs=2"]
    assert prune_main(args) == 2  # no seg_data
    assert capsys.readouterr().err.startswith("error: evaluation.metrics: 'seg' needs segmentation data")
    assert prune_main([*args, "--seg_data", "SegmentationDataModule", "--seg_data.init_args.source", "fashion_mnist"]) == 0
    run = tmp_path / "run"
    report = json.loads((run / "report.json").read_text())
    models = [report["dense"], *report["pruned"]]
    assert len(models) == 3 and all(0 <= m["metrics"]["seg_miou"] <= 1 for m in models)
    header = next(line for line in capsys.readouterr().out.splitlines() if "k-NN" in line)
    assert "| seg % |" in (run / "report.md").read_text() and header.split()[-2:] == ["seg", "%"]
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    logged = {(e.step, round(e.value, 6)) for e in events.Scalars("models/seg_miou_vs_params")}
    assert logged == {(m["params"], round(m["metrics"]["seg_miou"], 6)) for m in models}


def test_a_run_leaves_the_callers_sigterm_handler_in_place(tiny_prune_args):
    """prune.py turns SIGTERM into a clean stop during its own run only: a Python caller (a notebook, a test, a
    training launched after it in the same process) keeps its own handler."""
    import signal

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        assert prune_main(tiny_prune_args + ["--evaluation.metrics=[]", "--export.save_models=false"]) == 0
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


class _ReaderGone:
    """A standard output whose reader went away after the first line (``prune.py ... | head -1``)."""

    def __init__(self):
        self.lines = 0

    def write(self, text: str) -> int:
        if self.lines >= 1:
            raise BrokenPipeError(32, "Broken pipe")
        self.lines += text.count("\n")
        return len(text)

    def flush(self) -> None:
        if self.lines > 1:
            raise BrokenPipeError(32, "Broken pipe")

    def isatty(self) -> bool:
        return False


def test_overwrite_replaces_the_whole_earlier_run_and_a_closed_stdout_changes_nothing(tiny_prune_args, tmp_path,
                                                                                     monkeypatch):
    """Issue 48: --overwrite true over a finished run with other budgets left the replaced run's models (and plots,
    logs) beside the new ones; a reader of the table gone after one line made a finished run exit 130 as
    interrupted. Files of the user's own in the folder stay."""
    run = tmp_path / "run"
    common = [a for a in tiny_prune_args if not a.startswith(("--export.budgets", "--report.print_table"))] + \
        ["--evaluation.metrics=[]"]
    assert prune_main([*common, "--export.budgets=[{sparsity: 0.3}, {flops: 0.6}]"]) == 0
    (run / "notes.txt").write_text("mine")
    monkeypatch.setattr(sys, "stdout", _ReaderGone())
    assert prune_main([*common, "--export.budgets=[{sparsity: 0.5}]", "--overwrite=true",
                       "--report.print_table=true"]) == 0
    monkeypatch.undo()
    assert sorted(p.name for p in (run / "models").iterdir()) == ["sparsity0.5"]
    assert [e["label"] for e in json.loads((run / "report.json").read_text())["pruned"]] == ["sparsity0.5"]
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 1  # the earlier run's log went too
    assert (run / "notes.txt").read_text() == "mine" and not (run / ".lock").exists()


def test_a_bug_in_the_middle_of_a_run_leaves_no_lock(tiny_prune_args, tmp_path, monkeypatch):
    """A failure that is no user error keeps its traceback, and the run directory is not left locked."""
    from snapvit_pl.pipeline.driver import Pipeline

    def bug(self, device=None):
        raise RuntimeError("a bug")

    monkeypatch.setattr(Pipeline, "check_latency", bug)  # (called once the run holds its directory)
    with pytest.raises(RuntimeError, match="a bug"):
        prune_main(tiny_prune_args)
    assert (tmp_path / "run").is_dir() and not (tmp_path / "run" / ".lock").exists()


def test_a_signal_after_the_report_is_written_leaves_a_finished_run(tiny_prune_args, tmp_path, monkeypatch, capsys):
    """Issue 77: a SIGTERM just after a run wrote its report printed 'interrupted ... run it again' (status 130), and
    running it again answered 'already finished'. The report is the last file: once it is written, the run is
    finished, whatever signal comes after; nothing of it is removed."""
    from snapvit_pl.cli import prune_main
    from snapvit_pl.pipeline import driver

    written = driver.write_report

    def write_then_interrupted(*args, **kwargs):
        written(*args, **kwargs)
        raise KeyboardInterrupt  # what the SIGTERM handler raises, just after the last file

    monkeypatch.setattr(driver, "write_report", write_then_interrupted)
    assert prune_main([*tiny_prune_args, "--search.max_evaluations=0", "--evaluation.metrics=[]"]) == 0
    err = capsys.readouterr().err
    assert "finished: every result of the run is written in" in err and "interrupted" not in err
    run = tmp_path / "run"
    assert (run / "report.json").is_file() and (run / "elastic_scores.safetensors").is_file()
    assert not (run / ".lock").exists()
