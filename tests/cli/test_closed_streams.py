"""Issue 54: every command started with its standard output or its standard error closed (``>&-``, ``2>&-``, as
some schedulers and daemons start commands) ends as a normal run does: the same exit status, the same files; and a
Trainer option a pruning run refuses is refused once, before any process starts."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from run_helpers import TINY_RUN, digests, env
from snapvit_pl.data import find_fashion_mnist

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(find_fashion_mnist(None) is None, reason="dataset-fashion-mnist")]

TINY_PRUNE = [*TINY_RUN, "--evaluation.metrics=[knn]", "--evaluation.train_samples=60",
              "--evaluation.val_samples=30", "--evaluation.knn_k=5"]
TINY_TRAIN = ["--model.model_kwargs.embed_dim=32", "--model.model_kwargs.depth=2", "--model.model_kwargs.num_heads=4",
              "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
              "--data.init_args.batch_size=16", "--data.init_args.num_workers=0"]


def commands(base: Path, out: Path) -> dict[str, list[str]]:
    """Each command's arguments, writing under ``out``; ``base``: a finished prune run to read from."""
    model = base / "models" / "sparsity0.3"
    return {
        "prune": ["prune", *TINY_PRUNE, "--out_dir", str(out / "run")],
        "extract": ["extract", "--scores", str(base / "elastic_scores.safetensors"), "--out_dir", str(out / "cut"),
                    "--export.budgets=[{flops: 0.6}]"],
        "evaluate": ["evaluate", "--checkpoint", str(model), "--evaluation.metrics=[knn]",
                     "--evaluation.train_samples=60", "--evaluation.val_samples=30", "--evaluation.knn_k=5",
                     "--out", str(out / "metrics.json")],
        "train": ["train", "fit", "--config", str(ROOT / "configs" / "train" / "reference_fmnist.yaml"), *TINY_TRAIN,
                  f"--trainer.default_root_dir={out / 'train'}", f"--trainer.logger.init_args.save_dir={out / 'train'}"],
        "deploy": ["deploy", "--checkpoint", str(model), "--out", str(out / "model.onnx")],
        "hub": ["hub", "card", "--checkpoint", str(model), "--repo", "org/tiny-pruned"],
    }


#: A child that runs every command in turn (one interpreter start for all of them) and writes their exit statuses.
CHILD = """
import json, sys
from snapvit_pl.cli import main
statuses = {name: main(args) for name, args in json.loads(sys.argv[2]).items()}
with open(sys.argv[1], "w") as report:
    json.dump(statuses, report)
"""


def run_all(out: Path, base: Path, closed: str = "") -> dict[str, int]:
    """Every command's exit status, run in a child whose ``closed`` stream (``stdout``, ``stderr``) is closed before
    the interpreter starts (the shell's ``>&-``, ``2>&-``: Python then sets ``sys.stdout`` to None)."""
    fd = {"stdout": 1, "stderr": 2}.get(closed)
    report = out / "statuses.json"
    done = subprocess.run([sys.executable, "-c", CHILD, str(report), json.dumps(commands(base, out))], env=env(),
                          cwd=ROOT, timeout=600, stdout=None if fd == 1 else subprocess.PIPE,
                          stderr=None if fd == 2 else subprocess.PIPE, text=True,
                          preexec_fn=None if fd is None else (lambda: os.close(fd)))
    assert done.returncode == 0, (closed, (done.stderr or "")[-2000:])
    statuses = json.loads(report.read_text())
    report.unlink()
    return statuses


def written(folder: Path) -> list[str]:
    """The files a command wrote (names, relative), the event files' host- and time-stamped names aside."""
    return sorted(str(p.relative_to(folder)) if "tfevents" not in p.name else str(p.parent.relative_to(folder))
                  for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def normal(tmp_path_factory):
    """Every command run once with both streams open: the exit statuses (all 0) and the folder of their files."""
    out = tmp_path_factory.mktemp("normal")
    statuses = run_all(out, out / "run")
    assert set(statuses.values()) == {0}, statuses
    return out, statuses


@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_every_command_with_a_closed_stream_ends_as_a_normal_run(normal, closed, tmp_path):
    reference, statuses = normal
    assert run_all(tmp_path, reference / "run", closed) == statuses
    assert written(tmp_path) == written(reference)
    assert digests(tmp_path / "run") == digests(reference / "run")  # the same seeds: the same scores and models


def test_a_refused_trainer_option_on_two_devices_is_one_error_line_and_starts_no_process(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "prune.py"), *TINY_PRUNE, "--out_dir", str(tmp_path / "run"),
                           "--trainer.devices=2", "--trainer.precision=bf16-mixed"],
                          env=env(), cwd=tmp_path, timeout=300, capture_output=True, text=True)
    assert done.returncode == 2
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: Trainer(precision='bf16-mixed')"), lines
    assert not (tmp_path / "run").exists()  # refused before the run folder or any process
