"""Fine-tune (or train from scratch) a dense or pruned ViT: ``python train.py --help``."""
import sys

from snapvit_pl.cli import train_main

if __name__ == "__main__":
    sys.exit(train_main())
