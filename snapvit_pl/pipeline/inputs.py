"""What the stages read besides the scorer's batches: fitness images, calibration images, evaluation data."""
from __future__ import annotations

from typing import Any, Optional

import torch

from ..correction import CorrectionSettings
from ..errors import ConfigError
from ..eval.suite import EvalData, EvaluationSettings
from ..search.settings import SearchSettings


class StageInputs:
    """The images and labeled data of a run's later stages; the base class has none (every method refuses)."""

    def fitness_images(self, settings: SearchSettings) -> torch.Tensor:
        """``[N, C, H, W]`` plain images of the search's fitness (``settings.num_images`` of them at most)."""
        raise ConfigError("the search needs fitness images: pass fitness_images=[N, C, H, W] plain images")

    def has_fitness_images(self) -> bool:
        """Whether :meth:`fitness_images` has images to give."""
        return False

    def calibration_images(self, settings: CorrectionSettings) -> torch.Tensor:
        """``[N, C, H, W]`` plain images for the weight correction (``settings.num_samples`` at most)."""
        raise ConfigError("the weight correction needs calibration images: pass them, or leave correction off")

    def evaluation_data(self, settings: EvaluationSettings) -> Optional[EvalData]:
        """Labeled data for ``settings.metrics`` (None: no evaluation possible)."""
        return None

    def skipped_files(self) -> dict[str, list[str]]:
        """Unreadable data files passed over, per split."""
        return {}

    def has_segmentation(self) -> bool:
        """Whether the ``seg`` metric has data."""
        return False


class DataModuleInputs(StageInputs):
    """A run's inputs from its DataModule (``prune.py``): seeded subsets of the pruning data's plain views for
    the fitness and the correction, labeled class-balanced subsets for the evaluation.

    Args:
        datamodule: a configured :class:`snapvit_pl.data.VisionDataModule`.
        seg_datamodule: segmentation data for the ``seg`` metric (optional).
    """

    def __init__(self, datamodule: Any, seg_datamodule: Any = None):
        self.datamodule, self.seg_datamodule = datamodule, seg_datamodule

    def fitness_images(self, settings: SearchSettings) -> torch.Tensor:
        return self.datamodule.unlabeled_images(settings.num_images, settings.batch_size)

    def has_fitness_images(self) -> bool:
        return True

    def calibration_images(self, settings: CorrectionSettings) -> torch.Tensor:
        return self.datamodule.unlabeled_images(settings.num_samples, settings.batch_size)

    def evaluation_data(self, settings: EvaluationSettings) -> Optional[EvalData]:
        return EvalData.from_datamodule(self.datamodule, settings, self.seg_datamodule) if settings.metrics else None

    def skipped_files(self) -> dict[str, list[str]]:
        return dict(getattr(self.datamodule, "skipped", {}) or {})

    def has_segmentation(self) -> bool:
        return self.seg_datamodule is not None


class TensorInputs(StageInputs):
    """Inputs given as tensors (the Python API): the same images serve the fitness and the correction.

    Args:
        images: ``[N, C, H, W]`` plain images normalised for the model.
        evaluation: labeled data for the evaluation (optional).
    """

    def __init__(self, images: Optional[torch.Tensor] = None, evaluation: Optional[EvalData] = None):
        self.images, self.evaluation = images, evaluation

    def fitness_images(self, settings: SearchSettings) -> torch.Tensor:
        if self.images is None:
            return super().fitness_images(settings)
        return self.images[: settings.num_images]

    def has_fitness_images(self) -> bool:
        return self.images is not None

    def calibration_images(self, settings: CorrectionSettings) -> torch.Tensor:
        if self.images is None:
            return super().calibration_images(settings)
        return self.images[: settings.num_samples]

    def evaluation_data(self, settings: EvaluationSettings) -> Optional[EvalData]:
        return self.evaluation if settings.metrics else None

    def has_segmentation(self) -> bool:
        return self.evaluation is not None and self.evaluation.seg_train is not None
