"""Interrupted prune runs (SIGKILL or SIGTERM, in the importance pass, in the middle of a search generation, in the
export) resume to exactly the uninterrupted result: the scores file and every model byte for byte. While a run
holds its directory, a second run or a resume into it is refused; a killed run's lock does not block its resume. A
resume with a setting that would change the result is refused, one with a documented safe override is not. A resume
on other images than the interrupted run read is refused; one after changes to files it does not read is not."""
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from images import gray_image_folder
from run_helpers import digests as _digests, env as _env, in_search as _in_search, wait_for as _wait_for
from snapvit_pl.run.names import RESUME_FILE

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="apt-get install dataset-fashion-mnist"),
]
EVALUATIONS, POPSIZE = 24, 4
ARGS = [  # a tiny random-weight model; a search long enough to be caught in the middle of a generation
    "--model.checkpoint_path=null", "--model.model_kwargs.embed_dim=32", "--model.model_kwargs.depth=2",
    "--model.model_kwargs.num_heads=4", "--data.init_args.max_samples=160", "--data.init_args.batch_size=16",
    "--data.init_args.n_local_views=2", f"--search.max_evaluations={EVALUATIONS}", f"--search.popsize={POPSIZE}",
    "--search.num_images=256", "--search.batch_size=256", "--search.pca_components=8",
    "--export.budgets=[{mlp_ratio: 0.35, head_ratio: 0.25}, {flops: 0.6}]", "--export.split_grid=0.25",
    "--export.split_candidates=3",
    "--evaluation.metrics=[]", "--report.print_table=false", "--progress=off", "--trainer.logger=true",
]

# Loaded by a run through PYTHONPATH: the signal SNAPVIT_TEST_KILL_IN_EXPORT names, right after the first pruned
# model is saved (mid-export).
KILL_IN_EXPORT = '''
import os
if os.environ.get("SNAPVIT_TEST_KILL_IN_EXPORT"):
    import snapvit_pl.pipeline.extraction as extraction
    saved = extraction.save_pruned

    def save_then_die(*args, **kwargs):
        saved(*args, **kwargs)
        os.kill(os.getpid(), int(os.environ["SNAPVIT_TEST_KILL_IN_EXPORT"]))

    extraction.save_pruned = save_then_die
'''

# Loaded by a run through PYTHONPATH: after SNAPVIT_TEST_SIGTERM_AFTER_BATCHES importance batches, rank 0 sends
# SIGTERM to the run's whole process group (every rank), as a scheduler's stop or Ctrl+C in a terminal does.
SIGTERM_IN_IMPORTANCE = '''
import os
if os.environ.get("SNAPVIT_TEST_SIGTERM_AFTER_BATCHES"):
    import signal
    from snapvit_pl.pipeline.driver import Pipeline
    step, after = Pipeline.importance_step, int(os.environ["SNAPVIT_TEST_SIGTERM_AFTER_BATCHES"])

    def step_then_stop(self, batch):
        result = step(self, batch)
        self.test_batches = getattr(self, "test_batches", 0) + 1
        if self.test_batches == after and os.environ.get("LOCAL_RANK", "0") == "0":
            os.killpg(os.getpgrp(), signal.SIGTERM)
        return result

    Pipeline.importance_step = step_then_stop
'''


def _start(run: Path, *extra: str, env: dict | None = None, own_group: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "prune.py"), "--out_dir", str(run), *ARGS, *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env or _env(),
                            start_new_session=own_group)


def _hooked(tmp_path: Path, source: str, **variables: str) -> dict:
    """The environment of a run that loads ``source`` at start-up (a sitecustomize module on its PYTHONPATH)."""
    (tmp_path / "hooks").mkdir(exist_ok=True)
    (tmp_path / "hooks" / "sitecustomize.py").write_text(source)
    return _env(**variables,
                PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path / "hooks"), os.environ.get("PYTHONPATH")])))


