"""snapvit-pl: elastic, retraining-free structured pruning of pretrained Vision Transformers (SnapViT).

The Python API (imported on first use, so that ``import snapvit_pl.models`` stays light)::

    import snapvit_pl
    scores = snapvit_pl.fit_elastic(model, unlabeled_loader, search=snapvit_pl.SearchSettings(max_evaluations=50))
    small = scores.extract(model, flops=0.5)

See :mod:`snapvit_pl.api`, and :class:`snapvit_pl.Pipeline` for the stages one by one.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "fit_elastic": "snapvit_pl.api",
    "Pipeline": "snapvit_pl.pipeline.driver",
    "PipelineSettings": "snapvit_pl.pipeline.settings",
    "ImportanceSettings": "snapvit_pl.pipeline.settings",
    "ExportSettings": "snapvit_pl.pipeline.settings",
    "SearchSettings": "snapvit_pl.search.settings",
    "CorrectionSettings": "snapvit_pl.correction.settings",
    "EvaluationSettings": "snapvit_pl.eval.suite",
    "ElasticScores": "snapvit_pl.elastic.scores",
    "ElasticViT": "snapvit_pl.elastic.runtime",
    "Budget": "snapvit_pl.elastic.budget",
    "BackboneSpec": "snapvit_pl.models.loading",
    "load_backbone": "snapvit_pl.models.loading",
    "load_pruned": "snapvit_pl.models.checkpoint",
    "save_pruned": "snapvit_pl.models.checkpoint",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from .version import package_version

        globals()["__version__"] = package_version()
        return globals()["__version__"]
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'snapvit_pl' has no attribute {name!r}")
