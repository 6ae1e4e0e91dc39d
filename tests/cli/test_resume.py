"""Interrupted prune runs (kill -9 or SIGTERM at any stage) resume to exactly the uninterrupted result."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from snapvit_pl.elastic import ElasticScores
from snapvit_pl.pipeline.resume import RESUME_FILE

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="apt-get install dataset-fashion-mnist"),
]

# Loaded by a run through PYTHONPATH: SIGKILL right after the first pruned model is saved (mid-export).
KILL_IN_EXPORT = '''
import os
if os.environ.get("SNAPVIT_TEST_KILL_IN_EXPORT"):
    import snapvit_pl.pipeline.extraction as extraction
    saved = extraction.save_pruned

    def save_then_die(*args, **kwargs):
        saved(*args, **kwargs)
        os.kill(os.getpid(), 9)

    extraction.save_pruned = save_then_die
'''


def _args(tiny_prune_args, tmp_path):
    args = [a for a in tiny_prune_args if not str(a).startswith(str(tmp_path))]
    args.remove("--out_dir")
    return args + ["--data.init_args.max_samples=160", "--search.max_evaluations=40", "--search.popsize=4",
                   "--search.num_images=400", "--search.batch_size=200", "--evaluation.metrics=[]"]


def _start(run: Path, args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "prune.py"), "--out_dir", str(run), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def _resume(run: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "prune.py"), "--resume", str(run), *extra],
                          capture_output=True, text=True, timeout=600)


def _wait_for(run: Path, process: subprocess.Popen, ready, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        state_file = run / RESUME_FILE
        if state_file.exists():
            try:
                state = torch.load(state_file, weights_only=True)
            except Exception:  # being replaced at this moment
                continue
            if ready(state):
                return
        time.sleep(0.05)
    pytest.fail("the run ended before the awaited point")


def _in_search(state) -> bool:
    """Saved in the middle of a generation (some of its candidates evaluated, not all)."""
    progress = state.get("search") or {}
    return bool(progress) and progress["pending"] is not None


def _assert_same_run(reference: Path, resumed: Path) -> dict:
    a = ElasticScores.load(reference / "elastic_scores.safetensors")
    b = ElasticScores.load(resumed / "elastic_scores.safetensors")
    assert torch.equal(a.coefficients, b.coefficients)
    assert all(torch.equal(x, y) for x, y in zip(a.neuron_scores + a.head_scores, b.neuron_scores + b.head_scores))
    assert a.search["best_fitness"] == b.search["best_fitness"] and a.splits == b.splits
    for model in (reference / "models").iterdir():
        x, y = load_file(model / "model.safetensors"), load_file(resumed / "models" / model.name / "model.safetensors")
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), model.name
    report = json.loads((resumed / "report.json").read_text())
    assert {"scoring_s", "search_s", "total_s"} <= set(report["timings"])
    assert sum(report["search"]["evaluations_per_rank"]) == report["search"]["evaluations"] == 40
    return report


def test_kill_9_mid_generation_then_resume_gives_the_uninterrupted_result(tiny_prune_args, tmp_path):
    args = _args(tiny_prune_args, tmp_path)
    reference = _start(tmp_path / "reference", args)
    killed = _start(tmp_path / "killed", args)
    _wait_for(tmp_path / "killed", killed, _in_search)  # some candidates of generation 1 evaluated
    killed.kill()
    killed.wait()
    assert not (tmp_path / "killed" / "elastic_scores.safetensors").exists()
    resumed = _resume(tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert reference.wait() == 0
    report = _assert_same_run(tmp_path / "reference", tmp_path / "killed")
    assert report["search"]["resumed_at"] % 4 != 0  # continued inside a generation, not from its start


def test_a_resume_that_would_change_the_result_is_refused(tiny_prune_args, tmp_path):
    args = _args(tiny_prune_args, tmp_path)
    run = tmp_path / "run"
    process = _start(run, args)
    _wait_for(run, process, _in_search)
    process.kill()
    process.wait()
    config = (run / "config.yaml").read_text()
    other = tmp_path / "other.safetensors"
    other.write_bytes((ROOT / "assets" / "reference_vit_fmnist" / "model.safetensors").read_bytes())
    refused = _resume(run, f"--model.checkpoint_path={other}")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode == 2 and len(errors) == 1 and "--model.checkpoint_path" in errors[0], refused.stderr
    assert "Traceback" not in refused.stderr and (run / "config.yaml").read_text() == config
    assert _resume(run, "--report.print_table=false").returncode == 0  # a documented safe override


def test_sigterm_during_importance_then_resume(tiny_prune_args, tmp_path):
    run = tmp_path / "run"
    process = _start(run, _args(tiny_prune_args, tmp_path) + ["--data.init_args.max_samples=480"])
    _wait_for(run, process, lambda state: state.get("local") is None)  # the start state: importance running
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-2000:]
    assert f"continue with: python prune.py --resume {run}" in stderr
    again = _resume(run)
    assert again.returncode == 0, again.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert report["timings"]["scoring_s"] > 0 and report["search"]["resumed_at"] is None
    finished = _resume(run)
    assert finished.returncode == 2 and "already finished" in finished.stderr


def test_a_crash_during_export_resumes_to_the_complete_run(tiny_prune_args, tmp_path):
    args = _args(tiny_prune_args, tmp_path)
    reference = _start(tmp_path / "reference", args)
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "sitecustomize.py").write_text(KILL_IN_EXPORT)
    env = {**os.environ, "SNAPVIT_TEST_KILL_IN_EXPORT": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "hooks"), os.environ.get("PYTHONPATH")]))}
    crashed = _start(tmp_path / "crashed", args, env=env)
    assert crashed.wait(timeout=600) == -signal.SIGKILL
    assert len(list((tmp_path / "crashed" / "models").iterdir())) == 1 and not (tmp_path / "crashed" / "report.json").exists()
    resumed = _resume(tmp_path / "crashed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert reference.wait() == 0
    report = _assert_same_run(tmp_path / "reference", tmp_path / "crashed")
    assert [p["label"] for p in report["pruned"]] == ["mlp0.35_head0.25", "flops0.6"]
