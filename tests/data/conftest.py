"""Fixture data trees (real PNG/JPEG files in a temp dir) and small model configs for the data tests."""
import os

import numpy as np
import pytest
import timm
from PIL import Image

from snapvit_pl.data import find_fashion_mnist

# A 3-channel 32x32 input pipeline with no crop, so fixture pixels map 1:1 to tensors.
RGB32 = {"input_size": (3, 32, 32), "mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25),
         "interpolation": "bilinear", "crop_pct": 1.0}
# Solid colour of each fixture class, so a loaded image tells its true class.
CLASS_COLOURS = {"cat": (250, 10, 10), "dog": (10, 250, 10), "fish": (10, 10, 250)}


def save_image(path, array, fmt=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(array).save(path, format=fmt)


@pytest.fixture
def rgb32():
    """Data config of a 3-channel 32x32 model input with no crop."""
    return dict(RGB32)


@pytest.fixture
def class_colours():
    return dict(CLASS_COLOURS)


@pytest.fixture
def classification_tree(tmp_path):
    """root/{train,val}/{cat,dog,fish}: cat RGB PNG, dog RGB JPEG, fish grayscale PNG; 4 + 2 per class."""
    root = tmp_path / "folder"
    for split, count in (("train", 4), ("val", 2)):
        for name, colour in CLASS_COLOURS.items():
            for i in range(count):
                array = np.full((30 + i, 40, 3), colour, dtype=np.uint8)
                if name == "fish":
                    save_image(str(root / split / name / f"{i}.png"), array[..., 2])
                else:
                    ext = "jpg" if name == "dog" else "png"
                    save_image(str(root / split / name / f"{i}.{ext}"), array)
    return root


def random_mask(rng, shape, values):
    return rng.choice(np.asarray(values, dtype=np.uint8), size=shape)


@pytest.fixture
def ade_tree(tmp_path):
    """ADEChallengeData2016 with 3 training / 2 validation images; masks use raw values 0..150."""
    base = tmp_path / "ade" / "ADEChallengeData2016"
    rng = np.random.default_rng(0)
    for folder, count in (("training", 3), ("validation", 2)):
        for i in range(count):
            stem = f"ADE_{folder[:5]}_{i:08d}"
            save_image(str(base / "images" / folder / f"{stem}.jpg"),
                       rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
            save_image(str(base / "annotations" / folder / f"{stem}.png"), random_mask(rng, (32, 32), [0, 1, 7, 150]))
    return tmp_path / "ade"


@pytest.fixture
def voc_tree(tmp_path):
    """VOCdevkit/VOC2012 with palette masks (classes 0..20, 255 border)."""
    base = tmp_path / "voc" / "VOCdevkit" / "VOC2012"
    rng = np.random.default_rng(1)
    palette = rng.integers(0, 255, 768, dtype=np.uint8).tolist()
    ids = {"train": ["2007_000001", "2007_000002"], "val": ["2007_000003"]}
    for split, names in ids.items():
        (base / "ImageSets" / "Segmentation").mkdir(parents=True, exist_ok=True)
        (base / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("\n".join(names) + "\n")
        for name in names:
            save_image(str(base / "JPEGImages" / f"{name}.jpg"), rng.integers(0, 255, (24, 36, 3), dtype=np.uint8))
            mask = random_mask(rng, (24, 36), [0, 5, 20])
            mask[0, :] = 255
            image = Image.fromarray(mask, mode="P")
            image.putpalette(palette)
            os.makedirs(base / "SegmentationClass", exist_ok=True)
            image.save(base / "SegmentationClass" / f"{name}.png")
    return tmp_path / "voc"


@pytest.fixture
def seg_folder_tree(tmp_path):
    """root/{train,val}/{images,masks} with grayscale masks of classes 0..3."""
    root = tmp_path / "segfolder"
    rng = np.random.default_rng(2)
    for split, count in (("train", 3), ("val", 2)):
        for i in range(count):
            save_image(str(root / split / "images" / f"img{i}.png"), rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
            save_image(str(root / split / "masks" / f"img{i}.png"), random_mask(rng, (32, 32), [0, 1, 2, 3]))
    return root


@pytest.fixture
def tiny_vit():
    """The project's offline default shape: ViT on 28x28 single-channel inputs."""
    return timm.models.VisionTransformer(img_size=28, patch_size=4, in_chans=1, embed_dim=16, depth=1,
                                         num_heads=2, num_classes=10)


@pytest.fixture
def fashion_mnist_dir():
    """Directory of the installed Fashion-MNIST IDX files (Debian package)."""
    directory = find_fashion_mnist(None)
    if directory is None:
        pytest.skip("dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist); CI installs it")
    return directory
