"""A full disk (ENOSPC) or a file-size limit (EFBIG) while prune, extract or evaluate write (the run lock included):
one ``error:`` line naming the file and the space it needs, no lock and no half-written file left, and the run
afterwards (``--resume``, or the same command) ends with exactly the files of an uninterrupted run. Likewise an image
that fails only when it is read: the run stops with its progress saved, and ``--resume`` completes it."""
import hashlib
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from faults import disk_full_at, full_disk_on_flush
from snapvit_pl.cli import main
from snapvit_pl.data import find_fashion_mnist

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(find_fashion_mnist(None) is None, reason="apt-get install dataset-fashion-mnist")]


TINY_WIDTH = {"embed_dim": 32, "depth": 2, "num_heads": 4}  # random weights saved to a file (extract rebuilds them)


def _artifacts(run: Path) -> dict[str, str]:
    """sha256 of what a run's later use trusts: the scores file and every model file."""
    files = [run / "elastic_scores.safetensors", *sorted((run / "models").rglob("*"))]
    return {f.relative_to(run).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.is_file()}


def _one_line(capsys, code: int, *parts: str) -> str:
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert all(part in errors[0] for part in parts), errors[0]
    return err


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """An uninterrupted run of a small random-weight model (its weights in a file, so extract can rebuild it)."""
    from safetensors.torch import save_file

    from snapvit_pl.models import BackboneSpec, load_backbone

    folder = tmp_path_factory.mktemp("straight")
    kwargs = {"img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 10, **TINY_WIDTH}
    save_file(load_backbone(BackboneSpec("vit_tiny_patch16_224", False, None, kwargs)).state_dict(),
              str(folder / "base.safetensors"))
    _tiny.weights = str(folder / "base.safetensors")
    args = _tiny(folder / "run")
    assert main(["prune", *args]) == 0
    return _artifacts(folder / "run"), args


def _tiny(run: Path) -> list[str]:
    model = [f"--model.checkpoint_path={_tiny.weights}",
             *(f"--model.model_kwargs.{key}={value}" for key, value in TINY_WIDTH.items())]
    return ["--out_dir", str(run), *model, "--data.init_args.max_samples=48", "--data.init_args.batch_size=16",
            "--data.init_args.n_local_views=2", "--search.max_evaluations=4", "--search.num_images=32",
            "--search.batch_size=32", "--search.pca_components=8",
            "--export.budgets=[{mlp_ratio: 0.35, head_ratio: 0.25}, {flops: 0.6}]", "--evaluation.metrics=[]",
            "--report.print_table=false", "--report.plots=false", "--trainer.enable_progress_bar=false",
            "--progress=off"]


@pytest.mark.parametrize("writer, call, stage", [
    # the progress after the importance pass: nothing saved to resume from, so the run leaves nothing; run it again
    ("snapvit_pl.run.resume.write_bytes", 2, "resume_state.pt"),
    ("snapvit_pl.elastic.scores.save_file", 1, "elastic_scores.safetensors"),  # the scores, after the splits
    ("snapvit_pl.models.checkpoint.save_file", 2, "models/flops0.6"),  # the second model of the export
], ids=["importance", "splits", "export"])
def test_prune_disk_full_then_resume_is_byte_identical(uninterrupted, tmp_path, monkeypatch, capsys, writer, call,
                                                        stage):
    expected, _ = uninterrupted
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        calls = disk_full_at(patch, writer, call)
        code = main(["prune", *_tiny(run)])
    assert len(calls) >= call
    folder = (run / stage).parent  # the free space of the full file's own folder, not the working directory's
    err = _one_line(capsys, code, "cannot write", stage, "No space left on device", f"free in {folder}")
    if stage == "resume_state.pt":
        assert not run.exists()  # no progress to keep: a refused run leaves nothing behind
        assert main(["prune", *_tiny(run)]) == 0
    else:
        assert not (run / ".lock").exists() and not [p for p in run.rglob(".*tmp")]  # no lock, no temporary
        assert not (run / "report.json").exists() and (run / "resume_state.pt").exists()
        assert f"continue with: snapvit-pl prune --resume {run}" in err
        assert main(["prune", "--resume", str(run), "--progress=off"]) == 0
    assert _artifacts(run) == expected


def test_a_full_disk_while_taking_the_run_lock(uninterrupted, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        full_disk_on_flush(patch)
        code = main(["prune", *_tiny(run)])
    _one_line(capsys, code, "cannot write", ".lock", "No space left on device")
    assert not run.exists()  # nothing saved yet: the refused run leaves nothing, no stale lock either
    assert main(["prune", *_tiny(run)]) == 0 and _artifacts(run) == uninterrupted[0]


def test_extract_disk_full_then_the_same_command_is_byte_identical(uninterrupted, tmp_path, monkeypatch, capsys):
    scores = str(tmp_path / "scores.safetensors")
    run = Path(uninterrupted[1][uninterrupted[1].index("--out_dir") + 1])
    (tmp_path / "scores.safetensors").write_bytes((run / "elastic_scores.safetensors").read_bytes())
    args = ["extract", "--scores", scores, "--export.budgets=[{sparsity: 0.3}, {params: 0.5}]"]
    assert main([*args, "--out_dir", str(tmp_path / "straight")]) == 0
    with monkeypatch.context() as patch:
        disk_full_at(patch, "snapvit_pl.models.checkpoint.save_file", 2)
        code = main([*args, "--out_dir", str(tmp_path / "cut")])
    _one_line(capsys, code, "cannot write", "params0.5", "No space left on device")
    assert not (tmp_path / "cut" / "params0.5").exists()  # the model that did not fit is not there, not even half
    assert main([*args, "--out_dir", str(tmp_path / "cut"), "--overwrite", "true"]) == 0
    digest = lambda d: {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
                        for p in sorted(d.rglob("*")) if p.is_file()}
    assert digest(tmp_path / "cut") == digest(tmp_path / "straight")


def test_evaluate_over_a_file_size_limit_writes_nothing(uninterrupted, tmp_path):
    """A real limit (RLIMIT_FSIZE: the kernel refuses the write with EFBIG), in a subprocess."""
    run = Path(uninterrupted[1][uninterrupted[1].index("--out_dir") + 1])
    out = tmp_path / "reports" / "flops.json"
    command = [sys.executable, "-m", "snapvit_pl.evaluate", "--checkpoint", str(run / "models" / "flops0.6"),
               "--evaluation.metrics=[knn]", "--evaluation.train_samples=50", "--evaluation.val_samples=20",
               "--evaluation.knn_k=5", "--out", str(out)]
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # noqa: E731
    limited = subprocess.run(command, capture_output=True, text=True, timeout=600, preexec_fn=limit)
    errors = [line for line in limited.stderr.splitlines() if line.startswith("error:")]
    assert limited.returncode == 2 and len(errors) == 1 and "Traceback" not in limited.stderr, limited.stderr[-2000:]
    assert str(out) in errors[0] and "File too large" in errors[0] and "ulimit -f" in errors[0]
    assert not (tmp_path / "reports").exists()  # nothing half-written, not even the folder made for it
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert 0 <= json.loads(out.read_text())["knn_top1"] <= 1


def test_an_image_unreadable_only_when_read_leaves_a_run_that_resume_completes(uninterrupted, tmp_path, capsys):
    """What cannot be checked up front (an image that fails only when decoded, found by the evaluation after the
    expensive stages) stops the run with its progress saved; replaced, ``--resume`` completes it."""
    import numpy as np
    from PIL import Image

    root = tmp_path / "images"
    for split, count in (("train", 24), ("val", 6)):
        for c, value in (("a", 40), ("b", 200)):
            (root / split / c).mkdir(parents=True)
            for i in range(count):
                Image.fromarray(np.full((28, 28), value + i, np.uint8)).save(root / split / c / f"{i}.png")
    bad = root / "val" / "b" / "3.png"
    good = bad.read_bytes()
    bad.write_bytes(good[:40])  # a truncated PNG: the header is fine, decoding fails
    run = tmp_path / "run"
    args = [*_tiny(run), "--data.init_args.source=folder", f"--data.init_args.root={root}",
            "--evaluation.metrics=[knn]", "--evaluation.train_samples=20", "--evaluation.val_samples=12",
            "--evaluation.knn_k=3", "--data.init_args.max_samples=32"]
    err = _one_line(capsys, main(["prune", *args]), "cannot read image", "3.png")
    assert f"continue with: snapvit-pl prune --resume {run}" in err and not (run / "report.json").exists()
    bad.write_bytes(good)
    assert main(["prune", "--resume", str(run), "--progress=off"]) == 0
    assert (run / "report.json").exists() and not (run / ".lock").exists()
