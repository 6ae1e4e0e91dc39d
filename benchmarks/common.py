"""What the benchmarks share: the models they run on, the settings ``prune.py`` would use, the run record.

The settings come from ``configs/prune/demo.yaml`` through ``prune.py``'s own parser
(:func:`prune_setup`), so a benchmark measures what ``python prune.py`` ships.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # snapvit_pl when run as a script from a checkout

from snapvit_pl.config_files import DEFAULT_PRUNE_CONFIG  # noqa: E402
from snapvit_pl.cli.prune import prune_cli  # noqa: E402
from snapvit_pl.models import BackboneSpec  # noqa: E402
from snapvit_pl.pipeline import PipelineSettings  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
#: The development models (trained by this project, shipped in assets/): name -> checkpoint directory.
MODELS = {
    "reference": ROOT / "assets" / "reference_vit_fmnist",
    "dev_p7": ROOT / "assets" / "dev_vit_fmnist_p7",
    "clutter": ROOT / "assets" / "clutter_vit_fmnist",  # cluttered canvases: pruning hurts (docs/development_models.md)
    "dino": ROOT / "assets" / "dino_vit_fmnist",  # self-supervised (DINO), no classifier
    "ssl_clutter": ROOT / "assets" / "ssl_clutter_vit",  # self-supervised on the cluttered canvases: pruning hurts
}


@dataclass
class PruneSetup:
    """The objects ``python prune.py <overrides>`` runs with (model, data, every stage's settings)."""

    model: torch.nn.Module
    spec: BackboneSpec
    datamodule: Any
    settings: PipelineSettings

    def __getattr__(self, name: str) -> Any:
        """``setup.search`` is ``setup.settings.search`` (likewise every stage's settings)."""
        if name in _STAGE_SETTINGS:
            return getattr(self.settings, name)
        raise AttributeError(name)


_STAGE_SETTINGS = ("importance", "search", "export", "correction", "evaluation", "report")


#: The data a development model was trained on, when it is not the demo config's plain Fashion-MNIST.
MODEL_DATA = {name: ["--data.init_args.source=fashion_mnist_clutter"] for name in ("clutter", "ssl_clutter")}


def model_overrides(name: str) -> list[str]:
    """``prune.py`` overrides that load development model ``name`` (its architecture and weights) and its data."""
    for file in ("architecture.json", "model.safetensors"):
        _OPENED.add(str((MODELS[name] / file).relative_to(ROOT)))
    record = json.loads((MODELS[name] / "architecture.json").read_text())
    kwargs = record["base"]["model_kwargs"]
    return [f"--model.model_name={record['base']['model_name']}", "--model.pretrained=false",
            f"--model.checkpoint_path={MODELS[name] / 'model.safetensors'}", f"--model.model_kwargs={json.dumps(kwargs)}",
            *MODEL_DATA.get(name, [])]


def prune_setup(*overrides: str, config: Path = DEFAULT_PRUNE_CONFIG) -> PruneSetup:
    """Parse ``config`` plus ``overrides`` exactly as ``prune.py`` does and return what it would run with."""
    with tempfile.TemporaryDirectory() as tmp:
        cli = prune_cli(["--config", str(config), "--out_dir", tmp, "--trainer.logger=false", *overrides])
    cli.model.backbone.eval()
    cli.datamodule.configure_for_model(cli.model.backbone)
    return PruneSetup(cli.model.backbone, cli.model.spec, cli.datamodule, cli.model.pipeline.settings)


class Progress:
    """One line per stage with the elapsed time."""

    def __init__(self):
        self.start = time.perf_counter()

    def __call__(self, message: str) -> None:
        print(f"[{time.perf_counter() - self.start:7.1f}s] {message}", flush=True)


def machine_info() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "load_average_1m_at_end": load[0] if load else None,
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}


def rounded(value: Any, digits: int = 4) -> Any:
    """Floats rounded to ``digits`` decimals, or to ``digits`` significant digits below 1 (per-image costs keep
    their precision), recursively through dicts and lists, for the JSON record."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if abs(value) < 1 else round(value, digits)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    return value


def display(path: Path) -> str:
    """A path relative to the checkout when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def pct(value: Optional[float], digits: int = 1) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f}"


