"""Issue 53: a run folder is one run's at a time whatever the timing, and ``--overwrite true`` replaces what the
earlier run wrote and nothing of the user's."""
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from run_helpers import TINY_RUN, env
from snapvit_pl.cli import prune_main
from snapvit_pl.data import find_fashion_mnist

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(find_fashion_mnist(None) is None, reason="dataset-fashion-mnist")


def test_overwrite_removes_the_earlier_runs_files_and_keeps_the_users(tiny_prune_args, tmp_path):
    run = tmp_path / "run"
    common = [a for a in tiny_prune_args if not a.startswith("--export.budgets")] + ["--evaluation.metrics=[]"]
    assert prune_main([*common, "--export.budgets=[{sparsity: 0.3}, {flops: 0.6}]"]) == 0
    mine = {run / "models" / "README.md": "my notes on the models", run / "plots" / "my_figure.txt": "mine",
            run / "notes.txt": "mine too", run / "tensorboard" / "my_log.txt": "and this"}
    for path, text in mine.items():
        path.write_text(text)
    before = sorted(p.name for p in (run / "plots").glob("*.png"))
    assert before and (run / "models" / "flops0.6").is_dir()
    assert prune_main([*common, "--export.budgets=[{sparsity: 0.5}]", "--overwrite=true"]) == 0
    assert all(path.read_text() == text for path, text in mine.items())  # every file of the user's stays
    assert sorted(p.name for p in (run / "models").iterdir()) == ["README.md", "sparsity0.5"]  # the earlier models go
    assert [e["label"] for e in json.loads((run / "report.json").read_text())["pruned"]] == ["sparsity0.5"]
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 1


ARGS = [*TINY_RUN, "--evaluation.metrics=[]", "--report.print_table=false", "--progress=off"]


@pytest.mark.slow
def test_two_runs_started_together_on_one_new_folder_one_runs_the_other_is_refused_in_one_line(tmp_path):
    """prune.py takes its folder through the library's run-folder policy: the race itself is repeated where that
    policy is tested (tests/run/test_folder.py); here, once, what the command line prints for the loser."""
    run = tmp_path / "run"
    results: list = [None, None]
    start = threading.Barrier(2)

    def launch(i: int) -> None:
        start.wait()  # both processes start in the same instant
        results[i] = subprocess.run([sys.executable, str(ROOT / "prune.py"), *ARGS, "--out_dir", str(run)],
                                    capture_output=True, text=True, timeout=600, env=env())

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.returncode for r in results)
    assert codes == [0, 2], [r.stderr[-2000:] for r in results]
    refused = next(r for r in results if r.returncode == 2)
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in refused.stderr, lines
    assert "in use by another run" in lines[0] or "already holds results" in lines[0], lines[0]
    report = json.loads((run / "report.json").read_text())  # the first run, whole
    assert [e["label"] for e in report["pruned"]] == ["sparsity0.3"] and (run / "models" / "sparsity0.3").is_dir()
    assert not (run / ".lock").exists()
