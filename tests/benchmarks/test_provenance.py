"""Every results file says what made it (commit, settings digest, command), and the ones older than the code they
measure are listed (a failure for a file a document quotes, unless it is a record of a past decision quoted with its
commit)."""
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402
from benchmarks.provenance import (  # noqa: E402
    LINE, dated_where_quoted, documents, quoted_files, records, results_files, status,
)


def test_every_results_file_records_commit_settings_and_command():
    files = results_files()
    assert len(files) > 30
    for path in files:
        for record in records(path):
            assert record is not None, f"{path.relative_to(ROOT)} records no provenance"
            assert re.fullmatch(r"[0-9a-f]{12,40}", record["commit"]), path
            assert record["command"].startswith(("python ", "OMP_NUM_THREADS")), path
            assert record["recorded"] in ("run", "git"), path
            assert record["recorded"] == "git" or re.fullmatch(r"[0-9a-f]{16}", record["config_digest"]), path


def test_the_results_files_older_than_their_code_are_listed(capsys):
    """A report in the test output (``-s`` or ``-rA`` shows it); a failure for every quoted file older than its code,
    whether its run recorded the files it used or git says when it was written, except a record of a past decision
    (``research/``) the documents quote as what it is: its commit named where they quote it."""
    quoted = quoted_files()
    stale, failures = [], []
    for path in results_files():
        s = status(path)
        if s.stale:
            changed = s.changed_in if "/" in s.changed_in else f"commit {s.changed_in[:12]}"  # a file, or a commit
            stale.append(f"{path.relative_to(ROOT)} (recorded {s.commit[:12]} [{s.recorded}], changed: {changed}"
                         f"{', quoted' if path in quoted else ''})")
            if path in quoted and not dated_where_quoted(path, s.commit, documents()):
                failures.append(str(path.relative_to(ROOT)))
    with capsys.disabled():
        print(f"\n{len(stale)} results files are older than the code they measure:\n  " + "\n  ".join(stale))
    assert not failures, f"quoted results older than their code, run their scripts again: {failures}"