#: The code a results file may depend on besides its script: a run that starts the project in other processes
#: (``subprocesses=True`` in :func:`write_results`) records all of it as used, and uncommitted changes to it mark the
#: run ``dirty``.
MEASURED_CODE = ("snapvit_pl", "callbacks", "configs", "assets", "benchmarks/common.py")
#: Folders of project files a run may read as data (configs, development models): the ones it opened are recorded.
DATA_FOLDERS = ("configs", "assets")
_OPENED: set[str] = set()


def _record_open(event: str, args: tuple) -> None:
    """Audit hook: remember the project's configs and assets this process opens (for :func:`used_files`)."""
    if event != "open" or not args or not isinstance(args[0], (str, os.PathLike)):
        return
    path = os.path.abspath(os.fspath(args[0]))
    root = str(ROOT) + os.sep
    if path.startswith(root) and path[len(root):].split(os.sep, 1)[0] in DATA_FOLDERS:
        _OPENED.add(path[len(root):])


sys.addaudithook(_record_open)


def file_digest(path: Path) -> Optional[str]:
    """sha256 (16 hex digits) of a file's content; None when it does not exist."""
    import hashlib

    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def used_files(subprocesses: bool = False) -> dict[str, str]:
    """The project files this run used, with their :func:`file_digest`: every module imported from the checkout
    (the package, the callbacks, the benchmark scripts), the configs and assets opened, and the development models
    named (:func:`model_overrides`, whose weights are read outside Python's ``open``). ``subprocesses``: the run
    started the project in other processes, whose imports this one cannot see: every file of
    :data:`MEASURED_CODE`."""
    files = set(_OPENED)
    root = str(ROOT) + os.sep
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if name and os.path.abspath(name).startswith(root):
            relative = os.path.abspath(name)[len(root):]
            if not relative.startswith("tests" + os.sep):
                files.add(relative)
    if subprocesses:
        for top in MEASURED_CODE:
            folder = ROOT / top
            found = [folder] if folder.is_file() else [p for p in folder.rglob("*") if p.is_file()]
            files |= {str(p.relative_to(ROOT)) for p in found
                      if "__pycache__" not in p.parts and p.name != "training_log.md"}
    digests = {name: file_digest(ROOT / name) for name in sorted(files)}
    # A file edited while this process ran may not be what it read: its digest can match nothing.
    edited = {name for name in digests if digests[name] is not None and (ROOT / name).stat().st_mtime > STARTED}
    return {name: EDITED_DURING_RUN if name in edited else digest for name, digest in digests.items()
            if digest is not None}


#: When this process started reading the project (benchmarks.common is imported first by every benchmark).
STARTED = time.time()
#: The digest recorded for a file that changed while the run was going on (it makes the results file stale).
EDITED_DURING_RUN = "edited-during-run"


