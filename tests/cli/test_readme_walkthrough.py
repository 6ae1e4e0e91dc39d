"""The README's "Prune your own model" commands, verbatim, on DINO ViT-B/16 at 224 px with two of its twelve blocks
(random weights) and a tiny stand-in for ImageNet: prune (importance, search, a FLOPs budget, evaluation, report),
extract, evaluate, label-free fine-tuning, ONNX export; with ``pretrained: true`` through an offline Hugging Face
cache, and with ``--model.pretrained false`` and no cache at all. The full-size model runs the same function in
benchmarks/readme_walkthrough.py (results/readme_walkthrough.md: measured again whenever the code it ran changes)."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.slow


def test_the_readme_walkthrough_runs_with_the_weights_of_an_offline_hub_cache(tmp_path):
    pytest.importorskip("onnx")
    import timm
    from safetensors.torch import load_file

    from benchmarks.readme_walkthrough import MODEL, readme_commands, run_walkthrough
    from snapvit_pl.models.loading import fingerprint

    assert [argv[1] for argv in readme_commands()] == ["prune", "extract", "evaluate", "train", "deploy"]
    record = run_walkthrough(tmp_path, log=lambda line: None, depth=2)
    run = tmp_path / "runs" / "prune" / "dino"
    report = record["prune_report"]
    assert report["model"]["model_name"] == "vit_base_patch16_224.dino" and report["model"]["pretrained"] is True
    assert 10e6 < report["dense"]["params"] < 20e6  # ViT-B's embeddings and two of its blocks
    (weights,) = (tmp_path / "hf_home").rglob("model.safetensors")  # the run's base weights are the cache's
    base = timm.create_model(MODEL, pretrained=False, num_classes=0, depth=2)
    base.load_state_dict(load_file(weights))
    assert report["model"]["fingerprint"] == fingerprint(base)
    (model,) = report["pruned"]
    assert model["label"] == "flops0.5" and model["flops"] <= 0.5 * report["dense"]["flops"]
    assert "knn_top1" in model["metrics"] and report["search"]["evaluations"] == 2
    assert set(report["peak_memory_mb"]) == {"importance", "search", "splits", "export"}
    assert report["peak_memory"] == "process peak RSS" and min(report["peak_memory_mb"].values()) > 300
    prune_log = record["commands"][0]["stderr"]
    assert "[snapvit] importance: " in prune_log and "[snapvit] search: 2/2 evals" in prune_log  # no TTY: lines

    assert {p.name for p in (run / "more").iterdir()} >= {"flops0.4", "params0.6"}
    evaluation = json.loads((run / "flops0.5.json").read_text())
    assert evaluation["model"]["checkpoint"].endswith("flops0.5") and 0 <= evaluation["knn_top1"] <= 1
    finetuned = tmp_path / "runs" / "finetune" / "dino-flops0.5" / "model"
    assert (finetuned / "model.safetensors").is_file()
    assert (finetuned / "model.onnx").stat().st_size > 10e6  # beside the weights, not in the working directory
    assert "max abs diff" in record["commands"][-1]["stdout"]


def test_the_readme_walkthrough_runs_with_random_weights_and_no_hub_cache(tmp_path):
    """``pretrained: false``: the random base weights come from the run's recorded seed, so extract (its fingerprint
    check), evaluate, the fine-tuning's teacher and the export all rebuild the very same model, offline."""
    pytest.importorskip("onnx")
    from benchmarks.readme_walkthrough import run_walkthrough

    record = run_walkthrough(tmp_path, log=lambda line: None, random_weights=True, depth=2)
    report = record["prune_report"]
    assert report["model"]["pretrained"] is False and report["model"]["seed"] == 0
    assert not list((tmp_path / "hf_home").rglob("*.safetensors"))  # nothing came from a Hub cache
    run = tmp_path / "runs" / "prune" / "dino"
    assert {p.name for p in (run / "more").iterdir()} >= {"flops0.4", "params0.6"}
    finetuned = tmp_path / "runs" / "finetune" / "dino-flops0.5" / "model"
    assert (finetuned / "model.safetensors").is_file() and (finetuned / "model.onnx").is_file()
    assert "max abs diff" in record["commands"][-1]["stdout"]