def test_write_results_records_the_run(tmp_path, monkeypatch):
    """The JSON and the Markdown of one run carry the same provenance: the checkout's commit, the digest of the
    settings the command parsed (other settings, another digest) and the command line."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0")
    args = common.parse_args(parser, ["--seeds", "0,1,2"])
    common.write_results(tmp_path / "r", {"accuracy": 0.123456789}, lambda r: f"# acc {r['accuracy']}\n", args)
    report = json.loads((tmp_path / "r.json").read_text())
    record = report["provenance"]
    assert report["accuracy"] == 0.1235  # rounded, as before
    assert record["command"] == "python tests/benchmarks/test_provenance.py --seeds 0,1,2"
    assert record["commit"] == common._git("rev-parse", "HEAD") and record["recorded"] == "run"
    assert record["config_digest"] == common.config_digest({"seeds": "0,1,2"})
    assert record["config_digest"] != common.config_digest({"seeds": "0"})
    assert "benchmarks/common.py" in record["files"] and "snapvit_pl/io.py" in record["files"]
    markdown = (tmp_path / "r.md").read_text()
    assert markdown.startswith("# acc 0.1235\n")
    line = markdown.rstrip("\n").splitlines()[-1]
    assert LINE.match(line) and record["config_digest"] in line and record["commit"][:12] in line
    assert records(tmp_path / "r.md")[0]["config_digest"] == records(tmp_path / "r.json")[0]["config_digest"]


@pytest.mark.parametrize("text", ["no provenance line\n", "_Provenance: `python x.py` at commit zz (x); config digest 1._\n"])
def test_a_markdown_file_without_a_valid_provenance_line_has_none(text, tmp_path):
    (tmp_path / "x.md").write_text(text)
    assert records(tmp_path / "x.md") == [None]


def test_a_training_log_is_a_results_file_not_measured_code():
    """A development model's training_log.md sits among the measured code (assets/) but is a results file: writing
    it again does not make the other results files older than their code."""
    from benchmarks.provenance import last_change

    assert last_change(["assets/ssl_clutter_vit/training_log.md"]) is None
    assert last_change(["assets/ssl_clutter_vit/model.safetensors"]) is not None


def test_a_training_log_is_out_of_date_when_its_model_is_not_when_the_code_changes():
    """A development model's training log records how the model beside it was trained: it is compared with the
    model's weights (and its own script), not with the package's code, which later changes do not make untrue."""
    from benchmarks.provenance import measured_by

    log = ROOT / "assets" / "ssl_clutter_vit" / "training_log.md"
    assert measured_by(log, "benchmarks/training_log.py") == ["benchmarks/training_log.py",
                                                              "assets/ssl_clutter_vit/model.safetensors"]
    assert "snapvit_pl" in measured_by(ROOT / "benchmarks" / "results" / "gn_cost.json", "benchmarks/gn_cost.py")


def test_a_run_records_the_project_files_it_used_and_only_those():
    """Issue 51: the modules a run imported from the checkout, the development models it named and the configs it
    opened, each with the digest of its content; a module it did not import is not among them."""
    import subprocess

    script = ("import json, sys; sys.path.insert(0, '.'); from benchmarks.common import model_overrides, used_files; "
              "model_overrides('clutter'); open('configs/prune/quick.yaml').read(); print(json.dumps(used_files()))")
    files = json.loads(subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                                      check=True).stdout)
    assert {"benchmarks/common.py", "snapvit_pl/correction/dense_fit.py", "configs/prune/quick.yaml",
            "assets/clutter_vit_fmnist/model.safetensors"} <= set(files)
    assert "snapvit_pl/deploy/onnx.py" not in files and not any(name.startswith("tests/") for name in files)
    assert files["benchmarks/common.py"] == common.file_digest(ROOT / "benchmarks" / "common.py")
    everything = common.used_files(subprocesses=True)  # a run that starts the project in other processes
    assert "snapvit_pl/deploy/onnx.py" in everything and "configs/prune/demo.yaml" in everything


def test_a_file_is_stale_when_a_file_its_run_used_changed_and_not_when_another_did(tmp_path):
    from benchmarks.provenance import changed_files

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "used.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "other.py").write_text("y = 1\n")
    record = {"commit": "0" * 40, "files": {"pkg/used.py": common.file_digest(tmp_path / "pkg" / "used.py")}}
    assert changed_files([record], tmp_path) == []
    (tmp_path / "pkg" / "other.py").write_text("y = 2\n")  # a module the run did not import
    assert changed_files([record], tmp_path) == []
    (tmp_path / "pkg" / "used.py").write_text("x = 2\n")
    assert changed_files([record], tmp_path) == ["pkg/used.py"]
    (tmp_path / "pkg" / "used.py").unlink()
    assert changed_files([record], tmp_path) == ["pkg/used.py"]
    assert changed_files([{"commit": "0" * 40}], tmp_path) is None  # recorded before: judged by the commits
    (tmp_path / "pkg" / "used.py").write_text("x = 1\n")
    assert changed_files([{**record, "files": {"pkg/used.py": common.EDITED_DURING_RUN}}], tmp_path) == ["pkg/used.py"]


def test_a_file_edited_while_the_run_went_on_is_recorded_as_such(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "STARTED", 0.0)  # every file was edited after this "start"
    assert set(common.used_files().values()) == {common.EDITED_DURING_RUN}


def test_a_markdown_only_results_file_keeps_its_used_files_in_a_comment(tmp_path):
    common.write_markdown(tmp_path / "r.md", "# table\n", {"seeds": "0"})
    text = (tmp_path / "r.md").read_text()
    assert text.startswith("# table\n") and "<!-- files: " in text
    record = records(tmp_path / "r.md")[0]
    assert "benchmarks/common.py" in record["files"] and record["recorded"] == "run"


def test_a_markdown_file_written_with_its_json_is_judged_by_the_files_that_run_used(tmp_path):
    """Issue 51: a results Markdown file whose JSON sibling one run wrote with it is judged by the files the JSON
    records (it was judged by the commits: any later change to any measured code staled it); another run's JSON
    beside it lends it nothing."""
    common.write_results(tmp_path / "r", {"x": 1}, "# table\n", {"seeds": "0"})
    md, js = records(tmp_path / "r.md")[0], records(tmp_path / "r.json")[0]
    assert md["files"] == js["files"] and "benchmarks/common.py" in md["files"]
    report = json.loads((tmp_path / "r.json").read_text())
    report["provenance"]["command"] += " --other"
    (tmp_path / "r.json").write_text(json.dumps(report))
    assert "files" not in records(tmp_path / "r.md")[0]


def test_a_shallow_clone_is_an_error_of_the_check_not_a_pass(monkeypatch):
    import benchmarks.provenance as provenance

    monkeypatch.setattr(provenance, "_git", lambda *args: "true" if args[0] == "rev-parse" else None)
    with pytest.raises(RuntimeError, match="shallow"):
        provenance.check_history()


def test_a_record_of_a_past_decision_may_age_only_quoted_with_its_commit(tmp_path, monkeypatch):
    """Issue 51: ``research/`` files record decisions; once older than the code they may still be quoted, as what they
    are: each section of a document naming the file names the commit it measured."""
    from benchmarks import provenance

    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    record = tmp_path / "benchmarks" / "results" / "research" / "old.md"
    other = tmp_path / "benchmarks" / "results" / "old.md"
    commit = "0123456789abcdef0123"
    doc = tmp_path / "doc.md"
    doc.write_text("# A\n\nThe decision (`research/old.md`, measured at commit 0123456789ab).\n\n# B\n\nelse\n")
    assert dated_where_quoted(record, commit, [doc])
    assert not dated_where_quoted(other, commit, [doc])  # only records of decisions may age
    doc.write_text("# A\n\nThe decision (`research/old.md`, measured at commit 0123456789ab).\n\n# B\n\n"
                   "Quoted again without its commit: `research/old.md`.\n")
    assert not dated_where_quoted(record, commit, [doc])
    assert not dated_where_quoted(record, commit, [tmp_path / "doc.md"][:0])  # quoted nowhere: nothing to date
    # a claim's source is the record's JSON, the prose names its Markdown twin (one run wrote both): dated there
    doc.write_text("# A\n\nThe decision ([old.md](results/research/old.md), commit 0123456789ab).\n")
    assert dated_where_quoted(record.with_suffix(".json"), commit, [doc])
    assert not dated_where_quoted(record.with_name("old_other.json"), commit, [doc])
    doc.write_text("# A\n\nThe decision ([old.md](results/research/old.md)).\n")
    assert not dated_where_quoted(record.with_suffix(".json"), commit, [doc])


def test_the_commands_to_measure_again_are_each_run_once_with_the_files_they_write(tmp_path, capsys, monkeypatch):
    from benchmarks import provenance

    def results(name: str, command: str) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps({"provenance": {"commit": "0" * 40, "command": command, "recorded": "run"}}))
        return path

    a, b, c = results("a.json", "python benchmarks/a.py --x 1"), results("b.json", "python benchmarks/b.py"), \
        results("a_more.json", "python benchmarks/a.py --x 1")
    assert provenance.commands_for([a, b, c, a]) == [("python benchmarks/a.py --x 1", [a, c]),
                                                      ("python benchmarks/b.py", [b])]
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    monkeypatch.setattr(provenance, "to_measure_again", lambda: [b, a])
    assert provenance.main(["--commands"]) == 0
    # the script's own comments aside (its header), each command under the comment naming the files it serves
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if line.startswith("# for ") or not line.startswith("#")]
    assert lines == ["# for b.json", "python benchmarks/b.py", "# for a.json", "python benchmarks/a.py --x 1"]


def test_behaviour_records_vouch_for_a_behaviour_file_whose_code_changed_without_changing_what_it_computes(tmp_path):
    """Issue 51: a pure speed-up kept files that measure behaviour only. A record made with the files the run used and
    one made with today's, with the same numbers, vouch for it; other numbers, a changed file the records did not
    use, or no record made with today's files do not."""
    from benchmarks.provenance import vouched_by

    module, script = tmp_path / "snapvit_pl" / "fast.py", tmp_path / "benchmarks" / "accuracy.py"
    module.parent.mkdir()
    script.parent.mkdir()
    module.write_text("def f(): return 1\n")
    script.write_text("print(1)\n")
    before = {"snapvit_pl/fast.py": common.file_digest(module), "benchmarks/accuracy.py": common.file_digest(script)}
    module.write_text("def f():\n    return 1  # now faster\n")
    after = {"snapvit_pl/fast.py": common.file_digest(module)}

    def record(files, value, suite=("default",)):
        return {"suite": list(suite), "numbers": {"default": {"knn": value, "order": [3, 1, 2]}},
                "provenance": {"files": dict(files)}}

    run = before  # the results file's run used the module and its script
    then = record({"snapvit_pl/fast.py": before["snapvit_pl/fast.py"]}, 0.81234567)
    same = record(after, 0.81234568)  # float noise
    other = record(after, 0.8)
    changed = ["snapvit_pl/fast.py"]
    assert vouched_by(run, changed, tmp_path, {"then.json": then, "now.json": same}) == "then.json = now.json"
    assert vouched_by(run, changed, tmp_path, {"then.json": then, "now.json": other}) is None
    assert vouched_by(run, changed, tmp_path, {"then.json": then}) is None  # nothing made with today's files
    assert vouched_by(run, changed, tmp_path, {"now.json": same}) is None  # nothing made with the run's files
    assert vouched_by(run, [*changed, "benchmarks/accuracy.py"], tmp_path, {"then.json": then, "now.json": same}) is None
    assert vouched_by(run, changed, tmp_path, {"then.json": then, "now.json": record(after, 0.81234568, ("x",))}) is None


