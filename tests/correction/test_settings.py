"""The correction's settings: auto on models with a classifier, and each method's own settings refused elsewhere."""
import pytest
import torch

from snapvit_pl.correction import CorrectionSettings
from snapvit_pl.errors import ConfigError


def test_auto_corrects_models_with_a_classifier_and_explicit_settings_win():
    """Issue 75: ``auto`` corrects where it never lost on the development models (a backbone with a classifier); a
    headless backbone's models stay as cut unless asked; the device does not decide."""
    from timm.models.vision_transformer import VisionTransformer

    headed = VisionTransformer(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3)
    headless = VisionTransformer(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=0)
    assert CorrectionSettings().enabled is False and not CorrectionSettings().active(headed)  # off by default
    auto = CorrectionSettings(enabled="auto")
    assert auto.active(headed) and not auto.active(headless)
    assert CorrectionSettings(enabled=True).active(headless) and not CorrectionSettings(enabled=False).active(headed)
    for bad in ("sometimes", 1, "true"):  # (a word is never a switch: the command line and YAML give booleans)
        with pytest.raises(ConfigError, match=f"correction.enabled must be true, false or auto, got {bad!r}"):
            CorrectionSettings(enabled=bad)
    auto = CorrectionSettings()
    assert auto.steps_on("cpu") == 0 and auto.steps_on(torch.device("cuda")) > 0  # the steps: accelerators only


@pytest.mark.parametrize("method, setting, value, applies", [
    ("sparsegpt", "refit", "following", "dense_fit"), ("sparsegpt", "reconstruct_steps", 100, "dense_fit"),
    ("bias", "output_weight", 1.0, "dense_fit"), ("dense_fit", "block_size", 64, "sparsegpt"),
    ("bias", "damp_fraction", 0.1, "sparsegpt or dense_fit"),
])
def test_a_setting_the_chosen_method_does_not_read_is_refused(method, setting, value, applies):
    """Issue 77: --correction.refit following with --correction.method sparsegpt ran without a word."""
    with pytest.raises(ConfigError, match=rf"^correction.{setting} {value!r} applies to correction.method {applies} "
                                          rf"only, and the method is {method}"):
        CorrectionSettings(method=method, **{setting: value})
    CorrectionSettings(method=applies.split(" ")[0], **{setting: value})  # where it applies, it is taken
