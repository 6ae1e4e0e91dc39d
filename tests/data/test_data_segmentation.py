"""SegmentationDataModule: ADE20K / VOC / folder fixtures, Fashion-MNIST canvases, bad input."""
import numpy as np
import pytest
import torch
from PIL import Image

from snapvit_pl.data import DataError, FashionMNIST, FashionMNISTSegmentation, SegmentationDataModule

SAME_SIZE = {"input_size": (3, 32, 32), "mean": (0.5,) * 3, "std": (0.25,) * 3, "interpolation": "bilinear"}


def raw_mask(path):
    return torch.from_numpy(np.asarray(Image.open(path)).astype(np.int64))


def test_ade20k_reduces_zero_label(ade_tree):
    dm = SegmentationDataModule("ade20k", str(ade_tree), data_config=SAME_SIZE, batch_size=3)
    assert dm.num_classes == 150 and dm.ignore_index == 255
    images, masks = next(iter(dm.train_dataloader()))
    assert images.shape == (3, 3, 32, 32) and masks.shape == (3, 32, 32) and masks.dtype == torch.int64
    dataset, pairs = dm.labeled_dataset("train"), dm.base_dataset("train").pairs
    for index, (_, mask_path) in enumerate(pairs):
        mask, raw = dataset[index][1], raw_mask(mask_path)
        assert torch.equal(mask == 255, raw == 0) and torch.equal(mask[raw > 0], raw[raw > 0] - 1)
    assert set(masks.unique().tolist()) == {0, 6, 149, 255}
    assert len(dm.base_dataset("val")) == 2


def test_voc_keeps_palette_indices_and_ignore(voc_tree, tiny_vit):
    dm = SegmentationDataModule("voc", str(voc_tree), batch_size=2)
    dm.configure_for_model(tiny_vit)
    images, masks = next(iter(dm.train_dataloader()))
    assert images.shape == (2, 1, 28, 28) and masks.shape == (2, 28, 28)
    assert set(masks.unique().tolist()) <= {0, 5, 20, 255} and (masks[:, 0] == 255).all()  # resized nearest
    exact = SegmentationDataModule("voc", str(voc_tree / "VOCdevkit"), data_config={"input_size": (3, 24, 36)})
    _, mask = exact.labeled_dataset("val")[0]
    assert torch.equal(mask, raw_mask(exact.base_dataset("val").pairs[0][1]))


def test_folder_pairs_and_train_augment(seg_folder_tree):
    dm = SegmentationDataModule("folder", str(seg_folder_tree), num_classes=4, data_config=SAME_SIZE,
                                train_augment=True, batch_size=3)
    images, masks = next(iter(dm.train_dataloader()))
    assert images.shape == (3, 3, 32, 32) and set(masks.unique().tolist()) <= {0, 1, 2, 3}
    assert dm.num_classes == 4
    plain = next(iter(dm.unlabeled_dataloader("plain", batch_size=2, split="val")))
    assert plain.shape == (2, 3, 32, 32)
    with pytest.raises(DataError, match="needs num_classes"):
        _ = SegmentationDataModule("folder", str(seg_folder_tree)).num_classes


def test_mask_size_mismatch_names_both_paths(seg_folder_tree):
    image_path = seg_folder_tree / "train" / "images" / "img1.png"
    mask_path = seg_folder_tree / "train" / "masks" / "img1.png"
    Image.fromarray(np.zeros((20, 32), dtype=np.uint8)).save(mask_path)
    dm = SegmentationDataModule("folder", str(seg_folder_tree), num_classes=4, data_config=SAME_SIZE)
    with pytest.raises(DataError, match=rf"mask {mask_path} is 32x20 but image {image_path} is 32x32"):
        dm.labeled_dataset("train")[1]


def test_rgb_mask_and_missing_mask_are_errors(seg_folder_tree):
    mask_path = seg_folder_tree / "val" / "masks" / "img0.png"
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(mask_path)
    dm = SegmentationDataModule("folder", str(seg_folder_tree), num_classes=4)
    with pytest.raises(DataError, match=rf"mask {mask_path} has mode RGB"):
        dm.base_dataset("val")[0]
    (seg_folder_tree / "train" / "masks" / "img2.png").unlink()
    with pytest.raises(DataError, match=r"img2.png has no mask .*masks/img2.png"):
        SegmentationDataModule("folder", str(seg_folder_tree), num_classes=4).setup()


