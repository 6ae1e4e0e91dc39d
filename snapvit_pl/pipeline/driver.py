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

import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch
from torch import nn

from ..device import PeakMemory
from ..elastic.budget import Budget, CostModel
from ..elastic.scores import ElasticScores
from ..errors import ConfigError
from ..models.loading import BackboneSpec, fingerprint
from ..models.modes import eval_mode
from ..progress import ProgressMode, shown_mode
from ..run.folder import FolderHints, RunFolder
from ..scoring import LocalScores
from ..search.fitness import EmbeddingFitness
from ..search.loop import SearchProgress, SearchResult, run_search
from ..search.population import AllGather
from . import export_stage, reload, saved_state
from .importance import AllReduceSum, finish_pass, start_pass
from .inputs import LoaderInputs, StageInputs
from .report import write_report
from .settings import RECORDED_EXPORT, PipelineSettings
from .splits import SplitChoice, choose_splits, split_table
from .state import STAGES, ExtractedModel, RunState, StageWork


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


class Pipeline:
    """SnapViT on one pretrained ViT: its stages in order, over one :class:`RunState`.

    Args:
        model: a supported timm ViT (dense, pretrained), on the device to compute on; never modified.
        settings: every stage's settings (default :class:`PipelineSettings`).
        spec: how ``model`` is built (recorded so that its pruned models and scores can be rebuilt); default: its
            architecture name, without weights.
        inputs: the fitness / calibration images and evaluation data (:class:`DataModuleInputs`, :class:`TensorInputs`).
        seg_datamodule: a :class:`snapvit_pl.data.SegmentationDataModule` the ``seg`` metric (a linear probe's mIoU on
            patch tokens) evaluates every model on, when the inputs come from a DataModule (:func:`~.data_source.use_datamodule`).
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
        self.resumed = False  # load_state_dict continued an interrupted run
        #: what the stages hand each other while the run works (typed: :class:`StageWork`)
        self.work = StageWork()

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

    def progress_mode(self) -> ProgressMode | bool:
        """How this process shows progress: the run's mode on the first process, nothing on the others."""
        return self.progress if self.dist.is_main else "off"

    def begin_stage(self, stage: str) -> None:
        """Refuse a stage whose earlier stages (of those this run makes) have not run."""
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

    def end_stage(self, stage: str) -> None:
        """Record ``stage`` as done."""
        if stage not in self.state.completed:
            self.state.completed.append(stage)

    def start_memory(self) -> PeakMemory:
        """A peak-memory measurement started now (its kind recorded for the report)."""
        memory = PeakMemory(self.device).start()
        self.state.memory_kind = memory.kind
        return memory

    @contextmanager
    def peak_memory(self, stage: str) -> Iterator[None]:
        """Record the stage's peak memory (``report.json``'s ``peak_memory_mb``)."""
        memory = self.start_memory()
        yield
        self.state.peak_memory_mb[stage] = round(memory.peak_mb(), 1)

    # -- checks before any work (snapvit_pl/pipeline/export_stage.py) ---------------------------------------
    def check(self) -> None:
        """Refuse now what would fail after the expensive stages (:func:`~.export_stage.check`)."""
        export_stage.check(self)

    def check_latency(self, device: Optional[torch.device | str] = None) -> None:
        """Measure a latency budget's table now and refuse one it cannot reach (:func:`~.export_stage.check_latency`)."""
        export_stage.check_latency(self, device)

    # -- stage 1: importance ---------------------------------------------------------------------------------
    def start_importance(self, batches: Optional[int] = None) -> None:
        """Bind the scorer to the model and reset it (a pass of ``batches`` batches follows); a no-op when the
        scores are complete already (a resumed run)."""
        self.begin_stage("importance")
        if not self.completed("importance"):
            self.hold_folder()  # before any work: a folder this run may not write in is refused now
            self.work.importance_pass = start_pass(self, batches)

    @property
    def importance_passes(self) -> int:
        """Passes over the pruning data the importance stage makes (the scorer's; 0 once it is complete)."""
        scorer = self.settings.importance.scorer
        return 0 if self.completed("importance") or not scorer.requires_data else scorer.passes

    def importance_step(self, batch: Any) -> dict[str, Any]:
        """Feed one batch to the scorer; returns what to log (e.g. ``{"loss": ...}``). With a plain loader's inputs
        (:func:`~.data_source.use_loader`) the batch is kept for the later stages first, and given the scorer's form."""
        if self.work.importance_pass is None:
            if self.completed("importance"):
                return {}
            raise RuntimeError("importance_step before start_importance")
        if isinstance(self.inputs, LoaderInputs):
            batch = self.inputs.take(batch)
        return self.work.importance_pass.step(batch)

    def finish_importance(self) -> Optional[LocalScores]:
        """End a pass over the data (:func:`~.importance.finish_pass`): after the scorer's last pass, the local scores
        (recorded, progress saved); None while passes remain."""
        if self.completed("importance"):
            return self.state.local
        if self.work.importance_pass is None:
            raise RuntimeError("finish_importance before start_importance")
        return finish_pass(self)

    def importance(self, batches: Iterable[Any]) -> LocalScores:
        """The whole importance stage over ``batches`` (multi-crop views, or ``(images, labels)`` for label scorers):
        one pass, or one per stage of a re-linearised scorer (then ``batches`` must be readable again)."""
        from .importance import check_passes

        if self.completed("importance"):
            return self.state.local
        check_passes(self.settings.importance.scorer, batches)
        self.start_importance(len(batches) if hasattr(batches, "__len__") else None)
        with eval_mode(self.model):
            return self.work.importance_pass.run(batches, end_pass=self.finish_importance)

    # -- stage 2: search -------------------------------------------------------------------------------------
    def search(self) -> SearchResult:
        """Search the cross-block coefficients (each DDP rank evaluates its share of every generation); a resumed
        run continues from its saved progress, in the middle of a generation too."""
        self.begin_stage("search")
        s = self.settings.search
        world = self.dist.world_size

        def saved(progress: SearchProgress) -> None:
            self.work.search_progress = progress
            self.save_progress()

        def logged(es, candidates: torch.Tensor, values: torch.Tensor) -> None:
            if self.events.log_metrics is None:
                return
            first = es.evaluations - len(values)
            for offset, value in enumerate(values.tolist()):
                self.events.log_metrics({"search/fitness": value}, first + offset)
            self.events.log_metrics({"search/best_fitness": es.best_fitness, "search/sigma": es.sigma}, es.evaluations)

        with eval_mode(self.model), self.peak_memory("search"):
            fitness = self.fitness() if s.max_evaluations > 0 else None
            result = run_search(self.model, torch.empty(0) if fitness is None else fitness.images, self._local_scores(), s,
                                rank=self.dist.rank, world_size=world, all_gather=self.dist.all_gather,
                                resume=self.work.search_progress, on_progress=saved, on_generation=logged,
                                progress=self.progress_mode(), fitness=fitness)
        self.state.search = result
        self.state.timings.search_s = result.seconds
        self.end_stage("search")
        return result

    # -- stage 3: splits -------------------------------------------------------------------------------------
    def choose_splits(self) -> ElasticScores:
        """Choose the head/MLP split of every cost budget and of the grid (``export.split: fitness``), then write
        the finished elastic scores to the run directory (rank 0). Returns them."""
        self.begin_stage("splits")
        s = self.settings
        if s.export.split == "fitness":  # every rank: the candidates' evaluations are shared
            started = time.perf_counter()
            with eval_mode(self.model), self.peak_memory("splits"):
                fitness = self.fitness()
                self.state.splits = choose_splits(
                    self.model, fitness.images, self.elastic_scores(), s.export.budgets, s.search, s.export, self.cost,
                    self.progress_mode(), fitness=fitness, rank=self.dist.rank, world_size=self.dist.world_size,
                    all_gather=self.dist.all_gather)
            self.work.splits = split_table(self.state.splits)
            self.state.timings.add("splits", time.perf_counter() - started)
        scores = self.elastic_scores()
        if self.run_dir is not None and self.dist.is_main:
            self.hold_folder()
            scores.save(self.run_dir / s.export.scores_file)
            self.state.scores_file = s.export.scores_file
        self.end_stage("splits")
        return scores

    # -- stage 4: export -------------------------------------------------------------------------------------





    # -- stage 4: export (snapvit_pl/pipeline/export_stage.py) ----------------------------------------------
    def export(self, budgets: Optional[Sequence[Budget | dict[str, Any] | str]] = None, *,
               models_dir: Optional[str | Path] = None, overwrite: bool = True,
               evaluate_dense: bool = True) -> list[ExtractedModel]:
        """Cut every budget (default ``export.budgets``) from the elastic scores: cut -> correct -> evaluate -> save,
        on every process its share (:func:`~.export_stage.export`: the arguments)."""
        return export_stage.export(self, budgets, models_dir=models_dir, overwrite=overwrite,
                                   evaluate_dense=evaluate_dense)

    def unrecorded(self, budgets: Sequence[Budget], cost: Optional[CostModel] = None) -> list[Budget]:
        """The cost budgets whose split the scores do not record (:func:`~.export_stage.unrecorded`)."""
        return export_stage.unrecorded(self, budgets, cost)

    def race_unrecorded(self, budgets: Sequence[Budget], cost: Optional[CostModel] = None) -> list[SplitChoice]:
        """Race the split of those budgets as the run would have (:func:`~.export_stage.race_unrecorded`)."""
        return export_stage.race_unrecorded(self, budgets, cost)

    # -- stage 5: report -------------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Write ``report.json``, ``report.md`` and ``plots/`` into the run directory (rank 0); returns the report."""
        self.begin_stage("report")
        if self.run_dir is None or not self.dist.is_main:
            self.end_stage("report")
            return {}
        self.hold_folder()
        s = self.settings.report
        self.state.not_run = [stage for stage in STAGES[:-1] if not self.completed(stage)]
        self.state.timings.total_s = self.state.elapsed()
        self.state.skipped_files = self.inputs.skipped_files()
        report = write_report(self.state, self.run_dir, s.print_table, s.plots, self.events.on_figure)
        if self.events.on_report is not None:
            self.events.on_report(report)
        self.end_stage("report")
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
            search={} if search is None else search.summary(), splits=self.work.splits,
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
        """A pipeline whose importance, search and splits are those ``scores`` record (:func:`~.reload.from_scores`)."""
        return reload.from_scores(cls, model, scores, settings, **options)

    @classmethod
    def from_run(cls, run_dir: str | Path, model: Optional[nn.Module] = None,
                 settings: Optional[PipelineSettings] = None, scores_file: Optional[str] = None,
                 run_data: bool = True, **options: Any) -> "Pipeline":
        """:meth:`from_scores` for a ``prune.py`` run folder, with the run's images (:func:`~.reload.from_run`)."""
        return reload.from_run(cls, run_dir, model, settings, scores_file, run_data, **options)

    # -- resume (snapvit_pl/pipeline/saved_state.py) ---------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What an interrupted run needs to continue exactly (:func:`~.saved_state.state_dict`)."""
        return saved_state.state_dict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the run ``state`` describes (:func:`~.saved_state.load_state_dict`: what it refuses)."""
        saved_state.load_state_dict(self, state)

    def save_progress(self) -> None:
        """Write the run's progress to ``<run_dir>/resume_state.pt`` (rank 0; nothing without a run directory)."""
        saved_state.save_progress(self)





def _architecture_name(model: nn.Module) -> str:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return cfg.get("architecture") or type(model).__name__
