"""The version: the installed distribution's (importlib.metadata), else the checkout's pyproject.toml (the one place
it is written)."""
from __future__ import annotations


def package_version() -> str:
    """The installed distribution's version, else (a checkout run without installing it) pyproject.toml's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("snapvit-pl")
    except PackageNotFoundError:
        import re
        from pathlib import Path

        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.M) if pyproject.is_file() else None
        return found.group(1) if found else "0+unknown"
