import copy

import pytest
import timm
import torch

from families import FAMILIES, random_subnet
from snapvit_pl.elastic import CostModel
from snapvit_pl.models import Subnet, count_flops, count_params, load_backbone, prunable_blocks, prune_


def test_param_count_matches_closed_form():
    model = load_backbone(FAMILIES["dino_vit"])  # qkv and fc1 with bias, no scale norms
    dense = count_params(model)
    subnet = random_subnet(model, 4)
    dim, head_dim = 64, 16
    removed = 0
    for block, heads, neurons in zip(prunable_blocks(model), subnet.heads, subnet.neurons):
        removed += (block.heads.num_units - len(heads)) * head_dim * (3 * dim + 3 + dim)  # qkv rows+bias, proj cols
        removed += (block.neurons.num_units - len(neurons)) * (dim + 1 + dim)  # fc1 row+bias, fc2 col
    prune_(model, subnet)
    assert count_params(model) == dense - removed


def test_flops_fall_when_units_are_removed():
    model = load_backbone(FAMILIES["eva02_fused_qkv"])
    dense = count_flops(model)
    blocks = prunable_blocks(model)
    half = Subnet([torch.arange(b.heads.num_units // 2) for b in blocks], [torch.arange(b.neurons.num_units) for b in blocks])
    prune_(model, half)
    fewer_heads = count_flops(model)
    assert 0 < fewer_heads < dense
    prune_(model, Subnet([torch.arange(2)] * 2, [torch.arange(8)] * 2))
    assert count_flops(model) < fewer_heads


def test_flops_count_attention_and_linears():
    model = load_backbone(FAMILIES["dino_vit"])
    tokens, dim, hidden = 1 + (32 // 8) ** 2, 64, 256
    per_block = 2 * tokens * (dim * 3 * dim + dim * dim + 2 * dim * hidden) + 2 * 2 * tokens * tokens * dim
    patch = 2 * (32 // 8) ** 2 * 3 * 8 * 8 * dim
    assert count_flops(model) == 2 * per_block + patch


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cost_model_is_exact_for_every_family_and_leaves_the_model_as_it_was(family):
    model = load_backbone(FAMILIES[family]).train()  # trainable parameters, train mode: as a caller may hold it
    flags = [p.requires_grad for p in model.parameters()]
    cost = CostModel(model)
    assert model.training and flags == [p.requires_grad for p in model.parameters()]
    subnet = random_subnet(model, 2)
    pruned = prune_(copy.deepcopy(model), subnet)
    assert cost.params(subnet) == count_params(pruned) and cost.flops(subnet) == count_flops(pruned)


def test_vit_b16_is_17_6_g_multiply_accumulates_as_papers_count_it():
    """Papers (SnapViT, DeiT, timm's tables) quote ViT-B/16 at 224 px as 17.6 G "FLOPs": multiply-accumulates. The
    counter gives 2 per multiply-accumulate; the table and report.json show both, each labelled."""
    from snapvit_pl.models.cost import COST_CONVENTION, macs
    from snapvit_pl.pipeline.tables import CAPTION, columns, human, rows

    model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0)
    flops = count_flops(model)
    assert human(flops) == "35.1G" and human(macs(flops)) == "17.6G"
    report = {"dense": {"params": count_params(model), "flops": flops, "metrics": {}}, "pruned": []}
    row = dict(zip(columns(report), rows(report)[0]))
    assert row["FLOPs"] == "35.1G 100%" and row["MACs"] == "17.6G"
    assert "2 per multiply-accumulate" in CAPTION and "2 per multiply-accumulate" in COST_CONVENTION["flops"]
