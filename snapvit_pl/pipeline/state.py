"""The typed state a pruning run hands from stage to stage: importance -> search -> export -> report."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Iterator, Optional

from torch import nn

from ..elastic.budget import Budget
from ..elastic.splits import SplitTable
from ..models.cost import macs
from ..models.loading import BackboneSpec
from ..models.units import Subnet
from ..scoring.base import LocalScores
from ..search.loop import SearchProgress, SearchResult
from .splits import SplitChoice

#: Evaluation results that depend on the machine and the moment, not on the model: kept out of saved models.
MEASURED_KEYS = ("timings_s", "throughput_images_per_s", "throughput_batch_size", "throughput_device", "peak_memory_mb")

#: The stages, in the order they run.
STAGES = ("importance", "search", "splits", "export", "report")


@dataclass
class Timings:
    """Wall-clock seconds per stage; ``None`` for a stage that did not run in this process."""

    scoring_s: Optional[float] = None
    search_s: Optional[float] = None
    splits_s: Optional[float] = None
    export_s: Optional[float] = None
    correction_s: Optional[float] = None
    evaluation_s: Optional[float] = None
    total_s: Optional[float] = None

    def add(self, stage: str, seconds: float) -> None:
        """Add ``seconds`` to ``<stage>_s``."""
        name = f"{stage}_s"
        setattr(self, name, (getattr(self, name) or 0.0) + seconds)

    @contextmanager
    def measure(self, stage: str) -> Iterator[None]:
        """Time the block and add it to ``<stage>_s``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - started)

    def to_dict(self) -> dict[str, float]:
        """The stages that ran, rounded to milliseconds."""
        return {f.name: round(getattr(self, f.name), 3) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass
class DenseModel:
    """Size (and, when evaluated, metrics) of the unpruned base model."""

    params: int
    flops: int
    metrics: Optional[dict[str, Any]] = None


@dataclass
class ExtractedModel:
    """One pruned model cut from the elastic scores at a budget.

    Attributes:
        label: short name, e.g. ``mlp0.35_head0.20`` or ``flops0.5`` (its directory under ``models/``).
        budget: the budget asked for.
        subnet: kept heads / neurons per block (indices into the base model).
        mlp_ratio, head_ratio: share of the base model's MLP neurons / heads removed in this model (counted from its
            widths against the dense widths: what the report's tables show).
        params, flops: exact size of the pruned model (one image).
        model: the pruned module while it is post-processed (released after export).
        metrics: evaluation results, when evaluated.
        metrics_as_cut: the evaluation of the model as cut, before its correction, when corrected and evaluated.
        correction: what the weight correction did, when applied.
        checkpoint: path of the saved checkpoint relative to the run directory, when saved.
        latency_ms, predicted_latency_ms: measured and table-predicted milliseconds per batch, when a latency
            table was used (a latency budget).
        requested_mlp_ratio, requested_head_ratio: the prune ratios the budget resolved to, as asked of the ranking
            (before whole units and the MLP width rounding: a model removes at most this share of heads).
        rounding: what ``export.mlp_multiple`` changed, when the rounded MLP widths differ from what the requested
            ratio keeps: ``{"mlp_multiple": 8, "extra_neurons": 12}`` (neurons kept beyond the request; negative:
            removed beyond it).
    """

    label: str
    budget: Budget
    subnet: Subnet
    mlp_ratio: float
    head_ratio: float
    params: int
    flops: int
    model: Optional[nn.Module] = None
    metrics: Optional[dict[str, Any]] = None
    metrics_as_cut: Optional[dict[str, Any]] = None
    correction: Optional[dict[str, Any]] = None
    checkpoint: Optional[str] = None
    latency_ms: Optional[float] = None
    predicted_latency_ms: Optional[float] = None
    requested_mlp_ratio: Optional[float] = None
    requested_head_ratio: Optional[float] = None
    rounding: Optional[dict[str, Any]] = None

    def record(self) -> dict[str, Any]:
        """JSON-ready description (the report's ``pruned`` entries, the checkpoint's ``extra``)."""
        entry: dict[str, Any] = {
            "label": self.label, "budget": self.budget.to_dict(), "mlp_ratio": round(self.mlp_ratio, 6),
            "head_ratio": round(self.head_ratio, 6),
            **{key: round(value, 6) for key in ("requested_mlp_ratio", "requested_head_ratio")
               if (value := getattr(self, key)) is not None},
            "params": self.params, "flops": self.flops, "macs": macs(self.flops),
            "heads": self.subnet.head_counts, "mlp_hidden": self.subnet.neuron_counts,
        }
        for key in ("rounding", "metrics", "metrics_as_cut", "correction", "checkpoint", "latency_ms",
                    "predicted_latency_ms"):
            if getattr(self, key) is not None:
                entry[key] = getattr(self, key)
        return entry

    def checkpoint_record(self) -> dict[str, Any]:
        """What the saved model records (``architecture.json``'s ``extra``): :meth:`record` without what depends on
        the machine or the moment (timings, throughput, latency, memory), so that a model is byte-identical
        however its run was interrupted and resumed; report.json keeps those."""
        entry = {k: v for k, v in self.record().items() if k not in ("checkpoint", "latency_ms", "predicted_latency_ms")}
        for key in ("metrics", "metrics_as_cut"):
            if key in entry:
                entry[key] = {k: v for k, v in entry[key].items() if k not in MEASURED_KEYS}
        if "correction" in entry:
            entry["correction"] = {k: v for k, v in entry["correction"].items() if k != "seconds"}
        return entry


@dataclass
class StageWork:
    """What a run's stages hand each other while it works (the results are in :class:`RunState`).

    Attributes:
        checked: the checks before any work are done (:func:`snapvit_pl.pipeline.export_stage.check`).
        data_context: what the data tells the scorer (:func:`snapvit_pl.pipeline.data_source.use_datamodule`).
        inputs_source: the DataModule whose fingerprint the run records (``record_inputs``).
        importance_pass: the importance stage's loop, its scorer bound (between its start and its end).
        importance_started: the importance stage in progress: ``{"started": perf_counter, "memory": PeakMemory}``.
        scorer_choices: what the scorer chose for itself (kept in the resume state).
        search_progress: the search's progress (kept in the resume state).
        splits: the chosen splits, as the elastic scores record them.
    """

    checked: bool = False
    data_context: dict[str, Any] = field(default_factory=dict)
    inputs_source: Any = None
    importance_pass: Any = None
    importance_started: Optional[dict[str, Any]] = None
    scorer_choices: dict[str, str] = field(default_factory=dict)
    search_progress: Optional[SearchProgress] = None
    splits: SplitTable = field(default_factory=SplitTable)


@dataclass
class RunState:
    """Everything one pruning run has produced so far; each stage reads what the earlier ones wrote.

    Args:
        spec: how the base model was built.
        fingerprint: :func:`snapvit_pl.models.fingerprint` of the base weights.
    """

    spec: BackboneSpec
    fingerprint: str
    method: dict[str, Any] = field(default_factory=dict)  # how the scores are computed (scorer, search settings)
    completed: list[str] = field(default_factory=list)  # the stages done, in order
    not_run: list[str] = field(default_factory=list)  # the stages the run did not make (a Trainer without their callback)
    local: Optional[LocalScores] = None
    search: Optional[SearchResult] = None
    splits: list[SplitChoice] = field(default_factory=list)
    dense: Optional[DenseModel] = None
    extracted: list[ExtractedModel] = field(default_factory=list)
    scores_file: Optional[str] = None
    correction: dict[str, Any] = field(default_factory=dict)  # what the export did about the weight correction
    skipped_files: dict[str, list[str]] = field(default_factory=dict)  # unreadable data files passed over, per split
    inputs: Optional[dict[str, Any]] = None  # what the run reads of its data (VisionDataModule.input_fingerprint)
    timings: Timings = field(default_factory=Timings)
    peak_memory_mb: dict[str, float] = field(default_factory=dict)  # per stage (the kind: memory_kind)
    memory_kind: str = ""  # "CUDA max allocated" or "process peak RSS"
    elapsed_before: float = 0.0  # seconds spent by earlier processes of this run (a resumed run)
    started: float = field(default_factory=time.perf_counter)  # this process's start

    def elapsed(self) -> float:
        """Wall time of the whole run so far, over every process."""
        return self.elapsed_before + time.perf_counter() - self.started
