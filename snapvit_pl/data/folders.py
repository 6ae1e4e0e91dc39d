"""Image folders as practitioners have them: class-folder trees, ImageNet's flat validation folder with its label
file, and plain folders of unlabeled images.

The layouts ``ClassificationDataModule(source="folder", root=...)`` reads (:data:`FOLDER_LAYOUTS`):

1. ``root/train/<class>/<image>`` and ``root/val/<class>/<image>`` (an ImageFolder tree);
2. ``root/train/<class>/<image>`` and a flat ``root/val/<image>``, labeled by ImageNet's label file: Kaggle's
   ``LOC_val_solution.csv`` (``ImageId,PredictionString``; the first synset of each row), or the devkit's
   ``ILSVRC2012_validation_ground_truth.txt`` (one ILSVRC2012_ID per image, in file-name order) with the
   devkit's ``meta.mat`` beside it (read with SciPy); ``val_labels`` names the file, else it is looked for in
   ``root``, ``root/val`` and the devkit's ``data/`` folder;
3. ``root/<class>/<image>``, split by ``val_split``;
4. ``root/<image>``: unlabeled images, enough for pruning (the label-free scorers); nothing to evaluate on.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path
from collections.abc import Iterator, Mapping
from typing import Callable, Optional, Sequence

from PIL import Image
from torch.utils.data import Dataset
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from ..errors import DataError
from ..io import special_file
from .layouts import FOLDER_LAYOUTS

LOC_SOLUTION = "LOC_val_solution.csv"
DEVKIT_GROUND_TRUTH = "ILSVRC2012_validation_ground_truth.txt"
DEVKIT_META = "meta.mat"


def is_image(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def image_files(directory: str | Path) -> list[Path]:
    """The image files directly in ``directory``, sorted by name."""
    return sorted(p for p in Path(directory).iterdir() if p.is_file() and is_image(p.name))


def class_dirs(directory: str | Path) -> list[Path]:
    """The sub-directories of ``directory`` that hold images (at any depth), sorted by name."""
    return sorted(p for p in Path(directory).iterdir() if p.is_dir() and any(
        is_image(f.name) for f in walk_files(p, set())))


def walk_files(directory: str | Path, visited: set[tuple[int, int]]) -> Iterator[Path]:
    """The files under ``directory`` at any depth (each folder's in name order), following links to directories but
    entering every real directory once: a link loop, or a second way into a folder already read (``visited``: the
    (device, inode) of each directory entered, shared across calls), is not followed. Links to missing files are
    yielded too (reading them fails, or ``skip_corrupt`` skips them)."""
    stack = [Path(directory)]
    while stack:
        folder = stack.pop()
        try:
            key = _identity(folder)
        except OSError:
            continue
        if key in visited and folder != Path(directory):
            continue
        visited.add(key)
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
        folders = [Path(e.path) for e in entries if _is_dir(e)]  # through links
        for entry in entries:
            if Path(entry.path) in folders:
                continue
            if is_image(entry.name) and not _is_file(entry) and special_file(entry.path) is not None:
                raise DataError(f"{entry.path} is {special_file(entry.path)}, not an image file: reading it would wait "
                                "for ever; remove it from the image folder")
            yield Path(entry.path)
        stack.extend(reversed(folders))


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a link to itself
        return False


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def _identity(folder: Path) -> tuple[int, int]:
    stat = folder.stat()
    return stat.st_dev, stat.st_ino


def refuse_shared_files(splits: Mapping[str, Sequence[str]]) -> None:
    """Refuse a real file listed twice: under two classes, in both splits, or twice in one list (a class folder
    that links to another, a ``val`` that links to ``train``, a file hard-linked into two classes). A link to a file
    is itself a way to the file (its (device, inode) is the target's), so links that point to distinct files stay
    allowed. One ``stat`` per file; no image is read. Links to missing files are passed over (refused, or skipped
    with ``skip_corrupt``, where they are read).

    Args:
        splits: the image files of each split, in the order they are listed.

    Raises:
        DataError: naming both paths.
    """
    seen: dict[tuple[int, int], str] = {}
    for paths in splits.values():
        for path in paths:
            try:
                stat = os.stat(path)
            except OSError:
                continue
            first = seen.get((stat.st_dev, stat.st_ino))
            if first is None:
                seen[stat.st_dev, stat.st_ino] = path
                continue
            if os.fspath(first) == os.fspath(path):
                raise DataError(f"data: {path} is listed twice; a file may appear once, in one class of one split")
            how = ("a symlink" if os.path.realpath(first) == os.path.realpath(path) else "a hard link")
            raise DataError(f"data: {path} and {first} are the same file ({how}); a file may appear once, in one "
                            "class of one split: remove one of them, or link to distinct files")


class ImageTree(ImageFolder):
    """torchvision's ``ImageFolder`` (``root/<class>/<image at any depth>``), reading every real directory once: its
    walk follows directory links without limit, so a link loop multiplied the images (and a link to another class
    folder labeled that class's images twice). Here a link is followed only into a folder not read yet, never into
    another class folder.

    Args:
        root: the folder of class folders.
        loader: reads one image file.
        missing_ok: keep links to missing files (the data module's ``skip_corrupt`` skips them); else refuse them now.

    Raises:
        DataError: a link to a missing file (without ``missing_ok``).
    """

    def __init__(self, root: str | Path, loader: Callable[[str], Image.Image], missing_ok: bool = False):
        self.missing_ok = missing_ok
        super().__init__(str(root), loader=loader)

    def make_dataset(self, directory: str, class_to_idx: dict[str, int], extensions=None, is_valid_file=None,
                     allow_empty: bool = False) -> list[tuple[str, int]]:
        visited = {_identity(Path(directory) / name) for name in class_to_idx}  # each class folder is its own class
        samples = []
        for name, index in sorted(class_to_idx.items(), key=lambda item: item[1]):
            for path in walk_files(Path(directory) / name, visited):
                if not is_image(path.name):
                    continue
                if not path.exists() and not self.missing_ok:
                    raise DataError(f"{path} is a link to a missing file ({os.readlink(path)}); remove it, or set "
                                    "skip_corrupt: true to skip unreadable files")
                samples.append((str(path), index))
        if not samples and not allow_empty:
            raise FileNotFoundError(f"found no image files in the class folders of {directory}")
        return samples


class ImageList(Dataset):
    """``(PIL image, target)`` from a list of files; unlabeled images (``classes`` empty) have target -1.

    Args:
        samples: ``(path, class index)`` pairs.
        classes: class names, index = label (empty: unlabeled).
        loader: reads one image file.
    """

    def __init__(self, samples: Sequence[tuple[str, int]], classes: Sequence[str], loader: Callable[[str], Image.Image]):
        self.samples, self.classes, self.loader = list(samples), list(classes), loader
        self.targets = [t for _, t in self.samples] if self.classes else None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        path, target = self.samples[index]
        return self.loader(path), target


def unlabeled_images(root: str | Path, loader: Callable[[str], Image.Image]) -> ImageList:
    """Every image directly in ``root`` (layout 4), unlabeled."""
    return ImageList([(str(p), -1) for p in image_files(root)], [], loader)


def find_val_labels(root: str | Path, given: Optional[str] = None) -> Path:
    """ImageNet's validation label file: ``given``, else ``LOC_val_solution.csv`` or the devkit's ground truth in
    ``root``, ``root/val``, ``root/ILSVRC2012_devkit_t12/data`` or ``root/..``.

    Raises:
        DataError: none found.
    """
    if given is not None:
        path = Path(given).expanduser()
        if not path.is_file():
            raise DataError(f"val_labels {path} is not a file; give ImageNet's {LOC_SOLUTION} or the devkit's "
                            f"{DEVKIT_GROUND_TRUTH}")
        return path
    root = Path(root)
    for folder in (root, root / "val", root / "ILSVRC2012_devkit_t12" / "data", root.parent):
        for name in (LOC_SOLUTION, DEVKIT_GROUND_TRUTH):
            if (folder / name).is_file():
                return folder / name
    raise DataError(f"{root / 'val'} is a flat folder of images but no label file was found; set "
                    f"data.init_args.val_labels to ImageNet's {LOC_SOLUTION} or the devkit's {DEVKIT_GROUND_TRUTH}, "
                    f"or use one of the layouts: {FOLDER_LAYOUTS}")


def read_loc_solution(path: str | Path) -> dict[str, str]:
    """``LOC_val_solution.csv`` -> ``{image id (file stem): synset}`` (the first synset of each row)."""
    labels = {}
    with open(path, newline="") as f:
        rows = csv.reader(f)
        header = next(rows, [])
        if [h.strip() for h in header[:2]] != ["ImageId", "PredictionString"]:
            raise DataError(f"{path} is not a LOC_val_solution.csv (header ImageId,PredictionString); got {header[:2]}")
        for row in rows:
            if len(row) >= 2 and row[1].split():
                labels[row[0].strip()] = row[1].split()[0]
    return labels


def read_devkit_ground_truth(path: str | Path, val_files: Sequence[Path]) -> dict[str, str]:
    """The devkit's ground truth (one ILSVRC2012_ID per line, in file-name order) with ``meta.mat`` beside it
    -> ``{image id: synset}``.

    Raises:
        DataError: no ``meta.mat``, SciPy missing, or as many lines as images missing.
    """
    path = Path(path)
    meta = path.parent / DEVKIT_META
    if not meta.is_file():
        raise DataError(f"{path} gives ILSVRC2012_IDs; their synsets are in the devkit's {DEVKIT_META}, not found "
                        f"beside it ({meta}); copy it there, or use {LOC_SOLUTION}")
    try:
        from scipy.io import loadmat
    except ImportError as err:
        raise DataError(f"reading the devkit's {DEVKIT_META} needs SciPy (pip install scipy), or use "
                        f"{LOC_SOLUTION}") from err
    synsets = loadmat(str(meta), squeeze_me=True)["synsets"]
    by_id = {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets if int(s["num_children"]) == 0}
    ids = [int(line) for line in path.read_text().split()]
    if len(ids) != len(val_files):
        raise DataError(f"{path} has {len(ids)} labels for {len(val_files)} validation images; give the complete "
                        "validation folder (50 000 images) or use LOC_val_solution.csv, which names each image")
    return {file.stem: by_id[i] for file, i in zip(val_files, ids)}


def flat_val_images(val_dir: str | Path, classes: Sequence[str], label_file: Path,
                    loader: Callable[[str], Image.Image]) -> ImageList:
    """A flat validation folder (layout 2) labeled by ``label_file``, with the train split's ``classes``.

    Raises:
        DataError: an image without a label, or a label that is not one of the train classes.
    """
    files = image_files(val_dir)
    if label_file.name == DEVKIT_GROUND_TRUTH or label_file.suffix == ".txt":
        labels = read_devkit_ground_truth(label_file, files)
    else:
        labels = read_loc_solution(label_file)
    index = {name: i for i, name in enumerate(classes)}
    samples = []
    for file in files:
        synset = labels.get(file.stem)
        if synset is None:
            raise DataError(f"{label_file} has no label for {file.name}; give the label file of this validation set")
        if synset not in index:
            raise DataError(f"{file.name} is labeled {synset}, which is not a class folder of the train split; the "
                            "train folder and the label file must name the same classes")
        samples.append((str(file), index[synset]))
    return ImageList(samples, classes, loader)