def _prune(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "prune.py"), *args], capture_output=True, text=True, timeout=600,
                          env=_env())


def _stop(process: subprocess.Popen, signum: int) -> None:
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == (-signal.SIGKILL if signum == signal.SIGKILL else 130), stderr[-2000:]


def _one_error(result: subprocess.CompletedProcess, message: str) -> None:
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run."""
    run = tmp_path_factory.mktemp("reference") / "run"
    process = _start(run)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    return run


def _assert_same_run(reference: Path, resumed: Path) -> dict:
    assert _digests(resumed) == _digests(reference)
    report = json.loads((resumed / "report.json").read_text())
    assert {"scoring_s", "search_s", "total_s"} <= set(report["timings"])
    assert sum(report["search"]["evaluations_per_rank"]) == report["search"]["evaluations"] == EVALUATIONS
    return report


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "SIGTERM"])
def test_stopped_in_the_middle_of_a_generation(reference, tmp_path, signum):
    run = tmp_path / "run"
    process = _start(run)
    _wait_for(run, process, _in_search)  # some candidates of a generation evaluated
    if signum == signal.SIGKILL:  # while it runs (here paused), its directory is its own
        process.send_signal(signal.SIGSTOP)
        _one_error(_prune("--out_dir", str(run), *ARGS, "--overwrite", "true"), f"{run} is in use by another run")
        _one_error(_prune("--resume", str(run)), f"{run} is in use by another run")
    _stop(process, signum)
    assert not (run / "elastic_scores.safetensors").exists()
    safe = []
    if signum == signal.SIGKILL:  # a resume that would change the result is refused; a documented safe override is not
        config = (run / "config.yaml").read_text()
        other = tmp_path / "other.safetensors"
        other.write_bytes((ROOT / "assets" / "reference_vit_fmnist" / "model.safetensors").read_bytes())
        _one_error(_prune("--resume", str(run), f"--model.checkpoint_path={other}"), "--model.checkpoint_path")
        assert (run / "config.yaml").read_text() == config
        safe = ["--report.print_table=true"]  # (the run had false: a table on stdout, the same files)
    resumed = _prune("--resume", str(run), *safe)  # a killed run left no lock behind
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    report = _assert_same_run(reference, run)
    assert report["search"]["resumed_at"] % POPSIZE != 0  # continued inside a generation, not from its start
    assert not (run / ".lock").exists()


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "SIGTERM"])
def test_stopped_during_the_export(reference, tmp_path, signum):
    run = tmp_path / "run"
    process = _start(run, env=_hooked(tmp_path, KILL_IN_EXPORT, SNAPVIT_TEST_KILL_IN_EXPORT=str(int(signum))))
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == (-signal.SIGKILL if signum == signal.SIGKILL else 130), stderr[-2000:]
    assert len(list((run / "models").iterdir())) == 1 and not (run / "report.json").exists()
    resumed = _prune("--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    report = _assert_same_run(reference, run)
    assert [p["label"] for p in report["pruned"]] == ["mlp0.35_head0.25", "flops0.6"]


@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_during_importance_then_resume(reference, tmp_path, processes):
    """SIGTERM after two importance batches (of 10 on one process, of 5 per rank on two): a clean stop, exit 130;
    the resume (on as many processes, from the run's own config.yaml) scores again and writes the files of the
    uninterrupted one-process run, the scores byte for byte."""
    run = tmp_path / "run"
    devices = [f"--trainer.devices={processes}", "--trainer.accelerator=cpu"] if processes > 1 else []
    process = _start(run, *devices, env=_hooked(tmp_path, SIGTERM_IN_IMPORTANCE, SNAPVIT_TEST_SIGTERM_AFTER_BATCHES="2"),
                     own_group=True)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 130, stderr[-2000:]
    assert f"continue with: python prune.py --resume {run}" in stderr
    assert torch.load(run / RESUME_FILE, weights_only=True)["local"] is None  # stopped inside the importance pass
    assert not (run / ".lock").exists() and not (run / "elastic_scores.safetensors").exists()
    again = _prune("--resume", str(run))
    assert again.returncode == 0, again.stderr[-3000:]
    report = _assert_same_run(reference, run)
    assert report["timings"]["scoring_s"] > 0 and report["search"]["resumed_at"] is None
    assert len(report["search"]["evaluations_per_rank"]) == processes
    _one_error(_prune("--resume", str(run)), "already finished")


#: A folder data set in place of Fashion-MNIST: 48 training images, of which the pruning pass and the search read 32.
FOLDER_ARGS = [a for a in ARGS if not a.startswith(("--data.init_args.max_samples", "--search.num_images",
                                                     "--search.batch_size"))] + [
    "--data.init_args.source=folder", "--data.init_args.max_samples=32", "--search.num_images=32",
    "--search.batch_size=32"]


def _files(run: Path) -> dict[str, str]:
    """sha256 of every file of a run directory (its lock aside: a resume takes and releases it)."""
    return {str(f.relative_to(run)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(run.rglob("*")) if f.is_file() and f.name != ".lock"}


def test_a_resume_on_other_images_is_refused_and_one_after_unrelated_changes_is_not(tmp_path):
    data = gray_image_folder(tmp_path / "data")
    args = [*FOLDER_ARGS, f"--data.init_args.root={data}"]
    reference = tmp_path / "reference"
    done = _prune("--out_dir", str(reference), *args)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    process = subprocess.Popen([sys.executable, str(ROOT / "prune.py"), "--out_dir", str(run), *args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    _wait_for(run, process, lambda state: state.get("search") is not None)  # scores kept, the search under way
    process.kill()
    process.communicate(timeout=300)
    images = {path: path.read_bytes() for path in sorted((data / "train").rglob("*.png"))}
    noise = np.random.default_rng(1)
    for path in images:  # every image replaced with noise
        Image.fromarray(noise.integers(0, 255, (28, 28), dtype=np.uint8)).save(path)
    before = _files(run)
    _one_error(_prune("--resume", str(run)), "--resume: the pruning images changed since the run was interrupted "
                                              "(32 of 32 files differ, e.g. ")
    assert _files(run) == before  # nothing written
    for path, content in images.items():  # restored (new modification times, the same bytes)
        path.write_bytes(content)
    (data / "train" / "c0" / "notes.txt").write_text("not an image")  # files the run does not read
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(data / "val" / "c0" / "new.png")
    (data / "test").mkdir()
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(data / "test" / "0.png")
    resumed = _prune("--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _digests(run) == _digests(reference)


# Loaded by a run through PYTHONPATH: SIGINT to the run half a second into the first block's reconstruction steps.
SIGINT_IN_RECONSTRUCTION = '''
import os, signal, threading
import snapvit_pl.correction.dense_fit as dense_fit
run = dense_fit.Reconstruction.run

def run_then_interrupt(self, *args, **kwargs):
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    return run(self, *args, **kwargs)

dense_fit.Reconstruction.run = run_then_interrupt
'''


def test_ctrl_c_in_the_reconstruction_steps_stops_the_run_there(tmp_path):
    """Issue 77: an interrupt during the correction's reconstruction waited for the block's steps to end. Asked for
    ten million steps per block (hours of work), the run stops at the SIGINT and says how to continue."""
    run = tmp_path / "run"
    process = _start(run, "--correction.enabled=true", "--correction.reconstruct_steps=10000000",
                     "--correction.reconstruct_patience=null",
                     "--search.max_evaluations=0", "--export.budgets=[{flops: 0.6}]",
                     env=_hooked(tmp_path, SIGINT_IN_RECONSTRUCTION))
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr[-2000:]
    assert f"interrupted: progress is saved in {run}; continue with:" in stderr and "Traceback" not in stderr
