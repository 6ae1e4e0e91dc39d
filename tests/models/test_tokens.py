import pytest
import torch
from families import FAMILIES

from snapvit_pl.models import load_backbone
from snapvit_pl.models.tokens import block_kwargs, embed_tokens


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_embed_tokens_and_blocks_reproduce_forward_features(family):
    model, images = load_backbone(FAMILIES[family]).eval(), torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        x, rope = embed_tokens(model, images)
        for i, block in enumerate(model.blocks):
            x = block(x, **block_kwargs(model, rope, i))
        torch.testing.assert_close(model.norm(x), model.forward_features(images), rtol=0, atol=0)
