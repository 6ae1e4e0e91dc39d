"""The images a run's later stages read (``snapvit_pl/pipeline/inputs.py``)."""
import json

import torch

from snapvit_pl.cli.prune import prune_main
from snapvit_pl.correction import CorrectionSettings
from snapvit_pl.data import ClassificationDataModule
from snapvit_pl.pipeline import DataModuleInputs


def test_calibration_images_are_at_most_the_datas_max_samples_the_images_the_pass_read(tmp_path):
    """Issue 77: with ``data.max_samples: 16`` the correction drew its 1000 calibration images from the whole
    training split. It reads at most ``max_samples``: when fewer, the pruning pass's own seeded subset."""
    from images import gray_image_folder

    from snapvit_pl.models import BackboneSpec, load_backbone

    data = ClassificationDataModule(source="folder", root=str(gray_image_folder(tmp_path)), max_samples=16,
                                    batch_size=8, num_workers=0)
    data.configure_for_model(load_backbone(BackboneSpec.from_dict(
        {"model_name": "vit_tiny_patch16_224", "pretrained": False, "model_kwargs": {
            "img_size": 28, "patch_size": 7, "in_chans": 1, "embed_dim": 32, "depth": 2, "num_heads": 4}})))
    inputs = DataModuleInputs(data)
    images = inputs.calibration_images(CorrectionSettings(num_samples=1000))
    assert torch.equal(images, data.unlabeled_images(16))  # the pass's subset (max_samples' own)
    assert torch.equal(inputs.calibration_images(CorrectionSettings(num_samples=8)), data.unlabeled_images(8))
    assert inputs.fewer_calibration_images(16) == "data.max_samples is 16: the images the importance pass read"


def test_the_report_says_how_many_calibration_images_were_used_and_why_fewer(tiny_prune_args, tmp_path):
    assert prune_main([*tiny_prune_args, "--correction.enabled=true", "--correction.method=bias",
                       "--export.budgets=[{flops: 0.6}]", "--evaluation.metrics=[]"]) == 0
    run = tmp_path / "run"
    record = json.loads((run / "report.json").read_text())["correction"]
    assert (record["num_samples"], record["num_samples_asked"]) == (48, 1000)
    assert "- weight correction: `bias`, 48 calibration images (1000 asked; data.max_samples is 48: the images the " \
           "importance pass read)" in (run / "report.md").read_text()
