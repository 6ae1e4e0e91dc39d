import subprocess
import sys

import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from families import FAMILIES, random_subnet  # noqa: E402
from snapvit_pl.deploy import check_onnx, export_onnx, onnx_throughput  # noqa: E402
from snapvit_pl.deploy.__main__ import main  # noqa: E402
from snapvit_pl.models import load_backbone, prune_, save_pruned  # noqa: E402


def _pruned(family, seed=3):
    model = load_backbone(FAMILIES[family])
    return prune_(model, random_subnet(model, seed))


def _files(directory):
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_pruned_model_of_every_family_matches_onnxruntime_at_any_batch(tmp_path, family):
    model = _pruned(family).train()
    fused = [m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")]
    path = export_onnx(model, tmp_path / "model.onnx")
    assert check_onnx(model, path, batch_size=2) <= 1e-4
    assert check_onnx(model, path, batch_size=5) <= 1e-4  # dynamic batch axis
    assert model.training and fused == [m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")]
    assert _files(tmp_path) == ["model.onnx"]


def test_fixed_batch_export_and_throughput(tmp_path):
    path = export_onnx(_pruned("dino_vit"), tmp_path / "model.onnx", input_shape=(3, 32, 32), dynamic_batch=False)
    assert ort.InferenceSession(str(path)).get_inputs()[0].shape == [1, 3, 32, 32]
    assert onnx_throughput(path, None, batch_size=1, warmup=1, repeats=3) > 0


def test_failed_export_leaves_previous_file_untouched(tmp_path, monkeypatch):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"previous")

    def partial_then_fail(model, args, f, **kwargs):
        open(f, "wb").write(b"half an onnx file")
        raise RuntimeError("exporter crashed")

    monkeypatch.setattr(torch.onnx, "export", partial_then_fail)
    with pytest.raises(RuntimeError, match="exporter crashed"):
        export_onnx(_pruned("dino_vit"), path)
    assert path.read_bytes() == b"previous" and _files(tmp_path) == ["model.onnx"]


def test_weights_over_2gib_are_gathered_into_one_data_file(tmp_path, monkeypatch):
    export = torch.onnx.export

    def export_with_weights_outside(model, args, f, **kwargs):  # what the exporter does past 2 GiB
        export(model, args, f, **kwargs)
        onnx.save_model(onnx.load(f), f, save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0)

    monkeypatch.setattr(torch.onnx, "export", export_with_weights_outside)
    model = _pruned("eva02_fused_qkv")
    path = export_onnx(model, tmp_path / "model.onnx")
    assert _files(tmp_path) == ["model.onnx", "model.onnx.data"]
    assert check_onnx(model, path, batch_size=3) <= 1e-4


@pytest.fixture
def one_thread():
    """The benchmark runs 50 timed batches; one thread keeps them quick on a loaded CI machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_cli_exports_checks_and_benchmarks_a_pruned_checkpoint(tmp_path, capsys, one_thread):
    model = _pruned("deit_distilled")
    save_pruned(model, tmp_path / "ckpt", FAMILIES["deit_distilled"])
    out = tmp_path / "deploy" / "model.onnx"
    args = ["--checkpoint", str(tmp_path / "ckpt"), "--out", str(out), "--batch_size", "3", "--check", "true",
            "--benchmark=true"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert out.is_file() and lines[0].startswith(f"wrote {out}")
    assert lines[1].startswith("max abs diff") and float(lines[1].split()[-1]) <= 1e-4
    assert "onnxruntime" in lines[2] and lines[2].count("images/s") == 2


def test_cli_writes_into_the_checkpoints_directory_by_default(tmp_path, monkeypatch, capsys):
    save_pruned(_pruned("deit_distilled"), tmp_path / "ckpt", FAMILIES["deit_distilled"])
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["--checkpoint", str(tmp_path / "ckpt")]) == 0
    assert (tmp_path / "ckpt" / "model.onnx").is_file() and list((tmp_path / "elsewhere").iterdir()) == []
    assert main(["--checkpoint", "hf-hub:org/name"]) == 2  # no directory of one's own: --out is needed
    assert "give --out FILE.onnx" in capsys.readouterr().err


def test_cli_bad_checkpoint_is_one_line_and_exit_code_2(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "snapvit_pl.deploy", "--checkpoint", str(tmp_path / "missing"), "--out", str(tmp_path / "m.onnx")],
        capture_output=True, text=True,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "architecture.json not found" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "m.onnx").exists()
