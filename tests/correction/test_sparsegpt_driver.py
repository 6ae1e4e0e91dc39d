"""correct_and_prune: the SparseGPT-style update driven over a whole model, block by block."""
import copy

import pytest
import torch
import torch.nn.functional as F
from calibration import half_subnet, model_of, smooth_images
from families import random_subnet

from snapvit_pl.correction import correct_and_prune
from snapvit_pl.models import Subnet, architecture, prune_

PRUNED_FAMILIES = ["dino_vit", "dinov2_reg", "eva02_fused_qkv", "deit_distilled", "dinov2_swiglu_packed", "vit_swiglu"]


@pytest.mark.parametrize("family", ["dino_vit", "eva02_fused_qkv"])
def test_keeping_everything_is_a_bitwise_noop(family):
    model = model_of(family)
    before = copy.deepcopy(model.state_dict())
    assert correct_and_prune(model, Subnet.full(model), smooth_images(8, 0)) is model
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("family", PRUNED_FAMILIES)
def test_architecture_matches_prune(family):
    model = model_of(family)
    subnet = random_subnet(model, seed=3)
    corrected = correct_and_prune(copy.deepcopy(model), subnet, smooth_images(16, 0), batch_size=5)
    assert architecture(corrected) == architecture(prune_(copy.deepcopy(model), subnet))
    with torch.no_grad():
        assert torch.isfinite(corrected(smooth_images(4, 1))).all()


@pytest.mark.parametrize("family", ["dino_vit", "eva02_fused_qkv"])
def test_correction_reduces_feature_error_on_held_out_images(family):
    model = model_of(family)
    subnet = half_subnet(model)
    corrected = correct_and_prune(copy.deepcopy(model), subnet, smooth_images(128, 1))
    pruned = prune_(copy.deepcopy(model), subnet)
    held_out = smooth_images(64, 2)
    with torch.no_grad():
        dense = model.forward_features(held_out)
        err_corrected = F.mse_loss(corrected.forward_features(held_out), dense)
        err_pruned = F.mse_loss(pruned.forward_features(held_out), dense)
    assert err_corrected < 0.2 * err_pruned  # measured ~0.01-0.03


@pytest.mark.parametrize("damping", ["mean", "max", "p95"])
def test_every_damping_gives_finite_weights(damping):
    model = model_of("dino_vit")
    corrected = correct_and_prune(model, half_subnet(model), smooth_images(16, 0),
                                  damping=damping, block_size=16)
    assert all(torch.isfinite(p).all() for p in corrected.parameters())


def test_only_the_pruned_blocks_proj_and_fc2_change():
    model = model_of("dino_vit").train()
    subnet = Subnet.full(model)
    subnet.heads[1], subnet.neurons[1] = torch.tensor([0, 2]), torch.arange(0, 256, 2)
    corrected_model = correct_and_prune(copy.deepcopy(model), subnet, smooth_images(32, 0))
    assert corrected_model.training  # the mode is restored after the eval-mode calibration
    corrected, reference = corrected_model.state_dict(), prune_(copy.deepcopy(model), subnet).state_dict()
    changed = {"blocks.1.attn.proj.weight", "blocks.1.mlp.fc2.weight"}
    assert corrected.keys() == reference.keys()
    for name in corrected:
        assert torch.equal(corrected[name], reference[name]) != (name in changed), name
