"""Search of the global (cross-block) importance coefficients: the settings, the loop, the fitness, the optimisers."""

from .base import EvolutionStrategy, default_popsize, xnes_utilities
from .fitness import EmbeddingFitness, PCAProjection
from .loop import SearchProgress, SearchResult, run_search, search_snapshots
from .settings import DEFAULT_SPARSITY_PAIRS, OPTIMIZERS, SearchSettings
from .snes import SNES, snes_learning_rate
from .xnes import XNES, default_learning_rate

__all__ = ["DEFAULT_SPARSITY_PAIRS", "EmbeddingFitness", "EvolutionStrategy", "OPTIMIZERS", "PCAProjection", "SNES",
           "SearchProgress", "SearchResult", "SearchSettings", "XNES", "default_learning_rate", "default_popsize",
           "run_search", "search_snapshots", "snes_learning_rate", "xnes_utilities"]
