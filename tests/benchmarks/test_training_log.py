"""benchmarks/training_log.py: a run's TensorBoard events as a per-epoch table."""
import sys
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.training_log import main  # noqa: E402


def test_one_row_per_epoch_with_the_mean_loss_and_the_epoch_metrics(tmp_path):
    writer = SummaryWriter(str(tmp_path / "run" / "tensorboard"))
    for step in range(6):  # epochs of 3 steps, as Lightning logs them
        writer.add_scalar("epoch", step // 3, step)
        writer.add_scalar("train/loss", 2.0 - step * 0.2, step)
        writer.add_scalar("lr-AdamW", 1e-3, step)
    writer.add_scalar("val/accuracy", 0.5, 2)
    writer.add_scalar("val/accuracy", 0.75, 5)
    writer.close()
    main([str(tmp_path / "run"), str(tmp_path / "log.md")])
    rows = [line for line in (tmp_path / "log.md").read_text().splitlines() if line.startswith("| 0 ") or line.startswith("| 1 ")]
    assert rows[0].startswith("| 0 | 1.8000 | 50.00% |") and rows[1].startswith("| 1 | 1.2000 | 75.00% |")


def test_a_folder_without_events_is_one_error(tmp_path):
    with pytest.raises(SystemExit, match="no TensorBoard event files"):
        main([str(tmp_path), str(tmp_path / "log.md")])
