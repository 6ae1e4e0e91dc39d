"""A run's progress: what an interrupted run saves (``resume_state.pt``) and how a resumed one continues from it.
Functions over a :class:`~snapvit_pl.pipeline.Pipeline`."""
from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError
from ..models.surgery import architecture
from ..run.names import RESUME_FILE
from ..run.resume import check_inputs, check_resume_state, save_resume_state
from ..scoring import LocalScores
from ..search.loop import SearchProgress
from . import data_source
from .importance import record_scorer_choices
from .state import Timings

if TYPE_CHECKING:  # (annotations only)
    from .driver import Pipeline


def state_dict(pipe: "Pipeline") -> dict[str, Any]:
    """What an interrupted run needs to continue exactly (tensors, numbers, strings and lists only)."""
    return {
        "fingerprint": pipe.state.fingerprint, "timings": pipe.state.timings.to_dict(),
        "elapsed_s": pipe.state.elapsed(), "peak_memory_mb": dict(pipe.state.peak_memory_mb),
        "local": None if pipe.state.local is None else pipe.state.local.to_dict(),
        "search": None if pipe.work.search_progress is None else pipe.work.search_progress.to_dict(),
        "inputs": pipe.state.inputs,
        "scorer_choices": dict(pipe.work.scorer_choices),
    }


def load_state_dict(pipe: "Pipeline", state: dict[str, Any]) -> None:
    """Continue the run ``state`` describes: its local scores (the importance pass is skipped), its search
    progress, its timings so far.

    Raises:
        CheckpointError: the base weights are not those the run started with.
        DataError: the pruning images are not those the run read (:func:`~snapvit_pl.run.resume.check_inputs`
            against :func:`~.data_source.record_inputs`, when this pipeline recorded them).
    """
    check_resume_state(state, architecture(pipe.model), [f.name for f in fields(Timings)],
                       pipe.run_dir / RESUME_FILE if pipe.run_dir else "the resume state")
    pipe.resumed = True  # its run folder holds this run's progress: continued, not refused as another run's
    saved = state.get("fingerprint")
    if saved not in (None, pipe.state.fingerprint):
        raise CheckpointError(
            f"the base weights changed since the run started (fingerprint {saved[:12]} != "
            f"{pipe.state.fingerprint[:12]}): resume with the weights it started with, or start a new run"
        )
    check_inputs(state.get("inputs"), data_source.current_inputs(pipe), kept=state.get("local") is not None
                 or state.get("search") is not None)
    pipe.state.timings = type(pipe.state.timings)(**state.get("timings", {}))
    pipe.state.elapsed_before = float(state.get("elapsed_s", 0.0))
    pipe.state.peak_memory_mb.update(state.get("peak_memory_mb", {}))
    if state.get("local") is not None:
        pipe.state.local = LocalScores.from_dict(state["local"])
        record_scorer_choices(pipe, state.get("scorer_choices", {}))
        pipe.end_stage("importance")
    if state.get("search") is not None:
        pipe.work.search_progress = SearchProgress.from_dict(state["search"])


def save_progress(pipe: "Pipeline") -> None:
    """Write the run's progress to ``<run_dir>/resume_state.pt`` (rank 0; nothing without a run directory)."""
    if pipe.run_dir is not None and pipe.dist.is_main:
        pipe.hold_folder()
        save_resume_state(pipe.run_dir, state_dict(pipe))
