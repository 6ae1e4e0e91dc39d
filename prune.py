"""Prune a pretrained ViT into an elastic family of sub-networks: ``python prune.py --help``."""
import sys

from snapvit_pl.cli import prune_main

if __name__ == "__main__":
    sys.exit(prune_main())
