"""Elastic scores: ranking, budgets (ratios, sparsity, params, FLOPs), the artifact and the runtime."""
from .budget import PAPER_PAIRS, Budget, CostModel, paper_budgets, resolve, schedule
from .ranking import MIN_HEAD_KEEP, MIN_MLP_KEEP, check_ratio, select_subnet
from .runtime import ElasticViT
from .scores import ElasticScores, initial_coefficients, split_coefficients

__all__ = [
    "MIN_HEAD_KEEP", "MIN_MLP_KEEP", "PAPER_PAIRS", "Budget", "CostModel", "ElasticScores", "ElasticViT", "check_ratio",
    "initial_coefficients", "paper_budgets", "resolve", "schedule", "select_subnet", "split_coefficients",
]
