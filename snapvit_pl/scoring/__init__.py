"""Local importance scores: one per attention head and per MLP hidden neuron (higher = keep).

=================  =================================  ======  ======  =========================
name               class                              data    labels  notes
=================  =================================  ======  ======  =========================
``ssl_fisher``     :class:`SSLFisher` (default)       yes     no      multi-crop views, teacher
``label_fisher``   :class:`LabelFisher`               yes     yes     needs a classifier head
``snip_magnitude`` :class:`SNIPMagnitude`             yes     no      multi-crop views, teacher
``magnitude``      :class:`Magnitude`                 no      no      weights only
``lamp``           :class:`LAMP`                      no      no      weights only
``random``         :class:`RandomScorer`              no      no      seeded
=================  =================================  ======  ======  =========================

All share :class:`Scorer`'s ``setup / update / reduce / compute`` interface and return
:class:`LocalScores`; a YAML picks one by ``class_path`` (e.g. ``snapvit_pl.scoring.SSLFisher``),
code by :func:`build_scorer`. SnapViT's default is ``ssl_fisher`` with ``reduction="squared_sum"``
(the reference implementation's choice, and invariant to batching and DDP sharding; see
:mod:`snapvit_pl.scoring.gradient`).
"""
from __future__ import annotations

from typing import Any

from .base import LocalScores, NonFiniteGradientError, Scorer, ScoringError, split_batch
from .gradient import REDUCTIONS, GradientScorer, LabelFisher, SNIPMagnitude, SSLFisher, self_distillation_loss
from .weights import LAMP, Magnitude, RandomScorer, lamp

SCORERS: dict[str, type[Scorer]] = {
    cls.name: cls for cls in (SSLFisher, LabelFisher, SNIPMagnitude, Magnitude, LAMP, RandomScorer)
}


def build_scorer(name: str = "ssl_fisher", **kwargs: Any) -> Scorer:
    """A scorer by name, e.g. ``build_scorer("ssl_fisher", reduction="fisher")``.

    Raises:
        ScoringError: unknown name.
    """
    if name not in SCORERS:
        raise ScoringError(f"unknown scorer {name!r}; choose one of {', '.join(SCORERS)}")
    return SCORERS[name](**kwargs)


__all__ = [
    "GradientScorer", "LAMP", "LabelFisher", "LocalScores", "Magnitude", "NonFiniteGradientError", "REDUCTIONS",
    "RandomScorer", "SCORERS", "SNIPMagnitude", "SSLFisher", "Scorer", "ScoringError", "build_scorer", "lamp",
    "self_distillation_loss", "split_batch",
]
