"""compare_methods.py's report merge (runs over models or seeds, in parallel)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.compare_methods import PAPER_PAIRS, aggregate, merge  # noqa: E402


def report(seeds, methods, partial=False, dense=0.9):
    rows = [{"method": m, "seed": s, "pair": list(pair), "params": 100 - 10 * i, "head_top1": 0.8 + 0.01 * s,
             "linear_top1": 0.8, "knn_top1": 0.8} for m in methods for s in seeds for i, pair in enumerate(PAPER_PAIRS)]
    entry = {"dense": {"params": 100, "head_top1": dense, "linear_top1": dense, "knn_top1": dense,
                       "timings_s": {"classification": 10.0 + seeds[0]}},
             "search_settings": {"max_evaluations": 80, "seed": seeds[0]}, "rows": rows, "summary": aggregate(rows),
             "runs": [{"method": m, "seed": s} for m in methods for s in seeds]}
    return {"quick": False, "name": "x", "partial": partial, "total_s": 60.0, "models": {"reference": entry},
            "machine": {"date": "d", "cpu": "c", "torch_threads": 1},
            "settings": {"methods": methods, "seeds": seeds, "split": "test", "val_samples": None, "train_samples": 10}}


def write(tmp_path, name, data):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def test_merge_combines_seeds_of_a_model_and_refuses_a_measurement_twice(tmp_path):
    first = write(tmp_path, "a", report([0], ["ours_split", "ours", "label_fisher"], partial=True))
    second = write(tmp_path, "b", report([1, 2], ["ours_split", "label_fisher"]))
    merged = merge([first, second], tmp_path / "merged")
    cell = merged["models"]["reference"]["summary"]["ours_split"]["0.65,0.50"]["head_top1"]
    assert cell["n"] == 3 and cell["mean"] == pytest.approx(0.81)
    assert merged["models"]["reference"]["summary"]["ours"]["0.65,0.50"]["head_top1"]["n"] == 1
    assert merged["settings"]["seeds"] == [0, 1, 2] and "interrupted" in merged["merged_from"][0]
    text = (tmp_path / "merged.md").read_text()
    assert "(n=1)" in text and "Merged from 2 runs" in text and (tmp_path / "merged.png").stat().st_size > 0
    with pytest.raises(ValueError, match="ours_split seed 1"):
        merge([second, second], tmp_path / "again")
    with pytest.raises(ValueError, match="disagree"):
        merge([first, write(tmp_path, "c", report([3], ["ours_split"], dense=0.5))], tmp_path / "bad")
