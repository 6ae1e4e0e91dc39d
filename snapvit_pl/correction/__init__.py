"""Post-pruning weight correction (SparseGPT-style OBS update on removed input columns)."""

from .sparsegpt import ColumnCorrector
from .structured import correct_and_prune, embed_tokens

__all__ = ["ColumnCorrector", "correct_and_prune", "embed_tokens"]
