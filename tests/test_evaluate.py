import json

import pytest
import torch

import snapvit_pl.eval.suite as suite
from snapvit_pl.data import find_fashion_mnist
from snapvit_pl.errors import ConfigError
from snapvit_pl.evaluate import build_data, evaluate_model, main, parse_metrics
from snapvit_pl.models import BackboneSpec, Subnet, count_flops, count_params, load_backbone, load_pruned, prune_, save_pruned

TINY = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=2, num_classes=10)
SMALL_DATA = ["--train-samples", "100", "--val-samples", "50", "--seg-train-samples", "24", "--seg-val-samples", "12",
              "--seg-epochs", "2", "--knn-k", "5", "--batch-size", "64"]

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
    code = main(["--checkpoint", str(pruned_dir), "--metrics", "knn,linear,head,seg,throughput", *SMALL_DATA,
                 "--throughput-batch", "8", "--device", "cpu", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert report == json.loads(out.read_text())
    model, _ = load_pruned(pruned_dir)
    assert report["params"] == count_params(model) and report["flops"] == count_flops(model)
    assert report["model"]["heads"] == [1, 2] and report["model"]["mlp_hidden"] == [64, 100]
    for key in ("knn_top1", "knn_top5", "linear_top1", "head_top1", "seg_miou", "seg_pixel_accuracy"):
        assert 0.0 <= report[key] <= 1.0, key
    assert report["knn_top5"] >= report["knn_top1"]
    assert report["throughput_images_per_s"] > 0 and report["throughput_batch_size"] == 8
    assert set(report["timings_s"]) == {"classification", "seg", "throughput"}


@needs_data
def test_dense_model_of_a_config(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  model_name: vit_tiny_patch16_224\n  pretrained: false\n  model_kwargs:\n"
                      + "".join(f"    {k}: {v}\n" for k, v in TINY.items()))
    assert main(["--config", str(config), "--metrics", "head", *SMALL_DATA]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"]["dense"]["model_name"] == "vit_tiny_patch16_224" and 0 <= report["head_top1"] <= 1
    assert "knn_top1" not in report and "throughput_images_per_s" not in report


@needs_data
def test_features_are_extracted_once_for_knn_and_linear(pruned_dir, monkeypatch):
    calls = []
    extract = suite.extract_features
    monkeypatch.setattr(suite, "extract_features", lambda *a, **k: calls.append(k.get("description")) or extract(*a, **k))
    model, _ = load_pruned(pruned_dir)
    data = build_data(model, ["knn", "linear"], train_samples=60, val_samples=30, batch_size=32, cache=True)
    result = evaluate_model(model, data, ["knn", "linear"], knn_k=5, device="cpu")
    assert calls == ["train features", "val features"]
    assert {"knn_top1", "linear_top1"} <= set(result) and "head_top1" not in result


def test_headless_model_skips_head(monkeypatch):
    model = load_backbone(BackboneSpec("vit_tiny_patch16_224", False, None, dict(TINY, num_classes=0)))
    result = evaluate_model(model, build_data(model, ["throughput"]), ["head", "throughput"], throughput_batch=4,
                            throughput_repeats=2, device="cpu")
    assert "head" in result["skipped"] and "head_top1" not in result and result["throughput_images_per_s"] > 0


def test_missing_checkpoint_is_one_error_line(tmp_path, capsys):
    assert main(["--checkpoint", str(tmp_path / "nowhere"), "--metrics", "knn"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and captured.err.count("\n") == 1
    assert "architecture.json" in captured.err


def test_unknown_metric_is_refused_before_loading(tmp_path, capsys):
    assert main(["--checkpoint", str(tmp_path / "nowhere"), "--metrics", "knn,speed"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown metric(s) speed") and err.count("\n") == 1
    with pytest.raises(ConfigError):
        parse_metrics("")
    assert parse_metrics(" KNN, linear,knn ") == ["knn", "linear"]


def test_model_choice_must_be_unique(pruned_dir, capsys):
    assert main(["--checkpoint", str(pruned_dir), "--model", "vit_tiny_patch16_224", "--metrics", "knn"]) == 2
    assert "exactly one model" in capsys.readouterr().err
    assert main(["--model", "vit_tiny_patch16_224", "--model-kwargs", "[1]"]) == 2
    assert "JSON object" in capsys.readouterr().err


def test_unreadable_weights_file_is_one_error_line(tmp_path, capsys):
    (tmp_path / "random.safetensors").write_bytes(bytes(range(256)) * 16)
    code = main(["--model", "vit_tiny_patch16_224", "--model-kwargs", json.dumps(TINY),
                 "--weights", str(tmp_path / "random.safetensors"), "--metrics", "head"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: could not load") and err.count("\n") == 1