def _git(*args: str) -> Optional[str]:
    import subprocess

    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def config_digest(settings: Any) -> str:
    """sha256 (16 hex digits) of a benchmark's settings (its parsed arguments, any JSON-able value), key order
    aside: two files with the same digest were made with the same settings."""
    import hashlib

    text = json.dumps(settings, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: The command line of this process's benchmark, as :func:`parse_args` read it (None: not parsed yet).
COMMAND: Optional[str] = None


def parse_args(parser: Any, argv: Optional[list[str]] = None) -> Any:
    """``parser.parse_args(argv)``, remembering the command line (the calling script and ``argv``, or the process's
    arguments) as :data:`COMMAND`, for the results' :func:`provenance`."""
    import inspect
    import shlex

    global COMMAND
    args = parser.parse_args(argv)
    script = display(Path(inspect.stack()[1].filename))
    COMMAND = shlex.join(["python", script, *(sys.argv[1:] if argv is None else argv)])
    return args


def provenance(settings: Any, subprocesses: bool = False) -> dict[str, Any]:
    """What made a results file: the checkout's commit (``dirty``: the measured code had uncommitted changes), the
    digest of the run's settings (:func:`config_digest` of ``settings``: its parsed arguments, or a settings
    dataclass), its command line (:data:`COMMAND`), the date, the machine (:func:`machine_info`), the regression
    baseline the checkout holds (``benchmarks.regression.baseline_id``: what the project computed when the run was
    made) and the project files it used with their digests (:func:`used_files`; ``subprocesses``: it started the
    project in other processes; information, nothing is judged by them)."""
    from dataclasses import asdict, is_dataclass

    commit = _git("rev-parse", "HEAD")
    changes = _git("status", "--porcelain", "--", *MEASURED_CODE) if commit else None
    values = asdict(settings) if is_dataclass(settings) else vars(settings) if hasattr(settings, "__dict__") else settings
    return {"commit": commit, "dirty": bool(changes), "config_digest": config_digest(values),
            "command": COMMAND or "not recorded", "recorded": "run", "date": time.strftime("%Y-%m-%d %H:%M"),
            "machine": machine_info(), "baseline": baseline_id(), "files": used_files(subprocesses)}


def baseline_id() -> Optional[str]:
    """The regression baseline of this checkout (``benchmarks.regression.baseline_id``)."""
    from benchmarks.regression import baseline_id as current

    return current()


#: The Markdown comment (invisible when rendered) that holds a Markdown-only results file's used files, just before
#: its provenance line.
FILES_COMMENT = "<!-- files: {} -->"


def provenance_lines(record: dict[str, Any]) -> str:
    """The end of a Markdown results file: the used files' comment (when recorded) and the :func:`provenance_line`."""
    files = FILES_COMMENT.format(json.dumps(record["files"], separators=(",", ":"))) + "\n" if record.get("files") \
        else ""
    return files + provenance_line(record)


def provenance_line(record: dict[str, Any]) -> str:
    """The Markdown line that ends every results file: how to make it again, from which commit, when, on what
    machine, under which regression baseline."""
    from benchmarks.provenance import describe_machine

    commit = (record.get("commit") or "unknown")[:12] + (" with uncommitted changes" if record.get("dirty") else "")
    how = "recorded when it ran" if record.get("recorded") == "run" else "from git history: the commit that wrote it"
    machine = describe_machine(record.get("machine"))
    when = f"; {record['date']} on {machine}" if record.get("date") and machine else ""
    baseline = f"; baseline {record['baseline']}" if record.get("baseline") else ""
    return (f"_Provenance: `{record['command']}` at commit {commit} ({how}); config digest "
            f"{record.get('config_digest') or 'not recorded'}{when}{baseline}._")


def write_results(prefix: Path, report: dict[str, Any], markdown: Any, settings: Any,
                  round_values: bool = True, subprocesses: bool = False) -> None:
    """``<prefix>.json`` (the report, :func:`rounded` unless ``round_values`` is false, with its
    :func:`provenance` under ``"provenance"``) and ``<prefix>.md`` (``markdown(report)``, or the text ``markdown``,
    ending with the :func:`provenance_line`; the used files are in the JSON). ``settings``: what the run was asked
    for (its parsed arguments or its settings dataclass); ``subprocesses``: the run started the project in other
    processes (:func:`used_files`)."""
    from snapvit_pl.io import write_json_atomic, write_text_atomic

    report = {**(rounded(report) if round_values else report), "provenance": provenance(settings, subprocesses)}
    text = markdown(report) if callable(markdown) else markdown
    write_json_atomic(prefix.with_suffix(".json"), report)
    write_text_atomic(prefix.with_suffix(".md"), text.rstrip("\n") + "\n\n" + provenance_line(report["provenance"]) + "\n")


def write_markdown(path: Path, text: str, settings: Any, subprocesses: bool = False) -> None:
    """A results file that is Markdown only: ``text``, ending with the :func:`provenance_lines` of ``settings``."""
    from snapvit_pl.io import write_text_atomic

    write_text_atomic(path, text.rstrip("\n") + "\n\n" + provenance_lines(provenance(settings, subprocesses)) + "\n")
