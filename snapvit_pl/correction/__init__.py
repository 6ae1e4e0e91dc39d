"""Post-pruning weight correction: a ridge refit of each pruned block to the dense model's outputs; SparseGPT-style
OBS update on removed input columns; FLAP bias compensation; held-out images and the output check that keep a
correction from making a model worse."""

from .bias import compensate_bias_and_prune
from .dense_fit import RidgeFit, fit_to_dense_and_prune
from .guard import OutputCheck, OutputGuard, split_calibration
from .reconstruction import Reconstruction
from .settings import METHOD_SETTINGS, CorrectionSettings
from .sparsegpt import ColumnCorrector, correct_and_prune

__all__ = ["ColumnCorrector", "compensate_bias_and_prune", "CorrectionSettings", "correct_and_prune", "METHOD_SETTINGS",
           "OutputCheck", "OutputGuard", "Reconstruction", "RidgeFit", "fit_to_dense_and_prune", "split_calibration"]
