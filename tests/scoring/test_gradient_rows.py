"""The gradient scorers against an independent full backward pass, unit row by unit row."""

import pytest
import torch
import torch.nn.functional as F

from scoring_helpers import CORE, build, full_backward_grads, views
from snapvit_pl.models import Subnet, embed, use_subnet
from snapvit_pl.scoring import Magnitude, NonFiniteGradientError, SNIPMagnitude, SSLFisher, self_distillation_loss


def reference_loss(student, teacher):
    """The reference implementation's loop: sum over (teacher view, other student view) pairs, batch mean."""
    t = F.softmax(F.normalize(teacher, dim=-1), dim=-1).permute(1, 0, 2)
    s = F.log_softmax(F.normalize(student, dim=-1), dim=-1).permute(1, 0, 2)
    losses = torch.zeros(student.shape[0])
    for ti, tv in enumerate(t):
        for si, sv in enumerate(s):
            if ti != si:
                losses += (-tv * sv).sum(dim=-1)
    return losses.mean()


def test_self_distillation_loss_matches_reference_and_is_sane():
    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(5, 6, 32, generator=g), torch.randn(5, 2, 32, generator=g)
    loss = self_distillation_loss(student, teacher)
    torch.testing.assert_close(loss, reference_loss(student, teacher))
    assert torch.isfinite(loss) and loss > 0
    # L2 normalisation: invariant to the embeddings' scale; cross-entropy >= entropy of the teacher
    torch.testing.assert_close(self_distillation_loss(3 * student, 0.1 * teacher), loss)
    same = self_distillation_loss(teacher, teacher)  # each global view vs the other one only
    assert same > 0 and torch.isfinite(same)


def expected_rows(model_with_grads, block):
    """Per unit, the [U, rows*in] gradient rows SnapViT scores (V rows of heads; fc1 rows of neurons)."""
    attn, mlp = model_with_grads.blocks[block].attn, model_with_grads.blocks[block].mlp
    H = attn.num_heads
    if getattr(attn, "qkv", None) is not None:
        heads = attn.qkv.weight.grad.view(3, H, -1)[2]
    else:
        heads = attn.v_proj.weight.grad.view(H, -1)
    if hasattr(mlp, "fc1_g"):
        neurons = torch.cat([mlp.fc1_g.weight.grad, mlp.fc1_x.weight.grad], dim=1)
    elif mlp.fc1.out_features == 2 * mlp.fc2.in_features:  # packed gate: rows j and N + j
        N = mlp.fc2.in_features
        neurons = mlp.fc1.weight.grad.view(2, N, -1).permute(1, 0, 2).reshape(N, -1)
    else:
        neurons = mlp.fc1.weight.grad
    return heads, neurons


@pytest.mark.parametrize("family", CORE + ["eva02_fused_qkv"])
def test_ssl_fisher_equals_independent_backward(family):
    model, x = build(family), views(4)
    reference = full_backward_grads(model, x)
    for reduction in ("squared_sum", "fisher"):  # one batch: both are grad**2
        scorer = SSLFisher(reduction=reduction).bind(model)
        scorer.update(x)
        scores = scorer.compute()
        for b in range(len(model.blocks)):
            heads, neurons = expected_rows(reference, b)
            torch.testing.assert_close(scores.heads[b], heads.square().mean(1), rtol=1e-4, atol=0)
            torch.testing.assert_close(scores.neurons[b], neurons.square().mean(1), rtol=1e-4, atol=0)


def test_snip_magnitude_equals_independent_backward():
    model, x = build("dinov2_swiglu_packed"), views(4)
    reference = full_backward_grads(model, x)
    scorer = SNIPMagnitude(alpha=0.01).bind(model)
    scorer.update(x)
    scores = scorer.compute()
    fc1 = reference.blocks[1].mlp.fc1
    N = reference.blocks[1].mlp.fc2.in_features
    saliency = (fc1.weight.grad * fc1.weight).abs() + 0.01 * fc1.weight.detach() ** 2
    torch.testing.assert_close(scores.neurons[1], saliency.view(2, N, -1).mean(dim=(0, 2)), rtol=1e-4, atol=0)


