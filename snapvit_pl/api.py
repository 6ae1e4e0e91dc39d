"""The Python API: elastic scores for a timm ViT and a loader of unlabeled images, in one call.

    import snapvit_pl
    scores = snapvit_pl.fit_elastic(model, loader, budgets=[{"sparsity": 0.5}])
    small = scores.extract(model, sparsity=0.5)    # a physically pruned copy (the chosen split); ``model`` is untouched
    scores.save("elastic_scores.safetensors")      # any budget later, also with python -m snapvit_pl.extract

It runs the same stages as ``prune.py`` (:mod:`snapvit_pl.pipeline`), without Lightning.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional, Sequence

import torch
from torch import nn

from .elastic.budget import Budget
from .elastic.ranking import MIN_HEAD_KEEP, MIN_MLP_KEEP
from .elastic.scores import ElasticScores
from .errors import ConfigError
from .models.loading import BackboneSpec, fingerprint
from .models.modes import eval_mode
from .pipeline.importance import ImportanceSettings, local_importance, scoring_views
from .pipeline.search import SearchSettings
from .pipeline.splits import choose_splits
from .pipeline.stages import search_stage
from .pipeline.state import RunState
from .scoring import Scorer, split_batch


def fit_elastic(
    model: nn.Module,
    loader: Iterable[Any],
    *,
    scorer: Optional[Scorer] = None,
    search: Optional[SearchSettings] = None,
    fitness_images: Optional[torch.Tensor] = None,
    min_mlp_keep: float = MIN_MLP_KEEP,
    min_head_keep: float = MIN_HEAD_KEEP,
    spec: Optional[BackboneSpec] = None,
    budgets: Sequence[Budget | dict[str, float]] = (),
    split_candidates: int = 7,
    crop_seed: int = 0,
    progress: bool = True,
) -> ElasticScores:
    """Rank every head and MLP neuron of ``model`` once: local importance, then the coefficient search.

    Args:
        model: a supported timm ViT (dense, pretrained), on the device to compute on; it is not modified.
        loader: one pass of unlabeled batches: plain images ``[B, C, H, W]`` normalised as the model
            expects (multi-crop views are made from them for the self-supervised scorers), multi-crop
            views ``[B, V, C, H, W]`` (e.g. ``datamodule.unlabeled_dataloader(views="multicrop")``), or
            ``(images, labels)`` pairs for label-based scorers.
        scorer: the local score (default :class:`snapvit_pl.scoring.SSLFisher`, label-free).
        search: search settings (default :class:`SearchSettings`: the paper's).
        fitness_images: ``[N, C, H, W]`` images of the search's fitness (default: the first
            ``search.num_images`` plain images of ``loader``; required when it yields multi-crop views).
        min_mlp_keep, min_head_keep: share of each block's neurons / heads never pruned.
        spec: how ``model`` is built, recorded so that ``python -m snapvit_pl.extract`` can rebuild it.
        budgets: cost budgets (``{"sparsity": 0.5}``, ``Budget(flops=0.4)``, ...) whose head/MLP split is chosen
            now by the fitness (:func:`snapvit_pl.pipeline.choose_splits`) and recorded, so that
            ``scores.extract(model, sparsity=0.5)`` cuts the chosen split; other budgets follow the schedule.
        split_candidates: head ratios tried per budget.
        crop_seed: seed of the multi-crop views made from plain images.
        progress: show progress bars.

    Returns:
        the elastic scores: ``scores.extract(model, flops=0.5)`` cuts a model, ``scores.save(path)`` stores them.
    """
    settings = ImportanceSettings(scorer, min_mlp_keep, min_head_keep)
    search = search if search is not None else SearchSettings()
    views = scoring_views(settings.scorer)
    collected: list[torch.Tensor] = []
    batches = _scoring_batches(loader, views, collected, search.num_images if fitness_images is None else 0, crop_seed)
    with eval_mode(model):
        state = RunState(spec or BackboneSpec(_architecture_name(model), pretrained=False), fingerprint(model),
                         min_mlp_keep, min_head_keep)
        state.local = local_importance(settings.scorer, model, batches, progress=progress)
        state.scorer = settings.scorer_record()
        if search.max_evaluations > 0:
            if fitness_images is None and not settings.scorer.requires_data:  # the scorer did not read the loader
                for _ in batches:
                    if sum(len(c) for c in collected) >= search.num_images:
                        break
            if fitness_images is None:
                if not collected:
                    raise ConfigError("the loader yields multi-crop views: pass fitness_images=[N, C, H, W] plain images "
                                      "for the search (e.g. datamodule.unlabeled_images(1000))")
                fitness_images = torch.cat(collected)[: search.num_images]
        search_stage(state, model, fitness_images if fitness_images is not None else torch.empty(0), search,
                     progress=progress)
        wanted = [b if isinstance(b, Budget) else Budget(**b) for b in budgets]
        if wanted:
            if fitness_images is None:
                raise ConfigError("choosing the splits of budgets needs fitness images: give max_evaluations > 0 or "
                                  "fitness_images")
            state.splits = choose_splits(model, fitness_images, state.elastic_scores(), wanted,
                                         candidates=split_candidates, pca_components=search.pca_components,
                                         batch_size=search.batch_size)
    scores = state.elastic_scores()
    if spec is None:
        scores.base = {}  # unknown build arguments: extraction needs the model itself (scores.extract(model, ...))
    return scores


def _scoring_batches(loader: Iterable[Any], views: str, collected: list[torch.Tensor], wanted: int,
                     crop_seed: int) -> Iterator[Any]:
    """The loader's batches in the form the scorer needs, keeping the first ``wanted`` plain images aside."""
    from .data.transforms import BatchMultiCrop

    multicrop = BatchMultiCrop(seed=crop_seed)
    kept = 0
    for batch in loader:
        images, labels = split_batch(batch)
        if images.dim() == 4 and kept < wanted:
            collected.append(images[: wanted - kept].detach().cpu())
            kept += len(collected[-1])
        if views == "multicrop" and images.dim() == 4:
            yield multicrop(images)
        elif views == "labeled" and labels is None:
            raise ConfigError("this scorer needs labels: the loader must yield (images, labels) batches")
        else:
            yield batch if views != "multicrop" else images


def _architecture_name(model: nn.Module) -> str:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return cfg.get("architecture") or type(model).__name__
