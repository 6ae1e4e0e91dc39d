"""Elastic scores: ranking, budgets (ratios, sparsity, params, FLOPs), the artifact and the runtime."""
from .budget import DEFAULT_SPARSITIES, PAPER_PAIRS, Budget, CostModel, default_budgets, paper_budgets, resolve, schedule
from .ranking import MIN_HEAD_KEEP, MIN_MLP_KEEP, check_ratio, select_subnet
from .runtime import ElasticViT
from .scores import ElasticScores, initial_coefficients, split_coefficients

__all__ = [
    "DEFAULT_SPARSITIES", "MIN_HEAD_KEEP", "MIN_MLP_KEEP", "PAPER_PAIRS", "default_budgets", "Budget", "CostModel", "ElasticScores", "ElasticViT", "check_ratio",
    "initial_coefficients", "paper_budgets", "resolve", "schedule", "select_subnet", "split_coefficients",
]
