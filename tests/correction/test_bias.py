"""FLAP bias compensation: the bias update against a naive sequential computation, shapes, no-ops, errors."""
import copy

import pytest
import torch
import torch.nn.functional as F
from families import FAMILIES, random_subnet

from snapvit_pl.correction import compensate_bias_and_prune
from snapvit_pl.models import Subnet, architecture, embed, load_backbone, prune_


def smooth_images(n, seed):
    g = torch.Generator().manual_seed(seed)
    return F.interpolate(torch.randn(n, 3, 4, 4, generator=g), size=32, mode="bilinear", align_corners=False)


def model_of(family):
    torch.manual_seed(0)
    return load_backbone(FAMILIES[family]).eval()


def input_mean(model, layer, images):
    """Mean of ``layer``'s input over every token of ``images`` (float64), from a plain forward of ``model``."""
    seen = []
    handle = layer.register_forward_pre_hook(lambda _m, inp: seen.append(inp[0].detach().reshape(-1, inp[0].shape[-1])))
    with torch.no_grad():
        embed(model, images)
    handle.remove()
    return torch.cat(seen).double().mean(dim=0)


@pytest.mark.parametrize("family", ["dino_vit", "vit_swiglu", "eva02_separate_qkv"])
def test_bias_update_matches_naive_sequential_computation(family):
    """Block 0 loses neurons, block 1 loses heads: block 1's means are measured after block 0 was compensated."""
    model, images = model_of(family), smooth_images(12, 0)
    full = Subnet.full(model)
    keep_neurons = torch.arange(0, full.neurons[0].numel(), 2)
    keep_heads = torch.tensor([1, 3])
    subnet = Subnet([full.heads[0], keep_heads], [keep_neurons, full.neurons[1]])

    expected = copy.deepcopy(model)
    fc2 = expected.blocks[0].mlp.fc2
    removed = torch.ones(fc2.in_features, dtype=torch.bool)
    removed[keep_neurons] = False
    with torch.no_grad():
        fc2.bias += (fc2.weight.double()[:, removed] @ input_mean(expected, fc2, images)[removed]).float()
    prune_(expected, Subnet(full.heads, [keep_neurons, full.neurons[1]]))
    proj = expected.blocks[1].attn.proj
    d = expected.blocks[1].attn.head_dim
    removed = torch.ones(proj.in_features, dtype=torch.bool)
    removed[torch.cat([torch.arange(h * d, (h + 1) * d) for h in keep_heads.tolist()])] = False
    with torch.no_grad():
        proj.bias += (proj.weight.double()[:, removed] @ input_mean(expected, proj, images)[removed]).float()
    prune_(expected, Subnet([full.heads[0], keep_heads], [torch.arange(len(keep_neurons)), full.neurons[1]]))

    got = compensate_bias_and_prune(copy.deepcopy(model), subnet, images, batch_size=5)
    assert architecture(got) == architecture(expected)
    for (name, a), b in zip(got.state_dict().items(), expected.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_mean_output_of_a_compensated_layer_is_preserved():
    model, images = model_of("dino_vit"), smooth_images(16, 1)
    full = Subnet.full(model)
    subnet = Subnet(full.heads, [torch.arange(50), full.neurons[1]])

    def fc2_output_mean(m):
        seen = []
        handle = m.blocks[0].mlp.fc2.register_forward_hook(lambda _m, _i, out: seen.append(out.reshape(-1, out.shape[-1])))
        with torch.no_grad():
            embed(m, images)
        handle.remove()
        return torch.cat(seen).double().mean(dim=0)

    compensated = compensate_bias_and_prune(copy.deepcopy(model), subnet, images)
    plain = prune_(copy.deepcopy(model), subnet)
    torch.testing.assert_close(fc2_output_mean(compensated), fc2_output_mean(model), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(fc2_output_mean(plain), fc2_output_mean(model), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", ["dino_vit", "dinov2_reg", "eva02_fused_qkv", "deit_distilled", "dinov2_swiglu_packed"])
def test_architecture_matches_prune_and_keeping_everything_is_a_noop(family):
    model = model_of(family)
    subnet = random_subnet(model, seed=3)
    done = compensate_bias_and_prune(copy.deepcopy(model), subnet, smooth_images(8, 0), batch_size=3)
    assert architecture(done) == architecture(prune_(copy.deepcopy(model), subnet))
    with torch.no_grad():
        assert torch.isfinite(done(smooth_images(2, 1))).all()
    before = copy.deepcopy(model.state_dict())
    assert compensate_bias_and_prune(model, Subnet.full(model), smooth_images(4, 0)) is model
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_compensation_brings_embeddings_closer_on_calibration_data():
    model, images = model_of("dino_vit"), smooth_images(32, 2)
    full = Subnet.full(model)
    subnet = Subnet([torch.tensor([0, 1])] * 2, [torch.arange(0, n.numel(), 3) for n in full.neurons])
    with torch.no_grad():
        dense = embed(model, images)
        error = lambda m: float((embed(m, images) - dense).square().sum())  # noqa: E731
        assert error(compensate_bias_and_prune(copy.deepcopy(model), subnet, images)) < error(
            prune_(copy.deepcopy(model), subnet))


def test_a_layer_without_bias_is_refused():
    model = load_backbone(FAMILIES["dino_vit"].__class__(
        FAMILIES["dino_vit"].model_name, False, None, dict(FAMILIES["dino_vit"].model_kwargs, proj_bias=False)))
    subnet = Subnet([torch.tensor([0, 1])] * 2, Subnet.full(model).neurons)
    with pytest.raises(ValueError, match="blocks.0 proj has no bias"):
        compensate_bias_and_prune(model, subnet, smooth_images(2, 0))


def test_correction_method_bias_is_flaps_compensation_in_the_pipeline():
    from snapvit_pl.correction import CorrectionSettings
    from snapvit_pl.errors import ConfigError
    from snapvit_pl.pipeline.extraction import Correction

    model, images = model_of("dino_vit"), smooth_images(6, 0)
    full = Subnet.full(model)
    subnet = Subnet([full.heads[0], torch.tensor([1, 3])], [torch.arange(0, full.neurons[0].numel(), 2), full.neurons[1]])
    settings = CorrectionSettings(enabled=True, method="bias", batch_size=4, held_out=0)
    corrected, info = Correction(settings, images)(model, subnet)
    expected = compensate_bias_and_prune(copy.deepcopy(model), subnet, images, batch_size=4)
    assert architecture(corrected) == architecture(expected)
    for (name, a), b in zip(corrected.state_dict().items(), expected.state_dict().values()):
        assert torch.equal(a, b), name
    assert info["method"] == "bias" and info["num_samples"] == 6
    with pytest.raises(ConfigError, match="correction.method must be one of dense_fit, sparsegpt, bias, got 'obs'"):
        CorrectionSettings(method="obs")
