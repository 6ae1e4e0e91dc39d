"""Post-pruning weight correction (SparseGPT-style OBS update on removed input columns)."""

from .sparsegpt import ColumnCorrector
from .structured import CorrectionSettings, correct_and_prune

__all__ = ["ColumnCorrector", "CorrectionSettings", "correct_and_prune"]
