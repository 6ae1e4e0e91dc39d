"""Reading one image: high bit depths scaled (not saturated), what PIL refuses as one DataError."""
import numpy as np
import pytest
import torch
from PIL import Image

from snapvit_pl.data import ClassificationDataModule, read_image
from snapvit_pl.errors import DataError


def test_a_16_bit_png_is_scaled_to_8_bits_not_saturated(tmp_path, rgb32):
    ramp = (np.arange(32 * 32).reshape(32, 32) * 64).astype(np.uint16)  # 0 .. 65472: the full 16-bit range
    for c in ("a", "b"):
        (tmp_path / "root" / c).mkdir(parents=True)
        Image.fromarray(ramp).save(tmp_path / "root" / c / "x.png")
    image = read_image(str(tmp_path / "root" / "a" / "x.png"))
    assert image.mode == "L"
    expected = np.rint(ramp / 257.0)
    assert np.abs(np.asarray(image, dtype=np.float64) - expected).max() == 0
    assert (np.asarray(image) == 255).mean() < 0.01  # converting directly made 99% of the pixels 255
    dm = ClassificationDataModule("folder", str(tmp_path / "root"), val_split=0.5, data_config=rgb32)
    tensor = dm.labeled_dataset("train")[0][0]
    mean, std = torch.tensor(rgb32["mean"]).view(3, 1, 1), torch.tensor(rgb32["std"]).view(3, 1, 1)
    pixels = (tensor * std + mean) * 255
    assert torch.allclose(pixels[0], torch.from_numpy(expected).float(), atol=1.0)
    mask = read_image(str(tmp_path / "root" / "a" / "x.png"), raw=True)  # class indices keep their values
    assert mask.mode == "I;16" and np.array_equal(np.asarray(mask), ramp)


def test_images_without_a_fixed_range_are_refused(tmp_path):
    Image.fromarray(np.full((4, 4), 0.5, np.float32)).save(tmp_path / "f.tif")
    with pytest.raises(DataError, match=r"f.tif: mode F \(32-bit float\) has no fixed range"):
        read_image(str(tmp_path / "f.tif"))
    Image.fromarray(np.full((4, 4), 70_000, np.int32)).save(tmp_path / "i.tif")
    with pytest.raises(DataError, match="32-bit integers beyond 16 bits"):
        read_image(str(tmp_path / "i.tif"))


def test_a_decompression_bomb_is_one_error_and_skipped_with_skip_corrupt(tmp_path, rgb32, monkeypatch):
    for c in ("a", "b"):
        for i, size in enumerate((8, 8, 8, 200)):
            (tmp_path / c).mkdir(exist_ok=True)
            Image.fromarray(np.zeros((size, size), np.uint8)).save(tmp_path / c / f"{i}.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)  # 200x200 exceeds twice the limit: PIL refuses it
    with pytest.raises(DataError, match=r"3.png: .*decompression bomb.*MAX_IMAGE_PIXELS.*skip_corrupt: true"):
        read_image(str(tmp_path / "a" / "3.png"))
    dm = ClassificationDataModule("folder", str(tmp_path), val_split=0.25, data_config=rgb32, skip_corrupt=True,
                                  max_samples=None)
    assert len(dm.dataset("train")) + len(dm.dataset("val")) == 6
    assert sorted(p.rsplit("/", 2)[-2] for p in dm.skipped["train"] + dm.skipped["val"]) == ["a", "b"]
