import torch
import torch.nn.functional as F

from snapvit_pl.eval.seg_probe import seg_probe, tokens_to_feature_map

NUM_CLASSES, GRID, MASK, CHANNELS = 4, 8, 32, 12


def toy_segmentation(n, seed):
    """Masks of random blocks; feature channels encode the class of each patch (plus noise)."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.randint(0, NUM_CLASSES, (n, GRID // 2, GRID // 2), generator=generator)
    masks = coarse.repeat_interleave(MASK // (GRID // 2), 1).repeat_interleave(MASK // (GRID // 2), 2)
    patch_classes = masks[:, :: MASK // GRID, :: MASK // GRID]
    features = F.one_hot(patch_classes, CHANNELS).permute(0, 3, 1, 2).float()
    features = features + 0.3 * torch.randn(features.shape, generator=generator)
    masks[:, :2, :2] = 255  # some ignored pixels
    return features, masks


def test_probe_segments_toy_feature_maps():
    train_x, train_y = toy_segmentation(48, seed=0)
    test_x, test_y = toy_segmentation(16, seed=1)
    result = seg_probe(train_x, train_y, test_x, test_y, NUM_CLASSES, epochs=15, device="cpu")
    assert result.miou > 0.5
    assert result.pixel_accuracy > 0.7


def test_token_inputs_match_feature_maps():
    train_x, train_y = toy_segmentation(16, seed=2)
    test_x, test_y = toy_segmentation(8, seed=3)
    as_tokens = lambda maps: maps.flatten(2).transpose(1, 2)
    torch.testing.assert_close(tokens_to_feature_map(as_tokens(train_x), (GRID, GRID)), train_x)
    kwargs = dict(num_classes=NUM_CLASSES, epochs=2, device="cpu")
    maps = seg_probe(train_x, train_y, test_x, test_y, **kwargs)
    tokens = seg_probe(as_tokens(train_x), train_y, as_tokens(test_x), test_y, grid_size=(GRID, GRID), **kwargs)
    assert maps.miou == tokens.miou and maps.pixel_accuracy == tokens.pixel_accuracy
