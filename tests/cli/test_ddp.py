"""2-process DDP on CPU (gloo): prune.py gives the single-process result; train.py saves a checkpoint."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from snapvit_pl.elastic import ElasticScores
from snapvit_pl.models import load_pruned

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="apt-get install dataset-fashion-mnist"),
]


def _run(script: str, args: list[str], cwd: Path) -> None:
    result = subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True, cwd=cwd, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def test_prune_ddp_matches_single_process(tiny_prune_args, tmp_path):
    args = [a for a in tiny_prune_args if not str(a).startswith(str(tmp_path))]
    args.remove("--out_dir")
    args += ["--search.max_evaluations=6", "--evaluation.metrics=[]"]
    _run("prune.py", ["--out_dir", str(tmp_path / "single"), *args], tmp_path)
    _run("prune.py", ["--out_dir", str(tmp_path / "ddp"), *args, "--trainer.strategy=ddp", "--trainer.devices=2"], tmp_path)
    single = ElasticScores.load(tmp_path / "single" / "elastic_scores.safetensors")
    ddp = ElasticScores.load(tmp_path / "ddp" / "elastic_scores.safetensors")
    for a, b in zip(single.neuron_scores + single.head_scores, ddp.neuron_scores + ddp.head_scores):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5 * float(a.abs().max()))
    torch.testing.assert_close(ddp.coefficients, single.coefficients, rtol=1e-5, atol=1e-6)
    report = json.loads((tmp_path / "ddp" / "report.json").read_text())
    assert report["search"]["evaluations_per_rank"] == [3, 3]  # 6 candidates, each evaluated once
    assert json.loads((tmp_path / "single" / "report.json").read_text())["search"]["evaluations_per_rank"] == [6]


def test_train_ddp_two_processes_saves_loadable_checkpoint(tmp_path):
    run = tmp_path / "run"
    _run("train.py", [
        "fit", "--config", str(ROOT / "configs" / "train" / "reference_fmnist.yaml"),
        "--model.model_kwargs.embed_dim=32", "--model.model_kwargs.depth=2", "--model.model_kwargs.num_heads=4",
        f"--trainer.default_root_dir={run}", f"--trainer.logger.init_args.save_dir={run}", "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2", "--trainer.enable_progress_bar=false",
        "--data.init_args.batch_size=16", "--data.init_args.num_workers=0",
        "--trainer.strategy=ddp", "--trainer.devices=2",
    ], tmp_path)
    model, record = load_pruned(run / "model")
    assert record["heads"] == [4, 4]
    assert torch.isfinite(model(torch.zeros(1, 1, 28, 28))).all()
