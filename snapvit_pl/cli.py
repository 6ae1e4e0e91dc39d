"""Command-line entry points (LightningCLI) shared by ``prune.py`` and ``train.py``."""
from __future__ import annotations

import sys


def prune_main(argv: list[str] | None = None) -> int:
    """Entry point of ``prune.py``."""
    print("prune.py: the pruning pipeline is not implemented yet (see the issue tracker); the install works.")
    return 0


def train_main(argv: list[str] | None = None) -> int:
    """Entry point of ``train.py``."""
    print("train.py: fine-tuning is not implemented yet (see the issue tracker); the install works.")
    return 0


if __name__ == "__main__":
    sys.exit(prune_main())
