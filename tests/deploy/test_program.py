import pytest
import torch

pytest.importorskip("onnxruntime")  # snapvit_pl.deploy imports onnx and onnxruntime

from families import FAMILIES, random_subnet  # noqa: E402
from snapvit_pl.deploy import export_program  # noqa: E402
from snapvit_pl.models import load_backbone, prune_  # noqa: E402


# One family per distinct code path (all 14 export; the rest are left out to keep the suite fast).
PATHS = ["dino_vit", "deit_distilled", "siglip2_attn_pool", "dinov2_swiglu_packed", "eva02_fused_qkv", "eva02_separate_qkv", "dinov3"]


@pytest.mark.parametrize("family", PATHS)
def test_exported_program_of_pruned_model_matches_eager_at_any_batch(family):
    model = load_backbone(FAMILIES[family])
    prune_(model, random_subnet(model, 5))
    program = export_program(model.train())
    assert model.training
    model.eval()
    for batch in (3, 1):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(program.module()(x), model(x), rtol=0, atol=1e-5)


def test_saved_program_loads_without_the_model_code(tmp_path):
    model = load_backbone(FAMILIES["dino_vit"])
    prune_(model, random_subnet(model, 1))
    torch.export.save(export_program(model), tmp_path / "model.pt2")
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(torch.export.load(tmp_path / "model.pt2").module()(x), model(x), rtol=0, atol=1e-5)
