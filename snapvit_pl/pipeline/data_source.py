"""Where a run's later stages take their images from: a Trainer's DataModule (:func:`use_datamodule`), the batches of
a plain loader (:func:`use_loader`), and the fingerprint of what the run reads (:func:`record_inputs`). Functions over
a :class:`~snapvit_pl.pipeline.Pipeline`."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional


from ..errors import ConfigError
from ..eval.suite import check_classes
from .inputs import DATAMODULE_METHODS, DataModuleInputs, LoaderInputs, StageInputs

if TYPE_CHECKING:  # (annotations only)
    from .driver import Pipeline


def check_data_source(pipe: "Pipeline", datamodule: Any) -> bool:
    """Whether the run takes its later stages' images from a Trainer's ``datamodule`` (:func:`use_datamodule`: one
    of :mod:`snapvit_pl.data`'s, or one with :data:`DATAMODULE_METHODS`) or, when it has none or another kind,
    from the batches of its train loader (:func:`use_loader`, unless images were given otherwise, e.g.
    :class:`TensorInputs`).

    Raises:
        ConfigError: a plain loader on several processes (each would read all of it).
    """
    from ..data.base import VisionDataModule

    if datamodule is not None and (isinstance(datamodule, VisionDataModule)
                                   or all(callable(getattr(datamodule, m, None)) for m in DATAMODULE_METHODS)):
        return True
    if type(pipe.inputs) is StageInputs and pipe.dist.world_size > 1:
        given = "a plain loader" if datamodule is None else f"a {type(datamodule).__name__}"
        raise ConfigError(f"the Trainer was given {given} on {pipe.dist.world_size} processes: each would read all "
                          "of its images (the pruning run shards only its own DataModules); use one process, or "
                          "one of snapvit_pl.data's DataModules (ClassificationDataModule, ImageFolderDataModule)")
    return False


def use_loader(pipe: "Pipeline") -> None:
    """Take the later stages' images from the batches the importance pass reads (:class:`LoaderInputs`: a
    composed Trainer fitted on a plain loader, or on a DataModule without :data:`DATAMODULE_METHODS`)."""
    from .importance import scoring_views

    s = pipe.settings
    fitness = s.search.num_images if s.search.max_evaluations > 0 or s.export.split == "fitness" else 0
    calibration = s.correction.num_samples if s.correction.active(pipe.model) else 0
    evaluation = ((s.evaluation.train_samples or sys.maxsize // 2, s.evaluation.val_samples or sys.maxsize // 2)
                  if set(s.evaluation.metrics) & {"knn", "linear", "head"} else None)
    pipe.inputs = LoaderInputs(scoring_views(s.importance.scorer), fitness, calibration, evaluation,
                               model=pipe.model)


def use_datamodule(pipe: "Pipeline", datamodule: Any) -> None:
    """Take the run's data from a DataModule: set it up for the importance pass (the model's input format, the
    views the scorer needs) and read the later stages' images and evaluation data from it (and the ``seg``
    metric's from ``seg_datamodule``)."""
    from .importance import prepare_pruning_data

    pipe.work.data_context = prepare_pruning_data(datamodule, pipe.model, pipe.settings.importance.scorer)
    if not getattr(datamodule, "labeled", True):
        needs = [m for m in pipe.settings.evaluation.metrics if m != "throughput"]
        if needs or pipe.settings.importance.scorer.requires_labels:
            what = f"evaluation.metrics {needs}" if needs else f"the {pipe.settings.importance.scorer.name} scorer"
            raise ConfigError(f"{what} need labeled images, but {datamodule.root} is a folder of unlabeled images; "
                              "set --evaluation.metrics '[]' (or [throughput]) and a label-free scorer, or give "
                              "a labeled folder (root/train/<class>/..., root/val/...)")
    if getattr(datamodule, "labeled", True):
        check_classes(getattr(datamodule, "num_classes", None), pipe.settings.evaluation.metrics,
                      str(getattr(datamodule, "root", "the data")))
    if pipe.seg_datamodule is not None:
        pipe.seg_datamodule.configure_for_model(pipe.model)
    pipe.inputs = DataModuleInputs(datamodule, pipe.seg_datamodule)
    if pipe.state.inputs is None and pipe.work.inputs_source is datamodule:  # downloaded since record_inputs
        current_inputs(pipe)
        pipe.save_progress()


def record_inputs(pipe: "Pipeline", datamodule: Any) -> None:
    """Fingerprint what this run reads of ``datamodule``'s training split for its scores
    (:meth:`~snapvit_pl.data.VisionDataModule.input_fingerprint`): the pruning pass's subset (when the scorer
    reads data) and, when the search or the fitness split choice runs, the fitness images' subset. It is saved
    with the progress, and a resume recomputes and compares it before anything else (:meth:`Pipeline.load_state_dict`
    refuses other images). The calibration and evaluation images are not in it: a resumed run reads them afresh
    in full (the export always runs again), so they never mix with what the interrupted run read.

    Call it before the run's first :meth:`Pipeline.save_progress` or :meth:`Pipeline.load_state_dict`. A DataModule that downloads
    (``download: true``) is fingerprinted once it is prepared (:func:`use_datamodule`, which then saves the
    progress) unless a resume needs it first; one without ``input_fingerprint`` records nothing.
    """
    if getattr(datamodule, "input_fingerprint", None) is None:
        return
    pipe.work.inputs_source = datamodule
    if not getattr(datamodule, "download", False):  # now: a data error comes before anything is written
        current_inputs(pipe)


def current_inputs(pipe: "Pipeline") -> Optional[dict[str, Any]]:
    """The fingerprint :func:`record_inputs` asked for, computed once (None: nothing recorded)."""
    if pipe.state.inputs is None and pipe.work.inputs_source is not None:
        s = pipe.settings
        sizes: list[Optional[int]] = [None] if s.importance.scorer.requires_data else []
        if s.search.max_evaluations > 0 or s.export.split == "fitness":
            sizes.append(s.search.num_images)
        pipe.state.inputs = pipe.work.inputs_source.input_fingerprint(sizes)
    return pipe.state.inputs


def use_trainer_data(pipe: "Pipeline", datamodule: Any, rank: int = 0, world_size: int = 1) -> None:
    """A composed Trainer's data for the run: its DataModule (:func:`use_datamodule`, sharded across the processes:
    each image once) or, without one the run can read, the batches of its train loader (:func:`use_loader`),
    unless images were given otherwise (:class:`~snapvit_pl.pipeline.TensorInputs`)."""
    if check_data_source(pipe, datamodule):
        use_datamodule(pipe, datamodule)
        if hasattr(datamodule, "shard"):
            datamodule.shard(rank, world_size)
    elif type(pipe.inputs) is StageInputs:
        use_loader(pipe)
