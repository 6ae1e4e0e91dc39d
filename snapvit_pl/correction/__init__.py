"""Post-pruning weight correction (SparseGPT-style OBS update on removed input columns)."""

from snapvit_pl.correction.sparsegpt import ColumnCorrector
from snapvit_pl.correction.structured import correct_and_prune, embed_tokens

__all__ = ["ColumnCorrector", "correct_and_prune", "embed_tokens"]
