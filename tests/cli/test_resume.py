"""A prune run killed mid-search resumes to exactly the uninterrupted result."""
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from snapvit_pl.elastic import ElasticScores
from snapvit_pl.lightning.resume import RESUME_FILE

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="apt-get install dataset-fashion-mnist"),
]


def _search_args(tiny_prune_args, tmp_path):
    args = [a for a in tiny_prune_args if not str(a).startswith(str(tmp_path))]
    args.remove("--out_dir")
    return args + ["--search.max_evaluations=40", "--search.popsize=4", "--search.num_images=400",
                   "--search.batch_size=200", "--evaluation.metrics=[]"]


def _start(run: Path, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "prune.py"), "--out_dir", str(run), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for_search_state(run: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        state_file = run / RESUME_FILE
        if state_file.exists():
            state = torch.load(state_file, weights_only=True)
            if any(isinstance(v, dict) and "xnes" in v for v in state.values()):
                return
        time.sleep(0.1)
    pytest.fail("the run ended before the search saved any state")


def test_kill_9_mid_search_then_resume_gives_the_uninterrupted_result(tiny_prune_args, tmp_path):
    args = _search_args(tiny_prune_args, tmp_path)
    reference = _start(tmp_path / "reference", args)
    killed = _start(tmp_path / "killed", args)
    _wait_for_search_state(tmp_path / "killed", killed)
    killed.kill()
    killed.wait()
    assert not (tmp_path / "killed" / "elastic_scores.safetensors").exists()
    resumed = subprocess.run([sys.executable, str(ROOT / "prune.py"), "--resume", str(tmp_path / "killed")],
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert reference.wait() == 0
    a = ElasticScores.load(tmp_path / "reference" / "elastic_scores.safetensors")
    b = ElasticScores.load(tmp_path / "killed" / "elastic_scores.safetensors")
    assert torch.equal(a.coefficients, b.coefficients)
    assert all(torch.equal(x, y) for x, y in zip(a.neuron_scores + a.head_scores, b.neuron_scores + b.head_scores))
    assert a.search["best_fitness"] == b.search["best_fitness"]


def test_sigterm_saves_and_explains_how_to_resume(tiny_prune_args, tmp_path):
    run = tmp_path / "run"
    process = _start(run, _search_args(tiny_prune_args, tmp_path))
    _wait_for_search_state(run, process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130
    assert f"continue with: python prune.py --resume {run}" in stderr
    assert not (run / "report.json").exists() and (run / RESUME_FILE).exists()
    again = subprocess.run([sys.executable, str(ROOT / "prune.py"), "--resume", str(run)], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (run / "report.json").exists()
    finished = subprocess.run([sys.executable, str(ROOT / "prune.py"), "--resume", str(run)], capture_output=True, text=True)
    assert finished.returncode == 2 and "already finished" in finished.stderr
