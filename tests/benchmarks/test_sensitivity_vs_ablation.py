"""benchmarks/sensitivity_vs_ablation.py: the default score against exact single-unit ablation (smoke run)."""
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.sensitivity_vs_ablation import main, spearman  # noqa: E402


def test_spearman_is_a_rank_correlation():
    x = torch.tensor([0.1, 0.5, 0.2, 0.9])
    assert spearman(x, x ** 3) == pytest.approx(1.0) and spearman(x, -x) == pytest.approx(-1.0)


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="dataset-fashion-mnist")
def test_tiny_run_writes_the_correlations(tmp_path):
    main(["--tiny", "--out", str(tmp_path / "sanity")])
    report = json.loads((tmp_path / "sanity.json").read_text())
    (entry,) = report["models"].values()
    assert entry["heads"] == 36 and entry["neurons"] == 4
    assert entry["heads_spearman"] > 0.5  # even on 32 images the score ranks heads as their removal does
    assert "| heads |" in (tmp_path / "sanity.md").read_text()