def test_a_file_whose_runs_race_no_grid_point_stays_vouched_when_only_the_grid_races_changed(tmp_path):
    """Issue 55: the grid's races (splits recorded for later budgets, no model made from them) may change without
    touching what a run that races no grid point computes; an asked budget's split, a model or a score may not."""
    from benchmarks.behaviour import grid_entries, without_grid
    from benchmarks.provenance import vouched_by

    module = tmp_path / "snapvit_pl" / "race.py"
    module.parent.mkdir()
    module.write_text("z = 3\n")
    before = {"snapvit_pl/race.py": common.file_digest(module)}
    module.write_text("z = 3  # a zone for the grid\n")
    after = {"snapvit_pl/race.py": common.file_digest(module)}

    def record(files, asked=0.1, grid=0.2, knn=0.8):
        run = {"sparsity0.3.params": 100, "sparsity0.3.knn_top1": knn, "split.sparsity0.3": [asked, 0.01, 0.02],
               "split.params0.75": [grid, 0.001, 0.002]}
        return {"suite": ["default"], "numbers": {"default": run}, "provenance": {"files": dict(files)}}

    then = record(before)
    assert grid_entries(then["numbers"]["default"]) == {"split.params0.75"}
    assert without_grid(then["numbers"])["default"].keys() == {"sparsity0.3.params", "sparsity0.3.knn_top1",
                                                               "split.sparsity0.3"}
    changed = ["snapvit_pl/race.py"]
    grid_only = {"then.json": then, "now.json": record(after, grid=0.3)}
    assert vouched_by(before, changed, tmp_path, grid_only, grid=False) == "then.json = now.json without the grid's races"
    assert vouched_by(before, changed, tmp_path, grid_only) is None  # a file whose runs race the grid
    for other in (record(after, asked=0.3), record(after, knn=0.7)):
        assert vouched_by(before, changed, tmp_path, {"then.json": then, "now.json": other}, grid=False) is None
    same = {"then.json": then, "now.json": record(after)}
    assert vouched_by(before, changed, tmp_path, same, grid=False) == "then.json = now.json"


