"""The Taylor scorer against a naive per-unit loop over an independent backward pass; invariances; DDP."""
import io

import pytest
import torch

from scoring_helpers import assert_scores, build, full_backward_grads, scores_of, two_process_scores, views
from snapvit_pl.errors import CheckpointError
from snapvit_pl.errors import ConfigError
from snapvit_pl.scoring import ScoringError, Taylor




def saliency(module, name, index, dim=0):
    """sum |w * g| over entries ``index`` of ``module.<name>`` along ``dim`` (0 when absent or not a Parameter)."""
    owner, _, attr = name.rpartition(".")
    holder = module.get_submodule(owner) if owner else module
    p = getattr(holder, attr, None)
    if not isinstance(p, torch.nn.Parameter) or p.grad is None:
        return 0.0
    w, g = p.detach().double().index_select(dim, index), p.grad.double().index_select(dim, index)
    return float((w * g).abs().sum())


def naive_taylor(model, batches):
    """Per unit, by explicit index lists: |w * g| over its q/k/v rows (+biases), inner-norm channels and
    proj columns (heads), its fc1 row(s) (+bias), MLP-norm channel and fc2 column (neurons); g is the
    gradient of the loss summed over samples (batch mean loss times batch size), divided by the sample count."""
    total = sum(len(b) for b in batches)
    grads = [full_backward_grads(model, b) for b in batches]
    summed = full_backward_grads(model, batches[0][:1])  # a copy to hold the combined gradient
    for name, p in summed.named_parameters():
        parts = [dict(g.named_parameters())[name].grad for g in grads]
        p.grad = None if parts[0] is None else sum(len(b) * q for b, q in zip(batches, parts)) / total
    heads, neurons = [], []
    for block in summed.blocks:
        attn, mlp = block.attn, block.mlp
        H, d = attn.num_heads, attn.head_dim
        C = H * d
        h_scores = []
        for h in range(H):
            own = torch.arange(h * d, (h + 1) * d)
            s = 0.0
            if getattr(attn, "qkv", None) is not None:
                rows = torch.cat([own + k * C for k in range(3)])
                s += saliency(attn, "qkv.weight", rows) + saliency(attn, "qkv.bias", rows)
                s += sum(saliency(attn, f"{p}_bias", own) for p in "qkv")
            else:
                s += sum(saliency(attn, f"{p}_proj.{t}", own) for p in "qkv" for t in ("weight", "bias"))
            s += saliency(attn, "norm.weight", own) + saliency(attn, "norm.bias", own)
            s += saliency(attn, "proj.weight", own, dim=1)
            h_scores.append(s)
        heads.append(torch.tensor(h_scores, dtype=torch.float64))
        N = mlp.fc2.in_features
        n_scores = []
        for j in range(N):
            own = torch.tensor([j])
            if hasattr(mlp, "fc1_g"):
                s = sum(saliency(mlp, f"{fc}.{t}", own) for fc in ("fc1_g", "fc1_x") for t in ("weight", "bias"))
            else:
                rows = torch.tensor([j, N + j]) if mlp.fc1.out_features == 2 * N else own
                s = saliency(mlp, "fc1.weight", rows) + saliency(mlp, "fc1.bias", rows)
            s += saliency(mlp, "norm.weight", own) + saliency(mlp, "norm.bias", own)
            s += saliency(mlp, "fc2.weight", own, dim=1)
            n_scores.append(s)
        neurons.append(torch.tensor(n_scores, dtype=torch.float64))
    return heads, neurons


@pytest.mark.parametrize("family", ["dino_vit", "dinov2_swiglu_packed", "eva02_separate_qkv", "vit_swiglu",
                                    "eva02_fused_qkv", "vit_qk_norm_scale_norms"])
def test_taylor_matches_naive_loop(family):
    model = build(family).double()
    batches = list(views(6).double().split([4, 2]))
    assert_scores(scores_of(Taylor(), model, batches), *naive_taylor(model, batches), rtol=1e-7)


@pytest.mark.parametrize("family", ["dino_vit", "vit_swiglu"])
def test_taylor_does_not_depend_on_batching_or_order(family):
    model, x = build(family).double(), views(8).double()
    one = scores_of(Taylor(), model, [x])
    assert_scores(scores_of(Taylor(), model, list(x.split([5, 3]))), one.heads, one.neurons, rtol=1e-9)
    assert_scores(scores_of(Taylor(), model, list(x.split(2))[::-1]), one.heads, one.neurons, rtol=1e-9)


def test_taylor_two_shards_reduced_equal_one_process():
    model, x = build("eva02_fused_qkv"), views(8)
    single = scores_of(Taylor(), model, [x])
    assert_scores(two_process_scores(Taylor, model, x, 2), single.heads, single.neurons, rtol=1e-4)


def test_taylor_mean_normalizer_and_errors():
    model, x = build("dino_vit"), views(4)
    raw, normalized = scores_of(Taylor(), model, [x]), scores_of(Taylor(normalizer="mean"), model, [x])
    for a, b in zip(raw.heads + raw.neurons, normalized.heads + normalized.neurons):
        torch.testing.assert_close(b, a / a.mean(), rtol=1e-5, atol=0)
    with pytest.raises(ConfigError, match="normalizer must be one of none, mean"):
        Taylor(normalizer="max")
    with pytest.raises(ScoringError, match="n_global must be >= 1"):
        Taylor(n_global=0)


def test_taylor_resume_and_leaves_model_untouched():
    model, x = build("vit_swiglu"), views(6)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    batches = list(x.split(2))
    expected = scores_of(Taylor(), model, batches)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters())
    first = Taylor().bind(model)
    first.update(batches[0])
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    resumed = Taylor().bind(model)
    resumed.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    for batch in batches[1:]:
        resumed.update(batch)
    got = resumed.compute()
    assert all(torch.equal(a, b) for a, b in zip(got.heads + got.neurons, expected.heads + expected.neurons))
    other = Taylor().bind(build("dino_vit"))
    with pytest.raises(CheckpointError, match="does not fit"):
        other.load_state_dict(first.state_dict())
