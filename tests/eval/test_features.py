import pytest
import timm
import torch
from torch.utils.data import DataLoader, TensorDataset

from snapvit_pl.eval.features import extract_features


@pytest.fixture(scope="module")
def tiny_vit():
    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2, embed_dim=64, num_heads=2, num_classes=0
    )


def test_embeddings_tokens_and_labels(tiny_vit):
    images, labels = torch.randn(10, 3, 32, 32), torch.arange(10)
    loader = DataLoader(TensorDataset(images, labels), batch_size=4)
    tiny_vit.train()
    out = extract_features(tiny_vit, loader, patch_tokens=True, device="cpu")
    assert out.embeddings.shape == (10, 64) and out.embeddings.dtype == torch.float32
    assert out.patch_tokens.shape == (10, 16, 64) and out.grid_size == (4, 4)
    assert torch.equal(out.targets, labels)
    assert tiny_vit.training
    tiny_vit.eval()
    with torch.no_grad():
        expected = tiny_vit.forward_features(images)
    torch.testing.assert_close(out.embeddings, expected[:, 0])
    torch.testing.assert_close(out.patch_tokens, expected[:, tiny_vit.num_prefix_tokens :])


def test_masks_and_prefix_tokens_with_registers():
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1, embed_dim=32, num_heads=2,
        num_classes=0, reg_tokens=3, global_pool="avg",
    )
    images, masks = torch.randn(6, 3, 32, 32), torch.randint(0, 5, (6, 32, 32))
    loader = DataLoader(TensorDataset(images, masks), batch_size=4)
    out = extract_features(model, loader, embeddings=False, patch_tokens=True, device="cpu", progress=True)
    assert model.num_prefix_tokens == 4
    assert out.embeddings is None and out.patch_tokens.shape == (6, 16, 32)
    assert torch.equal(out.targets, masks)


def test_dynamic_image_size_grid():
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1, embed_dim=32, num_heads=2,
        num_classes=0, dynamic_img_size=True,
    )
    loader = DataLoader(TensorDataset(torch.randn(2, 3, 48, 32), torch.zeros(2)), batch_size=2)
    out = extract_features(model, loader, patch_tokens=True, device="cpu")
    assert out.grid_size == (6, 4) and out.patch_tokens.shape == (2, 24, 32)


@pytest.mark.parametrize("distilled", [False, True])
def test_logits_are_the_model_forward_and_give_the_separate_head_accuracy(distilled):
    from snapvit_pl.eval.suite import evaluate_classification, head_accuracy

    torch.manual_seed(0)
    name = "deit_tiny_distilled_patch16_224" if distilled else "vit_tiny_patch16_224"
    model = timm.create_model(name, pretrained=False, img_size=32, patch_size=8, depth=2, embed_dim=64, num_heads=2,
                              num_classes=5).eval()
    images, labels = torch.randn(20, 3, 32, 32), torch.randint(0, 5, (20,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=8)
    out = extract_features(model, loader, logits=True, device="cpu")
    with torch.no_grad():
        torch.testing.assert_close(out.logits, model(images))
    one_pass = evaluate_classification(model, loader, loader, metrics=("knn", "head"), device="cpu")["head_top1"]
    assert one_pass == head_accuracy(model, loader, torch.device("cpu"))
    assert evaluate_classification(model, loader, loader, metrics=("head",), device="cpu")["head_top1"] == one_pass
