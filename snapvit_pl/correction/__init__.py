"""Post-pruning weight correction (SparseGPT-style OBS update on removed input columns)."""

from snapvit_pl.correction.sparsegpt import ColumnCorrector

__all__ = ["ColumnCorrector"]
