"""Post-pruning weight correction: a ridge refit of each pruned block to the dense model's outputs; SparseGPT-style
OBS update on removed input columns; FLAP bias compensation."""

from .bias import compensate_bias_and_prune
from .dense_fit import Reconstruction, RidgeFit, fit_to_dense_and_prune
from .sparsegpt import ColumnCorrector
from .structured import CorrectionSettings, correct_and_prune

__all__ = ["ColumnCorrector", "compensate_bias_and_prune", "CorrectionSettings", "correct_and_prune", "Reconstruction",
           "RidgeFit", "fit_to_dense_and_prune"]
