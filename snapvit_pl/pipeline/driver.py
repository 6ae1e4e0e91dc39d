"""The pipeline driver: SnapViT's stages, in their order, over one typed :class:`RunState`.

    importance -> search -> splits -> export -> report

:class:`Pipeline` is the one place that sequences them. Its callers:

- :func:`snapvit_pl.fit_elastic` (plain Python): :meth:`Pipeline.run` (importance, search, splits);
- ``prune.py``: one thin Lightning callback per stage (``snapvit_pl.callbacks``), each hook calling one
  method (the importance pass is Lightning's training epoch, so it comes in three calls:
  :meth:`~Pipeline.start_importance`, :meth:`~Pipeline.importance_step` per batch,
  :meth:`~Pipeline.finish_importance`);
- ``python -m snapvit_pl.extract``: :meth:`Pipeline.from_scores`, then :meth:`~Pipeline.export`.

A stage refuses to run before the stages it follows. The driver builds the base model's cost model
once, builds one fitness (the fitness images, their dense embeddings and PCA: the search and the split choice
share it), and saves the
run's progress (``resume_state.pt``) after the importance pass and every round of search evaluations.
"""
from __future__ import annotations

import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch
from torch import nn

from ..elastic.budget import Budget, CostModel
from ..elastic.latency import latency_table
from ..elastic.scores import ElasticScores
from ..elastic.splits import SplitTable
from ..device import PeakMemory
from ..errors import CheckpointError, ConfigError
from ..eval.suite import check_classes
from ..models.loading import BackboneSpec, fingerprint, load_backbone
from ..models.surgery import architecture
from ..models.modes import eval_mode
from ..progress import Progress, ProgressMode, shown_mode
from ..run.folder import FolderHints, RunFolder
from ..scoring import LocalScores
from ..scoring.base import ScoringContext
from ..search.fitness import EmbeddingFitness
from ..search.loop import SearchProgress, SearchResult, run_search
from ..search.population import AllGather, share_by_cost
from .extraction import (
    Correction, Evaluation, check_budgets, correction_record, extract_models, refuse_existing, resolved_model,
    throughput_alone, with_timed,
)
from .importance import AllReduceSum, ImportancePass
from .inputs import DataModuleInputs, LoaderInputs, StageInputs
from .report import write_report
from ..run.names import RESUME_FILE
from ..run.resume import check_inputs, check_resume_state, save_resume_state
from ..run.data import run_data as find_run_data
from .settings import ExportSettings, PipelineSettings
from .splits import SplitChoice, choose_splits, split_table
from .tables import percent_label
from .state import DenseModel, ExtractedModel, RunState, Timings

#: The stages, in the order they run.
STAGES = ("importance", "search", "splits", "export", "report")
#: What elastic scores record of the export: the MLP width rounding and how the run split its cost budgets (a budget
#: cut later from the scores, with the run's images, is raced with them: :meth:`Pipeline.from_scores`).
RECORDED_EXPORT = ("mlp_multiple", "split", "split_candidates", "split_step", "split_images")
#: The search settings that define the fitness (its images, their batches, its PCA), as the scores record them.
FITNESS_SEARCH = ("num_images", "batch_size", "pca_components")


@dataclass
class Distributed:
    """Where this process stands in a multi-process (DDP) run.

    Attributes:
        rank: this process's rank (0: the one that writes files).
        world_size: number of processes.
        all_reduce_sum: sums a tensor over processes (the scorers' statistics).
        all_gather: gathers a ``[k]`` tensor from every process into ``[world_size, k]`` (the search's fitness, the
            split choice).
        gather_objects: every process's (picklable) object, in rank order, on every process (the export's models).
    """

    rank: int = 0
    world_size: int = 1
    all_reduce_sum: Optional[AllReduceSum] = None
    all_gather: Optional[AllGather] = None
    gather_objects: Optional[Callable[[Any], list[Any]]] = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def gather(self, value: Any) -> list[Any]:
        """``value`` of every process, in rank order (``[value]`` in a single process)."""
        if self.world_size == 1:
            return [value]
        if self.gather_objects is None:
            raise RuntimeError("a multi-process run needs Distributed.gather_objects")
        return self.gather_objects(value)


@dataclass
class RunEvents:
    """What a caller wants to hear about (e.g. the Lightning logger); each may be None.

    Attributes:
        log_metrics: scalars ``{tag: value}`` at a step (the search's fitness per evaluation, ...).
        on_figure: each figure of the report, with its name, before it is closed.
        on_report: the finished report (``report.json``'s content).
    """

    log_metrics: Optional[Callable[[dict[str, float], int], None]] = None
    on_figure: Optional[Callable[[str, Any], None]] = None
    on_report: Optional[Callable[[dict[str, Any]], None]] = None


#: What the run calls on a DataModule besides Lightning's own (snapvit_pl.data.VisionDataModule has them all).
DATAMODULE_METHODS = ("configure_for_model", "unlabeled_images", "labeled_dataloader")