def test_unreadable_image_error_and_skip(ade_tree):
    bad = next((ade_tree / "ADEChallengeData2016" / "images" / "training").iterdir())
    bad.write_bytes(b"\xff\xd8 truncated")
    dm = SegmentationDataModule("ade20k", str(ade_tree), data_config=SAME_SIZE)
    with pytest.raises(DataError, match=rf"cannot read image {bad}"):
        [dm.labeled_dataset("train")[i] for i in range(3)]
    skipping = SegmentationDataModule("ade20k", str(ade_tree), data_config=SAME_SIZE, skip_corrupt=True)
    assert len(skipping.labeled_dataset("train")) == 2 and skipping.skipped["train"] == [str(bad)]


@pytest.mark.parametrize("source,expected", [
    ("ade20k", r"ADE20K not found under .*ADEChallengeData2016/images/\{training,validation\}.*unzip"),
    ("voc", r"Pascal VOC 2012 not found under .*VOCdevkit/VOC2012/.*download: true"),
    ("folder", r"lacks train/images or train/masks; expected root/\{train,val\}/images"),
])
def test_wrong_layout_names_expected_layout(tmp_path, source, expected):
    with pytest.raises(DataError, match=expected):
        SegmentationDataModule(source, str(tmp_path)).setup()
    with pytest.raises(DataError, match="unknown segmentation source"):
        SegmentationDataModule("cityscapes", str(tmp_path))


def test_fashion_mnist_masks_align_with_items(fashion_mnist_dir):
    items = FashionMNIST(None, "val")
    dataset = FashionMNISTSegmentation(items, canvas_size=56, max_items=4, seed=7)
    counts = set()
    for index in (0, 1, 2, 3, 4, 9999):
        image, mask = dataset[index]
        canvas = torch.from_numpy(np.asarray(image).astype(np.int64))
        assert canvas.shape == mask.shape == (56, 56)
        assert torch.equal(mask > 0, canvas > 0)  # every non-zero pixel belongs to an item
        layout = dataset.layout(index)
        counts.add(len(layout))
        assert layout[0][0] == index and 1 <= len(layout) <= 4
        item, top, left = layout[-1]  # painted last: fully visible
        pixels = items.data[item].long()
        region = (slice(top, top + 28), slice(left, left + 28))
        foreground = pixels > 0
        assert torch.equal(canvas[region][foreground], pixels[foreground])
        assert (mask[region][foreground] == items.targets[item] + 1).all()
    assert len(counts) > 1


def test_fashion_mnist_segmentation_is_deterministic(fashion_mnist_dir, tiny_vit):
    def sample(seed, index=5):
        dm = SegmentationDataModule("fashion_mnist", seed=seed, canvas_size=56)
        dm.configure_for_model(tiny_vit)
        return dm.labeled_dataset("train")[index]

    image, mask = sample(0)
    again_image, again_mask = sample(0)
    assert torch.equal(image, again_image) and torch.equal(mask, again_mask)
    assert not torch.equal(mask, sample(1)[1])
    assert image.shape == (1, 28, 28) and mask.shape == (28, 28) and int(mask.max()) <= 10


@pytest.mark.parametrize("side, given, expected", [
    (28, (None, None), (28, 1)),  # a 28-px model sees items at native resolution, one per canvas
    (40, (None, None), (40, 1)),
    (224, (None, None), (56, 4)),  # larger models: 56-px canvases resized to the input
    (28, (84, 2), (84, 2)),  # explicit values win
])
def test_fashion_mnist_canvas_defaults_follow_the_model_input(side, given, expected):
    dm = SegmentationDataModule("fashion_mnist", data_config={"input_size": (1, side, side)},
                                canvas_size=given[0], max_items=given[1])
    assert dm.canvas_layout() == expected


def test_fashion_mnist_segmentation_splits(fashion_mnist_dir):
    dm = SegmentationDataModule("fashion_mnist", data_config={"input_size": (3, 112, 112)}, batch_size=4,
                                max_samples=8)
    assert len(dm.base_dataset("train")) == 60000 and len(dm.base_dataset("val")) == 10000
    assert dm.num_classes == 11 and len(dm.dataset("val")) == 8
    images, masks = next(iter(dm.val_dataloader()))
    assert images.shape == (4, 3, 112, 112) and masks.shape == (4, 112, 112)
    views = next(iter(dm.unlabeled_dataloader("multicrop", batch_size=2)))
    assert views.shape == (2, 12, 3, 112, 112)
