"""python -m snapvit_pl.deploy without the deploy extra, or into a directory it cannot write: one error line."""
import subprocess
import sys

import pytest

from families import FAMILIES, random_subnet
from snapvit_pl.models import load_backbone, prune_, save_pruned


@pytest.fixture
def checkpoint(tmp_path):
    model = load_backbone(FAMILIES["dino_vit"])
    subnet = random_subnet(model, 0)
    return save_pruned(prune_(model, subnet), tmp_path / "pruned", FAMILIES["dino_vit"], subnet)


def _deploy(args, block_onnx=False):
    prelude = "import sys; sys.modules['onnx'] = None; " if block_onnx else ""  # as if the extra were not installed
    code = prelude + "from snapvit_pl.deploy.__main__ import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", "import sys; " + code, *args], capture_output=True, text=True)


def test_missing_deploy_extra_names_the_install_command(checkpoint, tmp_path):
    result = _deploy(["--checkpoint", str(checkpoint), "--out", str(tmp_path / "m.onnx")], block_onnx=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "pip install 'snapvit-pl[deploy]'" in error


def test_unwritable_output_is_one_error_line(checkpoint, tmp_path):
    pytest.importorskip("onnx")
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("")  # the output's parent is a file: no one, root included, can create it
    result = _deploy(["--checkpoint", str(checkpoint), "--out", str(blocker / "m.onnx")])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert f"--out {blocker / 'm.onnx'} lies under the file {blocker}" in error
