"""Activation, Wanda-sp and FLAP scorers against naive loops; batching, order and DDP invariance; resume."""
import io
import math

import pytest
import torch

from scoring_helpers import CORE, assert_scores, build, scores_of, two_process_scores, views
from snapvit_pl.errors import CheckpointError, DataError
from snapvit_pl.models import embed, prunable_blocks
from snapvit_pl.errors import ConfigError
from snapvit_pl.scoring import FLAP, Activation, WandaSP

FAMILIES = CORE + ["vit_qk_norm_scale_norms", "eva02_fused_qkv", "deit_distilled"]




def captured_inputs(model, images):
    """Per block: the attn.proj and mlp.fc2 inputs [images, tokens, channels] of a plain forward (float64)."""
    seen = {}
    handles = []
    for b, block in enumerate(model.blocks):
        for name, layer in (("proj", block.attn.proj), ("fc2", block.mlp.fc2)):
            handles.append(layer.register_forward_pre_hook(
                lambda _m, inp, key=(b, name): seen.setdefault(key, []).append(inp[0].detach().double())))
    with torch.no_grad():
        embed(model.eval(), images)
    for h in handles:
        h.remove()
    return {k: torch.cat(v) for k, v in seen.items()}


def naive_activation(model, images, tokens):
    inputs = captured_inputs(model, images)
    heads, neurons = [], []
    for b, block in enumerate(model.blocks):
        H, d = block.attn.num_heads, block.attn.head_dim
        x = inputs[(b, "proj")]
        h_scores = torch.zeros(H, dtype=torch.float64)
        for h in range(H):
            for n in range(x.shape[0]):
                per_token = [float(x[n, t, h * d:(h + 1) * d].norm()) for t in range(x.shape[1])]
                h_scores[h] += math.sqrt(sum(v * v for v in per_token)) if tokens == "l2" else sum(per_token) / len(per_token)
        heads.append(h_scores / x.shape[0])
        y = inputs[(b, "fc2")]
        n_scores = torch.zeros(y.shape[-1], dtype=torch.float64)
        for j in range(y.shape[-1]):
            for n in range(y.shape[0]):
                a = y[n, :, j].abs()
                n_scores[j] += float(a.square().sum().sqrt()) if tokens == "l2" else float(a.mean())
        neurons.append(n_scores / y.shape[0])
    return heads, neurons


