"""Smoke runs of the benchmarks (their --tiny / --quick modes): they run and write what they promise."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
needs_data = pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="dataset-fashion-mnist")


def test_gpu_pipeline_tiny_runs_every_stage_on_cpu(tmp_path):
    from benchmarks.gpu_pipeline import main

    assert main(["--tiny", "--out", str(tmp_path / "gpu")]) == 0
    report = json.loads((tmp_path / "gpu.json").read_text())
    entry = report["models"]["tiny"]
    assert set(entry["stages"]) == {"load", "importance", "search_4", "search_8", "extraction"}
    assert entry["search"]["floor"]["ratio"] > 0 and len(entry["throughput"]) == 7
    assert {"bf16_b1_images_per_s", "32_b8_images_per_s"} <= set(entry["throughput"][0])
    assert (tmp_path / "gpu.md").read_text().startswith("# The pipeline on an accelerator")


@pytest.mark.slow
@needs_data
def test_latency_budget_quick(tmp_path):
    from benchmarks.latency_budget import main

    assert main(["--quick", "--out", str(tmp_path / "latency")]) == 0
    report = json.loads((tmp_path / "latency.json").read_text())
    for entry in report["batches"].values():
        assert len(entry["rows"]) == 6 and all(r["predicted_ms"] <= r["budget_ms"] + 1e-6 for r in entry["rows"])
