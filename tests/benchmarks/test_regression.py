"""The regression check: the project computes what the committed baseline records; when it does not, the failure
names the quoted results that rest on what changed and the command that measures them again."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import regression  # noqa: E402
from benchmarks.common import file_digest  # noqa: E402

needs_data = pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="dataset-fashion-mnist")


@pytest.mark.slow
@needs_data
def test_the_project_computes_what_the_baseline_records():
    """The fixed suite (every scorer family, both searches, every correction method, the split race, every budget
    kind) run now, against tests/benchmarks/regression_baseline.json. On a failure, read the message: it says what
    to measure again and how, or how to write the baseline when the change is meant."""
    message = regression.check(regression.suite(list(regression.SUITE)))
    assert message is None, message


def test_the_baseline_is_small_and_covers_the_suite():
    baseline = regression.load_baseline()
    assert baseline["suite"] == list(regression.SUITE) == list(baseline["numbers"])
    assert regression.BASELINE.stat().st_size < 200_000  # kilobytes: summaries, never raw scores
    assert all(len(v) < 8 for run in baseline["numbers"].values() for k, v in run.items() if k.startswith("scores."))
    assert "snapvit_pl/correction/sparsegpt.py" in baseline["files"] and not any(
        name.startswith("tests/") for name in baseline["files"])


def test_close_allows_float_noise_only():
    assert regression.close([1, 0.5, "x"], [1, 0.5 * (1 + 1e-6), "x"])
    assert not regression.close([1, 0.5], [2, 0.5])  # an integer (a count, a width) differs
    assert not regression.close(0.5, 0.51) and not regression.close([0.5], [0.5, 0.5])


def test_differences_name_the_variant_and_the_number():
    expected = {"default": {"dense.knn_top1": 0.8, "scores.heads.0": [1.0, 2.0]}, "gone": {}}
    actual = {"default": {"dense.knn_top1": 0.8, "scores.heads.0": [1.0, 2.5], "new": 1}}
    assert regression.differences(expected, actual) == [
        "default: new \"absent\" -> 1", "default: scores.heads.0 [1.0, 2.0] -> [1.0, 2.5]", "gone: not run"]
    assert regression.differences(expected, expected) == []


def test_the_files_that_rest_on_a_changed_module_are_the_quoted_accuracy_files_that_used_it():
    """Timing files never (they are dated snapshots), records of past decisions never (they are quoted with their
    commit), accuracy files whose runs used the changed file always."""
    from benchmarks.provenance import records, with_inputs

    compare = ROOT / "benchmarks" / "results" / "compare_methods.json"
    used = records(compare)[0]["files"]
    assert "snapvit_pl/correction/sparsegpt.py" in used
    resting = regression.resting_on(["snapvit_pl/correction/sparsegpt.py"])
    assert compare in resting
    names = {str(p.relative_to(ROOT)) for p in resting}
    assert "benchmarks/results/correction_cost.json" not in names and "benchmarks/results/throughput.json" not in names
    assert not any(name.startswith("benchmarks/results/research/") for name in names)
    unrecorded = [p for p in resting if any(r is None or r.get("files") is None
                                            for run in with_inputs([p]) for r in records(run))]
    assert regression.resting_on(["snapvit_pl/no_such_module.py"]) == unrecorded  # runs that did not record files


def test_a_failure_names_the_results_to_measure_again_and_the_command(tmp_path, monkeypatch):
    """What a deliberate change of the damping in the SparseGPT-style update makes the check say (without running the
    suite: the numbers of one variant moved, and the module is no longer what the baseline read)."""
    baseline = regression.load_baseline()
    moved = json.loads(json.dumps(baseline["numbers"]))
    weights = next(k for k in moved["magnitude_sparsegpt"] if k.endswith(".weights"))
    moved["magnitude_sparsegpt"][weights][0] += 1.0
    module = ROOT / "snapvit_pl" / "correction" / "sparsegpt.py"
    pretend = {**baseline, "files": {**baseline["files"], "snapvit_pl/correction/sparsegpt.py": "0" * 16}}
    assert file_digest(module) != "0" * 16
    message = regression.check(moved, pretend)
    assert f"magnitude_sparsegpt: {weights}" in message
    assert "files changed since the baseline: " in message and "snapvit_pl/correction/sparsegpt.py" in message
    assert "benchmarks/results/compare_methods.json" in message
    assert "python benchmarks/regression.py --update && python benchmarks/remeasure.py " in message
    assert regression.check(baseline["numbers"], pretend) is None  # the same numbers: a changed file is no failure


def test_the_baseline_id_changes_with_the_numbers_only(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"numbers": {"a": {"x": 1}}, "files": {"f": "1"}}))
    first = regression.baseline_id(path)
    path.write_text(json.dumps({"numbers": {"a": {"x": 1}}, "files": {"f": "2"}}))
    assert regression.baseline_id(path) == first
    path.write_text(json.dumps({"numbers": {"a": {"x": 2}}, "files": {"f": "2"}}))
    assert regression.baseline_id(path) != first and regression.baseline_id(tmp_path / "none.json") is None


def test_remeasure_runs_each_command_once_merges_after_their_inputs(tmp_path, capsys, monkeypatch):
    from benchmarks import provenance, remeasure

    def results(name: str, command: str) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps({"provenance": {"commit": "0" * 40, "command": command, "recorded": "run"}}))
        return path

    a = results("a.json", "python benchmarks/a.py --x 1")
    c = results("a_more.json", "python benchmarks/a.py --x 1")
    run = results("run.json", "python benchmarks/m.py --seeds 0")
    merged = results("m.json", f"python benchmarks/m.py --merge {run.name}")
    monkeypatch.setattr(remeasure, "ROOT", tmp_path)
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    assert remeasure.with_inputs([merged, a]) == [run, merged, a]
    assert provenance.commands_for([a, c, merged, a]) == [("python benchmarks/a.py --x 1", [a, c]),
                                                          (f"python benchmarks/m.py --merge {run.name}", [merged])]
    ran = []
    monkeypatch.setattr(remeasure, "run", lambda command: ran.append(command) or 0)
    monkeypatch.setattr(remeasure, "write_stamps", lambda: [])
    assert remeasure.main([str(merged), str(a)]) == 0
    assert ran == ["python benchmarks/m.py --seeds 0", f"python benchmarks/m.py --merge {run.name}",
                   "python benchmarks/a.py --x 1"]
    ran.clear()
    assert remeasure.main(["--dry-run", str(a)]) == 0 and ran == []
    assert remeasure.main(["no/such.json"]) == 2
    assert capsys.readouterr().err.startswith("error: no such results file: no/such.json")


def test_every_quoted_timing_has_a_command_to_measure_it_again():
    from benchmarks.provenance import commands_for, kinds_of
    from benchmarks.remeasure import quoted_timings

    timings = quoted_timings()
    assert timings and all("timing" in kinds_of(p) for p in timings)
    assert all(not command.endswith("(its arguments were not recorded)") for command, _ in commands_for(timings))