def test_the_files_said_to_race_no_grid_point_make_their_split_choices_without_a_grid():
    """Every ``choose_splits`` call in the scripts of :data:`NO_GRID` files (and the benchmarks modules they import)
    sits in a function that sets ``split_grid=0``, and none of them runs the whole pipeline (which races the grid)."""
    import ast

    from benchmarks.provenance import BEHAVIOUR, NO_GRID, ROOT, script_of

    def called(node: ast.AST) -> set:
        return {getattr(c.func, "id", getattr(c.func, "attr", None)) for c in ast.walk(node) if isinstance(c, ast.Call)}

    assert NO_GRID <= BEHAVIOUR
    scripts, todo = set(), [script_of(ROOT / name) for name in NO_GRID]
    while todo:
        script = todo.pop()
        if script in scripts:
            continue
        scripts.add(script)
        tree = ast.parse((ROOT / script).read_text())
        todo += [f"benchmarks/{node.module.split('.')[1]}.py" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks.")]
        assert not called(tree) & {"prune_main", "Pipeline"}, f"{script} runs the whole pipeline (and its grid)"
        for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
            if "choose_splits" in called(function):
                assert any(isinstance(k, ast.keyword) and k.arg == "split_grid" and getattr(k.value, "value", 1) == 0
                           for k in ast.walk(function)), f"{script}: {function.name} may race the grid"
    assert "benchmarks/compare_methods.py" in scripts and "benchmarks/research_custom.py" in scripts


def test_same_behaviour_allows_float_noise_only():
    from benchmarks.behaviour import same_behaviour

    assert same_behaviour({"a": [1, 0.5, "x"]}, {"a": [1, 0.5 * (1 + 1e-6), "x"]})
    assert not same_behaviour({"a": [1, 0.5]}, {"a": [2, 0.5]})  # an integer (a count, a width) differs
    assert not same_behaviour({"a": [0.5]}, {"a": [0.51]})
    assert not same_behaviour({"a": [0.5]}, {"a": [0.5, 0.5]}) and not same_behaviour({"a": 1}, {"b": 1})


def test_a_behaviour_file_is_current_only_while_a_pair_of_records_vouches_for_it(tmp_path, monkeypatch):
    """``status`` of a file listed as measuring behaviour: stale once a file its run used changed, current again
    with records showing the change computed the same numbers; a timing file with the same change stays stale."""
    from benchmarks import provenance

    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    module = tmp_path / "snapvit_pl" / "fast.py"
    module.parent.mkdir()
    module.write_text("x = 1\n")
    files = {"snapvit_pl/fast.py": common.file_digest(module)}
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    for name in ("accuracy.json", "timing.json"):
        (results / name).write_text(json.dumps({"provenance": {"commit": "a" * 40, "command": "python x.py",
                                                               "recorded": "run", "files": files}}))
    monkeypatch.setattr(provenance, "BEHAVIOUR", {"benchmarks/results/accuracy.json"})
    monkeypatch.setattr(provenance, "BEHAVIOUR_RECORDS", results / "behaviour")
    module.write_text("x = 1  # faster\n")
    assert provenance.status(results / "accuracy.json").stale
    (results / "behaviour").mkdir()
    for name, digests in (("then.json", files), ("now.json", {"snapvit_pl/fast.py": common.file_digest(module)})):
        (results / "behaviour" / name).write_text(json.dumps(
            {"suite": ["default"], "numbers": {"default": {"knn": 0.5}}, "provenance": {"files": digests}}))
    vouched = provenance.status(results / "accuracy.json")
    assert vouched.stale is False and vouched.vouched_by == "then.json = now.json"
    assert provenance.status(results / "timing.json").stale


def test_a_benchmark_that_starts_the_project_in_other_processes_records_all_of_it():
    """Their imports are invisible to the benchmark's process (``prune.py``'s start-up read ``cli/help.py`` that
    ``stage_floors.py`` never imported): every script that runs ``sys.executable`` writes with ``subprocesses=True``."""
    import ast

    checked = []
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        tree = ast.parse(script.read_text())
        names = {ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        if "sys.executable" not in names:
            continue
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and ast.unparse(node.func).endswith("write_results")]
        flagged = [any(k.arg == "subprocesses" and ast.unparse(k.value) == "True" for k in call.keywords)
                   for call in calls]
        assert calls and all(flagged), f"{script.name}: write_results(..., subprocesses=True)"
        checked.append(script.name)
    assert {"readme_walkthrough.py", "quick_cpu.py", "stage_floors.py"} <= set(checked)
