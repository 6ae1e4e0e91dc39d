"""Every results file says what made it (script, command, commit, settings digest, machine, baseline) and what kind
of number it holds."""
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402
from benchmarks.provenance import (  # noqa: E402
    KINDS, LINE, kinds_of, records, results_files, script_of,
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
        assert script_of(path) in KINDS and kinds_of(path), f"{path.relative_to(ROOT)}: add its script to KINDS"


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
    assert record["machine"]["cpu_count"] and record["machine"]["torch_threads"] >= 1 and record["date"]
    from benchmarks.regression import baseline_id

    assert record["baseline"] == baseline_id() and re.fullmatch(r"[0-9a-f]{12}", record["baseline"])
    markdown = (tmp_path / "r.md").read_text()
    assert markdown.startswith("# acc 0.1235\n")
    line = markdown.rstrip("\n").splitlines()[-1]
    assert LINE.match(line) and record["config_digest"] in line and record["commit"][:12] in line
    assert f"baseline {record['baseline']}" in line and " cores, " in line  # the machine, in words
    md = records(tmp_path / "r.md")[0]
    assert md["baseline"] == record["baseline"] and md["machine_text"].startswith(record["machine"]["cpu"])
    assert records(tmp_path / "r.md")[0]["config_digest"] == records(tmp_path / "r.json")[0]["config_digest"]


@pytest.mark.parametrize("text", ["no provenance line\n", "_Provenance: `python x.py` at commit zz (x); config digest 1._\n"])
def test_a_markdown_file_without_a_valid_provenance_line_has_none(text, tmp_path):
    (tmp_path / "x.md").write_text(text)
    assert records(tmp_path / "x.md") == [None]


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


def test_a_file_edited_while_the_run_went_on_is_recorded_as_such(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "STARTED", 0.0)  # every file was edited after this "start"
    assert set(common.used_files().values()) == {common.EDITED_DURING_RUN}


def test_a_markdown_only_results_file_keeps_its_used_files_in_a_comment(tmp_path):
    common.write_markdown(tmp_path / "r.md", "# table\n", {"seeds": "0"})
    text = (tmp_path / "r.md").read_text()
    assert text.startswith("# table\n") and "<!-- files: " in text
    record = records(tmp_path / "r.md")[0]
    assert "benchmarks/common.py" in record["files"] and record["recorded"] == "run"


def test_a_markdown_file_written_with_its_json_carries_what_that_run_recorded(tmp_path):
    """A results Markdown file whose JSON sibling one run wrote with it has the files, machine and baseline the JSON
    records; another run's JSON beside it lends it nothing."""
    common.write_results(tmp_path / "r", {"x": 1}, "# table\n", {"seeds": "0"})
    md, js = records(tmp_path / "r.md")[0], records(tmp_path / "r.json")[0]
    assert md["files"] == js["files"] and "benchmarks/common.py" in md["files"]
    report = json.loads((tmp_path / "r.json").read_text())
    report["provenance"]["command"] += " --other"
    (tmp_path / "r.json").write_text(json.dumps(report))
    assert "files" not in records(tmp_path / "r.md")[0]


def test_a_benchmark_that_starts_the_project_in_other_processes_records_all_of_it():
    """Their imports are invisible to the benchmark's process (``prune.py``'s start-up read ``cli/help.py`` that
    ``stage_floors.py`` never imported): every script that runs ``sys.executable`` writes with ``subprocesses=True``."""
    import ast

    checked = []
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        tree = ast.parse(script.read_text())
        names = {ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        if "sys.executable" not in names or not re.search(r"write_(results|markdown)\(", script.read_text()):
            continue
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and ast.unparse(node.func).endswith("write_results")]
        flagged = [any(k.arg == "subprocesses" and ast.unparse(k.value) == "True" for k in call.keywords)
                   for call in calls]
        assert calls and all(flagged), f"{script.name}: write_results(..., subprocesses=True)"
        checked.append(script.name)
    assert {"readme_walkthrough.py", "quick_cpu.py", "stage_floors.py"} <= set(checked)
