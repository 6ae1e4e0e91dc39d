"""Resumable runs: what the pipeline has done, saved atomically in the run directory (``resume_state.pt``).

The driver (:class:`snapvit_pl.pipeline.Pipeline`) writes it when a run starts (nothing done yet), once
the local scores are complete, and after every round of search evaluations, so a run killed at any
point loses at most one evaluation per rank (an importance pass cut short restarts). It holds no
pickled objects: tensors, numbers, strings and lists only; and a checksum of its content and of the run's
``config.yaml``, both checked when it is read back (a damaged file, or settings edited since, are refused). It also
records what the run reads of its data (``inputs``: :meth:`snapvit_pl.data.VisionDataModule.input_fingerprint`),
which a resume recomputes and compares (:func:`check_inputs`): a run never continues on other images.
"""
from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import torch

from ..errors import CheckpointError, ConfigError, DataError, field_error
from ..io import atomic_path, sha256_file, verify_checksum, with_checksum, write_bytes
from ..models.loading import UNREADABLE_CHECKPOINT
from .names import CONFIG_FILE, RESUME_FILE

_CONFIG_KEY = "config_sha256"
#: Settings a resumed run may change (``prune.py``'s keys): they change how the run reports, not what it computes.
SAFE_RESUME_OVERRIDES = ("config", "verbose", "resume", "overwrite", "out_dir", "progress", "trainer.enable_progress_bar",
                         "trainer.default_root_dir", "trainer.logger", "report.print_table", "report.plots")



