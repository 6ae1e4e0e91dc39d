"""What the stages read besides the scorer's batches: fitness images, calibration images, evaluation data."""
from __future__ import annotations

from typing import Any, Optional

import torch

from ..correction import CorrectionSettings
from ..errors import ConfigError
from ..eval.suite import EvalData, EvaluationSettings
from ..search.settings import SearchSettings


#: What the run calls on a DataModule besides Lightning's own (snapvit_pl.data.VisionDataModule has them all).
DATAMODULE_METHODS = ("configure_for_model", "unlabeled_images", "labeled_dataloader")


class StageInputs:
    """The images and labeled data of a run's later stages; the base class has none (every method refuses)."""

    def fitness_images(self, settings: SearchSettings) -> torch.Tensor:
        """``[N, C, H, W]`` plain images of the search's fitness (``settings.num_images`` of them at most)."""
        raise ConfigError("the search needs fitness images: pass fitness_images=[N, C, H, W] plain images")

    def has_fitness_images(self) -> bool:
        """Whether :meth:`fitness_images` has images to give."""
        return False

    def has_calibration_images(self) -> bool:
        """Whether :meth:`calibration_images` has images to give (``correction.enabled: auto`` corrects only then)."""
        return False

    def calibration_images(self, settings: CorrectionSettings) -> torch.Tensor:
        """``[N, C, H, W]`` plain images for the weight correction (``settings.num_samples`` at most)."""
        raise ConfigError("the weight correction needs calibration images: pass them, or leave correction off")

    def fewer_calibration_images(self, used: int) -> str:
        """Why the correction calibrated on ``used`` images, fewer than ``correction.num_samples`` (the report)."""
        return f"the images given are {used}"

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
        fitness: whether its images may serve the fitness (False: a later cut's split is interpolated, not raced
            on images that are not the run's; they still calibrate the correction).
    """

    def __init__(self, datamodule: Any, seg_datamodule: Any = None, fitness: bool = True):
        self.datamodule, self.seg_datamodule, self.fitness = datamodule, seg_datamodule, fitness

    def fitness_images(self, settings: SearchSettings) -> torch.Tensor:
        if not self.fitness:
            return super().fitness_images(settings)
        return self.datamodule.unlabeled_images(settings.num_images, settings.batch_size)

    def has_fitness_images(self) -> bool:
        return self.fitness

    def has_calibration_images(self) -> bool:
        return True

    def calibration_images(self, settings: CorrectionSettings) -> torch.Tensor:
        """At most ``data.max_samples`` of them: the images the importance pass read when it read fewer than
        ``settings.num_samples`` (the run reads no image its data settings leave out)."""
        limit = self.datamodule.max_samples
        count = settings.num_samples if limit is None else min(settings.num_samples, limit)
        return self.datamodule.unlabeled_images(count, settings.batch_size)

    def fewer_calibration_images(self, used: int) -> str:
        limit = self.datamodule.max_samples
        if limit is not None and used == min(limit, len(self.datamodule.base_dataset("train"))):
            return f"data.max_samples is {limit}: the images the importance pass read"
        return f"the training split has {used} images"

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

    def has_calibration_images(self) -> bool:
        return self.images is not None

    def calibration_images(self, settings: CorrectionSettings) -> torch.Tensor:
        if self.images is None:
            return super().calibration_images(settings)
        return self.images[: settings.num_samples]

    def evaluation_data(self, settings: EvaluationSettings) -> Optional[EvalData]:
        return self.evaluation if settings.metrics else None

    def has_segmentation(self) -> bool:
        return self.evaluation is not None and self.evaluation.seg_train is not None


class LoaderInputs(StageInputs):
    """A run's inputs from the batches of a plain loader: a composed Trainer fitted on ``train_dataloaders=loader``,
    or on a ``LightningDataModule`` of your own that has only a ``train_dataloader``. The images the importance pass
    reads are kept as they go by (:meth:`take`), split for each stage as :func:`snapvit_pl.fit_elastic` splits its
    loader: the first ``search.num_images`` are the fitness images and the first ``correction.num_samples`` the
    calibration images; when the batches carry labels, the first ``evaluation.train_samples`` are the evaluation's
    k-NN memory and probe training set and the next ``evaluation.val_samples`` the images it scores (when the loader
    has fewer, half of them at most are scored, the rest are the memory). Every image is kept once, in memory, on
    the CPU.

    Args:
        views: the batches the scorer reads (:func:`snapvit_pl.pipeline.scoring_views`): plain images are turned into
            multi-crop views for a self-supervised scorer (:class:`snapvit_pl.data.transforms.BatchMultiCrop`, the
            same views on every pass).
        fitness: fitness images wanted (0: none).
        calibration: calibration images wanted (0: none).
        evaluation: ``(train_samples, val_samples)`` of the evaluation (None: no evaluation).
        crop_seed: seed of the multi-crop views.
        model: the model scored (its input format is checked on the first batch).
        source: how messages name the loader.
    """

    def __init__(self, views: str, fitness: int, calibration: int, evaluation: Optional[tuple[int, int]] = None,
                 crop_seed: int = 0, model: Any = None, source: str = "the Trainer's loader"):
        self.views, self.crop_seed, self.model, self.source, self.fitness = views, crop_seed, model, source, fitness
        self.calibration = calibration
        self.wanted = max(fitness, calibration, sum(evaluation) if evaluation else 0)
        self.images: list[torch.Tensor] = []
        self.labels: Optional[list[torch.Tensor]] = []  # None once a batch came without labels
        self.kept = 0
        self._joined: Optional[tuple[torch.Tensor, Optional[torch.Tensor]]] = None  # (images, labels), once kept
        self.new_pass()

    def new_pass(self) -> None:
        """A pass over the loader starts: its multi-crop views are the first pass's again."""
        from ..data.transforms import BatchMultiCrop

        self._multicrop = BatchMultiCrop(seed=self.crop_seed)

    def take(self, batch: Any) -> Any:
        """Keep what the later stages need of ``batch`` and return it in the form the scorer reads.

        Raises:
            ConfigError: the batch holds no images, or no labels for a scorer that needs them.
        """
        from ..errors import DataError
        from ..models.cost import check_images
        from ..scoring import split_batch

        try:
            images, labels = split_batch(batch)
        except DataError:
            images, labels = None, None
        if images is None or not images.is_floating_point():
            raise ConfigError(f"{self.source} yields {describe_batch(batch)}; a pruning run needs image tensors: "
                              "[B, C, H, W] batches (or (images, labels) pairs) normalised as the model expects")
        if self.model is not None and images.dim() == 4 and not self.images:
            check_images(self.model, images, f"{self.source}'s images")
        if images.dim() == 4 and self.kept < self.wanted:
            self.images.append(images[: self.wanted - self.kept].detach().cpu())
            if self.labels is not None and labels is not None:
                self.labels.append(torch.as_tensor(labels)[: self.wanted - self.kept].detach().cpu())
            else:
                self.labels = None
            self.kept += len(self.images[-1])
            self._joined = None
        if self.views == "labeled" and labels is None:
            raise ConfigError(f"this scorer needs labels: {self.source} must yield (images, labels) batches")
        if self.views == "multicrop":
            return self._multicrop(images) if images.dim() == 4 else images
        return batch if self.views == "labeled" else images

    @property
    def labeled(self) -> bool:
        """Whether every batch kept came with labels."""
        return self.labels is not None and bool(self.labels)

    def _all(self) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The kept images (and labels), joined once (the calibration reads them for every corrected model)."""
        if self._joined is None:
            self._joined = (torch.cat(self.images), torch.cat(self.labels) if self.labeled else None)
        return self._joined

    def _first(self, count: int, what: str) -> torch.Tensor:
        if not self.images:
            raise ConfigError(f"the {what} needs plain images [N, C, H, W], and {self.source} gave none "
                              "(multi-crop views, or no batch)")
        return self._all()[0][:count]

    def fitness_images(self, settings: SearchSettings) -> torch.Tensor:
        return self._first(settings.num_images, "search's fitness")

    def has_fitness_images(self) -> bool:
        return self.fitness > 0

    def has_calibration_images(self) -> bool:
        return self.calibration > 0

    def calibration_images(self, settings: CorrectionSettings) -> torch.Tensor:
        return self._first(settings.num_samples, "weight correction")

    def fewer_calibration_images(self, used: int) -> str:
        return f"{self.source} gave {used} images"

    def evaluation_data(self, settings: EvaluationSettings) -> Optional[EvalData]:
        if not settings.metrics:
            return None
        if not self.labeled:
            import warnings

            warnings.warn(f"evaluation.metrics {settings.metrics}: {self.source} yields images without labels, "
                          "so no model is evaluated; give it (images, labels) batches, or set evaluation.metrics=[]",
                          stacklevel=2)
            return None
        images, labels = self._all()
        scored = min(settings.val_samples or len(images), len(images) // 2)
        memory = min(settings.train_samples or len(images), len(images) - scored)
        batch = settings.batch_size

        def batches(x: torch.Tensor, y: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
            return [(x[i:i + batch], y[i:i + batch]) for i in range(0, len(x), batch)]

        return EvalData(train=batches(images[:memory], labels[:memory]),
                        val=batches(images[memory:memory + scored], labels[memory:memory + scored]),
                        dataset=self.source)


def describe_batch(batch: Any) -> str:
    """What a loader's batch is, in a few words (``dicts with keys ['text']``, ``int64 tensors [8]``)."""
    if isinstance(batch, torch.Tensor):
        return f"{str(batch.dtype).removeprefix('torch.')} tensors {list(batch.shape)}"
    if isinstance(batch, dict):
        return f"dicts with keys {sorted(map(str, batch))[:6]}"
    if isinstance(batch, (list, tuple)):
        return f"{type(batch).__name__}s of " + ", ".join(describe_batch(b) if isinstance(b, torch.Tensor)
                                                             else type(b).__name__ for b in batch[:3])
    return f"{type(batch).__name__} objects"
