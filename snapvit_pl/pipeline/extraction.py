"""Stage 3: pruned models at budgets, each through the same steps in a fixed order.

For every budget: resolve the sub-network from the elastic scores -> cut it from the base model
(with weight correction when enabled) -> evaluate it (when enabled) -> save the checkpoint (when
a directory is given). ``prune.py``, ``python -m snapvit_pl.extract``, the Python API and the
benchmarks all go through :func:`extract_models`.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence

import torch
from torch import nn

from ..correction import correct_and_prune
from ..correction.sparsegpt import Damping
from ..elastic.budget import Budget, CostModel, default_budgets
from ..elastic.scores import ElasticScores
from ..errors import ConfigError
from ..eval.suite import EvalData, evaluate_model, parse_metrics
from ..eval.throughput import measure_throughput
from ..models.checkpoint import save_pruned
from ..models.cost import input_shape
from ..models.loading import BackboneSpec
from ..models.surgery import prune_
from ..models.units import prunable_blocks
from .state import ExtractedModel, Timings


@dataclass
class ExportSettings:
    """Which pruned models a run writes.

    Args:
        budgets: budgets as dicts of :class:`snapvit_pl.elastic.Budget` fields, e.g.
            ``{"mlp_ratio": 0.35, "head_ratio": 0.2}``, ``{"sparsity": 0.4}``, ``{"flops": 0.5}``,
            ``{"params": 20e6}``, ``{"latency": 12.5}``; default: 10%, 20%, ... 60% of the parameters removed
            (``{"sparsity": 0.1}`` ...), each split by ``split``.
        mlp_multiple: round MLP widths to this multiple (8 or 16 suit most hardware).
        split: how a sparsity / params / FLOPs budget is divided between heads and MLP neurons:
            ``fitness`` tries ``split_candidates`` head ratios around the schedule's and keeps the one
            whose sub-network drifts least from the dense embeddings (recorded in the elastic scores);
            ``schedule`` always uses ``head_ratio = mlp_ratio - 0.15``. Ratio pairs fix their own split.
        split_candidates: head ratios tried per budget with ``split: fitness``.
        latency_batch_size: batch size of the latency table (for ``{"latency": ms}`` budgets).
        latency_device: device of the latency table (default: the run's device). The table is measured
            once and cached in the run directory (``latency_table.json``).
        save_models: write the pruned checkpoints (else only the scores and the report).
        scores_file: file name of the elastic artifact in the run directory.
    """

    budgets: Optional[list[dict[str, float]]] = None
    mlp_multiple: int = 1
    split: Literal["fitness", "schedule"] = "fitness"
    split_candidates: int = 7
    latency_batch_size: int = 64
    latency_device: Optional[str] = None
    save_models: bool = True
    scores_file: str = "elastic_scores.safetensors"

    def __post_init__(self) -> None:
        if self.mlp_multiple < 1:
            raise ConfigError(f"export.mlp_multiple must be >= 1, got {self.mlp_multiple}")
        if self.split not in ("fitness", "schedule") or self.split_candidates < 1:
            raise ConfigError(f"export.split must be 'fitness' or 'schedule' (got {self.split!r}) and "
                              f"split_candidates >= 1 (got {self.split_candidates})")
        self.budget_list()  # a malformed budget fails here, before any work

    def budget_list(self) -> list[Budget]:
        return default_budgets() if self.budgets is None else [Budget(**b) for b in self.budgets]


@dataclass
class CorrectionSettings:
    """SparseGPT-style weight correction of every extracted model (off by default).

    Args:
        enabled: correct each model (``attn.proj`` / ``mlp.fc2`` of the blocks that lose units).
        num_samples: calibration images (plain views of a seeded subset of the pruning data).
        batch_size: images per forward pass.
        damping, damp_fraction, block_size: see :meth:`snapvit_pl.correction.ColumnCorrector.correct`
            (DINOv3: ``damping: max``, ``damp_fraction: 0.1``).
    """

    enabled: bool = False
    num_samples: int = 256
    batch_size: int = 64
    damping: Damping = "mean"
    damp_fraction: float = 0.01
    block_size: int = 128

    def __post_init__(self) -> None:
        if self.num_samples < 1 or self.batch_size < 1 or self.block_size < 1 or not self.damp_fraction >= 0:
            raise ConfigError("correction: num_samples, batch_size and block_size must be >= 1, damp_fraction >= 0")


@dataclass
class EvaluationSettings:
    """Evaluation of the dense model and of every extracted model.

    Args:
        metrics: any of ``knn``, ``linear``, ``head`` (own classifier, no retraining), ``throughput``;
            empty: no evaluation.
        train_samples: class-balanced subset of the train split used as k-NN memory / probe train set (None: all).
        val_samples: class-balanced subset of the val split scored (None: all).
        batch_size: feature-extraction batch size.
        knn_k: neighbours of the weighted k-NN (DINO: 20).
    """

    metrics: list[str] = field(default_factory=lambda: ["knn"])
    train_samples: Optional[int] = 5000
    val_samples: Optional[int] = 2000
    batch_size: int = 256
    knn_k: int = 20

    def __post_init__(self) -> None:
        self.metrics = parse_metrics(self.metrics) if self.metrics else []
        if "seg" in self.metrics:
            raise ConfigError("evaluation.metrics: 'seg' needs segmentation data; run python -m snapvit_pl.evaluate "
                              "--metrics seg on the exported checkpoints")
        if self.batch_size < 1 or self.knn_k < 1:
            raise ConfigError("evaluation: batch_size and knn_k must be >= 1")


class Correction:
    """The correction step, bound to its calibration images."""

    def __init__(self, settings: CorrectionSettings, images: torch.Tensor):
        self.settings, self.images = settings, images

    def __call__(self, base: nn.Module, subnet) -> tuple[nn.Module, dict[str, Any]]:
        """A corrected, pruned copy of ``base`` and what was done."""
        s = self.settings
        started = time.perf_counter()
        images = self.images.to(next(base.parameters()).device)
        model = correct_and_prune(copy.deepcopy(base), subnet, images, batch_size=s.batch_size, damping=s.damping,
                                  damp_fraction=s.damp_fraction, block_size=s.block_size)
        return model, {"num_samples": len(images), "damping": s.damping, "damp_fraction": s.damp_fraction,
                       "seconds": round(time.perf_counter() - started, 3)}


class Evaluation:
    """The evaluation step, bound to its data (see :func:`snapvit_pl.eval.suite.evaluate_model`)."""

    def __init__(self, settings: EvaluationSettings, data: EvalData, device: Optional[torch.device] = None,
                 log: Optional[Callable[[str], None]] = None):
        self.settings, self.data, self.device, self.log = settings, data, device, log

    def __call__(self, model: nn.Module) -> dict[str, Any]:
        s = self.settings
        return evaluate_model(model, self.data, s.metrics, knn_k=s.knn_k, device=self.device, log=self.log,
                              count_cost=False)


def check_budgets(model: nn.Module, budgets: Sequence[Budget], min_mlp_keep: float, min_head_keep: float,
                  mlp_multiple: int = 1) -> None:
    """Raise ``PruningSpecError`` now for a budget the keep ratios make unreachable (before the expensive stages).

    Reachability depends on the architecture and the keep ratios, not on the scores, so uniform
    placeholder scores decide it.
    """
    blocks = prunable_blocks(model)
    placeholder = ElasticScores([torch.zeros(b.heads.num_units) for b in blocks],
                                [torch.zeros(b.neurons.num_units) for b in blocks],
                                min_mlp_keep=min_mlp_keep, min_head_keep=min_head_keep)
    cost = CostModel(model)
    for budget in budgets:
        if budget.latency is None:  # a latency target is checked once its table is measured
            placeholder.subnet(budget, cost, mlp_multiple)


def extract_models(
    base: nn.Module,
    scores: ElasticScores,
    budgets: Sequence[Budget],
    *,
    mlp_multiple: int = 1,
    correction: Optional[Correction] = None,
    evaluation: Optional[Evaluation] = None,
    save_dir: Optional[str | Path] = None,
    spec: Optional[BackboneSpec] = None,
    overwrite: bool = True,
    keep_models: bool = False,
    cost: Optional[CostModel] = None,
    timings: Optional[Timings] = None,
    on_model: Optional[Callable[[ExtractedModel], None]] = None,
    measure_latency: bool = False,
) -> list[ExtractedModel]:
    """Cut, post-process and save one pruned model per budget, in that order.

    Args:
        base: the dense base model the scores belong to (never modified).
        scores: its elastic scores.
        budgets: the budgets to cut.
        mlp_multiple: round MLP widths to this multiple.
        correction: weight correction applied while cutting (None: plain surgery).
        evaluation: evaluation of each model (None: not evaluated).
        save_dir: write each model to ``save_dir/<label>/`` (None: not saved).
        spec: how the base model is built (recorded in each checkpoint; default ``scores.base``).
        overwrite: replace existing checkpoints.
        keep_models: keep the pruned modules in the results (else released once saved, to free memory).
        cost: the base model's :class:`CostModel`, if already built (with a latency table for latency budgets).
        timings: receives ``correction_s`` and ``evaluation_s``.
        on_model: called with each finished model (progress, logging).
        measure_latency: time each model on the latency table's device and batch size, next to its prediction.
    """
    if save_dir is not None and spec is None:
        if not scores.base.get("model_name"):
            raise ConfigError("saving pruned checkpoints needs the base model's BackboneSpec: pass spec=")
        spec = BackboneSpec.from_dict(scores.base)
    timings = timings if timings is not None else Timings()
    cost = cost or CostModel(base)
    extracted = []
    for budget in budgets:
        subnet, mlp_ratio, head_ratio = scores.subnet(budget, cost, mlp_multiple)
        item = ExtractedModel(budget.label(), budget, subnet, mlp_ratio, head_ratio, cost.params(subnet), cost.flops(subnet))
        if correction is not None:
            with timings.measure("correction"):
                item.model, item.correction = correction(base, subnet)
        else:
            item.model = prune_(copy.deepcopy(base), subnet)
        if evaluation is not None:
            with timings.measure("evaluation"):
                item.metrics = evaluation(item.model)
        if measure_latency and cost.latency is not None:
            table = cost.latency
            item.predicted_latency_ms = table.predict(subnet)
            item.latency_ms = 1000 * measure_throughput(item.model, input_shape(item.model), table.batch_size, warmup=5,
                                                        repeats=20, device=table.device).median_batch_seconds
        if save_dir is not None:
            relative = Path(save_dir) / item.label
            save_pruned(item.model, relative, spec, subnet, overwrite=overwrite,  # base_spec: the teacher of a fine-tune
                        extra={**item.record(), "base_fingerprint": scores.fingerprint, "base_spec": spec.to_dict()})
            item.checkpoint = str(relative)
        if not keep_models:
            item.model = None
        extracted.append(item)
        if on_model is not None:
            on_model(item)
    return extracted
