"""Every results file says what made it (commit, settings digest, command), and the ones older than the code they
measure are listed (a failure for a file a published claim quotes, once it records its run)."""
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402
from benchmarks.provenance import LINE, records, results_files, status  # noqa: E402


def quoted_files() -> set[Path]:
    """The results files a document quotes: docs/claims.yaml's sources and the results blocks' files."""
    quoted = {ROOT / claim["source"] for claim in yaml.safe_load((ROOT / "docs" / "claims.yaml").read_text())}
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        quoted |= {ROOT / m for m in re.findall(r"<!-- results: (\S+) -->", doc.read_text())}
    return quoted


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
    """A report in the test output (``-s`` or ``-rA`` shows it); a failure only for a quoted file that recorded its
    run (the files written before provenance was recorded carry the commit git says wrote them, and stay listed
    until their script runs again)."""
    quoted = quoted_files()
    stale, failures = [], []
    for path in results_files():
        s = status(path)
        if s.stale:
            stale.append(f"{path.relative_to(ROOT)} (recorded {s.commit[:12]} [{s.recorded}], code changed in "
                         f"{s.changed_in[:12]}{', quoted' if path in quoted else ''})")
            if path in quoted and s.recorded == "run":
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
