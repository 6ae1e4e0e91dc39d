import re

import pytest
import timm
import torch
from timm.models.vision_transformer import ParallelScalingBlock

from families import FAMILIES
from snapvit_pl.errors import PruningSpecError, UnsupportedModelError
from snapvit_pl.models import Subnet, load_backbone, prunable_blocks


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_exposes_heads_and_neurons(family):
    model = load_backbone(FAMILIES[family])
    blocks = prunable_blocks(model)
    assert len(blocks) == 2
    for block in blocks:
        assert block.heads.num_units == 4
        assert block.heads.unit_size == 64 // 4
        assert block.neurons.num_units == block.neurons.module.fc2.in_features > 0


def test_unsupported_model_lists_supported():
    with pytest.raises(UnsupportedModelError, match="supported models: VisionTransformer, Eva"):
        prunable_blocks(timm.create_model("resnet18", pretrained=False))


def test_unsupported_block_names_block_and_types():
    model = timm.create_model(
        "vit_small_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
        block_fn=ParallelScalingBlock,
    )
    with pytest.raises(UnsupportedModelError, match="block 0 .*ParallelScalingBlock.*supported"):
        prunable_blocks(model)


@pytest.mark.parametrize(
    "heads, neurons, message",
    [
        ([[0, 4], [0]], [[0], [0]], r"block 0 heads: index out of range \[0, 4\)"),
        ([[], [0]], [[0], [0]], "block 0 heads: every unit would be removed"),
        ([[1], [0]], [[0], []], "block 1 MLP neurons: every unit would be removed"),
        ([[1, 1], [0]], [[0], [0]], "repeated indices"),
        ([[1]], [[0]], "the model has 2 blocks"),
    ],
)
def test_invalid_selections_are_rejected(heads, neurons, message):
    model = load_backbone(FAMILIES["dino_vit"])
    with pytest.raises(PruningSpecError, match=message):
        Subnet(heads, neurons).validate(model)


def test_validate_sorts_indices():
    model = load_backbone(FAMILIES["dino_vit"])
    sub = Subnet([[3, 1], [2]], [torch.tensor([5, 0]), [1]]).validate(model)
    assert sub.heads[0].tolist() == [1, 3] and sub.neurons[0].tolist() == [0, 5]


@pytest.mark.parametrize("name, kwargs, message", [
    ("beit_base_patch16_224", dict(depth=1, embed_dim=64, num_heads=4, img_size=32), "Beit: BEiT attention keeps a relative-position bias"),
    ("vit_small_patch16_18x2_224", dict(depth=1, embed_dim=64, num_heads=4, img_size=32), "block 0 (ParallelThingsBlock) is not supported"),
    ("naflexvit_base_patch16_gap", dict(depth=1, embed_dim=64, num_heads=4), "NaFlexVit: NaFlexVit takes variable-resolution"),
])
def test_known_unsupported_architectures_say_why_and_what_is_supported(name, kwargs, message):
    model = timm.create_model(name, pretrained=False, **kwargs)
    with pytest.raises(UnsupportedModelError, match=re.escape(message)) as info:
        prunable_blocks(model)
    assert "supported models: VisionTransformer, Eva" in str(info.value)


def test_grouped_query_attention_names_the_block():
    from timm.layers import AttentionRope

    model = load_backbone(FAMILIES["dino_vit"])
    model.blocks[1].attn = AttentionRope(64, num_heads=4, num_kv_heads=2, qkv_fused=False)
    with pytest.raises(UnsupportedModelError, match=r"block 1: grouped-query attention \(4 query heads share 2"):
        prunable_blocks(model)
