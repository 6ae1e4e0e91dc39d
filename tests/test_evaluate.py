import json

import pytest
import torch

import snapvit_pl.eval.suite as suite
from snapvit_pl.cli.evaluate import main
from snapvit_pl.data import ClassificationDataModule, find_fashion_mnist
from snapvit_pl.errors import ConfigError
from snapvit_pl.eval import EvalData, EvaluationSettings, evaluate_model
from snapvit_pl.eval.suite import parse_metrics
from snapvit_pl.models import BackboneSpec, Subnet, count_flops, count_params, load_backbone, load_pruned, prune_, save_pruned

TINY = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=2, num_classes=10)
SMALL_DATA = ["--evaluation.train_samples=100", "--evaluation.val_samples=50", "--evaluation.seg_train_samples=24",
              "--evaluation.seg_val_samples=12", "--evaluation.seg_epochs=2", "--evaluation.knn_k=5",
              "--evaluation.batch_size=64"]

needs_data = pytest.mark.skipif(find_fashion_mnist(None) is None, reason="dataset-fashion-mnist is not installed")


@pytest.fixture(scope="module")
def pruned_dir(tmp_path_factory):
    torch.manual_seed(0)
    spec = BackboneSpec("vit_tiny_patch16_224", False, None, TINY)
    model = prune_(load_backbone(spec), Subnet.from_counts([1, 2], [64, 100]))
    return save_pruned(model, tmp_path_factory.mktemp("ckpt") / "pruned", spec)


@needs_data
def test_reports_every_metric_of_a_pruned_checkpoint(pruned_dir, tmp_path, capsys):
    out = tmp_path / "report.json"
    code = main(["--checkpoint", str(pruned_dir), "--evaluation.metrics=[knn,linear,head,seg,throughput]", *SMALL_DATA,
                 "--evaluation.throughput_batch_size=8", "--device=cpu", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(out.read_text())
    shown = captured.out.splitlines()  # with --out: a summary on the terminal, the report in the file
    assert shown[0] == f"params {report['params']:,}, FLOPs {report['flops']:,}" and len(shown) <= 12
    assert f"knn_top1 {100 * report['knn_top1']:.2f}%" in shown and shown[-1].startswith(f"wrote {out}")
    model, _ = load_pruned(pruned_dir)
    assert report["params"] == count_params(model) and report["flops"] == count_flops(model)
    assert report["model"]["heads"] == [1, 2] and report["model"]["mlp_hidden"] == [64, 100]
    for key in ("knn_top1", "knn_top5", "linear_top1", "head_top1", "seg_miou", "seg_pixel_accuracy"):
        assert 0.0 <= report[key] <= 1.0, key
    assert report["knn_top5"] >= report["knn_top1"]
    assert report["throughput_images_per_s"] > 0 and report["throughput_batch_size"] == 8
    assert set(report["timings_s"]) == {"classification", "seg", "throughput"}


@needs_data
def test_a_prune_config_gives_the_model_the_data_and_the_evaluation(tmp_path, capsys):
    """Every section a prune.py config has is read; evaluate uses its model, data and evaluation settings."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "model:\n  model_name: vit_tiny_patch16_224\n  pretrained: false\n  model_kwargs:\n"
        + "".join(f"    {k}: {v}\n" for k, v in TINY.items())
        + "data:\n  class_path: snapvit_pl.data.ClassificationDataModule\n  init_args:\n    source: fashion_mnist\n"
          "    seed: 3\n    max_samples: 48\n"
          "search:\n  max_evaluations: 7\nexport:\n  mlp_multiple: 8\ntrainer:\n  accelerator: cpu\nseed_everything: 0\n"
          "evaluation:\n  metrics: [head]\n  val_samples: 40\n")
    assert main(["--config", str(config), "--evaluation.train_samples=60"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"]["dense"]["model_name"] == "vit_tiny_patch16_224" and 0 <= report["head_top1"] <= 1
    assert "knn_top1" not in report and "throughput_images_per_s" not in report  # the config's metrics
    assert report["settings"]["data"]["init_args"]["seed"] == 3 and report["settings"]["evaluation"]["val_samples"] == 40


@needs_data
def test_features_are_extracted_once_for_knn_and_linear(pruned_dir, monkeypatch):
    calls = []
    extract = suite.extract_features
    monkeypatch.setattr(suite, "extract_features", lambda *a, **k: calls.append(k.get("description")) or extract(*a, **k))
    model, _ = load_pruned(pruned_dir)
    settings = EvaluationSettings(metrics=["knn", "linear"], train_samples=60, val_samples=30, batch_size=32, knn_k=5)
    dm = ClassificationDataModule()
    dm.configure_for_model(model)
    result = evaluate_model(model, EvalData.from_datamodule(dm, settings, cache=True), settings, device="cpu")
    assert calls == ["train features", "val features"]
    assert {"knn_top1", "linear_top1"} <= set(result) and "head_top1" not in result


def test_headless_model_skips_head():
    model = load_backbone(BackboneSpec("vit_tiny_patch16_224", False, None, dict(TINY, num_classes=0)))
    settings = EvaluationSettings(metrics=["head", "throughput"], throughput_batch_size=4, throughput_repeats=2)
    result = evaluate_model(model, EvalData(), settings, device="cpu")
    assert "head" in result["skipped"] and "head_top1" not in result and result["throughput_images_per_s"] > 0


def test_missing_checkpoint_is_one_error_line(tmp_path, capsys):
    assert main(["--checkpoint", str(tmp_path / "nowhere"), "--evaluation.metrics=[knn]"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and captured.err.count("\n") == 1
    assert "architecture.json" in captured.err


def test_unknown_metric_is_refused_before_loading(tmp_path, capsys):
    assert main(["--checkpoint", str(tmp_path / "nowhere"), "--evaluation.metrics=[knn,speed]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown metric(s) speed") and err.count("\n") == 1
    with pytest.raises(ConfigError):
        parse_metrics("")
    assert parse_metrics(" KNN, linear,knn ") == ["knn", "linear"]


def test_a_model_is_required(capsys):
    assert main(["--evaluation.metrics=[knn]"]) == 2
    assert "give the model" in capsys.readouterr().err


def test_unreadable_weights_file_is_one_error_line(tmp_path, capsys):
    (tmp_path / "random.safetensors").write_bytes(bytes(range(256)) * 16)
    code = main(["--model.model_name=vit_tiny_patch16_224", f"--model.model_kwargs={json.dumps(TINY)}",
                 f"--model.checkpoint_path={tmp_path / 'random.safetensors'}", "--evaluation.metrics=[head]"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: could not load") and err.count("\n") == 1
