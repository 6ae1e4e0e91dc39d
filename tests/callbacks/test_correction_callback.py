import copy
from types import SimpleNamespace

import torch
from families import FAMILIES, random_subnet

from callbacks.correction import CorrectionCallback
from snapvit_pl.correction import correct_and_prune
from snapvit_pl.lightning.pruning_module import ExtractedModel
from snapvit_pl.models import load_backbone, prune_


class FakeDataModule:
    def __init__(self):
        self.calls = 0

    def unlabeled_images(self, max_samples, batch_size):
        self.calls += 1
        return torch.randn(max_samples, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def test_hook_replaces_the_model_by_the_corrected_dense_copy():
    backbone = load_backbone(FAMILIES["dino_vit"]).eval()
    datamodule = FakeDataModule()
    hooks = []
    module = SimpleNamespace(backbone=backbone, summary={"timings": {}}, trainer=SimpleNamespace(datamodule=datamodule),
                             register_extract_hook=lambda hook, priority: hooks.append((priority, hook)))
    callback = CorrectionCallback(num_samples=12, batch_size=5)
    callback.on_fit_start(module.trainer, module)
    (priority, hook), = hooks
    assert priority == 10

    subnet = random_subnet(backbone, seed=1)
    for _ in range(2):
        extracted = ExtractedModel("b", {}, subnet, prune_(copy.deepcopy(backbone), subnet), 0.5, 0.5)
        hook(module, extracted)
    assert datamodule.calls == 1  # calibration images are loaded once
    expected = correct_and_prune(copy.deepcopy(backbone), subnet, callback._images, batch_size=5)
    for a, b in zip(extracted.model.state_dict().values(), expected.state_dict().values()):
        assert torch.equal(a, b)
    assert extracted.info["correction"]["num_samples"] == 12 and extracted.info["correction"]["damping"] == "mean"
    assert module.summary["timings"]["correction_s"] > 0
