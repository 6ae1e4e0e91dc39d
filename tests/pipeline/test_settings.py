import pytest

from snapvit_pl.errors import ConfigError
from snapvit_pl.pipeline import ExportSettings


@pytest.mark.parametrize("name", ["../../victim", "/tmp/scores.safetensors", "report.json", "models/x.safetensors",
                                  "config.yaml", "resume_state.pt", ".", ""])
def test_the_scores_file_stays_inside_the_run_directory(name):
    with pytest.raises(ConfigError, match="must be a file name inside the run directory"):
        ExportSettings(scores_file=name)


def test_a_scores_file_in_a_subfolder_is_fine_and_a_latency_table_must_be_a_file(tmp_path):
    assert ExportSettings(scores_file="scores/elastic.safetensors").scores_file == "scores/elastic.safetensors"
    with pytest.raises(ConfigError, match="export.latency_table .* is a directory"):
        ExportSettings(latency_table=str(tmp_path))
