import pytest
import torch

from scoring_helpers import build
from snapvit_pl.errors import UnsupportedModelError
from snapvit_pl.models import embed


@pytest.mark.parametrize("family", ["dino_vit", "deit_distilled", "eva02_fused_qkv", "siglip2_attn_pool", "augreg_vit"])
def test_embed_is_the_pre_logits_embedding(family):
    model = build(family).eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        features = embed(model, x)
        assert features.shape == (3, model.num_features)
        if model.num_classes and family != "deit_distilled":  # a plain head maps the embedding to the logits
            torch.testing.assert_close(model.head(features), model(x))
        if family == "deit_distilled":  # mean of the class and distillation tokens
            tokens = model.forward_features(x)
            torch.testing.assert_close(features, (tokens[:, 0] + tokens[:, 1]) / 2)
        if family == "siglip2_attn_pool":
            torch.testing.assert_close(features, model.attn_pool(model.forward_features(x)))


def test_embed_rejects_wrappers():
    with pytest.raises(UnsupportedModelError, match="not a DDP or Lightning wrapper"):
        embed(torch.nn.Sequential(build("dino_vit")), torch.randn(1, 3, 32, 32))
