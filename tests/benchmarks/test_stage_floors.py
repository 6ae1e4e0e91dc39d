"""stage_floors.py's report: the start-up table and the 1- against 2-process table from repeated runs."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.stage_floors import markdown  # noqa: E402


def test_the_two_process_table_shows_the_median_ratio_and_the_range_of_the_pairs_and_the_start_up_times():
    two = {"repeats": 3, "same_files": True, "files": 13, "one": {"splits_s": 6.0, "export_s": 20.0},
           "two": {"splits_s": 3.6, "export_s": 11.0}, "splits_ratio": 0.6, "export_ratio": 0.55,
           "splits_ratio_range": [0.58, 0.74], "export_ratio_range": [0.53, 0.57],
           "per_rank": {"1": [{"splits": {"cpu_s": 6.0}, "export": {"cpu_s": 20.0}}],
                        "2": [{"splits": {"cpu_s": 3.1}, "export": {"cpu_s": 10.0}},
                              {"splits": {"cpu_s": 3.2}, "export": {"cpu_s": 11.0}}],
                        "splits_cpu_ratio": 3.2 / 6.0, "export_cpu_ratio": 0.55}}
    report = {"tiny": False, "device": "cpu", "models": {}, "two_processes": two,
              "start_up": {"the help": {"argv": ["--help"], "seconds": 0.12, "exit_status": 0, "all_s": [0.2, 0.12]}},
              "machine": {"date": "d", "torch_threads": 1, "load_average_1m_at_end": 0.5}}
    text = markdown(report)
    assert "the median of 3 runs of each" in text
    assert "| split choice | 6.0 | 3.6 | 0.60 (0.58 .. 0.74) |" in text
    assert "| export (cut, evaluate, save) | 20.0 | 11.0 | 0.55 (0.53 .. 0.57) |" in text
    assert "the same bytes (sha256) in every run" in text
    assert "| `prune.py --help` | the help | 0.12 | 0 |" in text and "wall seconds (median of 2)" in text
    two["same_files"] = False
    assert "NOT the same bytes" in markdown(report)
