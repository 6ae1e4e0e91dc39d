"""``ElasticViT``: one set of base weights, any budget at run time."""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..models.surgery import prune_, use_subnet
from ..models.units import Subnet, prunable_blocks
from .budget import Budget, CostModel
from .scores import ElasticScores


class ElasticViT(nn.Module):
    """A base ViT plus its elastic scores; ``set_budget`` switches sub-network without reloading weights.

    The forward pass runs the current sub-network by gathering its rows/columns from the base
    weights (cost of the pruned model); :meth:`extract` returns a physically pruned copy.

    Args:
        model: the dense base model the scores were computed for.
        scores: its :class:`ElasticScores`.
        verify_fingerprint: check that ``model`` holds the weights the scores were computed on.
        mlp_multiple: round MLP widths to this multiple when resolving budgets (default: the run's).
    """

    def __init__(self, model: nn.Module, scores: ElasticScores, verify_fingerprint: bool = True,
                 mlp_multiple: int | None = None):
        super().__init__()
        scores.check_model(model, verify_fingerprint)
        self.model, self.scores, self.mlp_multiple = model, scores, mlp_multiple
        self.cost = CostModel(model)
        self._blocks = prunable_blocks(model)
        self.subnet = Subnet.full(self._blocks)
        self.ratios = (0.0, 0.0)

    def set_budget(self, budget: Budget | None = None, **kwargs: Any) -> "ElasticViT":
        """Select the sub-network for ``budget`` (or ``Budget(**kwargs)``), e.g. ``set_budget(flops=0.5)``."""
        budget = Budget.parse(budget if budget is not None else kwargs)
        subnet, mlp_ratio, head_ratio = self.scores.subnet(budget, self.cost, self.mlp_multiple)
        self.subnet, self.ratios = subnet, (mlp_ratio, head_ratio)
        return self

    @property
    def params(self) -> int:
        return self.cost.params(self.subnet)

    @property
    def flops(self) -> int:
        return self.cost.flops(self.subnet)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with use_subnet(self.model, self.subnet, self._blocks):
            return self.model(x)

    def extract(self, budget: Budget | None = None, **kwargs: Any) -> nn.Module:
        """A physically pruned copy for ``budget`` (default: the current one); the base stays intact."""
        subnet = self.subnet if budget is None and not kwargs else self.scores.subnet(
            Budget.parse(budget if budget is not None else kwargs), self.cost, self.mlp_multiple
        )[0]
        return prune_(copy.deepcopy(self.model), subnet)
