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
