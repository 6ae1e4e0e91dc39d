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
