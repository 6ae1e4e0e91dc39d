"""Reading one image: high bit depths scaled (not saturated), what PIL refuses as one DataError; the fingerprint of
what a run reads (a resume compares it)."""
import hashlib
import os

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


def _tree(root, per_class=6):
    for c, value in (("a", 20), ("b", 150)):
        for i in range(per_class):
            (root / "train" / c).mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((8, 8), value + i, np.uint8)).save(root / "train" / c / f"{i}.png")
        (root / "val" / c).mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8), value, np.uint8)).save(root / "val" / c / "v.png")
    return root


def test_the_input_fingerprint_covers_the_files_the_subsets_read_and_their_bytes(tmp_path):
    root = _tree(tmp_path / "root")
    dm = ClassificationDataModule("folder", str(root), max_samples=4, seed=1)
    fingerprint = dm.input_fingerprint()
    subset = dm.dataset("train")
    read = [subset.dataset.samples[i] for i in subset.indices]
    assert fingerprint["split"] == "train" and fingerprint["listed"] == 12
    assert [(path, label) for path, label, *_ in fingerprint["files"]] == read  # the subset, in its order
    path, _, size, mtime_ns, sha = fingerprint["files"][0]
    assert (size, mtime_ns) == (os.stat(path).st_size, os.stat(path).st_mtime_ns)
    assert sha == hashlib.sha256(open(path, "rb").read()).hexdigest()
    both = dm.input_fingerprint([None, 6])  # the pruning pass's subset and another one (the search's images)
    assert {f[0] for f in fingerprint["files"]} < {f[0] for f in both["files"]} and len(both["files"]) <= 10
    assert len(dm.input_fingerprint([None, None])["files"]) == 4
    assert not any("/val/" in f[0] for f in both["files"])  # the pruning data: the train split
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(read[0][0])  # new bytes: a new hash
    again = ClassificationDataModule("folder", str(root), max_samples=4, seed=1).input_fingerprint()
    assert again["files"][0][4] != sha and again["files"][1:] == fingerprint["files"][1:]


def test_fashion_mnist_is_fingerprinted_by_its_files(fashion_mnist_dir):
    fingerprint = ClassificationDataModule("fashion_mnist", max_samples=10).input_fingerprint()
    names = sorted(os.path.basename(f[0]) for f in fingerprint["files"])
    assert names == ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"] and fingerprint["listed"] == 60000
    assert all(len(f[4]) == 64 and f[1] == -1 for f in fingerprint["files"])


def test_the_listing_fingerprint_reads_no_image_and_changes_with_the_data(tmp_path):
    """What a training checkpoint records of its data: the same for the same files (moved elsewhere too), another
    for another subset, another tree or another label."""
    import shutil

    root = _tree(tmp_path / "root")
    one = ClassificationDataModule("folder", str(root), max_samples=4, seed=1).listing_fingerprint()
    assert one["samples"] == 4 and len(one["sha256"]) == 64
    shutil.move(root, tmp_path / "moved")
    assert ClassificationDataModule("folder", str(tmp_path / "moved"), max_samples=4, seed=1).listing_fingerprint()[
        "sha256"] == one["sha256"]
    assert ClassificationDataModule("folder", str(tmp_path / "moved"), max_samples=6, seed=1).listing_fingerprint()[
        "sha256"] != one["sha256"]
    other = _tree(tmp_path / "other")
    (other / "train" / "a" / "0.png").unlink()
    assert ClassificationDataModule("folder", str(other), max_samples=4, seed=1).listing_fingerprint()[
        "sha256"] != one["sha256"]


def test_a_named_pipe_among_the_images_is_refused_not_read(tmp_path):
    """A FIFO named like an image blocked the run for ever (nothing writes to it): refused, naming it."""
    root = _tree(tmp_path / "root")
    os.mkfifo(root / "train" / "a" / "0b.png")
    with pytest.raises(DataError, match=r"0b\.png is a named pipe \(FIFO\), not an image file"):
        ClassificationDataModule("folder", str(root)).setup()


def test_a_dropped_loader_frees_its_persistent_workers_at_once():
    """A loader dropped with its persistent workers is freed by reference counting (no cycle through its batch
    sampler): its workers stop now, not when a garbage collection runs, maybe in another loader's forked worker
    (which printed tracebacks of workers it did not own)."""
    import gc
    import weakref

    from torch.utils.data import TensorDataset

    from snapvit_pl.data.sampling import DeferredDataLoader

    loader = DeferredDataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, num_workers=1, persistent_workers=True)
    assert len(list(loader)) == 2
    workers, freed = list(loader._iterator._workers), weakref.ref(loader)
    gc.disable()
    try:
        del loader
        assert freed() is None
    finally:
        gc.enable()
    for worker in workers:
        worker.join(timeout=20)
        assert not worker.is_alive()
