"""``PruningModule``: the pretrained ViT being pruned and the pipeline that prunes it.

The module itself trains nothing. ``trainer.fit`` makes one pass over the pruning data per pass of the scorer
(one epoch each); the callbacks in ``snapvit_pl.callbacks`` (one per stage, :class:`StageCallback`) each run one
stage of the module's :class:`~snapvit_pl.pipeline.Pipeline` from a Lightning hook:

========================  =====================================================
hook                      stage
========================  =====================================================
train batch / epoch end   importance (``ImportanceCallback``)
``on_train_end``          coefficient search (``SearchCallback``), then the
                          head/MLP splits and the scores file (``SplitsCallback``)
``on_fit_end``            export: per budget cut -> correct -> evaluate -> save
                          (``ExportCallback``)
``teardown("fit")``       ``report.json`` / ``report.md`` (``ReportCallback``)
========================  =====================================================

The order of the stages is the pipeline's, whatever the order of the callbacks in the list: a stage runs the
earlier stages of the run that have not run yet (:meth:`~snapvit_pl.pipeline.Pipeline.run_stage`). Every callback is
optional: a Trainer without ``SearchCallback`` keeps the block coefficients at their initial values, without
``ExportCallback`` it makes the elastic scores only (:attr:`PruningModule.scores`), and the report says so. The
module works in any ``pl.Trainer`` (no ``prune.py`` wiring): its pipeline exists from construction, with the default
settings unless :meth:`PruningModule.configure_pipeline` gives others.
"""
from __future__ import annotations

import re
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

import pytorch_lightning as pl
import torch

from ..elastic.scores import ElasticScores
from ..errors import ConfigError
from ..models.loading import BackboneSpec, load_backbone
from ..pipeline.driver import Pipeline
from ..run.folder import FolderHints, RunFolder
from ..pipeline.settings import PipelineSettings
from ..progress import ProgressMode
from ..ranges import Seed, check_arguments
from .context import bind_trainer
from .trainer_policy import check_composed, quiet_composed_trainer, quiet_lightning

#: Lightning's default precision: the pipeline picks each stage's own (bf16 autocast on CUDA, fp32 on a CPU)
TRAINER_PRECISION = "32-true"


