"""What ``pip install`` puts into site-packages: the project's namespace only."""
import subprocess
import sys
import tomllib
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


def test_installing_keeps_a_torch_the_user_already_has(tmp_path):
    """A venv that already has another torch than the one tested (here a newer 2.15.0, as a CUDA build of one's
    own would be): pip resolves ``pip install -e .`` without replacing it (the dependencies are lower bounds)."""
    import json
    import os
    import venv

    venv.create(tmp_path / "venv", system_site_packages=True, with_pip=False)  # the other packages come from here
    python = tmp_path / "venv" / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    dist = Path(site) / "torch-2.15.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.15.0\n")
    (dist / "RECORD").write_text("")
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}  # the machine's own pip constraints are not the user's
    result = subprocess.run([str(python), "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                             "--quiet", "--report", str(tmp_path / "report.json"), "-e", str(ROOT)],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    installs = [item["metadata"]["name"] for item in json.loads((tmp_path / "report.json").read_text())["install"]]
    assert installs == ["snapvit-pl"]  # torch 2.15.0 (and everything else already there) is kept
