"""Elastic scores: ranking, budgets (ratios, sparsity, params, FLOPs, latency), splits, the artifact and the runtime."""
from .budget import DEFAULT_SPARSITIES, PAPER_PAIRS, Budget, CostModel, default_budgets, resolve, schedule
from .ranking import MIN_HEAD_KEEP, MIN_MLP_KEEP, check_ratio, select_subnet
from .runtime import ElasticViT
from .scores import ElasticScores, initial_coefficients, split_coefficients
from .splits import SplitTable

__all__ = [
    "DEFAULT_SPARSITIES", "MIN_HEAD_KEEP", "MIN_MLP_KEEP", "PAPER_PAIRS", "Budget", "CostModel", "ElasticScores",
    "ElasticViT", "SplitTable", "check_ratio", "default_budgets", "initial_coefficients", "resolve",
    "schedule", "select_subnet", "split_coefficients",
]
