"""The images a finished run read, taken back to cut more budgets later (``snapvit-pl extract``,
:meth:`snapvit_pl.pipeline.Pipeline.from_run`).

A budget the run did not choose a split for is raced on the run's fitness images, as the run would have raced it,
only when those images are the files the run read: the data section of the run's ``config.yaml`` is instantiated,
and the fitness subset's fingerprint (path, label, content of each file) is compared with the one the run's
``resume_state.pt`` recorded (their content and labels, in order, wherever they lie now). Anything else (no such
file, another run's folder, images changed) gives no data and the reason, and the split is interpolated between the
recorded ones. :func:`images_the_run_read` makes the same check of images given another way (``extract --config``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..errors import SnapViTError
from .names import CONFIG_FILE, RESUME_FILE
from .resume import load_resume_state


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
    if not config.is_file():
        return RunData(None, f"there is no {CONFIG_FILE} in {run_dir}")
    try:
        recorded, why_not = _recorded(run_dir, scores)
        if why_not:
            return RunData(None, why_not)
        settings = yaml.safe_load(config.read_text(encoding="utf-8"))
        section = settings.get("data") if isinstance(settings, dict) else None
        if not section:
            return RunData(None, f"the run behind {config} recorded no data it read")
        parser = ArgumentParser(exit_on_error=False)
        parser.add_subclass_arguments(VisionDataModule, "data")
        data = parser.instantiate(parser.parse_object({"data": section})).data
        why_not = _compare(data, recorded, num_images, f"the images {config} names")
    except (SnapViTError, argparse.ArgumentError, yaml.YAMLError, OSError, TypeError, ValueError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return RunData(None, f"the data of {config} cannot be read here ({reason})")
    return RunData(None if why_not else data, why_not)


def images_the_run_read(run_dir: str | Path, scores: Any, datamodule: Any, num_images: int,
                        named: str = "the images given") -> str:
    """Why ``datamodule``'s seeded subset of ``num_images`` fitness images is not the files the run in ``run_dir``
    read (``""`` when it is): the same content and labels, in the same order, wherever the files now lie (a data set
    moved to another root is the same data). ``named``: how the message names the images.

    Raises:
        DataError: a file of ``datamodule`` that cannot be read.
    """
    recorded, why_not = _recorded(Path(run_dir), scores)
    return why_not or _compare(datamodule, recorded, num_images, named)


def _recorded(run_dir: Path, scores: Any) -> tuple[Optional[dict[str, Any]], str]:
    """The input fingerprint the run in ``run_dir`` recorded (``resume_state.pt``), or None and why not."""
    if not (run_dir / RESUME_FILE).is_file():
        return None, f"there is no {RESUME_FILE} (what the run read) in {run_dir}"
    state = load_resume_state(run_dir)
    if state.get("fingerprint") != scores.fingerprint:
        return None, f"{run_dir} is another run's folder (its base weights are not the scores')"
    if state.get("inputs") is None:
        return None, f"the run in {run_dir} recorded no data it read"
    return state["inputs"], ""


def _compare(datamodule: Any, recorded: dict[str, Any], num_images: int, named: str) -> str:
    """Why the fitness images of ``datamodule`` are not among those of ``recorded`` (a run's input fingerprint: the
    pruning pass's images and the fitness images, in index order), compared by label and content in that order."""
    current = datamodule.input_fingerprint([num_images])
    if "samples" in recorded and not set(current.get("samples", ())) <= set(recorded["samples"]):
        return f"{named} are not those the run read (other samples of the same files: the data's seed or " \
               f"max_samples differ)"
    then = [(label, sha) for _, label, _, _, sha in recorded["files"]]
    differ, at = [], 0
    for path, label, _, _, sha in current["files"]:
        try:
            at = then.index((label, sha), at) + 1  # (the run's files, in its order, wherever they lie now)
        except ValueError:
            differ.append(path)
    if differ or (current["split"], current["listed"]) != (recorded.get("split"), recorded.get("listed")):
        example = f", e.g. {differ[0]}" if differ else \
            f"; {current['listed']} images listed, {recorded.get('listed')} then"
        return f"{named} are not those the run read ({len(differ)} of {len(current['files'])} files differ{example})"
    return ""