def kill(mlp, neuron, halves):
    """Zero the fc1 weight rows and bias entries of one neuron in the given halves (0 = gate, 1 = value)."""
    N = mlp.fc2.in_features
    with torch.no_grad():
        for h in halves:
            mlp.fc1.weight[h * N + neuron] = 0
            mlp.fc1.bias[h * N + neuron] = 0


def test_packed_gated_neuron_scores_cover_both_halves():
    """SwiGLUPacked: neuron j is fc1 rows j (gate, SiLU) and N + j (value), as surgery cuts them."""
    model, x = build("dinov2_swiglu_packed"), views(4)
    mlp = model.blocks[0].mlp
    kill(mlp, 0, halves=(0, 1))  # a dead neuron: both halves zero
    kill(mlp, 1, halves=(1,))    # value half zero: output 0, but the value rows still get a gradient
    scorer = SSLFisher().bind(model)
    scorer.update(x)
    fisher = scorer.compute().neurons[0]
    magnitude = Magnitude().bind(model)
    norms = magnitude.compute().neurons[0]

    grad = full_backward_grads(model, x).blocks[0].mlp.fc1.weight.grad.view(2, mlp.fc2.in_features, -1)
    assert fisher[0] == 0 and norms[0] == 0  # nothing flows through a dead neuron
    assert grad[0, 1].abs().max() == 0 < grad[1, 1].abs().max()  # gate rows get no gradient, value rows do
    torch.testing.assert_close(fisher[1], grad[1, 1].square().mean() / 2, rtol=1e-4, atol=0)  # mean over both halves
    torch.testing.assert_close(norms[1], mlp.fc1.weight[1].norm())  # the gate half's weights still count

    # the dead neuron (lowest score) is exactly what the surgery removes: pruning it changes nothing
    keep = Subnet.full(model)
    keep.neurons[0] = torch.arange(1, mlp.fc2.in_features)
    plain = x[:, 0]
    with torch.no_grad():
        full = embed(model, plain)
        with use_subnet(model, keep):
            pruned = embed(model, plain)
    torch.testing.assert_close(pruned, full, rtol=1e-5, atol=1e-6)


def test_swiglu_neuron_scores_use_fc1_g_and_fc1_x():
    model, x = build("vit_swiglu"), views(4)
    mlp = model.blocks[1].mlp
    with torch.no_grad():
        mlp.fc1_x.weight[3] = 0
        mlp.fc1_x.bias[3] = 0  # value path of neuron 3 off: only its fc1_x rows still get a gradient
    scorer = SSLFisher().bind(model)
    scorer.update(x)
    reference = full_backward_grads(model, x).blocks[1].mlp
    g_gate, g_value = reference.fc1_g.weight.grad[3], reference.fc1_x.weight.grad[3]
    assert g_gate.abs().max() == 0 < g_value.abs().max()
    torch.testing.assert_close(scorer.compute().neurons[1][3], g_value.square().mean() / 2, rtol=1e-4, atol=0)
    magnitude = Magnitude().bind(model)
    torch.testing.assert_close(magnitude.compute().neurons[1][3], mlp.fc1_g.weight[3].norm())


def test_non_finite_gradient_names_block_and_batch():
    scorer = SSLFisher().bind(build("dino_vit"))
    scorer.update(views(2))
    bad = views(2)
    bad[0, 0, 0, 0, 0] = float("nan")
    message = r"non-finite gradient in block 0 attention qkv \(batch 2, loss nan\)"
    with pytest.raises(NonFiniteGradientError, match=message):
        scorer.update(bad)
    assert issubclass(NonFiniteGradientError, FloatingPointError)
    assert scorer.state_dict()["batches"] == 1, "a failed batch must not be counted"

    eva = SSLFisher().bind(build("eva02_separate_qkv"))
    with pytest.raises(FloatingPointError, match=r"block 0 attention v_proj \(batch 1"):
        eva.update(bad)