class Pipeline:
    """SnapViT on one pretrained ViT: its stages in order, over one :class:`RunState`.

    Args:
        model: a supported timm ViT (dense, pretrained), on the device to compute on; never modified.
        settings: every stage's settings (default :class:`PipelineSettings`).
        spec: how ``model`` is built (recorded so that its pruned models and scores can be rebuilt); default: its
            architecture name, without weights.
        inputs: the fitness / calibration images and evaluation data (:class:`DataModuleInputs`, :class:`TensorInputs`).
        seg_datamodule: a :class:`snapvit_pl.data.SegmentationDataModule` the ``seg`` metric (a linear probe's mIoU on
            patch tokens) evaluates every model on, when the inputs come from a DataModule (:meth:`use_datamodule`).
        run_dir: where the scores, models, report and progress are written (None: nothing is written): a folder, or a
            :class:`~snapvit_pl.run.folder.RunFolder` its caller holds. The pipeline takes the folder before it
            starts work (:meth:`hold_folder`) and holds it until :meth:`close` (or the end of a ``with`` block): a
            folder another run uses, or one holding an earlier run's results or files of yours, is refused then.
        overwrite: replace an earlier run in ``run_dir`` (only what that run wrote is removed).
        dist: this process's place in a DDP run (default: a single process).
        progress: ``auto`` (bars in a terminal, log lines elsewhere), ``bar``, ``lines`` or ``off``.
        events: who hears about metrics, figures and the report.

    Example::

        pipeline = Pipeline(model, PipelineSettings(search=SearchSettings(max_evaluations=50)),
                            inputs=TensorInputs(images))
        scores = pipeline.run(multicrop_batches)      # importance, search, splits
        models = pipeline.export([Budget(flops=0.5)])  # cut (correct, evaluate) each budget

        with Pipeline(model, settings, inputs=TensorInputs(images), run_dir="runs/mine") as pipeline:
            pipeline.run(multicrop_batches)            # the folder is taken (and checked) before any work
            pipeline.export()                          # scores, models, progress written there
            pipeline.report()
    """

    def __init__(
        self,
        model: nn.Module,
        settings: Optional[PipelineSettings] = None,
        *,
        spec: Optional[BackboneSpec] = None,
        inputs: Optional[StageInputs] = None,
        seg_datamodule: Any = None,
        run_dir: Optional[str | Path | RunFolder] = None,
        overwrite: bool = False,
        dist: Optional[Distributed] = None,
        progress: ProgressMode | bool = "auto",
        events: Optional[RunEvents] = None,
    ):
        self.progress = shown_mode(progress)  # checked here, once (a mode resolved already, as prune.py's, passes)
        self.model = model
        self.settings = settings or PipelineSettings()
        self.spec = spec or BackboneSpec(_architecture_name(model), pretrained=False)
        self.inputs = inputs or StageInputs()
        self.seg_datamodule = seg_datamodule
        self.folder = run_dir if isinstance(run_dir, RunFolder) or run_dir is None else RunFolder(
            run_dir, overwrite, self.settings.export.scores_file, hints=FolderHints("run_dir", "pass overwrite=True"))
        self.run_dir = None if self.folder is None else self.folder.path
        self.dist = dist or Distributed()
        self.events = events or RunEvents()
        self.state = RunState(self.spec, fingerprint(model), method=self.settings.record())
        #: the stages this run makes, in order (:meth:`use_stages`)
        self.stages: tuple[str, ...] = STAGES
        self._cost: Optional[CostModel] = None
        self._fitness_images: Optional[torch.Tensor] = None
        self._fitness: Optional[EmbeddingFitness] = None
        self._search_progress: Optional[SearchProgress] = None
        self._scorer_choices: dict[str, str] = {}  # what the scorer chose for itself (kept in the resume state)
        self._splits = SplitTable()  # the chosen splits, as the elastic scores record them
        self._importance: Optional[dict[str, Any]] = None  # the stage in progress: its start time and memory
        self._inputs_source: Any = None  # the DataModule whose fingerprint the run records (record_inputs)
        self._checked = False  # check() done
        self.resumed = False  # load_state_dict continued an interrupted run
        self._pass: Optional[ImportancePass] = None  # the importance stage's loop, its scorer bound (start_importance)
        self._data_context: dict[str, Any] = {}  # what the data tells the scorer (use_datamodule)

    # -- the run folder --------------------------------------------------------------------------------------
    def hold_folder(self) -> None:
        """Take the run folder (created, locked, checked: :class:`RunFolder`) before the run works or writes there;
        a no-op when it is held already (by this pipeline, ``prune.py`` or a :class:`PruningModule`), on processes
        other than the first, and without a run folder.

        Raises:
            ConfigError: the folder is in use by another run, or holds what this run may not replace.
        """
        if self.folder is not None and not self.folder.held and self.dist.is_main:
            self.folder.resume = self.folder.resume or self.resumed
            self.folder.open()

    def close(self) -> None:
        """Give the run folder up (what was written stays); a later write takes it again."""
        if self.folder is not None:
            self.folder.close()

    def __enter__(self) -> "Pipeline":
        self.hold_folder()
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        # a run that failed before it saved any progress leaves nothing behind
        if self.folder is not None and kind is not None:
            self.folder.abandon()
        else:
            self.close()

    # -- shared by the stages --------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def cost(self) -> CostModel:
        """The base model's exact parameter and FLOP counts per sub-network (built once)."""
        if self._cost is None:
            self._cost = CostModel(self.model)
        return self._cost

    def fitness_images(self) -> torch.Tensor:
        """The search's fitness images on the model's device (decoded once; the split choice reuses them)."""
        if self._fitness_images is None:
            self._fitness_images = self.inputs.fitness_images(self.settings.search).to(self.device)
        return self._fitness_images

    def fitness(self) -> EmbeddingFitness:
        """The run's one fitness (dense embeddings and PCA of the fitness images, built once): the search's
        objective and the judge of the splits."""
        if self._fitness is None:
            self._fitness = EmbeddingFitness(self.model, self.fitness_images(), self._local_scores(), self.settings.search,
                                             rank=self.dist.rank, world_size=self.dist.world_size,
                                             all_gather=self.dist.all_gather)
        return self._fitness

    def completed(self, stage: str) -> bool:
        return stage in self.state.completed

    def _show(self) -> ProgressMode | bool:
        return self.progress if self.dist.is_main else "off"

    def _begin(self, stage: str) -> None:
        missing = [s for s in STAGES[:STAGES.index(stage)] if s in self.stages and s not in self.state.completed]
        if missing:
            raise RuntimeError(f"the {stage} stage runs after {', '.join(missing)}: run those first")

    def use_stages(self, stages: Iterable[str]) -> None:
        """Make only ``stages`` of :data:`STAGES` (a Lightning Trainer without a stage's callback leaves it out):
        without ``search`` the block coefficients stay at their initial values, without ``export`` the run ends
        with the scores, without ``report`` nothing is reported; the importance and the splits always run (they
        make the scores).

        Raises:
            ConfigError: an unknown stage name.
        """
        stages = set(stages)
        unknown = sorted(stages - set(STAGES))
        if unknown:
            raise ConfigError(f"unknown pipeline stages {unknown}; the stages are {', '.join(STAGES)}")
        self.stages = tuple(s for s in STAGES if s in stages | {"importance", "splits"})

    def run_stage(self, stage: str) -> Any:
        """Run ``stage`` (unless done), after those of this run's earlier stages (:meth:`use_stages`) that have not
        run yet, in the pipeline's order: whoever asks first runs them, and no stage runs twice. Returns the stage's
        result (None when it was done already). The importance stage is a pass over the data: it is not run here."""
        methods = {"search": self.search, "splits": self.choose_splits, "export": self.export, "report": self.report}
        result = None
        for name in STAGES[1:STAGES.index(stage) + 1]:
            if (name in self.stages or name == stage) and not self.completed(name):
                result = methods[name]()
        return result

    def _end(self, stage: str) -> None:
        if stage not in self.state.completed:
            self.state.completed.append(stage)

    def _start_memory(self) -> PeakMemory:
        memory = PeakMemory(self.device).start()
        self.state.memory_kind = memory.kind
        return memory

    @contextmanager
    def _peak_memory(self, stage: str) -> Iterator[None]:
        """Record the stage's peak memory (``report.json``'s ``peak_memory_mb``)."""
        memory = self._start_memory()
        yield
        self.state.peak_memory_mb[stage] = round(memory.peak_mb(), 1)

    def check_data_source(self, datamodule: Any) -> bool:
        """Whether the run takes its later stages' images from a Trainer's ``datamodule`` (:meth:`use_datamodule`: one
        of :mod:`snapvit_pl.data`'s, or one with :data:`DATAMODULE_METHODS`) or, when it has none or another kind,
        from the batches of its train loader (:meth:`use_loader`, unless images were given otherwise, e.g.
        :class:`TensorInputs`).

        Raises:
            ConfigError: a plain loader on several processes (each would read all of it).
        """
        from ..data.base import VisionDataModule

        if datamodule is not None and (isinstance(datamodule, VisionDataModule)
                                       or all(callable(getattr(datamodule, m, None)) for m in DATAMODULE_METHODS)):
            return True
        if type(self.inputs) is StageInputs and self.dist.world_size > 1:
            given = "a plain loader" if datamodule is None else f"a {type(datamodule).__name__}"
            raise ConfigError(f"the Trainer was given {given} on {self.dist.world_size} processes: each would read all "
                              "of its images (the pruning run shards only its own DataModules); use one process, or "
                              "one of snapvit_pl.data's DataModules (ClassificationDataModule, ImageFolderDataModule)")
        return False

    def use_loader(self) -> None:
        """Take the later stages' images from the batches the importance pass reads (:class:`LoaderInputs`: a
        composed Trainer fitted on a plain loader, or on a DataModule without :data:`DATAMODULE_METHODS`)."""
        from .importance import scoring_views

        s = self.settings
        fitness = s.search.num_images if s.search.max_evaluations > 0 or s.export.split == "fitness" else 0
        calibration = s.correction.num_samples if s.correction.enabled else 0
        evaluation = ((s.evaluation.train_samples or sys.maxsize // 2, s.evaluation.val_samples or sys.maxsize // 2)
                      if set(s.evaluation.metrics) & {"knn", "linear", "head"} else None)
        self.inputs = LoaderInputs(scoring_views(s.importance.scorer), fitness, calibration, evaluation,
                                   model=self.model)

    def use_datamodule(self, datamodule: Any) -> None:
        """Take the run's data from a DataModule: set it up for the importance pass (the model's input format, the
        views the scorer needs) and read the later stages' images and evaluation data from it (and the ``seg``
        metric's from ``seg_datamodule``)."""
        from .importance import prepare_pruning_data

        self._data_context = prepare_pruning_data(datamodule, self.model, self.settings.importance.scorer)
        if not getattr(datamodule, "labeled", True):
            needs = [m for m in self.settings.evaluation.metrics if m != "throughput"]
            if needs or self.settings.importance.scorer.requires_labels:
                what = f"evaluation.metrics {needs}" if needs else f"the {self.settings.importance.scorer.name} scorer"
                raise ConfigError(f"{what} need labeled images, but {datamodule.root} is a folder of unlabeled images; "
                                  "set --evaluation.metrics '[]' (or [throughput]) and a label-free scorer, or give "
                                  "a labeled folder (root/train/<class>/..., root/val/...)")
        if getattr(datamodule, "labeled", True):
            check_classes(getattr(datamodule, "num_classes", None), self.settings.evaluation.metrics,
                          str(getattr(datamodule, "root", "the data")))
        if self.seg_datamodule is not None:
            self.seg_datamodule.configure_for_model(self.model)
        self.inputs = DataModuleInputs(datamodule, self.seg_datamodule)
        if self.state.inputs is None and self._inputs_source is datamodule:  # downloaded since record_inputs
            self._current_inputs()
            self.save_progress()

    def record_inputs(self, datamodule: Any) -> None:
        """Fingerprint what this run reads of ``datamodule``'s training split for its scores
        (:meth:`~snapvit_pl.data.VisionDataModule.input_fingerprint`): the pruning pass's subset (when the scorer
        reads data) and, when the search or the fitness split choice runs, the fitness images' subset. It is saved
        with the progress, and a resume recomputes and compares it before anything else (:meth:`load_state_dict`
        refuses other images). The calibration and evaluation images are not in it: a resumed run reads them afresh
        in full (the export always runs again), so they never mix with what the interrupted run read.

        Call it before the run's first :meth:`save_progress` or :meth:`load_state_dict`. A DataModule that downloads
        (``download: true``) is fingerprinted once it is prepared (:meth:`use_datamodule`, which then saves the
        progress) unless a resume needs it first; one without ``input_fingerprint`` records nothing.
        """
        if getattr(datamodule, "input_fingerprint", None) is None:
            return
        self._inputs_source = datamodule
        if not getattr(datamodule, "download", False):  # now: a data error comes before anything is written
            self._current_inputs()

    def _current_inputs(self) -> Optional[dict[str, Any]]:
        """The fingerprint :meth:`record_inputs` asked for, computed once (None: nothing recorded)."""
        if self.state.inputs is None and self._inputs_source is not None:
            s = self.settings
            sizes: list[Optional[int]] = [None] if s.importance.scorer.requires_data else []
            if s.search.max_evaluations > 0 or s.export.split == "fitness":
                sizes.append(s.search.num_images)
            self.state.inputs = self._inputs_source.input_fingerprint(sizes)
        return self.state.inputs

    # -- checks before any work ------------------------------------------------------------------------------
    def check(self) -> None:
        """Refuse now what would fail after the expensive stages: budgets the configured keep ratios
        (``importance.min_mlp_keep`` / ``min_head_keep``) cannot reach, metrics a pruning run cannot measure.

        Raises:
            PruningSpecError, ConfigError: naming the budget or setting.
        """
        if self._checked:  # once per run (prune.py checks before anything is written, the export callback again)
            return
        s = self.settings
        check_budgets(self.model, s.export.budgets, s.importance, s.export.mlp_multiple, self.cost)
        self._checked = True
        if "seg" in s.evaluation.metrics and self.seg_datamodule is None and not self.inputs.has_segmentation():
            raise ConfigError("evaluation.metrics: 'seg' needs segmentation data; give a SegmentationDataModule as "
                              "seg_data (e.g. the offline Fashion-MNIST canvases: --seg_data SegmentationDataModule "
                              "--seg_data.init_args.source fashion_mnist)")

    def check_latency(self, device: Optional[torch.device | str] = None) -> None:
        """When a budget asks for latency: measure the latency table now (once; cached in the run directory, reused
        by a resume) and refuse a latency budget it cannot reach, before the expensive stages. Rank 0 only.

        Args:
            device: where the run will compute (default: the model's device); ``export.latency_device`` wins.
        """
        s = self.settings
        if self.dist.is_main and any(b.latency is not None for b in s.export.budgets):
            check_budgets(self.model, s.export.budgets, s.importance, s.export.mlp_multiple,
                          self._cost_for(s.export.budgets, device))

    # -- stage 1: importance ---------------------------------------------------------------------------------
    def start_importance(self, batches: Optional[int] = None) -> None:
        """Bind the scorer to the model and reset it (a pass of ``batches`` batches follows); a no-op when the
        scores are complete already (a resumed run)."""
        self._begin("importance")
        if self.completed("importance"):
            return
        self.hold_folder()  # before any work: a folder this run may not write in is refused now
        self._pass = ImportancePass(self.settings.importance.scorer, self.model, self.scoring_context(),
                                    self.dist.all_reduce_sum, batches, self._show())
        self._importance = {"started": time.perf_counter(), "memory": self._start_memory()}

    def scoring_context(self) -> ScoringContext:
        """What this run hands its scorer: the keep ratios (``importance.min_mlp_keep`` / ``min_head_keep``) and, from a
        DataModule (:meth:`use_datamodule`), its global crops per sample and batch size."""
        importance = self.settings.importance
        return ScoringContext(min_mlp_keep=importance.min_mlp_keep, min_head_keep=importance.min_head_keep,
                              **self._data_context)

    @property
    def importance_passes(self) -> int:
        """Passes over the pruning data the importance stage makes (the scorer's; 0 once it is complete)."""
        scorer = self.settings.importance.scorer
        return 0 if self.completed("importance") or not scorer.requires_data else scorer.passes

    def importance_step(self, batch: Any) -> dict[str, Any]:
        """Feed one batch to the scorer; returns what to log (e.g. ``{"loss": ...}``). With a plain loader's inputs
        (:meth:`use_loader`) the batch is kept for the later stages first, and given the scorer's form."""
        if self._pass is None:
            if self.completed("importance"):
                return {}
            raise RuntimeError("importance_step before start_importance")
        if isinstance(self.inputs, LoaderInputs):
            batch = self.inputs.take(batch)
        return self._pass.step(batch)

    def finish_importance(self) -> Optional[LocalScores]:
        """End a pass over the data: sum the scorer's statistics over processes; after its last pass, compute the
        local scores, record them and save progress (returns them; None while passes remain)."""
        if self.completed("importance"):
            return self.state.local
        if self._pass is None:
            raise RuntimeError("finish_importance before start_importance")
        local = self._pass.end_pass()
        if local is None:
            if isinstance(self.inputs, LoaderInputs):
                self.inputs.new_pass()
            return None
        self.state.local = local.allocated(self.settings.importance.allocation)
        self._record_scorer_choices(self._pass.scorer.choices())
        self._pass = None  # its accumulators (a Gram of gigabytes) are not needed once the scores exist
        self.state.timings.add("scoring", time.perf_counter() - self._importance["started"])
        self.state.peak_memory_mb["importance"] = round(self._importance["memory"].peak_mb(), 1)
        self._importance = None
        self._end("importance")
        self.save_progress()
        return self.state.local

    def importance(self, batches: Iterable[Any]) -> LocalScores:
        """The whole importance stage over ``batches`` (multi-crop views, or ``(images, labels)`` for label scorers):
        one pass, or one per stage of a re-linearised scorer (then ``batches`` must be readable again)."""
        from .importance import check_passes

        if self.completed("importance"):
            return self.state.local
        check_passes(self.settings.importance.scorer, batches)
        self.start_importance(len(batches) if hasattr(batches, "__len__") else None)
        with eval_mode(self.model):
            return self._pass.run(batches, end_pass=self.finish_importance)

    # -- stage 2: search -------------------------------------------------------------------------------------
    def search(self) -> SearchResult:
        """Search the cross-block coefficients (each DDP rank evaluates its share of every generation); a resumed
        run continues from its saved progress, in the middle of a generation too."""
        self._begin("search")
        s = self.settings.search
        world = self.dist.world_size

        def saved(progress: SearchProgress) -> None:
            self._search_progress = progress
            self.save_progress()

        def logged(es, candidates: torch.Tensor, values: torch.Tensor) -> None:
            if self.events.log_metrics is None:
                return
            first = es.evaluations - len(values)
            for offset, value in enumerate(values.tolist()):
                self.events.log_metrics({"search/fitness": value}, first + offset)
            self.events.log_metrics({"search/best_fitness": es.best_fitness, "search/sigma": es.sigma}, es.evaluations)

        with eval_mode(self.model), self._peak_memory("search"):
            fitness = self.fitness() if s.max_evaluations > 0 else None
            result = run_search(self.model, torch.empty(0) if fitness is None else fitness.images, self._local_scores(), s,
                                rank=self.dist.rank, world_size=world, all_gather=self.dist.all_gather,
                                resume=self._search_progress, on_progress=saved, on_generation=logged,
                                progress=self._show(), fitness=fitness)
        self.state.search = result
        self.state.timings.search_s = result.seconds
        self._end("search")
        return result

    # -- stage 3: splits -------------------------------------------------------------------------------------
    def choose_splits(self) -> ElasticScores:
        """Choose the head/MLP split of every cost budget and of the grid (``export.split: fitness``), then write
        the finished elastic scores to the run directory (rank 0). Returns them."""
        self._begin("splits")
        s = self.settings
        if s.export.split == "fitness":  # every rank: the candidates' evaluations are shared
            started = time.perf_counter()
            with eval_mode(self.model), self._peak_memory("splits"):
                fitness = self.fitness()
                self.state.splits = choose_splits(
                    self.model, fitness.images, self.elastic_scores(), s.export.budgets, s.search, s.export, self.cost,
                    self._show(), fitness=fitness, rank=self.dist.rank, world_size=self.dist.world_size,
                    all_gather=self.dist.all_gather)
            self._splits = split_table(self.state.splits)
            self.state.timings.add("splits", time.perf_counter() - started)
        scores = self.elastic_scores()
        if self.run_dir is not None and self.dist.is_main:
            self.hold_folder()
            scores.save(self.run_dir / s.export.scores_file)
            self.state.scores_file = s.export.scores_file
        self._end("splits")
        return scores

    # -- stage 4: export -------------------------------------------------------------------------------------
    def export(
        self,
        budgets: Optional[Sequence[Budget | dict[str, Any] | str]] = None,
        *,
        models_dir: Optional[str | Path] = None,
        overwrite: bool = True,
        evaluate_dense: bool = True,
    ) -> list[ExtractedModel]:
        """Cut every budget from the elastic scores: cut -> correct (``correction.enabled``) -> evaluate
        (``evaluation.metrics``) -> save, in that order; the dense model is evaluated too. Under DDP every rank
        calls this: each takes its share of the models (and of the dense evaluation), writes its models into the
        (shared) run directory, and every rank returns all of them, as one process would.

        Args:
            budgets: the budgets (default ``export.budgets``).
            models_dir: where each model goes (``<models_dir>/<label>/``); default ``<run_dir>/models`` when
                ``export.save_models``, else nothing is saved.
            overwrite: replace models already there (else refuse before any is written).
            evaluate_dense: also evaluate the dense model (the report's reference row).
        """
        self._begin("export")
        with self._peak_memory("export"):
            return self._export(budgets, models_dir, overwrite, evaluate_dense)

    def _export(self, budgets: Optional[Sequence[Budget | dict[str, Any] | str]], models_dir: Optional[str | Path],
                overwrite: bool, evaluate_dense: bool) -> list[ExtractedModel]:
        s = self.settings
        started = time.perf_counter()
        budgets = s.export.budgets if budgets is None else [Budget.parse(b) for b in budgets]
        cost = self._cost_for(budgets, shared=True)
        self.race_unrecorded(budgets, cost)
        scores = self.elastic_scores()
        # every budget resolved once (a budget that cannot be met fails on every rank, before anything is written),
        # then the models (and the dense evaluation) shared across ranks by their cost
        resolved = [resolved_model(b, scores, cost, s.export.mlp_multiple) for b in budgets]
        flops = [item.flops / cost.dense_flops for item in resolved]
        self.hold_folder()
        if models_dir is None and self.run_dir is not None and s.export.save_models:
            models_dir = self.run_dir / "models"
        if models_dir is not None and not overwrite:  # on every rank, before any work
            refuse_existing(models_dir, [b.label() for b in budgets])
        dense_job = evaluate_dense and s.evaluation.metrics
        # several processes: the throughput is timed after the others, by the first process alone (throughput_alone)
        apart = self.dist.world_size > 1 and "throughput" in s.evaluation.metrics
        settings = replace(s.evaluation, metrics=[m for m in s.evaluation.metrics if m != "throughput"]) if apart else \
            s.evaluation
        owner = share_by_cost(flops + ([1.0] if dense_job else []), self.dist.world_size)
        mine = [item for item, r in zip(resolved, owner) if r == self.dist.rank]
        correction = None
        corrected = s.correction.active(self.device)
        self.state.correction = correction_record(s.correction, corrected, self.device,
                                                  bool(getattr(s.importance.scorer, "correction_aware", False)))
        if corrected and mine:
            correction = Correction(s.correction, self.inputs.calibration_images(s.correction))
        data = self.inputs.evaluation_data(settings) if mine or (dense_job and owner[-1] == self.dist.rank) else None
        evaluation = Evaluation(settings, data, self.device) if data is not None else None
        self.state.dense = DenseModel(cost.dense_params, cost.dense_flops)
        timings = Timings()
        dense_metrics = None
        if evaluation is not None and dense_job and owner[-1] == self.dist.rank:
            with timings.measure("evaluation"):
                dense_metrics = evaluation(self.model)
        with Progress("export", len(budgets), self._show(), unit="model") as bar:  # (every process's models)
            def finished(item: ExtractedModel) -> None:
                bar.update(model=item.label, **{percent_label(k): round(100 * v, 2)
                                                for k, v in (item.metrics or {}).items() if k.endswith("_top1")})

            extracted = extract_models(
                self.model, scores, mine, mlp_multiple=s.export.mlp_multiple, correction=correction,
                evaluation=evaluation, save_dir=models_dir, spec=self.spec, overwrite=overwrite, cost=cost,
                timings=timings, on_model=finished, measure_latency=cost.latency is not None,
            )
            shares = self.dist.gather((extracted, dense_metrics))  # every rank's models, in rank order
            bar.update(len(budgets) - len(mine))  # the other processes' models, done too
        done = {item.label: item for share, _ in shares for item in share}
        self.state.extracted = [done[b.label()] for b in budgets]
        used = next((item.correction["num_samples"] for item in self.state.extracted if item.correction), None)
        if used is not None and used < s.correction.num_samples:  # the report says how many, and why fewer
            self.state.correction.update(num_samples=used, num_samples_asked=s.correction.num_samples,
                                         fewer_because=self.inputs.fewer_calibration_images(used))
        self.state.dense.metrics = next((m for _, m in shares if m is not None), None)
        if apart:
            timed = self.dist.gather(throughput_alone(self.model, self.state.extracted, s.evaluation, self.device,
                                                      bool(dense_job)) if self.dist.is_main else None)[0]
            for item in self.state.extracted:
                item.metrics = with_timed(item.metrics, timed[item.label])
            if dense_job:
                self.state.dense.metrics = with_timed(self.state.dense.metrics, timed["dense"])
        for stage in ("correction", "evaluation"):  # this process's wall clock, as every stage's
            if getattr(timings, f"{stage}_s") is not None:
                self.state.timings.add(stage, getattr(timings, f"{stage}_s"))
        if models_dir is not None and self.run_dir is not None:
            for item in self.state.extracted:
                path = Path(item.checkpoint)
                if path.is_relative_to(self.run_dir):
                    item.checkpoint = path.relative_to(self.run_dir).as_posix()
        own = (timings.correction_s or 0.0) + (timings.evaluation_s or 0.0)  # this process's
        self.state.timings.add("export", time.perf_counter() - started - own)
        self._end("export")
        return self.state.extracted

    def unrecorded(self, budgets: Sequence[Budget], cost: Optional[CostModel] = None) -> list[Budget]:
        """The cost budgets among ``budgets`` whose split the elastic scores do not record (cut later, they take
        a split interpolated between the recorded ones unless :meth:`race_unrecorded` races them)."""
        cost = cost or self.cost
        return [b for b in budgets if (point := b.cost_point(cost)) is not None and not self._splits.records(*point)]

    def race_unrecorded(self, budgets: Sequence[Budget], cost: Optional[CostModel] = None) -> list[SplitChoice]:
        """Race the split of every cost budget the scores do not record, as a run asked for it would have (its
        fitness images, ``split_images``, ``split_candidates`` and ``split_step``: recorded in the scores, see
        :meth:`from_scores`), and record it; nothing without fitness images or with ``export.split: schedule``."""
        missing = self.unrecorded(budgets, cost)
        if not missing or self.settings.export.split != "fitness" or not self.inputs.has_fitness_images():
            return []
        started = time.perf_counter()
        with eval_mode(self.model), self._peak_memory("splits"):
            choices = choose_splits(
                self.model, self.fitness_images(), self.elastic_scores(), missing, self.settings.search,
                replace(self.settings.export, split_grid=0.0), cost or self.cost, self._show(), fitness=self.fitness(),
                rank=self.dist.rank, world_size=self.dist.world_size, all_gather=self.dist.all_gather)
        for choice in choices:
            self._splits.add(choice.metric, choice.keep, choice.head_ratio)
        self.state.splits = [*(self.state.splits or []), *choices]
        self.state.timings.add("splits", time.perf_counter() - started)
        return choices

    def _cost_for(self, budgets: Sequence[Budget], device: Optional[torch.device | str] = None,
                  shared: bool = False) -> CostModel:
        """The cost model, with the latency table of the target device when a budget asks for latency (measured
        once, by rank 0, cached in the run directory). ``shared``: called on every rank (the export), which all take
        rank 0's table so that every rank cuts the same models; the start-up check runs on rank 0 alone."""
        cost = self.cost
        if any(b.latency is not None for b in budgets):
            if cost.latency is None and self.dist.is_main:
                e = self.settings.export
                self.hold_folder()
                cache = e.latency_table or (None if self.run_dir is None else self.run_dir / "latency_table.json")
                cost.latency = latency_table(self.model, e.latency_batch_size, e.latency_device or device or self.device,
                                             cache, mlp_multiple=e.mlp_multiple)
            if shared:
                cost.latency = self.dist.gather(cost.latency)[0]
        return cost

    # -- stage 5: report -------------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Write ``report.json``, ``report.md`` and ``plots/`` into the run directory (rank 0); returns the report."""
        self._begin("report")
        if self.run_dir is None or not self.dist.is_main:
            self._end("report")
            return {}
        self.hold_folder()
        s = self.settings.report
        self.state.not_run = [stage for stage in STAGES[:-1] if not self.completed(stage)]
        self.state.timings.total_s = self.state.elapsed()
        self.state.skipped_files = self.inputs.skipped_files()
        report = write_report(self.state, self.run_dir, s.print_table, s.plots, self.events.on_figure)
        if self.events.on_report is not None:
            self.events.on_report(report)
        self._end("report")
        return report

    # -- the whole method ------------------------------------------------------------------------------------
    def run(self, batches: Optional[Iterable[Any]] = None) -> ElasticScores:
        """Importance (over ``batches``; skipped when complete or the scorer needs no data), search and splits:
        the elastic scores."""
        if not self.completed("importance"):
            self.importance(batches if batches is not None else [])
        self.search()
        return self.choose_splits()

    def elastic_scores(self) -> ElasticScores:
        """The elastic artifact so far: local scores, the search's coefficients once it ran, the chosen splits.

        Raises:
            RuntimeError: the importance stage has not run.
        """
        search = self.state.search
        return replace(
            self._local_scores(), coefficients=None if search is None else search.coefficients,
            settings={**self.state.method, "export": {k: getattr(self.settings.export, k) for k in RECORDED_EXPORT}},
            search={} if search is None else search.summary(), splits=self._splits,
        )

    def _local_scores(self) -> ElasticScores:
        """The local scores alone (no coefficients, no splits): what the search starts from."""
        if self.state.local is None:
            raise RuntimeError("no local scores yet: run the importance stage first")
        importance = self.settings.importance
        return ElasticScores(self.state.local.heads, self.state.local.neurons, None, self.spec.to_dict(),
                             self.state.fingerprint, importance.min_mlp_keep, importance.min_head_keep)

    @classmethod
    def from_scores(cls, model: nn.Module, scores: ElasticScores, settings: Optional[PipelineSettings] = None,
                    **options: Any) -> "Pipeline":
        """A pipeline whose importance, search and splits are those recorded in ``scores`` (e.g. to export more
        budgets later); ``model`` must hold the weights they were computed on. The keep ratios are the scores';
        without ``settings``, so is the MLP width rounding (``export.mlp_multiple``). With ``inputs`` holding the
        run's images, :meth:`export` races the split of a budget the scores do not record as the run would have
        (the fitness and split settings are the ones the scores record); without, it interpolates.

        Raises:
            CheckpointError: ``model`` is not the scores' base model.
        """
        scores.check_model(model)
        if settings is None:
            settings = PipelineSettings()
            settings.export.mlp_multiple = scores.mlp_multiple
        # a budget the scores do not record is raced as the run raced its own: the run's fitness and split settings
        recorded = scores.settings.get("export") or {}
        search = scores.settings.get("search") or {}
        settings = replace(
            settings, importance=replace(settings.importance, min_mlp_keep=scores.min_mlp_keep,
                                         min_head_keep=scores.min_head_keep),
            search=replace(settings.search, **{k: search[k] for k in FITNESS_SEARCH if k in search}),
            export=replace(settings.export, **{k: recorded[k] for k in RECORDED_EXPORT
                                               if k in recorded and k != "mlp_multiple"}))
        spec = options.pop("spec", None) or (BackboneSpec.from_dict(scores.base) if scores.base.get("model_name") else None)
        pipeline = cls(model, settings, spec=spec, **options)
        pipeline.state.local = LocalScores(scores.head_scores, scores.neuron_scores)
        pipeline.state.method = {k: v for k, v in scores.settings.items() if k != "export"}
        if scores.coefficients is not None:
            pipeline.state.search = SearchResult(scores.coefficients)
        pipeline._splits = scores.splits
        pipeline.state.completed = ["importance", "search", "splits"]
        return pipeline

    @classmethod
    def from_run(cls, run_dir: str | Path, model: Optional[nn.Module] = None,
                 settings: Optional[PipelineSettings] = None, scores_file: Optional[str] = None,
                 run_data: bool = True, **options: Any) -> "Pipeline":
        """:meth:`from_scores` for the scores in ``run_dir`` (a ``prune.py`` run folder), with the run's images
        when they are the files the run read (:func:`~snapvit_pl.run.data.run_data`): a budget the run
        did not choose a split for is then raced on them as the run would have, and they calibrate a correction.
        ``model``: the base model (default: rebuilt from the spec the scores record); ``scores_file``: default
        ``export.scores_file``'s. When the images cannot be taken, a warning says why (``run_data=False``: not
        tried) and such a budget's split is interpolated.

        Raises:
            CheckpointError: no readable scores in ``run_dir``, or ``model`` is not their base model.
            ConfigError: the scores record no base model to rebuild and no ``model`` is given.
        """
        run_dir = Path(run_dir)
        scores = ElasticScores.load(run_dir / (scores_file or ExportSettings.scores_file))
        spec = options.pop("spec", None) or (BackboneSpec.from_dict(scores.base) if scores.base.get("model_name")
                                             else None)
        if model is None:
            if spec is None:
                raise ConfigError(f"the scores in {run_dir} do not record how to build their base model (written by "
                                  "fit_elastic without spec=): pass model=")
            model = load_backbone(spec)
        pipeline = cls.from_scores(model, scores, settings, spec=spec, **options)
        if run_data and "inputs" not in options:
            found = find_run_data(run_dir, scores, pipeline.settings.search.num_images)
            if found.datamodule is None:
                warnings.warn(f"the images of the run in {run_dir} are not taken because {found.why_not}: a budget "
                              "whose split the run did not choose is interpolated (docs/pruning.md)", stacklevel=2)
            else:
                found.datamodule.configure_for_model(model)
                pipeline.inputs = DataModuleInputs(found.datamodule)
        return pipeline

    # -- resume ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What an interrupted run needs to continue exactly (tensors, numbers, strings and lists only)."""
        return {
            "fingerprint": self.state.fingerprint, "timings": self.state.timings.to_dict(),
            "elapsed_s": self.state.elapsed(), "peak_memory_mb": dict(self.state.peak_memory_mb),
            "local": None if self.state.local is None else self.state.local.to_dict(),
            "search": None if self._search_progress is None else self._search_progress.to_dict(),
            "inputs": self.state.inputs,
            "scorer_choices": dict(self._scorer_choices),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the run ``state`` describes: its local scores (the importance pass is skipped), its search
        progress, its timings so far.

        Raises:
            CheckpointError: the base weights are not those the run started with.
            DataError: the pruning images are not those the run read (:func:`~snapvit_pl.run.resume.check_inputs`
                against :meth:`record_inputs`, when this pipeline recorded them).
        """
        check_resume_state(state, architecture(self.model), [f.name for f in fields(Timings)],
                           self.run_dir / RESUME_FILE if self.run_dir else "the resume state")
        self.resumed = True  # its run folder holds this run's progress: continued, not refused as another run's
        saved = state.get("fingerprint")
        if saved not in (None, self.state.fingerprint):
            raise CheckpointError(
                f"the base weights changed since the run started (fingerprint {saved[:12]} != "
                f"{self.state.fingerprint[:12]}): resume with the weights it started with, or start a new run"
            )
        check_inputs(state.get("inputs"), self._current_inputs(), kept=state.get("local") is not None
                     or state.get("search") is not None)
        self.state.timings = type(self.state.timings)(**state.get("timings", {}))
        self.state.elapsed_before = float(state.get("elapsed_s", 0.0))
        self.state.peak_memory_mb.update(state.get("peak_memory_mb", {}))
        if state.get("local") is not None:
            self.state.local = LocalScores.from_dict(state["local"])
            self._record_scorer_choices(state.get("scorer_choices", {}))
            self._end("importance")
        if state.get("search") is not None:
            self._search_progress = SearchProgress.from_dict(state["search"])

    def _record_scorer_choices(self, choices: dict[str, str]) -> None:
        """What the scorer chose for itself (e.g. ``gram: auto`` -> ``full``), in the run's record of the method and
        in its resume state (a resumed run skips the importance pass but reports the same choices)."""
        self._scorer_choices = dict(choices)
        self.state.method["scorer"] = {**self.state.method.get("scorer", {}), **choices}

    def save_progress(self) -> None:
        """Write the run's progress to ``<run_dir>/resume_state.pt`` (rank 0; nothing without a run directory)."""
        if self.run_dir is not None and self.dist.is_main:
            self.hold_folder()
            save_resume_state(self.run_dir, self.state_dict())


def _architecture_name(model: nn.Module) -> str:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return cfg.get("architecture") or type(model).__name__
