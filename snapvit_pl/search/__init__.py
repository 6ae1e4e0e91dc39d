"""Search of the global (cross-block) importance coefficients: evolution strategies and the fitness."""

from .base import EvolutionStrategy, default_popsize, xnes_utilities
from .snes import SNES, snes_learning_rate
from .xnes import XNES, default_learning_rate

__all__ = ["EvolutionStrategy", "SNES", "XNES", "default_learning_rate", "default_popsize", "snes_learning_rate",
           "xnes_utilities"]
