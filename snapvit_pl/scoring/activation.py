"""Forward-only (activation-statistic) scorers: Minitron activations, Wanda-sp, FLAP.

All three read the *inputs of the two output projections* of every block, the tensors a
head or an MLP neuron contributes to the residual stream through:

- ``attn.proj``: its input is the attention output, head-major (``[..., num_heads * head_dim]``:
  channels ``h * head_dim ... (h + 1) * head_dim - 1`` are head ``h``'s), after ``attn.norm``
  where a model has one (``scale_attn_inner`` / ``scale_attn_norm``);
- ``mlp.fc2``: its input is the hidden activation after the nonlinearity (after the gate of a
  gated MLP, after ``mlp.norm`` where present): channel ``j`` is neuron ``j``.

They need plain images and nothing else: no labels, no teacher, no gradients. A batch may be
``[B, C, H, W]`` images, ``[B, V, C, H, W]`` multi-crop views (every view counts as one image: the
pipeline hands multi-crop views to every label-free data scorer), or an ``(images, labels)``
pair whose labels are ignored. Every token counts (class, register and patch tokens alike).

The statistics are sums over images / tokens (float64), so :meth:`reduce` with an all-reduce-sum
gives on sharded data what one process gives on all of it, and neither batch order nor batch
size changes the result beyond float rounding.
"""
from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from ..device import autocast_context
from ..errors import DataError
from ..models.embedding import embed
from ..models.modes import eval_mode
from ..models.units import UnitGroup
from ..ranges import check_arguments, one_of
from .base import LocalScores, ScoringContext, ScoringError, SummedStatistics, model_device_dtype

#: The Linear whose input columns belong to the units of each kind.
OUTPUT_LAYERS = {"heads": "proj", "neurons": "fc2"}


def output_layer(group: UnitGroup, kind: str) -> nn.Linear:
    """``attn.proj`` (heads) or ``mlp.fc2`` (neurons) of a unit group."""
    layer = getattr(group.module, OUTPUT_LAYERS[kind], None)
    if not isinstance(layer, nn.Linear):
        raise ScoringError(f"{type(group.module).__name__} has no nn.Linear {OUTPUT_LAYERS[kind]!r} to read inputs of")
    return layer


def output_weight(group: UnitGroup, kind: str) -> Tensor:
    """The output projection's weight ``[out, units * unit_size]`` (float64, detached)."""
    return output_layer(group, kind).weight.detach().double()


def per_unit(channels: Tensor, group: UnitGroup, reduce: str = "sum") -> Tensor:
    """Per-channel values ``[units * unit_size]`` -> one per unit (sum or mean over the unit's channels)."""
    view = channels.view(group.num_units, group.unit_size)
    return view.sum(dim=1) if reduce == "sum" else view.mean(dim=1)


def standardized(channel_or_unit: Tensor, group: UnitGroup, per_channel: bool) -> Tensor:
    """FLAP's cross-layer standardisation: z-score over the layer's channels (or units), a head the mean of its
    channels' z, returned as ``exp(z)`` (positive, same order; a block coefficient ``c`` shifts z by ``ln c``)."""
    std = channel_or_unit.std()
    z = (channel_or_unit - channel_or_unit.mean()) / (std if std > 0 else 1.0)
    if per_channel:
        z = per_unit(z, group, reduce="mean")
    return z.clamp(max=math.log(torch.finfo(torch.float32).max) - 1).exp()


