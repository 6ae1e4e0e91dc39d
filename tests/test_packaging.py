"""What ``pip install`` puts into site-packages: the project's namespace only, with the presets and the demo's
model as package data, so that an installed snapvit-pl runs from any directory."""
import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest
import yaml
from images import image_folder

from snapvit_pl.cli import main
from snapvit_pl.config_files import DEFAULT_PRUNE_CONFIG, PRESET_KINDS, PRESETS_DIR, resolve_config

ROOT = Path(__file__).resolve().parents[1]
#: Data-only packages (no Python modules): configs/<kind>/ and the demo's model folder under assets/.
DATA_PACKAGES = {"snapvit_pl.configs.prune", "snapvit_pl.configs.prune.base", "snapvit_pl.configs.train",
                 "snapvit_pl.assets.reference_vit_fmnist"}


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_is_installed_under_snapvit_pl():
    config = _setuptools()
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "snapvit_pl").rglob("__init__.py")}
    assert set(config["packages"]) == on_disk | {"snapvit_pl.callbacks"} | DATA_PACKAGES
    assert config["package-dir"] == {"snapvit_pl.callbacks": "callbacks", "snapvit_pl.configs": "configs",
                                     "snapvit_pl.assets": "assets"}


def test_the_presets_and_the_demos_model_are_package_data():
    """Every preset folder ships whole, and so does the folder of the weights the demo config names."""
    config = _setuptools()
    kinds = sorted(p.name for p in (ROOT / "configs").iterdir() if p.is_dir())
    assert kinds == sorted(PRESET_KINDS)
    for kind in kinds:
        for folder in [ROOT / "configs" / kind, *(p for p in (ROOT / "configs" / kind).iterdir() if p.is_dir())]:
            package = ".".join(("snapvit_pl", *folder.relative_to(ROOT).parts))
            assert package in DATA_PACKAGES and config["package-data"][package] == ["*.yaml"], package
    weights = Path(yaml.safe_load(DEFAULT_PRUNE_CONFIG.read_text())["model"]["checkpoint_path"])
    folder = "snapvit_pl." + ".".join(weights.parent.parts)
    assert folder in DATA_PACKAGES
    assert sorted(config["package-data"][folder]) == sorted(p.name for p in (ROOT / weights.parent).iterdir()
                                                            if p.name in ("architecture.json", "model.safetensors"))


def test_a_preset_is_found_by_name_or_by_path_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prune = PRESETS_DIR / "prune"
    assert resolve_config("dino_vitb16") == str(prune / "dino_vitb16.yaml")
    assert resolve_config("quick.yaml") == str(prune / "quick.yaml")
    assert resolve_config("configs/prune/quick.yaml") == str(prune / "quick.yaml")  # the checkout's path, anywhere
    assert resolve_config("finetune_pruned", "train") == str(PRESETS_DIR / "train" / "finetune_pruned.yaml")
    (tmp_path / "quick.yaml").write_text("search: {num_images: 8}\n")
    assert resolve_config("quick.yaml") == "quick.yaml"  # a file of the working directory comes first
    assert resolve_config("{search: {num_images: 8}}") == "{search: {num_images: 8}}"  # YAML text: as it is


@pytest.mark.parametrize("argv, names", [
    (["prune", "--config", "dino_vitb16", "--config", "nope"], ("dino_vitb16", "quick", "demo")),
    (["prune", "--config=finetune_pruned"], ("dino_vitb16",)),  # a train preset is not a prune config
    (["train", "fit", "--config", "nope"], ("finetune_pruned", "reference_fmnist")),
])
def test_a_name_that_is_neither_a_file_nor_a_preset_is_one_error_line_listing_the_presets(capsys, tmp_path,
                                                                                          monkeypatch, argv, names):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --config ") and "no such file or preset" in lines[0]
    assert all(name in lines[0] for name in names), lines[0]


def test_version_is_pyprojects(capsys):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"snapvit-pl {version}"
    import snapvit_pl

    assert snapvit_pl.__version__ == version


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


def venv_over_this_environment(folder: Path) -> tuple[Path, Path]:
    """A fresh venv at ``folder`` that sees the packages of the environment running the tests (behind its own): a .pth
    file lists this interpreter's site-packages. Not ``--system-site-packages``: that is the *base* interpreter's,
    which inside a virtual environment (where contributors run the tests) lacks what the environment installed.
    Returns the venv's python and its site-packages."""
    venv.create(folder, with_pip=False)
    python = folder / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    installed = [p for p in sys.path if Path(p).is_dir() and Path(p).name in ("site-packages", "dist-packages")]
    (site / "the_tests_packages.pth").write_text("\n".join(installed) + "\n")
    return python, site


