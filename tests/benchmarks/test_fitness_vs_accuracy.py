"""benchmarks/fitness_vs_accuracy.py: fitness against accuracy across candidate coefficients (smoke run)."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="dataset-fashion-mnist")
def test_tiny_run_correlates_every_metric_for_both_scorers(tmp_path):
    from benchmarks.fitness_vs_accuracy import main

    main(["--tiny", "--out", str(tmp_path / "fva")])
    report = json.loads((tmp_path / "fva.json").read_text())
    (model,) = report["models"].values()
    for scorer in ("ssl_fisher", "sensitivity"):
        result = model[scorer]
        assert result["candidates"] == 3 and len(result["rows"]) == 3
        keys = {f"{images}/{metric}" for images in ("scoring_images", "disjoint_images")
                for metric in ("head_top1", "linear_top1", "knn_top1")}
        assert keys <= set(result) and all(-1 <= result[k] <= 1 for k in keys)
        assert all(row["scoring_images"] > 0 and row["disjoint_images"] > 0 for row in result["rows"])
    assert "| disjoint images |" in (tmp_path / "fva.md").read_text()
