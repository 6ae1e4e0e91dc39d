import sys
from pathlib import Path

import pytest
import torch

# scoring_helpers.py is importable by name (pytest runs with --import-mode=importlib).
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    """The models here are tiny: one thread is as fast, and immune to OpenMP spin-waits on a busy machine
    (measured here under load: 9 s with one thread against 90 s with two)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
