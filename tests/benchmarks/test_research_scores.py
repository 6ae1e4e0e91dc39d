"""research_scores.py --quick: one variant end to end (scores, split, cut, evaluation) into a JSON-lines file."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
needs_data = pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="dataset-fashion-mnist")


@needs_data
def test_research_scores_quick_writes_a_record_and_resumes(tmp_path, capsys):
    from benchmarks.research_scores import PAIRS, REPORTED, main

    out, cache = tmp_path / "quick.jsonl", tmp_path / "cache"
    args = ["--quick", "--threads", "1", "--variants", "sens_none_split", "--out", str(out), "--cache", str(cache)]
    main(args)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 1
    record = records[0]
    assert {"model", "seed", "variant", "config", "scoring_s", "split_s", "drift", "evaluation_s", "rows"} <= set(record)
    assert (record["model"], record["seed"], record["variant"]) == ("reference", 0, "sens_none_split")
    assert record["config"]["scorer"] == "sensitivity" and record["config"]["coefficients"] == "none"
    assert [tuple(r["pair"]) for r in record["rows"]] == [tuple(p) for p in PAIRS]
    for row in record["rows"]:
        assert {"ratios", "params", "heads", "mlp_hidden", *REPORTED} <= set(row)
        assert all(0.0 <= row[k] <= 1.0 for k in REPORTED)
    assert any(cache.glob("reference_s0_sensitivity_*.pt"))  # the local scores were cached

    main(args)  # already in the file: skipped, nothing appended
    assert len(out.read_text().splitlines()) == 1
    capsys.readouterr()
    main(["--summary", "--out", str(out)])
    assert "| sens_none_split [1] |" in capsys.readouterr().out


def test_selection_tables_mean_over_seeds_per_metric_and_skip_a_missing_head(tmp_path):
    from benchmarks.research_scores import PAIRS, selection_table

    def record(model, variant, seed, head):
        rows = [{"pair": list(p), "head_top1": head, "linear_top1": 0.5, "knn_top1": 0.4} for p in PAIRS]
        if model == "ssl":
            for row in rows:
                row["head_top1"] = None
        return json.dumps({"model": model, "seed": seed, "variant": variant, "rows": rows})

    path = tmp_path / "h.jsonl"
    path.write_text("\n".join([record("sup", "a", 0, 0.9), record("sup", "a", 1, 0.8), record("ssl", "a", 0, None)]))
    table = selection_table(path, ["a", "b"], ["sup", "ssl"])
    head, linear, knn = (table.split(f"**{title}**")[1] for title in ("own head", "linear probe", "k-NN"))
    assert "| variant | sup |\n" in head and "| a | 85.00 / 85.00 / 85.00 [2] |" in head  # ssl has no head
    assert "| a | 50.00 / 50.00 / 50.00 [2] | 50.00 / 50.00 / 50.00 [1] |" in linear
    assert "| a | 40.00 / 40.00 / 40.00 [2] | 40.00 / 40.00 / 40.00 [1] |" in knn and "| b | - | - |" in knn
    assert "| a | 1 | not recorded | - |" in table  # these records carry no scoring time
    timed = [json.loads(line) | {"scoring_s": s} for line, s in zip(path.read_text().splitlines(), (2.0, 4.0, 6.0))]
    path.write_text("\n".join([*map(json.dumps, timed), json.dumps(json.loads(record("sup", "b", 0, 0.7)) | {"scoring_s": 8.0})]))
    assert "| a | 1 | 4.0 | 1.00 |" in selection_table(path, ["a", "b"], ["sup", "ssl"])
    assert "| b | 1 | 8.0 | 2.00 |" in selection_table(path, ["a", "b"], ["sup", "ssl"])


def test_paired_table_differences_by_seed_and_only_where_both_ran(tmp_path):
    from benchmarks.research_scores import PAIRS, paired_table

    def record(model, variant, seed, linear):
        rows = [{"pair": list(p), "head_top1": None, "linear_top1": linear, "knn_top1": 0.4} for p in PAIRS]
        return json.dumps({"model": model, "seed": seed, "variant": variant, "rows": rows})

    path = tmp_path / "h.jsonl"
    path.write_text("\n".join([record("m", "base", 0, 0.90), record("m", "base", 1, 0.80), record("m", "new", 0, 0.91),
                               record("m", "new", 1, 0.83), record("m", "new", 2, 0.10)]))  # seed 2: no baseline
    table = paired_table(path, ["new"], "base", ["m", "other"])
    assert "| m | - | +2.00 ± 1.41 / +2.00 ± 1.41 / +2.00 ± 1.41 [2] | +0.00 ± 0.00 / +0.00 ± 0.00 / +0.00 ± 0.00 [2] |" \
        in table
    assert "| other | - | - | - |" in table
