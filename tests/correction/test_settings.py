"""The correction's settings: auto on accelerators only, and each method's own settings refused elsewhere."""
import pytest
import torch

from snapvit_pl.correction import CorrectionSettings
from snapvit_pl.errors import ConfigError


def test_auto_corrects_on_accelerators_only_and_explicit_settings_win():
    assert CorrectionSettings().enabled is False and not CorrectionSettings().active("cuda")  # off by default
    auto = CorrectionSettings(enabled="auto")
    assert not auto.active("cpu") and auto.active("cuda") and auto.active(torch.device("mps"))
    assert CorrectionSettings(enabled=True).active("cpu") and not CorrectionSettings(enabled=False).active("cuda")
    for bad in ("sometimes", 1, "true"):  # (a word is never a switch: the command line and YAML give booleans)
        with pytest.raises(ConfigError, match=f"correction.enabled must be true, false or auto, got {bad!r}"):
            CorrectionSettings(enabled=bad)


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
