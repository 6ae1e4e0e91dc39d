"""What ``pip install`` puts into site-packages: the project's namespace only."""
import json
import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_installed_under_snapvit_pl():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "snapvit_pl").rglob("__init__.py")}
    assert set(config["packages"]) == on_disk | {"snapvit_pl.callbacks"}
    assert config["package-dir"] == {"snapvit_pl.callbacks": "callbacks"}


def test_callbacks_import_from_the_namespace_not_as_a_top_level_package(tmp_path):
    code = ("import importlib.util, snapvit_pl.callbacks as c; "
            "assert c.SearchCallback.__module__ == 'snapvit_pl.callbacks.search'; "
            "print(importlib.util.find_spec('callbacks'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None"


def test_nothing_imports_the_bare_callbacks_package():
    offenders = [str(p.relative_to(ROOT)) for folder in ("snapvit_pl", "callbacks", "benchmarks", "examples", "tests")
                 for p in (ROOT / folder).rglob("*.py")
                 if any(line.startswith(("from callbacks", "import callbacks")) for line in p.read_text().splitlines())]
    assert offenders == []


def _resolve(python: Path, requirements: list[str], report: Path) -> subprocess.CompletedProcess:
    """``pip install --dry-run`` of ``requirements`` with ``python``, against what is installed only: no index, no
    find-links, no configuration or constraints of the machine's pip, no build step."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return subprocess.run([str(python), "-m", "pip", "install", "--dry-run", "--no-index", "--quiet", "--report",
                           str(report), *requirements], capture_output=True, text=True, env=env)


def test_installing_keeps_a_torch_the_user_already_has(tmp_path):
    """A venv that already has another torch than the one tested (here a newer 2.15.0, as a CUDA build of one's
    own would be): pip resolves the project's dependencies (those ``pip install -e .`` reads from pyproject.toml)
    without replacing it, since they are lower bounds. Hermetic: the venv sees this interpreter's packages (pip
    included) behind its own, and resolving needs no build backend (no ``wheel``), no index and no network."""
    venv.create(tmp_path / "venv", with_pip=False)
    python = tmp_path / "venv" / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    installed = [p for p in sys.path if Path(p).is_dir() and Path(p).name in ("site-packages", "dist-packages")]
    (site / "the_tests_packages.pth").write_text("\n".join(installed) + "\n")
    dist = site / "torch-2.15.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.15.0\n")
    (dist / "RECORD").write_text("")
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.replace(" ", "").startswith("torch>=") for d in dependencies)
    result = _resolve(python, dependencies, tmp_path / "report.json")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "report.json").read_text())["install"] == []  # torch 2.15.0 and the rest kept
    # the control: pip sees the venv's torch 2.15.0 (an exact pin of it is met without installing anything)
    assert _resolve(python, ["torch==2.15.0"], tmp_path / "pinned.json").returncode == 0
    assert json.loads((tmp_path / "pinned.json").read_text())["install"] == []
