"""The Python API: elastic scores for a timm ViT and a loader of unlabeled images, in one call.

    import snapvit_pl
    scores = snapvit_pl.fit_elastic(model, loader)
    small = scores.extract(model, flops=0.5)       # a physically pruned copy; ``model`` is untouched
    scores.save("elastic_scores.safetensors")      # any budget later, also with python -m snapvit_pl.extract

It runs the stages of ``prune.py`` (:class:`snapvit_pl.pipeline.Pipeline`: importance, search, splits) without
Lightning.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from torch import nn

from .elastic.scores import ElasticScores
from .errors import ConfigError
from .models.cost import check_images
from .models.loading import BackboneSpec, check_finite
from .models.modes import eval_mode
from .models.units import prunable_blocks
from .pipeline.driver import Pipeline
from .pipeline.importance import scoring_views
from .pipeline.inputs import LoaderInputs, TensorInputs
from .pipeline.settings import ExportSettings, ImportanceSettings, PipelineSettings
from .progress import ProgressMode
from .scoring import Scorer
from .search.settings import SearchSettings


def fit_elastic(
    model: nn.Module,
    loader: Iterable[Any],
    *,
    scorer: Optional[Scorer] = None,
    importance: Optional[ImportanceSettings] = None,
    search: Optional[SearchSettings] = None,
    export: Optional[ExportSettings] = None,
    fitness_images: Optional[torch.Tensor] = None,
    spec: Optional[BackboneSpec] = None,
    crop_seed: int = 0,
    progress: ProgressMode | bool = "auto",
) -> ElasticScores:
    """Rank every head and MLP neuron of ``model`` once: local importance, the coefficient search, and the
    head/MLP split of cost budgets (a grid of parameter and FLOPs budgets, and ``export.budgets``).

    Args:
        model: a supported timm ViT (dense, pretrained), on the device to compute on; it is not modified.
        loader: one pass of unlabeled batches: plain images ``[B, C, H, W]`` normalised as the model
            expects (multi-crop views are made from them for the self-supervised scorers), multi-crop
            views ``[B, V, C, H, W]`` (e.g. ``datamodule.unlabeled_dataloader(views="multicrop")``), or
            ``(images, labels)`` pairs for label-based scorers.
        scorer: the local score (default :class:`snapvit_pl.scoring.GaussNewtonGreedy`, label-free); a shortcut for
            ``importance=ImportanceSettings(scorer)``.
        importance: the scorer and the keep ratios (:class:`snapvit_pl.pipeline.ImportanceSettings`).
        search: search settings (default :class:`snapvit_pl.SearchSettings`).
        export: how cost budgets are split (``split``, ``split_grid``, ``split_candidates``, ``mlp_multiple``) and
            the budgets whose split must be exact (``budgets``; default: 10% ... 60% of the parameters removed).
        fitness_images: ``[N, C, H, W]`` images of the search's fitness (default: the first
            ``search.num_images`` plain images of ``loader``; required when it yields multi-crop views).
        spec: how ``model`` is built, recorded so that ``python -m snapvit_pl.extract`` can rebuild it.
        crop_seed: seed of the multi-crop views made from plain images.
        progress: ``auto`` (bars in a terminal, log lines elsewhere), ``bar``, ``lines`` or ``off``.

    Returns:
        the elastic scores: ``scores.extract(model, flops=0.5)`` cuts a model, ``scores.save(path)`` stores them.
    """
    _check_model(model)
    if isinstance(loader, (str, bytes)) or not isinstance(loader, Iterable):
        raise ConfigError(f"loader must be an iterable of image batches (e.g. a DataLoader), got "
                          f"{type(loader).__name__}; e.g. datamodule.unlabeled_dataloader(views='multicrop')")
    if scorer is not None and not isinstance(scorer, Scorer):
        raise ConfigError(f"scorer must be a snapvit_pl.scoring.Scorer (e.g. GaussNewtonGreedy()), got "
                          f"{type(scorer).__name__}")
    if scorer is not None and importance is not None:
        raise ConfigError("give the scorer either as scorer= or inside importance=, not both")
    importance = _settings(importance, ImportanceSettings, "importance") or ImportanceSettings(scorer)
    settings = PipelineSettings(importance=importance,
                                search=_settings(search, SearchSettings, "search") or SearchSettings(),
                                export=_settings(export, ExportSettings, "export") or ExportSettings())
    if fitness_images is not None:
        check_images(model, fitness_images, "fitness_images")
    wanted = settings.search.num_images if fitness_images is None else 0
    kept = LoaderInputs(scoring_views(importance.scorer), wanted, 0, crop_seed=crop_seed, model=model,
                        source="the loader")
    batches = _ScoringBatches(loader, kept)
    inputs = TensorInputs(fitness_images)
    pipeline = Pipeline(model, settings, spec=spec, inputs=inputs, progress=progress)
    with eval_mode(model):
        pipeline.importance(batches)
        if fitness_images is None and _needs_images(settings):
            if not importance.scorer.requires_data:  # the scorer did not read the loader
                for batch in loader:
                    kept.take(batch)
                    if kept.kept >= wanted:
                        break
            if not kept.images:
                raise ConfigError("the search and the head/MLP split choice need plain images, and the loader yields "
                                  "none (multi-crop views, or nothing): pass fitness_images=[N, C, H, W] (e.g. "
                                  "datamodule.unlabeled_images(1000)), or search=SearchSettings(max_evaluations=0) "
                                  "with export=ExportSettings(split='schedule')")
            inputs.images = kept.fitness_images(settings.search)
        pipeline.search()
        scores = pipeline.choose_splits()
    if spec is None:
        scores.base = {}  # unknown build arguments: extraction needs the model itself (scores.extract(model, ...))
    return scores


def _needs_images(settings: PipelineSettings) -> bool:
    return settings.search.max_evaluations > 0 or settings.export.split == "fitness"


def _check_model(model: Any) -> None:
    """A supported timm ViT, or one error saying what was given and how to get one."""
    if isinstance(model, (str, Path)):
        raise ConfigError(f"fit_elastic takes the model itself, got the path or name {str(model)!r}; load it first: "
                          "snapvit_pl.models.load_backbone(BackboneSpec(name_or_file...)) or timm.create_model(...)")
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model must be a timm ViT (a torch.nn.Module), got {type(model).__name__}")
    prunable_blocks(model)  # UnsupportedModelError naming what is supported
    check_finite(model)


def _settings(value: Any, kind: type, name: str) -> Any:
    """A stage's settings: as given, or built from a mapping of its fields (``search={"max_evaluations": 0}``)."""
    if value is None or isinstance(value, kind):
        return value
    if isinstance(value, Mapping):
        known = {f.name for f in fields(kind)}
        unknown = sorted(set(map(str, value)) - known)
        if unknown:
            raise ConfigError(f"{name}= has unknown keys {unknown}; {kind.__name__} takes {', '.join(sorted(known))}")
        return kind(**value)
    raise ConfigError(f"{name}= must be a {kind.__name__} (or a mapping of its fields), got {type(value).__name__}")


class _ScoringBatches:
    """The loader's batches in the form the scorer needs (:meth:`LoaderInputs.take`, which keeps the first plain
    images aside on the first pass); readable again for a scorer of several passes (as often as the loader is),
    with the same multi-crop views on every pass."""

    def __init__(self, loader: Iterable[Any], kept: LoaderInputs):
        self.loader, self.kept = loader, kept

    def __iter__(self) -> Iterator[Any]:
        self.kept.new_pass()
        for batch in self.loader:
            yield self.kept.take(batch)