def naive_wanda(model, images):
    inputs = captured_inputs(model, images)
    heads, neurons = [], []
    for b, block in enumerate(model.blocks):
        for layer, key, size, out in ((block.attn.proj, "proj", block.attn.head_dim, heads), (block.mlp.fc2, "fc2", 1, neurons)):
            x = inputs[(b, key)].reshape(-1, layer.in_features)
            W = layer.weight.detach().double()
            channel = torch.tensor([sum(abs(float(W[i, j])) for i in range(W.shape[0])) * float(x[:, j].norm())
                                    for j in range(layer.in_features)], dtype=torch.float64)
            out.append(torch.stack([channel[u * size:(u + 1) * size].sum() for u in range(layer.in_features // size)]))
    return heads, neurons


def naive_flap(model, images, standardize):
    inputs = captured_inputs(model, images)
    heads, neurons = [], []
    for b, block in enumerate(model.blocks):
        for layer, key, size, out in ((block.attn.proj, "proj", block.attn.head_dim, heads), (block.mlp.fc2, "fc2", 1, neurons)):
            x = inputs[(b, key)].reshape(-1, layer.in_features)
            W = layer.weight.detach().double()
            metric = torch.tensor([float(torch.var(x[:, j], unbiased=True)) * float(W[:, j].square().sum())
                                   for j in range(layer.in_features)], dtype=torch.float64)
            units = range(layer.in_features // size)
            if standardize == "none":
                out.append(torch.stack([metric[u * size:(u + 1) * size].sum() for u in units]))
            else:
                z = (metric - metric.mean()) / metric.std(unbiased=True)
                out.append(torch.stack([z[u * size:(u + 1) * size].mean().exp() for u in units]))
    return heads, neurons




def plain(n=5, seed=3):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("tokens", ["l2", "mean"])
@pytest.mark.parametrize("family", ["dino_vit", "eva02_separate_qkv", "vit_swiglu"])
def test_activation_matches_naive_loop(family, tokens):
    model, x = build(family), plain()
    heads, neurons = naive_activation(model, x, tokens)
    assert_scores(scores_of(Activation(tokens=tokens), model, [x]), heads, neurons)


@pytest.mark.parametrize("family", ["dino_vit", "dinov2_swiglu_packed", "vit_qk_norm_scale_norms"])
def test_wanda_sp_matches_naive_loop(family):
    model, x = build(family), plain()
    assert_scores(scores_of(WandaSP(), model, [x]), *naive_wanda(model, x))


@pytest.mark.parametrize("standardize", ["zscore", "none"])
@pytest.mark.parametrize("family", ["dino_vit", "eva02_fused_qkv", "vit_swiglu"])
def test_flap_matches_naive_loop(family, standardize):
    model, x = build(family), plain()
    assert_scores(scores_of(FLAP(standardize=standardize), model, [x]), *naive_flap(model, x, standardize), rtol=1e-4)


def test_flap_zscore_is_comparable_across_blocks():
    """Standardised per layer: a block whose weights are scaled up by 10 does not take over the ranking."""
    model, x = build("dino_vit"), plain()
    raw, standard = scores_of(FLAP("none"), model, [x]), scores_of(FLAP(), model, [x])
    with torch.no_grad():
        model.blocks[1].mlp.fc2.weight.mul_(10)
    raw10, standard10 = scores_of(FLAP("none"), model, [x]), scores_of(FLAP(), model, [x])
    torch.testing.assert_close(raw10.neurons[1], 100 * raw.neurons[1], rtol=1e-4, atol=0)
    torch.testing.assert_close(standard10.neurons[1], standard.neurons[1], rtol=1e-4, atol=0)
    assert all(bool((s > 0).all()) for s in standard.heads + standard.neurons)


SCORERS = {"activation": Activation, "activation_mean": lambda: Activation("mean"), "wanda_sp": WandaSP, "flap": FLAP}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", sorted(SCORERS))
def test_batching_and_order_do_not_matter(name, family):
    model, x = build(family).double(), plain(8).double()
    one = scores_of(SCORERS[name](), model, [x])
    assert_scores(scores_of(SCORERS[name](), model, list(x.split([3, 5]))), one.heads, one.neurons, rtol=1e-9)
    assert_scores(scores_of(SCORERS[name](), model, list(x.split(2))[::-1]), one.heads, one.neurons, rtol=1e-9)


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_two_shards_reduced_equal_one_process(name):
    model, x = build("vit_swiglu"), plain(8)
    single = scores_of(SCORERS[name](), model, [x])
    assert_scores(two_process_scores(lambda: SCORERS[name](), model, x, 3), single.heads, single.neurons, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_multicrop_views_and_labels(name):
    """Multi-crop views count as images; labels are ignored."""
    model, x = build("dino_vit"), views(3, n_views=2)
    flat = scores_of(SCORERS[name](), model, [x.flatten(0, 1)])
    assert_scores(scores_of(SCORERS[name](), model, [(x, torch.zeros(3, dtype=torch.long))]), flat.heads, flat.neurons)


def test_resume_and_errors():
    model, x = build("dinov2_swiglu_packed"), plain(6)
    expected = scores_of(FLAP(), model, list(x.split(2)))
    first = FLAP().bind(model)
    first.update(x[:2])
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    state = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    resumed = FLAP().bind(model)
    resumed.load_state_dict(state)
    for batch in x[2:].split(2):
        resumed.update(batch)
    got = resumed.compute()
    assert all(torch.equal(a, b) for a, b in zip(got.heads + got.neurons, expected.heads + expected.neurons))
    with pytest.raises(CheckpointError, match="cannot resume"):
        FLAP("none").load_state_dict(state)
    with pytest.raises(CheckpointError, match="cannot resume"):
        WandaSP().load_state_dict(state)
    other = FLAP().bind(build("dino_vit"))
    with pytest.raises(CheckpointError, match="does not fit"):
        other.load_state_dict(state)
    empty = Activation().bind(model)
    with pytest.raises(DataError, match="saw no images"):
        empty.compute()
    with pytest.raises(ConfigError, match="tokens must be one of l2, mean"):
        Activation("max")
    with pytest.raises(ConfigError, match="standardize must be one of zscore, none"):
        FLAP("minmax")


def test_update_leaves_the_model_as_found():
    model = build("dino_vit").train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    scorer = WandaSP().bind(model)
    with torch.inference_mode():
        scorer.update(plain(2))
    assert model.training and all(m.training for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(not m._forward_pre_hooks for m in model.modules()), "hooks must be removed"
    assert len(scorer.compute().heads) == len(prunable_blocks(model))


@pytest.mark.parametrize("make", [lambda s: Activation(standardize=s), lambda s: WandaSP(standardize=s)],
                         ids=["activation", "wanda_sp"])
def test_zscore_option_standardizes_per_layer(make):
    """exp(z-score over the layer): channel z for Wanda-sp (a head: the mean of its channels), unit z for activations."""
    model, x = build("dino_vit"), plain()
    raw, standard = scores_of(make("none"), model, [x]), scores_of(make("zscore"), model, [x])
    for r, s in zip(raw.neurons, standard.neurons):  # neurons: one channel each, both forms agree
        z = (r.double() - r.double().mean()) / r.double().std()
        torch.testing.assert_close(s.double(), z.exp(), rtol=1e-4, atol=0)
    for r, s in zip(raw.heads, standard.heads):  # order within a layer kept for activations
        if isinstance(make("none"), Activation):
            assert torch.equal(torch.argsort(r), torch.argsort(s))
    with pytest.raises(ConfigError, match="standardize must be one of zscore, none"):
        make("max")
