"""A small ImageFolder tree for the command-line tests that need a real ``--data.init_args.root``."""
from pathlib import Path


def image_folder(root: Path, per_class: int = 8) -> Path:
    """root/train/<class>/*.png and root/val/<class>/*.png: 2 classes of ``per_class`` random 32 px images each."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in ("a", "b"):
            (root / split / label).mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / split / label / f"{i}.png")
    return root


def gray_image_folder(root: Path) -> Path:
    """root/{train,val}/{c0,c1}: 24 + 4 random 28x28 grayscale PNGs per class (the tiny test model's input)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", 24), ("val", 4)):
        for c in range(2):
            (root / split / f"c{c}").mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 255, (28, 28), dtype=np.uint8) // (c + 1)).save(
                    root / split / f"c{c}" / f"{i}.png")
    return root
