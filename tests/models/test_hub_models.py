"""Hub models loaded for real through an offline Hugging Face cache: timm names with pretrained=True and hf-hub: names."""
import pytest
import torch

from hub_cache import HUB_NAMES, TIMM_NAMES
from snapvit_pl.elastic import CostModel
from snapvit_pl.errors import CheckpointError
from snapvit_pl.models import BackboneSpec, load_backbone, load_pruned, prunable_blocks, save_pruned


def _same_weights(a, b, skip_heads=False):
    """Equal state dicts (with ``skip_heads``, but the classifiers: timm re-initialises a head whose class count
    differs from the pretrained config's, as for deit with 10 classes here)."""
    keep = lambda k: not (skip_heads and k.startswith("head"))  # noqa: E731
    x, y = ({k: v for k, v in m.state_dict().items() if keep(k)} for m in (a, b))
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("name", sorted(TIMM_NAMES))
def test_pretrained_timm_names_load_the_cached_weights(offline_hub, name):
    _, models = offline_hub
    model = load_backbone(BackboneSpec(name, pretrained=True, model_kwargs=TIMM_NAMES[name]))
    assert _same_weights(model, models[name], skip_heads=True)
    assert prunable_blocks(model) and CostModel(model).dense_flops > 0


@pytest.mark.parametrize("name", sorted(HUB_NAMES))
def test_hf_hub_names_build_the_architecture_from_their_config(offline_hub, name, tmp_path):
    _, models = offline_hub
    spec = BackboneSpec(name, pretrained=True)
    model = load_backbone(spec)
    assert _same_weights(model, models[name])
    # a pruned copy records the resolved timm architecture: rebuilding it needs no hub
    resolved = spec.architecture_only()
    assert resolved.model_name == HUB_NAMES[name][0] and resolved.model_kwargs["depth"] == 2
    save_pruned(model, tmp_path / "copy", spec)
    again, record = load_pruned(tmp_path / "copy")
    assert record["base"]["model_name"] == HUB_NAMES[name][0] and _same_weights(again, model)


def test_a_name_missing_from_the_offline_cache_is_one_clear_error(offline_hub):
    with pytest.raises(CheckpointError, match="hf-hub:snapvit-test/not-there"):
        load_backbone(BackboneSpec("hf-hub:snapvit-test/not-there", pretrained=True))
