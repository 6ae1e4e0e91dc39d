"""An offline Hugging Face cache laid out by hand, so that ``pretrained=True`` and ``hf-hub:`` names load for real.

Layout (what ``huggingface_hub`` looks up with ``HF_HUB_OFFLINE=1``): ``<HF_HOME>/hub/models--<org>--<name>/``
with ``refs/main`` (a 40-hex revision, no trailing newline) and ``snapshots/<revision>/`` holding the
files; timm's ``save_for_hf`` writes ``model.safetensors`` and ``config.json``. The weights are random,
of small variants of each family: the timm names load them with the same small ``model_kwargs``.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import timm
import torch
from timm.models._hub import save_for_hf

SMALL = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)

#: timm names with their pretrained tag (hub repo timm/<name>) -> the small architecture cached for them.
TIMM_NAMES = {
    "vit_small_patch16_224.dino": dict(SMALL, num_classes=0),
    "deit_tiny_distilled_patch16_224.fb_in1k": dict(SMALL, num_classes=10),
    "vit_small_patch14_reg4_dinov2.lvd142m": dict(SMALL, num_classes=0),
    "vit_base_patch16_siglip_224.v2_webli": dict(SMALL, num_classes=0),
    "eva02_tiny_patch14_224.mim_in22k": dict(SMALL, num_classes=0, ref_feat_shape=(4, 4)),
    "vit_small_patch16_dinov3.lvd1689m": dict(SMALL, num_classes=0),
}
#: hf-hub names (a user's own upload: the architecture comes from config.json) -> (architecture, arguments).
HUB_NAMES = {
    "hf-hub:snapvit-test/tiny-dino": ("vit_small_patch16_224", dict(SMALL, num_classes=0)),
    "hf-hub:snapvit-test/tiny-classifier": ("vit_tiny_patch16_224", dict(SMALL, num_classes=10)),
}


def snapshot(hub: Path, repo_id: str) -> Path:
    """Create (or reuse) the snapshot directory of ``repo_id`` in a cache rooted at ``hub``."""
    folder = hub / f"models--{repo_id.replace('/', '--')}"
    revision = hashlib.sha1(repo_id.encode()).hexdigest()
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(revision)
    path = folder / "snapshots" / revision
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_cache(home: Path) -> dict[str, torch.nn.Module]:
    """Write every model above into ``<home>/hub``; returns the models, by name, to compare weights with."""
    hub = home / "hub"
    models = {}
    for seed, (name, kwargs) in enumerate(TIMM_NAMES.items()):
        torch.manual_seed(100 + seed)
        model = timm.create_model(name.split(".")[0], pretrained=False, **kwargs)
        save_for_hf(model, str(snapshot(hub, f"timm/{name}")), safe_serialization=True)
        models[name] = model
    for seed, (name, (architecture, kwargs)) in enumerate(HUB_NAMES.items()):
        torch.manual_seed(200 + seed)
        model = timm.create_model(architecture, pretrained=False, **kwargs)
        save_for_hf(model, str(snapshot(hub, name.removeprefix("hf-hub:"))), model_args=kwargs, safe_serialization=True)
        models[name] = model
    return models
