"""Search of the global (cross-block) importance coefficients."""

from .xnes import XNES, default_learning_rate, default_popsize, xnes_utilities

__all__ = ["XNES", "default_learning_rate", "default_popsize", "xnes_utilities"]
