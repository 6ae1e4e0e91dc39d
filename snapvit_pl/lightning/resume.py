"""Resumable pruning runs: what each stage has done, saved atomically in the run directory.

``resume_state.pt`` is written when the run starts (nothing done yet), by ``ImportanceCallback`` once
the local scores are complete, and by ``SearchCallback`` after every round of evaluations, so a run
killed at any point loses at most one evaluation per rank (an importance pass cut short restarts).
``prune.py --resume RUN_DIR`` reloads the run's ``config.yaml`` and this file and continues; the
result equals that of an uninterrupted run with the same seed. A resume is refused when the base
weights changed (their fingerprint) or when an override changes what the run computes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import pytorch_lightning as pl
import torch
import yaml

from ..errors import CheckpointError, ConfigError
from ..io import atomic_path
from ..models.loading import UNREADABLE_CHECKPOINT
from ..pipeline.state import Timings

RESUME_FILE = "resume_state.pt"
RUN_KEY = "run"  # the run's own record in the resume state: base fingerprint, timings so far

#: Settings a resumed run may change: they change how the run reports, not what it computes.
SAFE_RESUME_OVERRIDES = ("verbose", "resume", "overwrite", "trainer.enable_progress_bar", "report.print_table",
                         "report.plots")


def save_resume_state(trainer: pl.Trainer) -> None:
    """Write the run's record and ``{state_key: state_dict()}`` of every callback marked ``resumable`` (rank 0)."""
    if not trainer.is_global_zero:
        return
    state: dict[str, Any] = {cb.state_key: cb.state_dict() for cb in trainer.callbacks if getattr(cb, "resumable", False)}
    module = trainer.lightning_module
    run = getattr(module, "state", None)
    if run is not None:
        state[RUN_KEY] = {"fingerprint": run.fingerprint, "timings": run.timings.to_dict(), "elapsed_s": run.elapsed()}
    with atomic_path(Path(trainer.default_root_dir) / RESUME_FILE) as tmp:
        torch.save(state, tmp)


def start_resume_state(run_dir: str | Path, module: Any) -> None:
    """The state of a run that has done nothing yet: resuming it starts every stage afresh."""
    run = module.state
    with atomic_path(Path(run_dir) / RESUME_FILE) as tmp:
        torch.save({RUN_KEY: {"fingerprint": run.fingerprint, "timings": {}, "elapsed_s": run.elapsed()}}, tmp)


def has_progress(run_dir: str | Path) -> bool:
    """Whether an interrupted run in ``run_dir`` saved any stage's progress (worth resuming)."""
    try:
        state = load_resume_state(run_dir)
    except CheckpointError:
        return False
    return any(value for key, value in state.items() if key != RUN_KEY and isinstance(value, dict)
               and any(v is not None for v in value.values()))


def load_resume_state(run_dir: str | Path) -> dict[str, Any]:
    """Read the resume state of ``run_dir``; ``CheckpointError`` if missing or unreadable."""
    path = Path(run_dir) / RESUME_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} not found: {run_dir} is not an interrupted prune.py run (nothing to resume)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except UNREADABLE_CHECKPOINT as err:
        raise CheckpointError(f"{path} is unreadable ({str(err).splitlines()[0][:200]}); start the run again") from err


def override_pairs(overrides: list[str]) -> list[tuple[str, str]]:
    """``["--a.b=1", "--c", "x"]`` -> ``[("a.b", "1"), ("c", "x")]`` (a flag without a value gets "true")."""
    pairs, i = [], 0
    while i < len(overrides):
        arg = overrides[i]
        if arg.startswith("--") and "=" in arg:
            key, value = arg[2:].split("=", 1)
        elif arg.startswith("--"):
            has_value = i + 1 < len(overrides) and not overrides[i + 1].startswith("--")
            key, value = arg[2:], overrides[i + 1] if has_value else "true"
            i += has_value
        else:
            key, value = arg, ""
        pairs.append((key, value))
        i += 1
    return pairs


def changed_settings(saved_config: str, overrides: list[str], safe: Iterable[str] = SAFE_RESUME_OVERRIDES) -> list[str]:
    """The keys of ``overrides`` (command-line arguments) whose values differ from the saved configuration's,
    safe keys excepted."""
    saved = yaml.safe_load(saved_config) or {}
    safe = tuple(safe)
    changed = []
    for key, value in override_pairs(overrides):
        if any(key == s or key.startswith(s + ".") for s in safe):
            continue
        node: Any = saved
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        try:
            given = yaml.safe_load(value) if value else value
        except yaml.YAMLError:
            given = value
        if given != node:
            changed.append(key)
    return sorted(set(changed))


def check_resume(saved_config: str, overrides: list[str]) -> None:
    """Refuse a resume whose command-line overrides change what the run computes.

    Raises:
        ConfigError: naming the changed settings.
    """
    changed = changed_settings(saved_config, overrides)
    if changed:
        shown = ", ".join(f"--{key}" for key in changed[:5]) + (" ..." if len(changed) > 5 else "")
        raise ConfigError(
            f"--resume keeps the interrupted run's settings, but {shown} would change what it computes; "
            f"resume without these overrides, or start a new run (another --out_dir) with them"
        )


def restore_run(trainer: pl.Trainer, module: Any, state: dict[str, Any]) -> None:
    """Check the base weights against the interrupted run's, then hand each resumable callback its saved
    state and the module its timings so far.

    Raises:
        CheckpointError: the base weights are not those the run started with.
    """
    run = state.get(RUN_KEY, {})
    if run.get("fingerprint") not in (None, module.state.fingerprint):
        raise CheckpointError(
            f"the base weights changed since the run started (fingerprint {run['fingerprint'][:12]} != "
            f"{module.state.fingerprint[:12]}): resume with the weights it started with, or start a new run"
        )
    module.state.timings = Timings(**run.get("timings", {}))
    module.state.elapsed_before = float(run.get("elapsed_s", 0.0))
    for cb in trainer.callbacks:
        if getattr(cb, "resumable", False) and cb.state_key in state:
            cb.load_state_dict(state[cb.state_key])