class ActivationStatistics(SummedStatistics):
    """Shared machinery: forward hooks on every ``attn.proj`` / ``mlp.fc2`` input, additive statistics.

    Subclasses define :meth:`_statistics` (the names and shapes of their per-group sums),
    :meth:`_accumulate` (add one batch's inputs) and :meth:`_score` (scores from the reduced sums).
    """

    requires_labels = False
    views = "plain"

    def setup(self, model: nn.Module, context: Optional[ScoringContext] = None) -> None:
        super().setup(model, context)
        self._device = model_device_dtype(model)[0]
        self._groups = [(f"{b.index}.{kind}", kind, getattr(b, kind)) for b in self.blocks for kind in ("heads", "neurons")]
        for key, kind, group in self._groups:
            output_layer(group, kind)  # fail early on an unsupported layer
        self._acc = self._init_accumulators()
        self._start_counting()

    def _init_accumulators(self) -> dict[str, Tensor]:
        acc = {}
        for key, kind, group in self._groups:
            width = group.num_units * group.unit_size
            for name, per in self._statistics().items():
                size = {"channel": width, "unit": group.num_units, "scalar": 1}[per]
                acc[f"{key}.{name}"] = torch.zeros(size, dtype=torch.float64, device=self._device)
        return acc

    @abstractmethod
    def _statistics(self) -> dict[str, str]:
        """``{name: "channel" | "unit" | "scalar"}``: the additive sums kept per unit group."""

    @abstractmethod
    def _accumulate(self, key: str, group: UnitGroup, x: Tensor) -> None:
        """Add one batch of inputs ``x`` ``[images, tokens, channels]`` (float64) to the group's sums."""

    @abstractmethod
    def _score(self, key: str, kind: str, group: UnitGroup) -> Tensor:
        """One score per unit from the reduced sums (``self._acc``)."""

    @torch.no_grad()
    def update(self, batch: Any) -> dict[str, float]:
        """Accumulate one batch of images (see the module docstring for the formats)."""
        images, _ = self._batch(batch)
        if images.dim() == 5:
            images = images.flatten(0, 1)
        handles = []

        def hook(key: str, group: UnitGroup) -> Callable:
            def read(_module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
                x = inputs[0].detach()
                x = x.reshape(x.shape[0], -1, x.shape[-1]).double()  # [images, tokens, channels]
                self._accumulate(key, group, x)
            return read

        try:
            for key, kind, group in self._groups:
                handles.append(output_layer(group, kind).register_forward_pre_hook(hook(key, group)))
            with eval_mode(self.model), autocast_context(self._device):
                embed(self.model, images)
        finally:
            for handle in handles:
                handle.remove()
        self._batches += 1
        self._samples += images.shape[0]
        return {}

    def compute(self) -> LocalScores:
        self._require_bound()
        if self._samples == 0:
            raise DataError(f"{self.name} saw no images: feed the scoring data through update() before compute()")
        with torch.no_grad():
            scores = {key: self._score(key, kind, group).float().cpu() for key, kind, group in self._groups}
        return LocalScores([scores[f"{b.index}.heads"] for b in self.blocks],
                           [scores[f"{b.index}.neurons"] for b in self.blocks])

    # -- resume --------------------------------------------------------------------------------
TokenAggregation = one_of("l2", "mean")
Standardize = one_of("zscore", "none")


class Activation(ActivationStatistics):
    """Minitron's activation-based width importance (NVIDIA, "Compact Language Models via Pruning and
    Knowledge Distillation", 2024; NVIDIA ModelOpt), forward passes only.

    Per image and token, a head's activation is the L2 norm of its slice of the ``attn.proj`` input
    (its attention output), a neuron's the absolute value of its ``mlp.fc2`` input (its activation
    after the nonlinearity). These are aggregated over the image's tokens, then averaged over images:

    - ``tokens="l2"`` (default): ``sqrt(sum_t a_t^2)`` (for a head: the Frobenius norm of its
      ``[tokens, head_dim]`` output);
    - ``tokens="mean"``: ``mean_t a_t``.

    Minitron aggregates over the batch by mean or L2 and over the sequence by mean or L2; the mean
    over images is the brief of this project (and keeps the statistic additive for DDP).

    Raw norms do not compare across blocks (a block with larger activations keeps all its units);
    ``standardize="zscore"`` applies FLAP's per-layer standardisation (see :class:`FLAP`) to the unit scores.

    Args:
        tokens: token aggregation, ``"l2"`` or ``"mean"``.
        standardize: ``"none"`` (default, Minitron) or ``"zscore"``.
    """

    name = "activation"

    def __init__(self, tokens: TokenAggregation = "l2", standardize: Standardize = "none"):
        check_arguments(Activation.__init__, locals(), "importance.scorer.init_args", skip={"self"})
        self.tokens, self.standardize = tokens, standardize

    def _statistics(self) -> dict[str, str]:
        return {"sum": "unit"}

    def _accumulate(self, key: str, group: UnitGroup, x: Tensor) -> None:
        a = x.view(*x.shape[:2], group.num_units, group.unit_size).square().sum(dim=-1)  # squared norms [n, T, U]
        per_image = a.sum(dim=1).sqrt() if self.tokens == "l2" else a.sqrt().mean(dim=1)
        self._acc[f"{key}.sum"].add_(per_image.sum(dim=0))

    def _score(self, key: str, kind: str, group: UnitGroup) -> Tensor:
        score = self._acc[f"{key}.sum"] / self._samples
        return standardized(score, group, per_channel=False) if self.standardize == "zscore" else score


class WandaSP(ActivationStatistics):
    """Structured Wanda ("Wanda-sp": Sun et al. 2023, "A Simple and Effective Pruning Approach for
    Large Language Models"; the structured form of An et al. 2024, FLAP's baseline).

    Input channel ``j`` of ``mlp.fc2`` (neuron ``j``) and of ``attn.proj`` scores
    ``sum_i |W_ij| * ||X_j||_2``, with ``||X_j||_2`` the L2 norm of channel ``j`` over every
    calibration token of every image; a head sums its ``head_dim`` channels. By default scores are not
    normalised across blocks (the global ranking compares them as they are); ``standardize="zscore"``
    applies FLAP's per-layer standardisation to the channel scores (see :class:`FLAP`).

    Args:
        standardize: ``"none"`` (default) or ``"zscore"``.
    """

    name = "wanda_sp"

    def __init__(self, standardize: Standardize = "none"):
        check_arguments(WandaSP.__init__, locals(), "importance.scorer.init_args", skip={"self"})
        self.standardize = standardize

    def _statistics(self) -> dict[str, str]:
        return {"sq": "channel"}

    def _accumulate(self, key: str, group: UnitGroup, x: Tensor) -> None:
        self._acc[f"{key}.sq"].add_(x.square().sum(dim=(0, 1)))

    def _score(self, key: str, kind: str, group: UnitGroup) -> Tensor:
        channel = output_weight(group, kind).abs().sum(dim=0) * self._acc[f"{key}.sq"].sqrt()
        return standardized(channel, group, per_channel=True) if self.standardize == "zscore" else per_unit(channel, group)


class FLAP(ActivationStatistics):
    """FLAP's fluctuation metric (An et al., "Fluctuation-based Adaptive Structured Pruning for Large
    Language Models", AAAI 2024).

    Input channel ``j`` of ``mlp.fc2`` / ``attn.proj`` scores ``var_n(X_nj) * ||W_:,j||_2^2``: the
    sample variance of the channel over all calibration tokens times the squared norm of its weight
    column (how much the layer's output would fluctuate around the bias-compensated value if the
    channel were replaced by its mean; :func:`snapvit_pl.correction.compensate_bias_and_prune`
    does that replacement).

    Across layers (``standardize="zscore"``, FLAP's "AL-AM" structure): each layer's channel metrics are
    standardised to zero mean and unit standard deviation over that layer's channels (FLAP's
    ``standarlization``), and a head takes the *mean* of its channels' standardised values (FLAP's
    reshape-and-mean over each head's channels), so that one global ranking over blocks compares
    units by how they stand within their own layer. FLAP then ranks heads and MLP channels together;
    here, as for every scorer, heads and neurons are ranked separately, each globally across blocks.
    The standardised value ``z`` is returned as ``exp(z)``: the same order, but positive, so that a
    block coefficient ``c`` (which multiplies scores) acts as the additive shift ``ln c`` of ``z``
    instead of inverting the order of negative scores. ``standardize="none"``: the raw metric
    (a head sums its channels).

    Args:
        standardize: ``"zscore"`` (default, FLAP) or ``"none"``.
    """

    name = "flap"

    def __init__(self, standardize: Standardize = "zscore"):
        check_arguments(FLAP.__init__, locals(), "importance.scorer.init_args", skip={"self"})
        self.standardize = standardize

    def _statistics(self) -> dict[str, str]:
        return {"sum": "channel", "sq": "channel", "tokens": "scalar"}

    def _accumulate(self, key: str, group: UnitGroup, x: Tensor) -> None:
        self._acc[f"{key}.sum"].add_(x.sum(dim=(0, 1)))
        self._acc[f"{key}.sq"].add_(x.square().sum(dim=(0, 1)))
        self._acc[f"{key}.tokens"].add_(x.shape[0] * x.shape[1])

    def channel_metric(self, key: str, kind: str, group: UnitGroup) -> Tensor:
        """The raw fluctuation metric of every input channel (float64)."""
        n = float(self._acc[f"{key}.tokens"])
        mean = self._acc[f"{key}.sum"] / n
        variance = ((self._acc[f"{key}.sq"] - n * mean.square()) / max(n - 1, 1)).clamp_min(0)
        return variance * output_weight(group, kind).square().sum(dim=0)

    def _score(self, key: str, kind: str, group: UnitGroup) -> Tensor:
        metric = self.channel_metric(key, kind, group)
        return per_unit(metric, group) if self.standardize == "none" else standardized(metric, group, per_channel=True)
