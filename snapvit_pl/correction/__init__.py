"""Post-pruning weight correction (SparseGPT-style OBS update on removed input columns; FLAP bias compensation)."""

from .bias import compensate_bias_and_prune
from .sparsegpt import ColumnCorrector
from .structured import CorrectionSettings, correct_and_prune

__all__ = ["ColumnCorrector", "compensate_bias_and_prune", "CorrectionSettings", "correct_and_prune"]
