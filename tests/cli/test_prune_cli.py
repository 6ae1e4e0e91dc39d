import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from snapvit_pl.cli import prune_cli, prune_main
from snapvit_pl.elastic import Budget, ElasticScores, ElasticViT
from snapvit_pl.models import BackboneSpec, count_params, fingerprint, load_backbone, load_pruned
from snapvit_pl.pipeline import SearchSettings

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
    assert report["method"]["scorer"]["name"] == "ssl_fisher"
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
    for name in ("accuracy_vs_params", "accuracy_vs_flops", "kept_units", "search_fitness"):
        assert (run / "plots" / f"{name}.png").read_bytes()[:4] == b"\x89PNG", name
    umask = os.umask(0)
    os.umask(umask)
    for artifact in [run / "elastic_scores.safetensors", run / "report.json", *run.glob("models/*/model.safetensors")]:
        assert artifact.stat().st_mode & 0o777 == 0o666 & ~umask, artifact  # not the 0600 of temporary files
    assert not [p for p in run.rglob(".*") if p.is_dir() or p.suffix == ".tmp"]  # no temp leftovers

    # The elastic artifact reproduces the exported models from the base weights.
    scores = ElasticScores.load(run / "elastic_scores.safetensors")
    torch.manual_seed(0)  # the CLI seeds everything with 0 before building the model
    base = load_backbone(BackboneSpec.from_dict(scores.base))
    elastic = ElasticViT(base, scores).set_budget(Budget(mlp_ratio=0.35, head_ratio=0.25))
    assert elastic.subnet.head_counts == report["pruned"][0]["heads"]


def test_existing_results_are_not_overwritten(tiny_prune_args, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.json").write_text("{}")
    assert prune_main(tiny_prune_args) == 2
    assert "already holds results" in capsys.readouterr().err
    assert (tmp_path / "run" / "report.json").read_text() == "{}"


@pytest.fixture
def bad_files(tmp_path):
    """A weights file of random bytes and a truncated copy of the reference weights."""
    (tmp_path / "random.safetensors").write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    weights = (ROOT / "assets" / "reference_vit_fmnist" / "model.safetensors").read_bytes()
    (tmp_path / "truncated.safetensors").write_bytes(weights[: len(weights) // 3])
    (tmp_path / "empty").mkdir()
    return tmp_path


BAD_INPUTS = [
    (["--export.budgets=[{mlp_ratio: 1.5, head_ratio: 0.1}]"], "mlp_ratio=1.5 is outside [0, 1)"),
    (["--export.budgets=[{params: 0.01}]"], "unreachable"),
    (["--model.model_name=vit_not_a_model"], "unknown timm model"),
    (["--data.init_args.source=folder", "--data.init_args.root=TMP/empty"], "has no train/ and val/ folders"),
    (["--model.checkpoint_path=/nonexistent/weights.safetensors"], "checkpoint file not found"),
    (["--model.model_kwargs={num_classes: 0}", "--model.model_name=resnet18"], "unsupported architecture ResNet"),
    (["--data.init_args.batch_size=64"], "is larger than the 48 pruning images"),
    (["--data.init_args.batch_size=0"], "--data.init_args.batch_size: Not of type PositiveInt"),
    (["--search.max_evaluations=-5"], "max_evaluations must be >= 0"),
    (["--search.sigma=0"], "sigma must be a positive number"),
    (["--model.checkpoint_path=TMP/random.safetensors"], "could not load"),
    (["--model.checkpoint_path=TMP/truncated.safetensors"], "could not load"),
]


@pytest.mark.parametrize("overrides, message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line(tiny_prune_args, bad_files, capsys, overrides, message):
    code = prune_main([*tiny_prune_args, *(a.replace("TMP", str(bad_files)) for a in overrides)])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and message in errors[0], err[-2000:]
    assert "Traceback" not in err
    assert not (bad_files / "run").exists(), "a run that failed on bad input leaves nothing behind"


def test_the_command_line_exits_2_without_a_traceback(tiny_prune_args, tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "prune.py"), *tiny_prune_args, "--search.max_evaluations=-5"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: search: max_evaluations must be >= 0, got -5"]
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
    cli = prune_cli([
        "--config", str(config), "--out_dir", str(tmp_path / "run"), "--model.pretrained=false", "--model.checkpoint_path=null",
        "--model.model_kwargs.depth=1", "--trainer.logger=false",
    ])
    assert cli.model.backbone is not None and cli.datamodule is not None
    assert {type(c).__name__ for c in cli.trainer.callbacks} >= {"ImportanceCallback", "SearchCallback", "ExportCallback", "ReportCallback"}


def test_default_config_prunes_the_shipped_reference_model(tmp_path):
    cli = prune_cli(["--config", str(ROOT / "configs" / "prune" / "demo.yaml"), "--out_dir", str(tmp_path / "run"),
                         "--trainer.logger=false"])
    reference, record = load_pruned(ROOT / "assets" / "reference_vit_fmnist")
    assert cli.model.pipeline.state.fingerprint == fingerprint(reference)
    assert record["heads"] == [6] * 6 and record["extra"]["metrics"]["val/accuracy"] > 0.85


def test_help_leads_with_the_project_and_shows_what_prune_py_runs(capsys):
    with pytest.raises(SystemExit):
        prune_main(["--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: python prune.py") and "--resume" in text and "--verbose" in text
    own, trainer = text.index("--search.max_evaluations"), text.index("--trainer.accelerator")
    assert own < trainer and text.index("--out_dir") < own
    # configs/prune/demo.yaml's values, not the class defaults (1000 images, 150 evaluations)
    import yaml

    demo = yaml.safe_load((ROOT / "configs" / "prune" / "demo.yaml").read_text())["search"]
    for key in ("num_images", "max_evaluations"):
        option = text[text.index(f"--search.{key}"):]
        option = " ".join(option[:option.index("\n  --", 1)].split())  # this option's own help lines, unwrapped
        assert f"default: {demo[key]})" in option and demo[key] != getattr(SearchSettings(), key)
