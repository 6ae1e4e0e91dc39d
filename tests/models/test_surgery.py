import copy

import pytest
import torch

from families import FAMILIES, random_subnet
from snapvit_pl.errors import PruningSpecError
from snapvit_pl.models import Subnet, architecture, load_backbone, manual_attention, prunable_blocks, prune_, use_subnet

FAMILY_NAMES = sorted(FAMILIES)


def _images(model, n=2):
    return torch.randn(n, model.patch_embed.proj.in_channels, 32, 32)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_zero_pruning_is_bit_identical(family):
    model = load_backbone(FAMILIES[family])
    x = _images(model)
    with torch.no_grad():
        reference = model(x)
        with use_subnet(model, Subnet.full(model)):
            masked = model(x)
        physical = prune_(copy.deepcopy(model), Subnet.full(model))(x)
    assert torch.equal(masked, reference)
    assert torch.equal(physical, reference)


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_forward_matches_physical_surgery(family, seed):
    model = load_backbone(FAMILIES[family])
    x = _images(model)
    subnet = random_subnet(model, seed)
    with torch.no_grad():
        dense = model(x)
        with use_subnet(model, subnet):
            masked = model(x)
        restored = model(x)
        physical = prune_(copy.deepcopy(model), subnet)(x)
    assert torch.equal(restored, dense), "use_subnet must restore the model on exit"
    assert (masked - physical).abs().max() <= 1e-5
    assert architecture(prune_(copy.deepcopy(model), subnet)) == {
        "heads": subnet.head_counts, "mlp_hidden": subnet.neuron_counts
    }


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_minimum_model_runs_with_fused_and_manual_attention(family):
    model = load_backbone(FAMILIES[family])
    blocks = prunable_blocks(model)
    keep_one = Subnet([torch.tensor([b.heads.num_units - 1]) for b in blocks], [torch.tensor([0]) for _ in blocks])
    prune_(model, keep_one)
    assert architecture(model) == {"heads": [1, 1], "mlp_hidden": [1, 1]}
    x = _images(model)
    with torch.no_grad():
        fused = model(x)
        with manual_attention(model):
            manual = model(x)
    assert torch.isfinite(fused).all()
    assert (fused - manual).abs().max() <= 1e-5


def test_gradients_reach_original_parameters_through_gathered_forward():
    model = load_backbone(FAMILIES["dino_vit"])
    subnet = random_subnet(model, 0)
    with use_subnet(model, subnet):
        # squared: the plain sum of a LayerNorm output has a zero gradient up to rounding
        model(_images(model)).square().sum().backward()
    fc1 = model.blocks[0].mlp.fc1.weight.grad
    removed = sorted(set(range(fc1.shape[0])) - set(subnet.neurons[0].tolist()))
    assert fc1[subnet.neurons[0]].abs().sum() > 0
    assert fc1[removed].abs().sum() == 0


def test_invalid_subnet_leaves_model_untouched():
    model = load_backbone(FAMILIES["dino_vit"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bad = Subnet([torch.tensor([0]), torch.tensor([], dtype=torch.long)], [torch.tensor([0]), torch.tensor([0])])
    with pytest.raises(PruningSpecError, match="block 1 heads: every unit would be removed"):
        prune_(model, bad)
    with pytest.raises(PruningSpecError):
        with use_subnet(model, bad):
            pass
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("family", ["dino_vit", "eva02_fused_qkv"])
def test_pruned_model_runs_under_torch_compile(family):
    model = load_backbone(FAMILIES[family])
    prune_(model, random_subnet(model, 3))
    x = _images(model)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model)(x)
    assert (eager - compiled).abs().max() <= 1e-4


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_the_gathered_forward_restores_every_attribute_and_tensor(family):
    """Inside ``use_subnet`` the modules report the pruned sizes (and EVA attention its pruned class); after it, even
    when the body raises, every attribute, class and tensor object is the one from before."""
    model = load_backbone(FAMILIES[family])
    blocks = prunable_blocks(model)
    subnet = Subnet([h[: max(1, len(h) // 2)] for h in Subnet.full(blocks).heads],
                    [n[: max(1, len(n) // 3)] for n in Subnet.full(blocks).neurons])

    def snapshot():
        return [(type(m), {k: v for k, v in vars(m).items() if not k.startswith("_")},
                 {k: id(v) for k, v in m._parameters.items()}, {k: id(v) for k, v in m._buffers.items()})
                for m in model.modules()]

    before = snapshot()
    with use_subnet(model, subnet, blocks):
        attn, fc2 = model.blocks[0].attn, model.blocks[0].mlp.fc2
        assert attn.num_heads == len(subnet.heads[0]) and fc2.in_features == len(subnet.neurons[0])
        assert fc2.weight.shape[1] == len(subnet.neurons[0])
    assert snapshot() == before
    with pytest.raises(RuntimeError, match="inside"):
        with use_subnet(model, subnet, blocks):
            raise RuntimeError("inside")
    assert snapshot() == before