def save_resume_state(run_dir: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` (a :meth:`Pipeline.state_dict`) to ``run_dir/resume_state.pt`` atomically, with its checksum
    and that of the run's ``config.yaml`` (when there is one)."""
    config = Path(run_dir) / CONFIG_FILE
    state = with_checksum({**state, _CONFIG_KEY: sha256_file(config) if config.is_file() else None})
    buffer = io.BytesIO()  # serialised first: a full disk is then an OSError of the write (torch's names no errno)
    torch.save(state, buffer)
    with atomic_path(Path(run_dir) / RESUME_FILE, size=buffer.getbuffer().nbytes) as tmp:
        write_bytes(tmp, buffer.getbuffer())


def load_resume_state(run_dir: str | Path) -> dict[str, Any]:
    """Read the resume state of ``run_dir``; ``CheckpointError`` if missing, unreadable, damaged, or if the run's
    ``config.yaml`` changed since it was written."""
    path = Path(run_dir) / RESUME_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} not found: {run_dir} is not an interrupted prune.py run (nothing to resume)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except UNREADABLE_CHECKPOINT as err:
        if "weights_only" in str(err):  # torch refused a pickled object (its own text suggests running it)
            raise CheckpointError(f"{path} holds pickled Python objects, which snapvit-pl never loads (they could run "
                                  "code; prune.py writes tensors, numbers and strings only); start the run again "
                                  "(another --out_dir)") from None
        reason = (str(err).strip().splitlines() or [f"{type(err).__name__}: empty or cut short"])[0][:200]
        raise CheckpointError(f"{path} is unreadable ({reason}); start the run again") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a resume state; start the run again")
    state = verify_checksum(state, path, "start the run again (another --out_dir)")
    config, recorded = Path(run_dir) / CONFIG_FILE, state.pop(_CONFIG_KEY, None)
    if recorded is not None and (not config.is_file() or sha256_file(config) != recorded):
        raise CheckpointError(f"{config} changed since the run started (edited or damaged): a resume keeps the run's "
                              "settings; restore the file, or start a new run (another --out_dir)")
    return state


def check_resume_state(state: dict[str, Any], widths: dict[str, list[int]], stages: Iterable[str], source: Any) -> None:
    """The schema of a resume state, before a field is used: timings per known stage and elapsed seconds as finite
    non-negative numbers, peak memory per device, the local scores as one finite 1-D vector per block of the model's
    widths (``widths``: :func:`snapvit_pl.models.architecture` of the base model), the search progress's kinds.
    ``stages``: the timings' field names (``Timings``'s).

    Raises:
        CheckpointError: one line naming ``source``, the field, what was found and what is allowed.
    """
    def refuse(field: str, found: Any, allowed: str) -> None:
        raise field_error(source, field, found, allowed, "start the run again (another --out_dir)")

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0

    stages = set(stages)
    timings = state.get("timings", {})
    if not isinstance(timings, dict) or any(k not in stages or not (v is None or number(v)) for k, v in timings.items()):
        refuse("timings", timings, f"seconds (or null) per stage of {', '.join(sorted(stages))}")
    if not number(state.get("elapsed_s", 0.0)):
        refuse("elapsed_s", state.get("elapsed_s"), "a number of seconds")
    memory = state.get("peak_memory_mb", {})
    if not isinstance(memory, dict) or not all(isinstance(k, str) and number(v) for k, v in memory.items()):
        refuse("peak_memory_mb", memory, "megabytes per device")
    local = state.get("local")
    if local is not None:
        if not isinstance(local, dict):
            refuse("local", local, "the local scores (heads and neurons per block)")
        for key, sizes in (("heads", widths["heads"]), ("neurons", widths["mlp_hidden"])):
            scores = local.get(key)
            try:  # one vector per block: tensors, or lists of numbers
                vectors = [torch.as_tensor(t, dtype=torch.float64) for t in scores]
            except (TypeError, ValueError, RuntimeError):
                vectors = None
            shapes = [tuple(v.shape) for v in vectors] if vectors is not None else scores
            if shapes != [(n,) for n in sizes] or not all(bool(torch.isfinite(v).all()) for v in vectors):
                refuse(f"local.{key}", shapes, f"finite scores of shapes {[(n,) for n in sizes]} (the model's blocks)")
    inputs = state.get("inputs")
    if inputs is not None and not _is_fingerprint(inputs):
        refuse("inputs", type(inputs).__name__, "the fingerprint of the pruning data (split, listed, files: "
               "[path, label, size, mtime_ns, sha256] each)")
    choices = state.get("scorer_choices", {})
    if not isinstance(choices, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in choices.items()):
        refuse("scorer_choices", choices, "what the scorer chose for itself, as names and words")
    search = state.get("search")
    if search is not None:
        fitness = search.get("initial_fitness") if isinstance(search, dict) else None
        if not isinstance(search, dict) or not isinstance(search.get("optimizer"), dict) or not (
                isinstance(fitness, (int, float)) and not isinstance(fitness, bool) and math.isfinite(fitness)):
            refuse("search", type(search).__name__, "the search's progress (optimizer state, initial fitness)")


def _is_fingerprint(inputs: Any) -> bool:
    """Whether ``inputs`` has the shape of :meth:`snapvit_pl.data.VisionDataModule.input_fingerprint`."""
    def integer(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def record(item: Any) -> bool:
        return (isinstance(item, list) and len(item) == 5 and isinstance(item[0], str) and integer(item[1])
                and integer(item[2]) and integer(item[3]) and isinstance(item[4], str) and len(item[4]) == 64)

    return (isinstance(inputs, dict) and isinstance(inputs.get("split"), str) and integer(inputs.get("listed"))
            and isinstance(inputs.get("files"), list) and all(record(item) for item in inputs["files"]))


def check_inputs(recorded: Any, current: Optional[dict[str, Any]], kept: bool = True) -> None:
    """Refuse a resume whose pruning data are not what the interrupted run read: ``recorded`` (its resume state's
    fingerprint) against ``current`` (:meth:`snapvit_pl.data.VisionDataModule.input_fingerprint` now; None: the
    run has no data module, nothing to compare). ``kept``: the state holds progress a resume keeps (without it, a
    state that recorded no fingerprint, a run stopped before its data were prepared, is no risk).

    The files a run read are compared by path, label and content (sha256), in order: an image replaced, removed,
    relabelled (moved to another class) or added among those read is refused. A file's modification time alone
    (``touch``, a copy that kept the bytes) is no change. A file the run does not read (a text file in the folder,
    an image in the val split, a file outside the seeded subset) is no change either; but an image added to (or
    removed from) the split the subset is drawn from usually changes the subset itself (the seeded draw runs over
    the whole list), and a different subset is refused: the resumed run would continue scores computed on other
    images.

    Raises:
        DataError: one line: how many files differ, one of them, and the fix.
    """
    if current is None:
        return
    if recorded is None and not kept:
        return
    if recorded is None:
        raise DataError("--resume: the interrupted run recorded no fingerprint of its pruning images, so a change "
                        "since cannot be ruled out; start a new run (another --out_dir)")

    def key(files: list) -> list[tuple]:
        return [(path, label, sha) for path, label, _, _, sha in files]

    before, now = key(recorded["files"]), key(current["files"])
    if "samples" in recorded and current.get("samples") != recorded["samples"] and before == now:
        raise DataError("--resume: the pruning images changed since the run was interrupted (other samples of the "
                        "same files: the data's seed or max_samples differ); restore the data settings, or start a new "
                        "run (another --out_dir)")
    if recorded.get("split") == current.get("split") and before == now:
        return
    old, new = {path: item for path, *item in before}, {path: item for path, *item in now}
    paths = list(dict.fromkeys([path for path, *_ in before] + [path for path, *_ in now]))
    differ = [path for path in paths if old.get(path) != new.get(path)] or paths  # (else: the same files reordered)
    example = f", e.g. {differ[0]}" if differ else ""
    listed = ""
    if recorded.get("listed") != current.get("listed"):
        listed = (f"; the {current.get('split')} split lists {current.get('listed')} images, "
                  f"{recorded.get('listed')} then, and the seeded subset is drawn from all of them")
    raise DataError(f"--resume: the pruning images changed since the run was interrupted ({len(differ)} of "
                    f"{len(paths)} files differ{example}{listed}); restore them, or start a new run "
                    "(another --out_dir)")


def has_progress(run_dir: str | Path) -> bool:
    """Whether an interrupted run in ``run_dir`` saved any stage's progress (worth resuming)."""
    try:
        state = load_resume_state(run_dir)
    except CheckpointError:
        return False
    return state.get("local") is not None or state.get("search") is not None


def changed_settings(saved: Mapping[str, Any], given: Mapping[str, Any]) -> list[str]:
    """The settings (flat ``group.key`` names) of ``given`` that differ from the interrupted run's ``saved`` ones,
    :data:`SAFE_RESUME_OVERRIDES` excepted."""
    safe = lambda key: any(key == s or key.startswith(s + ".") for s in SAFE_RESUME_OVERRIDES)  # noqa: E731
    return sorted(k for k in set(saved) | set(given) if not safe(k) and saved.get(k) != given.get(k))


def check_unchanged(saved: Mapping[str, Any], given: Mapping[str, Any]) -> None:
    """Refuse to resume a run with settings that change what it computes (:func:`changed_settings`).

    Raises:
        ConfigError: naming the first five such settings.
    """
    changed = changed_settings(saved, given)
    if changed:
        shown = ", ".join(f"--{key}" for key in changed[:5]) + (" ..." if len(changed) > 5 else "")
        raise ConfigError(f"--resume keeps the interrupted run's settings, but {shown} would change what it computes; "
                          "resume without these overrides, or start a new run (another --out_dir) with them")
