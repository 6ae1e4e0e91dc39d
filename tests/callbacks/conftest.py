"""A stand-in trainer and DataModule, so the callbacks are tested on their own, outside ``trainer.fit``."""
from types import SimpleNamespace

import pytest
import torch

from families import FAMILIES
from snapvit_pl.callbacks import ImportanceCallback
from snapvit_pl.lightning.pruning_module import PruningModule
from snapvit_pl.pipeline import ImportanceSettings, PipelineSettings
from snapvit_pl.scoring import Magnitude


class FakeDataModule:
    """The DataModule methods the pipeline calls, on seeded random tensors."""

    num_classes = 10
    source = "fake"

    def __init__(self, n=24, batch_size=8):
        g = torch.Generator().manual_seed(0)
        self.images, self.labels = torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
        self.views = torch.randn(n, 3, 3, 32, 32, generator=g)
        self.batch_size, self.train_views, self.configured, self.max_samples = batch_size, "labeled", False, None

    def configure_for_model(self, model):
        self.configured = True

    def dataset(self, split):
        return list(range(len(self.images)))

    def base_dataset(self, split):
        return self.dataset(split)

    def train_batches(self):
        return list(self.views.split(self.batch_size))

    def unlabeled_images(self, max_samples=None, batch_size=None):
        return self.images[:max_samples]

    def labeled_dataloader(self, split, max_samples=None, batch_size=None):
        n = max_samples or len(self.images)
        return list(zip(self.images[:n].split(batch_size or 8), self.labels[:n].split(batch_size or 8)))


@pytest.fixture
def module(tmp_path):
    """A PruningModule on a tiny random ViT; ``module.configure_pipeline(settings, run_dir)`` sets its stages up."""
    torch.manual_seed(0)
    spec = FAMILIES["augreg_vit"]
    pl_module = PruningModule(spec.model_name, False, None, spec.model_kwargs)
    pl_module.log = lambda *args, **kwargs: None  # no Lightning loop to log into
    pl_module.configure_pipeline(PipelineSettings(), run_dir=tmp_path, progress="off")
    return pl_module


@pytest.fixture
def trainer(tmp_path, module):
    """A stand-in trainer holding ``callbacks``, bound to ``module`` (as ``trainer.fit`` does at setup)."""
    def make(callbacks=()):
        t = SimpleNamespace(
            lightning_module=module, datamodule=FakeDataModule(), is_global_zero=True, world_size=1, global_rank=0,
            default_root_dir=str(tmp_path), callbacks=list(callbacks), logger=None, loggers=[], num_training_batches=3, fit_loop=SimpleNamespace(max_epochs=1),
            strategy=SimpleNamespace(reduce=lambda t, reduce_op: t, root_device=torch.device("cpu")),
        )
        module.trainer = t
        module.setup("fit")
        return t
    return make


@pytest.fixture
def scored(trainer, module):
    """A trainer holding ``callbacks`` after a (data-free, magnitude) importance stage on ``module``."""
    def make(callbacks=()):
        module.pipeline.settings.importance = ImportanceSettings(Magnitude())
        importance = ImportanceCallback()
        t = trainer([importance, *callbacks])
        importance.setup(t, module, "fit")
        importance.on_train_start(t, module)
        importance.on_train_epoch_end(t, module)
        return t
    return make
