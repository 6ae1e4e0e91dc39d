import sys
from pathlib import Path

import pytest
import torch

# tests/<pkg>/ helper modules (e.g. tests/models/families.py) are importable by name.
sys.path.insert(0, str(Path(__file__).parent / "models"))


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield
