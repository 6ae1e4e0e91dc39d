"""Every setting of a pruning run, one dataclass per stage: the one home of each default.

The field names are the YAML keys of ``prune.py`` (``search.max_evaluations``, ``export.budgets``, ...);
the library functions take these objects, so a default is written once, here or in the stage's own
layer (:class:`snapvit_pl.search.SearchSettings`, :class:`snapvit_pl.correction.CorrectionSettings`,
:class:`snapvit_pl.eval.EvaluationSettings`), and re-exported together as :class:`PipelineSettings`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Optional

from jsonargparse.typing import register_type

from ..correction import CorrectionSettings
from ..elastic.budget import Budget, check_unique_labels, default_budgets
from ..elastic.ranking import MIN_HEAD_KEEP, MIN_MLP_KEEP
from ..errors import ConfigError
from ..ranges import ClosedUnitInterval, HalfOpenUnitInterval, OpenUnitInterval, PositiveInt, check_fields, one_of
from ..eval.suite import EvaluationSettings
from ..scoring import DEFAULT_SCORER, Scorer
from ..scoring.base import Allocation
from ..run.names import RUN_DIR_NAMES, SCORES_FILE
from ..search.settings import SearchSettings

#: What elastic scores record of the export: the MLP width rounding and how the run split its cost budgets (a budget
#: cut later from the scores, with the run's images, is raced with them: :meth:`Pipeline.from_scores`).
RECORDED_EXPORT = ("mlp_multiple", "split", "split_candidates", "split_step", "split_images")
#: The search settings that define the fitness (its images, their batches, its PCA), as the scores record them.
FITNESS_SEARCH = ("num_images", "batch_size", "pca_components")

# Budgets are parsed at the edge: the command line's parser reads ``{flops: 0.5}`` (or ``flops=0.5``) with
# Budget.parse, which names a mistyped key or an impossible value, and writes a budget back as its own fields.
register_type(Budget, serializer=Budget.to_dict, deserializer=Budget.parse)


@dataclass
class ImportanceSettings:
    """Which local score, how blocks are compared, and how much of each block is protected from pruning.

    Args:
        scorer: any :class:`snapvit_pl.scoring.Scorer` (default :data:`snapvit_pl.scoring.DEFAULT_SCORER`, the
            label-free ``GaussNewtonGreedy()``).
        allocation: how the scores of different blocks are compared by the global ranking: ``global`` (as they are,
            the default), ``uniform`` (each block loses the same share: Minitron's and Wanda-sp's published
            allocation) or ``standardized`` (per-block z-scores: FLAP's); see ``LocalScores.allocated``.
        min_mlp_keep: share of each block's MLP neurons never pruned.
        min_head_keep: share of each block's heads never pruned.

    Both keep ratios reach the scorer too when the run binds it (:class:`snapvit_pl.scoring.base.ScoringContext`: the
    ``gn_greedy`` order needs them), so that they have one source.
    """

    scorer: Optional[Scorer] = None
    allocation: Allocation = "global"
    min_mlp_keep: ClosedUnitInterval = MIN_MLP_KEEP
    min_head_keep: ClosedUnitInterval = MIN_HEAD_KEEP

    def __post_init__(self) -> None:
        if self.scorer is None:
            self.scorer = DEFAULT_SCORER()
        check_fields(self, "importance")

    def scorer_record(self) -> dict[str, Any]:
        """The scorer's name and constructor arguments, for the record."""
        return {"name": self.scorer.name, **self.scorer.config()}


#: How a cost budget divides between heads and MLP neurons (``export.split``).
Split = one_of("fitness", "schedule")


@dataclass
class ExportSettings:
    """Which pruned models a run writes, and how cost budgets divide between heads and MLP neurons.

    Args:
        budgets: :class:`snapvit_pl.elastic.Budget` objects, or dicts of their fields, e.g.
            ``{"mlp_ratio": 0.35, "head_ratio": 0.2}``, ``{"sparsity": 0.4}``, ``{"flops": 0.5}``,
            ``{"params": 20e6}``, ``{"latency": 12.5}``; default: 10%, 20%, ... 60% of the parameters removed
            (``{"sparsity": 0.1}`` ...). Parsed once into ``Budget`` objects.
        mlp_multiple: round MLP widths to this multiple (8 or 16 suit most hardware).
        split: how a sparsity / params / FLOPs budget is divided between heads and MLP neurons:
            ``fitness`` tries ``split_candidates`` head ratios around the schedule's and keeps the one
            whose sub-network drifts least from the dense embeddings, for every budget asked for and for a
            grid of parameter and FLOPs budgets (every ``split_grid`` of the dense cost), all recorded in the
            elastic scores so that any later budget interpolates between them; ``schedule`` always uses
            ``head_ratio = mlp_ratio - 0.15``. Ratio pairs fix their own split.
        split_candidates: head ratios tried per budget with ``split: fitness``.
        split_step: spacing of those head ratios.
        split_grid: spacing of the grid of kept parameter and FLOPs fractions (twice that above one half; 0: only the
            budgets asked for).
        split_images: fitness images every candidate split of a budget asked for is raced on first; the candidates
            that may still win go on to twice as many, up to all of them (``search.num_images`` or more: every
            candidate on every image). A grid point races from ``snapvit_pl.search.race.MIN_IMAGES`` images to
            at most ``snapvit_pl.pipeline.splits.GRID_IMAGES``.
        latency_batch_size: batch size of the latency table (for ``{"latency": ms}`` budgets).
        latency_device: device of the latency table (default: the run's device).
        latency_table: the latency table's JSON file, reused when it was measured for this architecture, device
            and batch size, else measured and written (default: ``latency_table.json`` in the run directory).
        save_models: write the pruned checkpoints (else only the scores and the report).
        scores_file: file name of the elastic artifact in the run directory.
    """

    budgets: Optional[list[Budget]] = None
    mlp_multiple: PositiveInt = 1
    split: Split = "fitness"
    split_candidates: PositiveInt = 7
    split_step: OpenUnitInterval = 0.1
    split_grid: HalfOpenUnitInterval = 0.1
    split_images: PositiveInt = 128
    latency_batch_size: PositiveInt = 64
    latency_device: Optional[str] = None
    latency_table: Optional[str] = None
    save_models: bool = True
    scores_file: str = SCORES_FILE

    def __post_init__(self) -> None:
        check_fields(self, "export")
        name = PurePath(str(self.scores_file))
        if name.is_absolute() or ".." in name.parts or not name.parts or name.parts[0] in RUN_DIR_NAMES:
            raise ConfigError(f"export.scores_file {self.scores_file!r} must be a file name inside the run directory "
                              f"(--out_dir), not one of {', '.join(RUN_DIR_NAMES)}; e.g. elastic_scores.safetensors")
        if self.latency_table is not None and Path(self.latency_table).is_dir():
            raise ConfigError(f"export.latency_table {self.latency_table} is a directory; give a JSON file path")
        # the one place budgets are parsed: a malformed one, or two with one label, fails here, before any work
        self.budgets = default_budgets() if self.budgets is None else [Budget.parse(b) for b in self.budgets]
        check_unique_labels(self.budgets)


@dataclass
class ReportSettings:
    """What the report shows (report.json and report.md are always written).

    Args:
        print_table: print the summary table at the end of the run.
        plots: write the figures into ``plots/`` (and TensorBoard) and embed them in ``report.md``.
    """

    print_table: bool = True
    plots: bool = True


@dataclass
class PipelineSettings:
    """All the stages' settings: what a :class:`snapvit_pl.pipeline.Pipeline` runs with."""

    importance: ImportanceSettings = field(default_factory=ImportanceSettings)
    search: SearchSettings = field(default_factory=SearchSettings)
    export: ExportSettings = field(default_factory=ExportSettings)
    correction: CorrectionSettings = field(default_factory=CorrectionSettings)
    evaluation: EvaluationSettings = field(default_factory=EvaluationSettings)
    report: ReportSettings = field(default_factory=ReportSettings)

    def record(self) -> dict[str, Any]:
        """How the scores are computed, JSON-ready (recorded in the elastic scores and the report)."""
        allocation = self.importance.allocation
        return {"scorer": self.importance.scorer_record(), "search": self.search.to_dict(),
                **({} if allocation == "global" else {"allocation": allocation})}