class PruningModule(pl.LightningModule):
    """A pretrained timm ViT to prune (its weights are never changed).

    Args:
        model_name: timm model name with pretrained tag, e.g. ``vit_base_patch16_224.dino``.
        pretrained: load timm's weights for ``model_name`` (hub or local cache).
        checkpoint_path: local weights file used instead of the hub weights.
        model_kwargs: ``timm.create_model`` overrides (``img_size``, ``num_classes``, ...).
        seed: the seed of random weights (``pretrained: false`` without ``checkpoint_path``), recorded with the
            base model so that ``extract``, ``evaluate`` and ``train`` rebuild the same weights; ``prune.py``
            derives it from the run's ``seed_everything`` unless given. Logged as the hyperparameter
            ``weights_seed`` (the DataModule's ``seed`` is another seed).

    Example (a plain Trainer; ``dm`` a :class:`snapvit_pl.data.VisionDataModule`)::

        module = PruningModule("vit_small_patch16_224.dino")
        trainer = pl.Trainer(callbacks=[c() for c in snapvit_pl.callbacks.STAGE_CALLBACKS], logger=False,
                             use_distributed_sampler=False)
        trainer.fit(module, datamodule=dm)
        small = module.scores.extract(module.backbone, flops=0.5)
    """

    def __init__(
        self,
        model_name: str = "vit_small_patch16_224.dino",
        pretrained: bool = True,
        checkpoint_path: Optional[str] = None,
        model_kwargs: Optional[dict[str, Any]] = None,
        seed: Optional[Seed] = None,
    ):
        check_arguments(PruningModule.__init__, {"seed": seed}, "model")  # (the other arguments have no range)
        random_weights = pretrained is False and checkpoint_path is None
        super().__init__()
        self.save_hyperparameters(ignore=["seed"])
        self.hparams["weights_seed"] = seed  # its own name: Lightning merges these hparams with the DataModule's
        self.automatic_optimization = False
        self.spec = BackboneSpec(model_name, pretrained, checkpoint_path, dict(model_kwargs or {}),
                                 seed if random_weights else None)
        self.backbone = load_backbone(self.spec)
        self.backbone.requires_grad_(False)
        self._pipeline: Optional[Pipeline] = None
        self._opened_folder = False  # this module took the run folder (in setup), so it gives it back (teardown)
        self._quiet = ExitStack()  # Lightning's expected warnings and information lines, off for a fit's duration

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline the stage callbacks drive: :meth:`configure_pipeline`'s, else one with the default settings,
        made when first asked for (a callback's ``setup`` may be first)."""
        if self._pipeline is None:
            self.configure_pipeline()
        return self._pipeline

    def configure_pipeline(self, settings: Optional[PipelineSettings] = None, run_dir: Optional[str | Path] = None,
                           progress: ProgressMode | bool = "auto", seg_data: Any = None,
                           overwrite: bool = False) -> Pipeline:
        """The pipeline the stage callbacks drive (over this module's backbone; ``settings``: every stage's,
        default :class:`PipelineSettings`; ``run_dir``: where the scores, models and report are written, None:
        nothing is written; ``seg_data``: the segmentation DataModule of the ``seg`` metric); returns it. Call it
        before ``trainer.fit``. The run folder is held as ``prune.py`` holds it (:class:`RunFolder`, from ``setup`` to
        ``teardown``): a folder in use by another run, or holding an earlier run's results, is refused unless
        ``overwrite`` (then only what that run wrote is removed)."""
        settings = settings or PipelineSettings()
        folder = None if run_dir is None else RunFolder(run_dir, overwrite, settings.export.scores_file,
                                                        hints=FolderHints("run_dir", "pass overwrite=True to "
                                                                                     "configure_pipeline"))
        self._pipeline = Pipeline(self.backbone, settings, spec=self.spec, seg_datamodule=seg_data, run_dir=folder,
                                  progress=progress)
        return self._pipeline

    def use_run_folder(self, folder: RunFolder) -> None:
        """The run folder its caller holds already (``prune.py``): this module neither takes nor gives it back."""
        self.pipeline.folder = folder

    @property
    def scores(self) -> ElasticScores:
        """The elastic scores, once the splits are chosen (e.g. in a user's ``on_fit_end`` callback).

        Raises:
            RuntimeError: the splits stage has not run yet.
        """
        if not self.pipeline.completed("splits"):
            raise RuntimeError("the elastic scores exist once the splits stage ran (SplitsCallback at on_train_end)")
        return self.pipeline.elastic_scores().copy()  # a user's callback may change it; the run's own stay

    def configure_callbacks(self) -> list[pl.Callback]:
        """None of its own. The first hook Lightning calls, before its own loop checks: ``trainer.validate``/``test``/
        ``predict`` are refused here, and a fit's expected Lightning lines go quiet from here to ``teardown`` (a
        pruning run has no validation loop, whether or not its data has a ``val_dataloader``)."""
        stage = str(getattr(self.trainer.state.fn, "value", self.trainer.state.fn))  # (Lightning's TrainerFn)
        if stage in ("validate", "test", "predict"):
            raise ConfigError(f"trainer.{stage} on a PruningModule: a pruning run trains nothing to {stage}; the export "
                              "stage evaluates every model it cuts (evaluation.metrics), and `snapvit-pl evaluate "
                              "--checkpoint DIR` (snapvit_pl.eval.evaluate_model) any model, the dense one included")
        self._quiet.close()  # (a fit that failed before its teardown left it open)
        self._quiet.enter_context(quiet_lightning())
        return []

    def setup(self, stage: str) -> None:
        trainer = self.trainer
        if self._pipeline is not None and self._pipeline.completed("export" if "export" in self._pipeline.stages
                                                                   else "splits"):
            raise ConfigError("this PruningModule's run is finished (its scores and models are made): a second fit "
                              "would do nothing; call module.configure_pipeline(...) to start another run, or make a "
                              "new PruningModule")
        check_trainer(trainer)
        quiet_composed_trainer(trainer)  # no default checkpoint, model summary or epoch bar (a configured checkpoint:
        # refused): as quiet as prune.py's run
        trainer.num_sanity_val_steps, trainer.limit_val_batches = 0, 0  # nothing to validate while pruning
        stages = {c.stage for c in trainer.callbacks if isinstance(c, StageCallback)}
        if "importance" not in stages and not self.pipeline.completed("importance"):
            # (else the Trainer runs its epochs over the data for nothing, and the next stage finds no scores)
            raise ConfigError("the Trainer has no ImportanceCallback: nothing would score the units; add it (all the "
                              "stages: callbacks=[c() for c in snapvit_pl.callbacks.STAGE_CALLBACKS])")
        self.pipeline.use_stages(stages)
        bind_trainer(self.pipeline, trainer)
        folder = self.pipeline.folder
        if folder is not None and not folder.held and trainer.global_rank == 0:
            self.pipeline.hold_folder()  # refused here, before any epoch, when the folder is not this run's to write in
            self._opened_folder = True

    def teardown(self, stage: str) -> None:
        self._quiet.close()
        if self._opened_folder:
            self.pipeline.close()
            self._opened_folder = False

    def abandon(self) -> None:
        """The fit failed (Lightning calls no ``teardown`` then; the stage callbacks' ``on_exception`` calls this):
        the run folder is given up, and what the run wrote there removed unless it saved progress; Lightning's
        lines are heard again."""
        self._quiet.close()
        if self._opened_folder:
            self.pipeline.folder.abandon()
            self._opened_folder = False

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Optional[int]:
        # resumed with complete scores: -1 ends the epoch at once
        return -1 if self.pipeline.completed("importance") else None

    def training_step(self, batch: Any, batch_idx: int) -> None:
        """No-op: each batch is consumed by ``ImportanceCallback.on_train_batch_end``."""
        return None

    def configure_optimizers(self):
        return None


#: Lightning's notice for a fit without ``max_epochs``, issued in ``Trainer.fit`` before any hook: a pruning run
#: sets its epochs itself (one per importance pass, :class:`~callbacks.importance.ImportanceCallback`).
EPOCH_DEFAULT_NOTICE = "`max_epochs` was not set. Setting it to 1000 epochs"


def hide_epoch_default_notice() -> None:
    """Hide :data:`EPOCH_DEFAULT_NOTICE` from now on in this process (building a stage callback calls it: a
    composed run is as quiet as ``prune.py``'s; every other Lightning warning still shows)."""
    from pytorch_lightning.utilities.warnings import PossibleUserWarning

    warnings.filterwarnings("ignore", message=re.escape(EPOCH_DEFAULT_NOTICE), category=PossibleUserWarning)


def check_trainer(trainer: pl.Trainer) -> None:
    """Refuse, in one line each, the Trainer settings a pruning run cannot honour in every stage: a DDP strategy
    that wraps the module (it has no trainable parameter; :class:`~snapvit_pl.lightning.strategy.PruningDDPStrategy`
    shares the work without one), a precision other than Lightning's default (each stage picks its own), and the
    options :mod:`~snapvit_pl.lightning.trainer_policy` refuses for ``prune.py`` too (debug modes and batch limits
    that score a share of the images, a distributed sampler over several processes).

    Raises:
        ConfigError: naming the setting and what to use.
    """
    from pytorch_lightning.strategies import DDPStrategy

    from .strategy import PruningDDPStrategy

    strategy = trainer.strategy
    if isinstance(strategy, DDPStrategy) and not isinstance(strategy, PruningDDPStrategy):
        raise ConfigError(f"Trainer(strategy={type(strategy).__name__}): a pruning run trains nothing and shares its work "
                          "across processes with its own DDP; pass strategy=snapvit_pl.lightning.strategy."
                          "PruningDDPStrategy() (prune.py: --trainer.strategy ddp)")
    check_precision(getattr(trainer, "precision", TRAINER_PRECISION))
    if getattr(getattr(trainer, "fit_loop", None), "max_epochs", None) == 0:
        raise ConfigError("Trainer(max_epochs=0): the run would stop before its importance pass, and no later stage "
                          "could run; leave max_epochs unset (the module runs one epoch per importance pass)")
    check_composed(trainer)  # the options prune.py refuses, in the same words


def check_precision(precision: Any) -> None:
    """Refuse a Trainer precision other than Lightning's default (None: unset): each pruning stage picks its own.
    ``prune.py`` calls this before it starts any process, :func:`check_trainer` in a composed Trainer's setup.

    Raises:
        ConfigError: naming the precision and what to do instead.
    """
    if precision is not None and str(precision) not in (TRAINER_PRECISION, "32"):
        raise ConfigError(f"Trainer(precision={str(precision)!r}): each pruning stage picks its own precision (bf16 "
                          "autocast on CUDA, fp32 on a CPU; the scorer's precision setting for the importance pass); "
                          "leave the Trainer's precision at its default")


class StageCallback(pl.Callback):
    """A Lightning callback that runs one stage of the :class:`PruningModule`'s pipeline (:attr:`stage`); its
    presence in the Trainer's callbacks is what makes the run make that stage (:meth:`Pipeline.use_stages`)."""

    stage: str = ""

    def __init__(self) -> None:
        hide_epoch_default_notice()

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not isinstance(pl_module, PruningModule):  # (Lightning calls the callbacks' setup before the module's)
            raise ConfigError(f"{type(self).__name__} runs a stage of snapvit_pl's pruning pipeline on a PruningModule, "
                              f"not on a {type(pl_module).__name__}: fit a snapvit_pl.lightning.PruningModule")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if isinstance(pl_module, PruningModule):
            pl_module.abandon()

    def _run(self, pl_module: PruningModule) -> Any:
        return pl_module.pipeline.run_stage(self.stage)
