"""Elastic scores: ranking, budgets (ratios, sparsity, params, FLOPs), the artifact and the runtime."""
from .budget import Budget, CostModel, resolve, schedule
from .ranking import check_ratio, select_subnet
from .runtime import ElasticViT
from .scores import ElasticScores, initial_coefficients, split_coefficients

__all__ = [
    "Budget", "CostModel", "ElasticScores", "ElasticViT", "check_ratio", "initial_coefficients", "resolve",
    "schedule", "select_subnet", "split_coefficients",
]
