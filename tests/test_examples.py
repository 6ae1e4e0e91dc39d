"""The examples run as shipped (their --quick mode here)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="apt-get install dataset-fashion-mnist")
def test_python_api_example_prints_its_table(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "python_api.py"), "--quick"], capture_output=True,
                            text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert any(line.startswith("dense") for line in lines) and any(line.startswith("sparsity=0.45") for line in lines)
