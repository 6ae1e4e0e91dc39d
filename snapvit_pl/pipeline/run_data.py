"""The images a finished run read, taken back to cut more budgets later (``snapvit-pl extract``,
:meth:`snapvit_pl.pipeline.Pipeline.from_run`).

A budget the run did not choose a split for is raced on the run's fitness images, as the run would have raced it,
only when those images are the files the run read: the data section of the run's ``config.yaml`` is instantiated,
and the fitness subset's fingerprint (path, label, content of each file) is compared with the one the run's
``resume_state.pt`` recorded. Anything else (no such file, another run's folder, images changed or moved) gives no
data and the reason, and the split is interpolated between the recorded ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..errors import SnapViTError
from .resume import CONFIG_FILE, RESUME_FILE, load_resume_state


@dataclass(frozen=True)
class RunData:
    """The data module of a run's ``config.yaml`` (its images those the run read), or None and why not."""

    datamodule: Optional[Any]
    why_not: str = ""


def run_data(run_dir: str | Path, scores: Any, num_images: int) -> RunData:
    """The DataModule of the run in ``run_dir`` that wrote ``scores`` (the ``data`` section of its
    ``config.yaml``), when the seeded subset of ``num_images`` fitness images it gives is the files the run read;
    otherwise none, with the reason (never raises for a run folder that cannot give them)."""
    import argparse

    import yaml
    from jsonargparse import ArgumentParser

    from ..data import VisionDataModule

    run_dir = Path(run_dir)
    config = run_dir / CONFIG_FILE
    if not config.is_file() or not (run_dir / RESUME_FILE).is_file():
        missing = CONFIG_FILE if not config.is_file() else f"{RESUME_FILE} (what the run read)"
        return RunData(None, f"there is no {missing} in {run_dir}")
    try:
        state = load_resume_state(run_dir)
        if state.get("fingerprint") != scores.fingerprint:
            return RunData(None, f"{config} is another run's (its base weights are not the scores')")
        recorded = state.get("inputs")
        settings = yaml.safe_load(config.read_text(encoding="utf-8"))
        section = settings.get("data") if isinstance(settings, dict) else None
        if recorded is None or not section:
            return RunData(None, f"the run behind {config} recorded no data it read")
        parser = ArgumentParser(exit_on_error=False)
        parser.add_subclass_arguments(VisionDataModule, "data")
        data = parser.instantiate(parser.parse_object({"data": section})).data
        current = data.input_fingerprint([num_images])
    except (SnapViTError, argparse.ArgumentError, yaml.YAMLError, OSError, TypeError, ValueError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return RunData(None, f"the data of {config} cannot be read here ({reason})")
    read = {path: (label, sha) for path, label, _, _, sha in recorded["files"]}
    differ = [path for path, label, _, _, sha in current["files"] if read.get(path) != (label, sha)]
    if differ or (current["split"], current["listed"]) != (recorded.get("split"), recorded.get("listed")):
        example = f", e.g. {differ[0]}" if differ else f"; {current['listed']} images listed, {recorded.get('listed')} then"
        return RunData(None, f"the images {config} names are not those the run read ({len(differ)} of "
                             f"{len(current['files'])} files differ{example})")
    return RunData(data)
