"""A pipeline from a finished run: its scores (:func:`from_scores`) or its folder (:func:`from_run`), to cut more
budgets later."""
from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from torch import nn

from ..elastic.scores import ElasticScores
from ..errors import ConfigError
from ..models.loading import BackboneSpec, load_backbone
from ..scoring import LocalScores
from ..run.data import run_data as find_run_data
from ..search.loop import SearchResult
from .inputs import DataModuleInputs
from .settings import FITNESS_SEARCH, RECORDED_EXPORT, ExportSettings, PipelineSettings

if TYPE_CHECKING:  # (annotations only)
    from .driver import Pipeline


def from_scores(cls: type["Pipeline"], model: nn.Module, scores: ElasticScores, settings: Optional[PipelineSettings] = None,
                **options: Any) -> "Pipeline":
    """A pipeline whose importance, search and splits are those recorded in ``scores`` (e.g. to export more
    budgets later); ``model`` must hold the weights they were computed on. The keep ratios are the scores';
    without ``settings``, so is the MLP width rounding (``export.mlp_multiple``). With ``inputs`` holding the
    run's images, :meth:`Pipeline.export` races the split of a budget the scores do not record as the run would have
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
    pipeline.work.splits = scores.splits
    pipeline.state.completed = ["importance", "search", "splits"]
    return pipeline


def from_run(cls: type["Pipeline"], run_dir: str | Path, model: Optional[nn.Module] = None,
             settings: Optional[PipelineSettings] = None, scores_file: Optional[str] = None,
             run_data: bool = True, **options: Any) -> "Pipeline":
    """:func:`from_scores` for the scores in ``run_dir`` (a ``prune.py`` run folder), with the run's images
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