def test_a_venv_made_by_the_tests_sees_this_environments_packages(tmp_path):
    """Whether the tests run in a virtual environment or not, the venvs they make import what this process imports
    (pytorch_lightning from the same file), not the base interpreter's packages (with --system-site-packages a venv
    inside a venv missed pytorch_lightning: the wheel test failed for every contributor using a venv)."""
    import importlib.util

    python, _ = venv_over_this_environment(tmp_path / "venv")
    code = "import importlib.util as u; print(u.find_spec('pytorch_lightning').origin)"
    found = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env={
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")})
    assert found.returncode == 0, found.stderr[-2000:]
    assert Path(found.stdout.strip()) == Path(importlib.util.find_spec("pytorch_lightning").origin)


def test_installing_keeps_a_torch_the_user_already_has(tmp_path):
    """A venv that already has another torch than the one tested (here a newer 2.15.0, as a CUDA build of one's
    own would be): pip resolves the project's dependencies (those ``pip install -e .`` reads from pyproject.toml)
    without replacing it, since they are lower bounds. Hermetic: the venv sees this interpreter's packages (pip
    included) behind its own, and resolving needs no build backend (no ``wheel``), no index and no network."""
    python, site = venv_over_this_environment(tmp_path / "venv")
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


_TOP_NOT_COPIED = {".git", "runs", "build", "dist", "data", ".venv", ".pytest_cache", ".hypothesis", "lightning_logs"}


def _not_copied(folder: str, names: list[str]) -> set[str]:
    """What building does not need of the checkout: its runs, data, caches and build leftovers."""
    top = Path(folder) == ROOT
    return {n for n in names if (top and n in _TOP_NOT_COPIED) or n == "__pycache__" or n.endswith((".pyc", ".egg-info"))}


@pytest.mark.slow
def test_the_wheel_installs_and_runs_from_an_empty_directory(tmp_path):
    """Builds the wheel (``pip wheel --no-deps --no-build-isolation``, from a copy of the checkout: nothing is written
    into it), installs it, not editable, into a fresh venv (:func:`venv_over_this_environment`: torch and the rest
    come from this environment; the wheel with ``--no-deps``), and from an empty directory runs
    ``snapvit-pl --version``, the offline demo and one named preset with the quick overlay and random weights.

    The demo runs with a few tiny overrides (48 pruning images, 32 fitness images, 8 PCA components, no split grid,
    no evaluation): the full demo takes ~70 s on one thread; the table is printed all the same. The preset
    (``--config dino_vitb16 --config quick``) runs on a small ViT (``--model.model_kwargs``: 4 blocks of width 64 at
    32 px) over a 32-image folder made here. About 30 s in all on one CPU thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PIP_CONFIG_FILE=os.devnull, PYTHONNOUSERSITE="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    source, dist = tmp_path / "source", tmp_path / "dist"
    shutil.copytree(ROOT, source, ignore=_not_copied)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "--quiet", "-w", str(dist), str(source)], capture_output=True, text=True, env=env)
    assert build.returncode == 0, build.stderr[-3000:]
    wheel, = dist.glob("snapvit_pl-*.whl")
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"snapvit_pl/configs/prune/dino_vitb16.yaml", "snapvit_pl/configs/prune/quick.yaml",
            "snapvit_pl/configs/prune/base/imagenet.yaml",
            "snapvit_pl/configs/prune/demo.yaml", "snapvit_pl/configs/train/finetune_pruned.yaml",
            "snapvit_pl/assets/reference_vit_fmnist/model.safetensors", "snapvit_pl/cli/prune_options.json",
            "snapvit_pl/callbacks/__init__.py"} <= names
    assert not any(n.startswith(("callbacks/", "configs/", "assets/", "tests/", "benchmarks/")) for n in names)

    venv_over_this_environment(tmp_path / "venv")
    bin_dir = tmp_path / "venv" / "bin"
    install = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "--no-deps", "--no-index",
                              "--ignore-installed", "--quiet", str(wheel)], capture_output=True, text=True, env=env)
    assert install.returncode == 0, install.stderr[-3000:]
    empty = tmp_path / "empty"
    empty.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, env=env, cwd=empty, timeout=600)

    # the venv's snapvit_pl is the wheel's: not the checkout (an editable install's finder comes after it)
    where = run(str(bin_dir / "python"), "-c", "import snapvit_pl, snapvit_pl.callbacks, snapvit_pl.io as io; "
                "print(snapvit_pl.__file__, snapvit_pl.callbacks.__file__, io.DATA_ROOT, sep='\\n')")
    assert where.returncode == 0, where.stderr[-3000:]
    for line in where.stdout.split():
        assert Path(line).is_relative_to(tmp_path / "venv"), where.stdout
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    shown = run(str(bin_dir / "snapvit-pl"), "--version")
    assert (shown.returncode, shown.stdout.strip()) == (0, f"snapvit-pl {version}"), shown.stderr[-3000:]

    demo = run(str(bin_dir / "snapvit-pl"), "prune", "--data.init_args.max_samples=48", "--search.num_images=32",
               "--search.pca_components=8", "--export.split_grid=0", "--evaluation.metrics=[]", "--progress=off",
               "--out_dir=demo")
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "snapvit-pl: vit_tiny_patch16_224" in demo.stdout and "sparsity0.6" in demo.stdout, demo.stdout[-3000:]
    assert (empty / "demo" / "report.json").is_file()

    images = image_folder(tmp_path / "images")
    preset = run(str(bin_dir / "snapvit-pl"), "prune", "--config", "dino_vitb16", "--config", "quick",
                 "--model.pretrained", "false", "--data.init_args.root", str(images),
                 "--data.init_args.num_workers=0", "--progress=off", "--out_dir=preset",
                 "--model.model_kwargs={num_classes: 0, img_size: 32, patch_size: 8, embed_dim: 64, depth: 4, "
                 "num_heads: 4}")
    assert preset.returncode == 0, preset.stderr[-3000:]
    assert "snapvit-pl: vit_base_patch16_224.dino" in preset.stdout, preset.stdout[-3000:]
    saved = yaml.safe_load((empty / "preset" / "config.yaml").read_text())
    assert saved["search"]["num_images"] == 8 and saved["export"]["split_grid"] == 0  # the quick overlay's
    assert saved["export"]["mlp_multiple"] == 8 and saved["data"]["init_args"]["source"] == "folder"  # the base's

    unknown = run(str(bin_dir / "snapvit-pl"), "prune", "--config", "dino_vitb61")
    assert unknown.returncode == 2 and "dino_vitb16, " in unknown.stderr and unknown.stderr.count("\n") == 1


MINIMUM_VERSIONS = ROOT / ".ci" / "minimum-versions.txt"


def _pins(path: Path) -> dict[str, str]:
    """``name -> version`` of a constraints file's ``name==version`` lines (comments and blank lines skipped)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def _lower_bounds() -> dict[str, str]:
    """``name -> lower bound`` of every dependency in pyproject.toml (its ``>=`` version)."""
    import re

    bounds = {}
    for dependency in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        match = re.match(r"^([A-Za-z0-9_.-]+)(\[[^]]*\])?\s*>=\s*([0-9][^,;\s]*)", dependency)
        assert match, f"{dependency!r}: every dependency declares a lower bound (>=)"
        bounds[match.group(1).lower()] = match.group(3)
    return bounds


def test_the_minimum_versions_run_installs_every_declared_lower_bound():
    """.ci/run's second test run installs .ci/minimum-versions.txt: exactly the lower bounds pyproject.toml declares,
    written out in full (``>=2.6.1`` -> ``==2.6.1``, ``>=1.4`` -> ``==1.4.0``), for every dependency."""
    from packaging.version import Version

    pins, bounds = _pins(MINIMUM_VERSIONS), _lower_bounds()
    assert set(pins) == set(bounds), f"pinned but not declared: {set(pins) - set(bounds)}; declared but not pinned: " \
                                     f"{set(bounds) - set(pins)}"
    for name, bound in bounds.items():
        assert Version(pins[name]) == Version(bound), f"{name}: pyproject says >={bound}, the minimum run installs {pins[name]}"


@pytest.mark.skipif(os.environ.get("SNAPVIT_MINIMUM_VERSIONS") != "1", reason=".ci/run's minimum-versions run only")
def test_this_run_has_the_minimum_versions_installed():
    """In .ci/run's minimum-versions run (``SNAPVIT_MINIMUM_VERSIONS=1``), the suite runs with exactly the pinned
    lower bounds installed (a local build label such as ``+cu130`` aside)."""
    from importlib.metadata import version

    from packaging.version import Version

    for name, pinned in _pins(MINIMUM_VERSIONS).items():
        assert Version(Version(version(name)).base_version) == Version(pinned), f"{name} {version(name)} != {pinned}"
