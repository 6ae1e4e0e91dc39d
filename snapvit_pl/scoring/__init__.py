"""Local importance scores: one per attention head and per MLP hidden neuron (higher = keep).

=================  =================================  ======  ======  =========================
name               class                              data    labels  notes
=================  =================================  ======  ======  =========================
``sensitivity``    :class:`OutputSensitivity`         yes     no      Gauss-Newton drift of the embedding
``ssl_fisher``     :class:`SSLFisher`                 yes     no      multi-crop views, teacher (SnapViT)
``label_fisher``   :class:`LabelFisher`               yes     yes     needs a classifier head
``snip_magnitude`` :class:`SNIPMagnitude`             yes     no      multi-crop views, teacher
``magnitude``      :class:`Magnitude`                 no      no      weights only
``lamp``           :class:`LAMP`                      no      no      weights only
``random``         :class:`RandomScorer`              no      no      seeded
``activation``     :class:`Activation`                yes     no      forward only (Minitron / ModelOpt)
``wanda_sp``       :class:`WandaSP`                   yes     no      forward only (Wanda-sp)
``flap``           :class:`FLAP`                      yes     no      forward only (FLAP)
``taylor``         :class:`Taylor`                    yes     no      multi-crop views, teacher (Torch-Pruning)
``ssl_mask_fisher`` :class:`SSLMaskFisher`            yes     no      per-sample mask Fisher, teacher
``gn_greedy``      :class:`GaussNewtonGreedy` (default) yes   no      greedy order under the GN drift
=================  =================================  ======  ======  =========================

All share :class:`Scorer`'s ``setup / update / reduce / compute`` interface and return
:class:`LocalScores`; a YAML picks one by ``class_path`` (e.g. ``snapvit_pl.scoring.SSLFisher``),
code by :func:`build_scorer`. The pipeline's default, :data:`DEFAULT_SCORER`, is ``gn_greedy``: the
removal order under the Gauss-Newton model of the embedding drift over all units of all blocks, so the
cross-block interactions that SnapViT searches coefficients for are computed, and no search is needed
(docs/method.md, "The default score"). SnapViT's own score is ``ssl_fisher`` with ``reduction="squared_sum"`` (the reference
implementation's choice, invariant to batching and DDP sharding; see :mod:`snapvit_pl.scoring.gradient`).
"""
from __future__ import annotations

from typing import Any

from .base import Accumulator, LocalScores, NonFiniteGradientError, Scorer, ScoringError, split_batch
from .gradient import REDUCTIONS, GradientScorer, LabelFisher, SNIPMagnitude, SSLFisher, self_distillation_loss
from .activation import FLAP, Activation, ActivationStatistics, WandaSP
from .gauss_newton import GaussNewtonGreedy
from .sensitivity import MaskGradientScorer, OutputSensitivity, SSLMaskFisher
from .taylor import Taylor
from .weights import LAMP, Magnitude, RandomScorer, lamp

#: The pipeline's scorer when none is given (``ImportanceSettings()``, ``fit_elastic``, the presets): one definition.
DEFAULT_SCORER: type[Scorer] = GaussNewtonGreedy

#: The scorers by name: every class that names itself registers as it is defined (:attr:`Scorer.registry`; a
#: user's scorer too, once its module is imported).
SCORERS: dict[str, type[Scorer]] = Scorer.registry


def build_scorer(name: str = DEFAULT_SCORER.name, **kwargs: Any) -> Scorer:
    """A scorer by name, e.g. ``build_scorer("ssl_fisher", reduction="fisher")``.

    Raises:
        ScoringError: unknown name.
    """
    if name not in SCORERS:
        raise ScoringError(f"unknown scorer {name!r}; choose one of {', '.join(sorted(SCORERS))}")
    return SCORERS[name](**kwargs)


__all__ = [
    "Accumulator", "Activation", "ActivationStatistics", "DEFAULT_SCORER", "FLAP", "GaussNewtonGreedy", "MaskGradientScorer", "OutputSensitivity",
    "SSLMaskFisher", "Taylor", "WandaSP", "GradientScorer", "LAMP", "LabelFisher", "LocalScores", "Magnitude", "NonFiniteGradientError", "REDUCTIONS",
    "RandomScorer", "SCORERS", "SNIPMagnitude", "SSLFisher", "Scorer", "ScoringError", "build_scorer", "lamp",
    "self_distillation_loss", "split_batch",
]
