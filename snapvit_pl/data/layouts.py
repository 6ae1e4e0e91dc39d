"""The image-folder layouts, as text, and the check of a folder root: no data library imported, so that a command
line can refuse a missing data root before it imports torch."""
from __future__ import annotations

import os

from ..errors import DataError

FOLDER_LAYOUTS = ("root/train/<class>/<image> with root/val/<class>/<image>; root/train/<class>/<image> with a flat "
                  "root/val/<image> and ImageNet's label file (LOC_val_solution.csv, or the devkit's "
                  "ILSVRC2012_validation_ground_truth.txt with meta.mat; set val_labels); root/<class>/<image> with "
                  "val_split; or root/<image> (unlabeled images: pruning only)")


def check_folder_root(root: str | os.PathLike) -> None:
    """Refuse an image-folder root that is not a directory.

    Raises:
        DataError: naming the root and the layouts read under it.
    """
    if not os.path.isdir(root):
        kind = "is a file, not a folder" if os.path.exists(root) else "does not exist"
        raise DataError(f"image folder root {root} {kind}; expected one of: {FOLDER_LAYOUTS}")
