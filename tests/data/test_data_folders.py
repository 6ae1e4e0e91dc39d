"""Image folders as practitioners have them: ImageNet's flat validation folder with its label file, plain folders of
unlabeled images, and one error line naming the accepted layouts for anything else; one real file under two classes
or in both splits (links, hard links) refused."""
import os

import numpy as np
import pytest
import torch
from PIL import Image

from snapvit_pl.data import ClassificationDataModule
from snapvit_pl.errors import DataError

def save_image(path, array, fmt=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(array).save(path, format=fmt)


WNIDS = {"n01440764": (250, 10, 10), "n01443537": (10, 250, 10), "n01484850": (10, 10, 250)}  # sorted, as ImageNet's
VAL = [("ILSVRC2012_val_00000001", "n01484850"), ("ILSVRC2012_val_00000002", "n01440764"),
       ("ILSVRC2012_val_00000003", "n01443537"), ("ILSVRC2012_val_00000004", "n01484850")]


def _imagenet_like(root):
    """root/train/<wnid>/*.JPEG (2 each) and a flat root/val/ILSVRC2012_val_*.JPEG, each image its class's colour."""
    for wnid, colour in WNIDS.items():
        for i in range(2):
            save_image(str(root / "train" / wnid / f"{wnid}_{i}.JPEG"), np.full((20, 24, 3), colour, np.uint8), "JPEG")
    for name, wnid in VAL:
        save_image(str(root / "val" / f"{name}.JPEG"), np.full((20, 24, 3), WNIDS[wnid], np.uint8), "JPEG")
    return root


def _colour_label(image: torch.Tensor) -> int:
    """The class a solid-colour image shows: its brightest channel (red, green, blue = classes 0, 1, 2)."""
    return int(image.reshape(image.shape[0], -1).mean(1).argmax())


def _check_labels(dm, rgb32):
    dm.configure_for_model(rgb32)
    assert dm.classes == sorted(WNIDS) and len(dm.dataset("val")) == len(VAL)
    for image, label in dm.labeled_dataset("val"):
        assert label == _colour_label(image)
    assert [label for _, label in dm.labeled_dataset("val")] == [2, 0, 1, 2]


def test_flat_validation_folder_with_the_kaggle_solution_file(tmp_path, rgb32):
    root = _imagenet_like(tmp_path / "imagenet")
    lines = ["ImageId,PredictionString"] + [f"{name},{wnid} 10 12 40 50 {wnid} 1 2 3 4" for name, wnid in VAL]
    (root / "LOC_val_solution.csv").write_text("\n".join(lines) + "\n")
    _check_labels(ClassificationDataModule("folder", str(root), data_config=rgb32), rgb32)


def test_flat_validation_folder_with_the_devkit_ground_truth(tmp_path, rgb32):
    scipy_io = pytest.importorskip("scipy.io")
    root = _imagenet_like(tmp_path / "imagenet")
    devkit = root / "ILSVRC2012_devkit_t12" / "data"
    devkit.mkdir(parents=True)
    ids = {"n01484850": 1, "n01440764": 2, "n01443537": 3}  # the devkit numbers classes in its own order
    synsets = np.array([(i, wnid, 0) for wnid, i in ids.items()] + [(1001, "n00001740", 3)],
                       dtype=[("ILSVRC2012_ID", "O"), ("WNID", "O"), ("num_children", "O")])
    scipy_io.savemat(str(devkit / "meta.mat"), {"synsets": synsets.reshape(-1, 1)})
    (devkit / "ILSVRC2012_validation_ground_truth.txt").write_text("\n".join(str(ids[w]) for _, w in VAL) + "\n")
    _check_labels(ClassificationDataModule("folder", str(root), data_config=rgb32), rgb32)


def test_a_missing_label_is_one_error(tmp_path, rgb32):
    root = _imagenet_like(tmp_path / "imagenet")
    (root / "solution.csv").write_text("ImageId,PredictionString\nILSVRC2012_val_00000001,n01484850 1 2 3 4\n")
    dm = ClassificationDataModule("folder", str(root), data_config=rgb32, val_labels=str(root / "solution.csv"))
    with pytest.raises(DataError, match="has no label for ILSVRC2012_val_00000002.JPEG"):
        dm.dataset("val")
    with pytest.raises(DataError, match="no label file was found; set data.init_args.val_labels"):
        ClassificationDataModule("folder", str(root), data_config=rgb32).dataset("val")


def test_a_plain_folder_of_unlabeled_images_is_enough_for_pruning(tmp_path, rgb32):
    for i in range(5):
        save_image(str(tmp_path / "pool" / f"{i}.jpg"), np.full((20, 20, 3), 40 * i, np.uint8), "JPEG")
    dm = ClassificationDataModule("folder", str(tmp_path / "pool"), data_config=rgb32, batch_size=2)
    dm.configure_for_model(rgb32)
    assert not dm.labeled and len(dm.dataset("train")) == 5
    assert dm.unlabeled_images().shape == (5, 3, 32, 32)
    dm.train_views = "multicrop"
    assert next(iter(dm.train_dataloader())).shape[:2] == (2, 12)
    with pytest.raises(DataError, match="unlabeled images"):
        dm.labeled_dataloader("val")


@pytest.mark.parametrize("make", ["empty", "only_train", "files_and_nothing"])
def test_a_wrong_layout_names_every_accepted_one(tmp_path, make):
    root = tmp_path / "data"
    root.mkdir()
    if make == "only_train":
        save_image(str(root / "train" / "cat" / "0.png"), np.zeros((8, 8, 3), np.uint8))
    elif make == "files_and_nothing":
        (root / "notes.txt").write_text("no images here")
    with pytest.raises(DataError) as raised:
        ClassificationDataModule("folder", str(root)).dataset("train")
    message = str(raised.value)
    assert "root/train/<class>/<image>" in message and "LOC_val_solution.csv" in message
    assert "root/<image> (unlabeled" in message and "\n" not in message


def test_class_folders_still_work(classification_tree, rgb32, class_colours):
    dm = ClassificationDataModule("folder", str(classification_tree), data_config=rgb32)
    dm.configure_for_model(rgb32)
    assert dm.labeled and dm.classes == sorted(class_colours) and len(dm.dataset("val")) == 6


def _class_tree(root, per_class=4):
    for c, value in (("a", 40), ("b", 200)):
        for i in range(per_class):
            save_image(str(root / c / f"{i}.png"), np.full((8, 8), value + i, np.uint8))
    return root


def test_a_symlink_loop_is_read_once(tmp_path):
    """A link back up the tree (and a link into another class) multiplied the images, and made the val split overlap
    the train split: every real folder is read once, as its own class."""
    root = _class_tree(tmp_path / "root", per_class=20)
    (root / "a" / "loop").symlink_to(root, target_is_directory=True)
    (root / "a" / "again").symlink_to(root / "a", target_is_directory=True)
    (root / "b" / "to_a").symlink_to(root / "a", target_is_directory=True)
    (root / "b" / "self").symlink_to(root / "b" / "self")  # a link to itself
    dm = ClassificationDataModule("folder", str(root), val_split=0.25, max_samples=None)
    train, val = dm.base_dataset("train"), dm.base_dataset("val")
    assert len(train) + len(val) == 40 and len(val) == 10
    files = [train.dataset.samples[i] for i in train.indices] + [val.dataset.samples[i] for i in val.indices]
    assert len({os.path.realpath(path) for path, _ in files}) == 40  # no file twice, so no overlap of the splits
    assert all(os.path.basename(os.path.dirname(path)) == ("a", "b")[label] for path, label in files)


def test_a_link_to_a_missing_file_is_refused_before_any_work_or_skipped(tmp_path, rgb32):
    root = _class_tree(tmp_path / "root")
    (root / "b" / "gone.png").symlink_to(tmp_path / "deleted.png")
    with pytest.raises(DataError, match=r"b/gone.png is a link to a missing file .*skip_corrupt: true"):
        ClassificationDataModule("folder", str(root), val_split=0.25).setup()
    dm = ClassificationDataModule("folder", str(root), val_split=0.5, skip_corrupt=True, data_config=rgb32,
                                  max_samples=None)
    assert len(dm.dataset("train")) + len(dm.dataset("val")) == 8
    assert [os.path.basename(p) for p in dm.skipped["train"] + dm.skipped["val"]] == ["gone.png"]


def _split_tree(root, per_class=2):
    """root/{train,val}/{a,b}/<i>.png, every file distinct."""
    for s, split in enumerate(("train", "val")):
        for c, value in (("a", 40), ("b", 200)):
            for i in range(per_class):
                save_image(str(root / split / c / f"{i}.png"), np.full((8, 8), value + 10 * s + i, np.uint8))
    return root


def _refused(root, first, second, **kwargs):
    """The one DataError of reading ``root``: it names both paths (relative to root) as the same file (the one
    listed later first)."""
    with pytest.raises(DataError) as raised:
        ClassificationDataModule("folder", str(root), **kwargs).dataset("train")
    message = str(raised.value)
    assert (f"{root / second} and {root / first} are the same file" in message
            or kwargs.get("val_split") and f"{root / first} and {root / second} are the same" in message), message
    assert "a file may appear once, in one class of one split" in message and "\n" not in message


def test_a_class_linked_to_another_class_is_refused(tmp_path):
    """Class b a link to class a: every image read under both labels (k-NN 50%, no warning)."""
    root = _split_tree(tmp_path / "root")
    for split in ("train", "val"):
        for file in (root / split / "b").iterdir():
            file.unlink()
        (root / split / "b").rmdir()
        (root / split / "b").symlink_to(root / split / "a", target_is_directory=True)
    _refused(root, "train/a/0.png", "train/b/0.png")


def test_val_linked_to_train_is_refused(tmp_path):
    """val a link to train: an evaluation on the training images."""
    root = _split_tree(tmp_path / "root")
    for file in (root / "val").rglob("*.png"):
        file.unlink()
    for folder in ("a", "b"):
        (root / "val" / folder).rmdir()
    (root / "val").rmdir()
    (root / "val").symlink_to(root / "train", target_is_directory=True)
    _refused(root, "train/a/0.png", "val/a/0.png")


def test_one_file_hard_linked_into_two_classes_or_both_splits_is_refused(tmp_path):
    root = _split_tree(tmp_path / "root")
    os.link(root / "train" / "a" / "1.png", root / "train" / "b" / "extra.png")
    _refused(root, "train/a/1.png", "train/b/extra.png")
    (root / "train" / "b" / "extra.png").unlink()
    (root / "val" / "b" / "1.png").unlink()
    os.link(root / "train" / "b" / "0.png", root / "val" / "b" / "1.png")
    _refused(root, "train/b/0.png", "val/b/1.png")


@pytest.mark.parametrize("layout", ["val_split", "flat_val", "unlabeled"])
def test_the_same_file_twice_is_refused_in_every_layout(tmp_path, layout):
    root = tmp_path / "root"
    if layout == "val_split":  # root/<class>/<image>: the seeded split of one tree
        _class_tree(root)
        os.link(root / "a" / "0.png", root / "b" / "copy.png")
        _refused(root, "a/0.png", "b/copy.png", val_split=0.5)
    elif layout == "flat_val":  # ImageNet's flat validation folder: an image of the train split in it
        _imagenet_like(root)
        lines = ["ImageId,PredictionString"] + [f"{name},{wnid} 1 2 3 4" for name, wnid in VAL]
        (root / "LOC_val_solution.csv").write_text("\n".join(lines) + "\n")
        first = "train/n01484850/n01484850_0.JPEG"
        (root / "val" / f"{VAL[0][0]}.JPEG").unlink()
        (root / "val" / f"{VAL[0][0]}.JPEG").symlink_to(root / first)
        _refused(root, first, f"val/{VAL[0][0]}.JPEG")
    else:  # a plain folder of unlabeled images
        for i in range(3):
            save_image(str(root / f"{i}.png"), np.full((8, 8), 30 * i, np.uint8))
        os.link(root / "1.png", root / "3.png")
        _refused(root, "1.png", "3.png")


def test_links_to_distinct_files_are_accepted(tmp_path):
    """Links are a common way to assemble a data set: each to its own file is fine, also a class folder that is a
    link to a folder outside the tree."""
    store = tmp_path / "store"
    for i in range(6):
        save_image(str(store / f"{i}.png"), np.full((8, 8), 30 * i, np.uint8))
    root = tmp_path / "root"
    for split, offset in (("train", 0), ("val", 2)):
        for c, first in (("a", 0), ("b", 1)):
            (root / split / c).mkdir(parents=True)
            (root / split / c / "x.png").symlink_to(store / f"{offset + first}.png")
    save_image(str(tmp_path / "elsewhere" / "0.png"), np.full((8, 8), 7, np.uint8))
    (root / "train" / "a" / "more").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    dm = ClassificationDataModule("folder", str(root), max_samples=None)
    assert len(dm.dataset("train")) == 3 and len(dm.dataset("val")) == 2
