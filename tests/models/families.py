"""Tiny random-weight configurations of every supported timm ViT family (for tests)."""
import torch
from timm.layers import SwiGLU

from snapvit_pl.elastic import ElasticScores, initial_coefficients
from snapvit_pl.models import BackboneSpec, Subnet, fingerprint, prunable_blocks

SMALL = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)

FAMILIES = {
    "dino_vit": BackboneSpec("vit_small_patch16_224.dino", False, None, dict(SMALL, num_classes=0)),
    "augreg_vit": BackboneSpec("vit_tiny_patch16_224.augreg_in21k", False, None, dict(SMALL, num_classes=10)),
    "deit3_layerscale": BackboneSpec("deit3_small_patch16_224", False, None, dict(SMALL, num_classes=10)),
    "deit_distilled": BackboneSpec("deit_tiny_distilled_patch16_224", False, None, dict(SMALL, num_classes=10)),
    "dinov2_reg": BackboneSpec("vit_small_patch14_reg4_dinov2", False, None, dict(SMALL, num_classes=0)),
    "dinov2_swiglu_packed": BackboneSpec("vit_giant_patch14_dinov2", False, None, dict(SMALL, num_classes=0, mlp_ratio=4.0)),
    "siglip2_attn_pool": BackboneSpec("vit_base_patch16_siglip_224.v2_webli", False, None, dict(SMALL, num_classes=0)),
    "vit_swiglu": BackboneSpec("vit_small_patch16_224", False, None, dict(SMALL, num_classes=5, mlp_layer=SwiGLU)),
    "vit_qk_norm_scale_norms": BackboneSpec("vit_small_patch16_224", False, None, dict(SMALL, num_classes=5, qk_norm=True, scale_attn_norm=True, scale_mlp_norm=True)),
    "eva02_fused_qkv": BackboneSpec("eva02_tiny_patch14_224", False, None, dict(SMALL, num_classes=0, ref_feat_shape=(4, 4), qkv_fused=True)),
    "eva02_separate_qkv": BackboneSpec("eva02_tiny_patch14_224", False, None, dict(SMALL, num_classes=0, ref_feat_shape=(4, 4), qkv_fused=False)),
    "eva02_scale_norms_swiglu": BackboneSpec("eva02_tiny_patch14_224", False, None, dict(SMALL, num_classes=0, ref_feat_shape=(4, 4), scale_mlp=True, scale_attn_inner=True)),
    "dinov3": BackboneSpec("vit_small_patch16_dinov3", False, None, dict(SMALL, num_classes=0)),
    "dinov3_swiglu": BackboneSpec("vit_small_plus_patch16_dinov3", False, None, dict(SMALL, num_classes=0)),
}


def random_subnet(model, seed, min_heads=1, min_neurons=1):
    """A seeded random selection keeping at least ``min_*`` units per block."""
    g = torch.Generator().manual_seed(seed)
    heads, neurons = [], []
    for b in prunable_blocks(model):
        h = int(torch.randint(min_heads, b.heads.num_units + 1, (1,), generator=g))
        n = int(torch.randint(min_neurons, b.neurons.num_units + 1, (1,), generator=g))
        heads.append(torch.randperm(b.heads.num_units, generator=g)[:h])
        neurons.append(torch.randperm(b.neurons.num_units, generator=g)[:n])
    return Subnet(heads, neurons)


def random_elastic_scores(model, seed=0):
    """Seeded random local scores with the search's initial coefficients."""
    g = torch.Generator().manual_seed(seed)
    blocks = prunable_blocks(model)
    return ElasticScores(
        [torch.rand(b.heads.num_units, generator=g) for b in blocks],
        [torch.rand(b.neurons.num_units, generator=g) for b in blocks],
        initial_coefficients(len(blocks), [b.heads.num_units for b in blocks], 1.2, 0.8),
        fingerprint=fingerprint(model),
    )


def saved_scores(folder, name="scores.safetensors", family="dino_vit"):
    """``family``'s model with its weights in ``folder/base.safetensors`` and its random elastic scores saved as
    ``folder/name``, recording that file as their base (what ``extract`` rebuilds the model from); returns
    ``(scores file, model)``."""
    from safetensors.torch import save_file

    from snapvit_pl.models import load_backbone

    spec = FAMILIES[family]
    model = load_backbone(spec)
    save_file(model.state_dict(), str(folder / "base.safetensors"))
    scores = random_elastic_scores(model)
    scores.base = BackboneSpec(spec.model_name, False, str(folder / "base.safetensors"), spec.model_kwargs).to_dict()
    return scores.save(folder / name), model
